//! Tensors: a shape, an element type and data on the CPU or the GPU.
//!
//! Tensors are values: cloning one shares its data, and no operation changes a tensor that
//! another handle can see (in-place updates copy first when the data is shared).
//! Operations live in `crate::kernels`, one file per kernel family, each holding the CPU
//! reference and the GPU launch side by side; the private `ops` module gives them method
//! syntax on [`Tensor`].

mod device;
mod ops;

use std::sync::Arc;

pub use device::Device;

use crate::error::{DTypeName, Error, Result};
use crate::gpu::{Gpu, GpuBuf};

/// Element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit floats, the type of values and gradients.
    F32,
    /// Indices and labels.
    U32,
}

impl DType {
    pub(crate) fn name(self) -> DTypeName {
        DTypeName(match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
        })
    }
}

#[derive(Clone)]
pub(crate) enum Storage {
    F32(Arc<Vec<f32>>),
    U32(Arc<Vec<u32>>),
    Gpu(GpuBuf),
}

/// An n-dimensional array of f32 or u32 on a [`Device`], immutable and cheap to clone (clones share
/// the data).
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
    device: Device,
}

/// Largest element count a kernel can index with u32 arithmetic.
pub const MAX_ELEMENTS: usize = (u32::MAX / 4) as usize;

pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn check_len(op: &'static str, shape: &[usize], len: usize) -> Result<()> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match n {
        Some(n) if n == len && n <= MAX_ELEMENTS => Ok(()),
        Some(n) if n != len => crate::error::shape_err(
            op,
            format!("shape {shape:?} holds {n} elements, data has {len}"),
        ),
        _ => crate::error::shape_err(
            op,
            format!("shape {shape:?} exceeds {MAX_ELEMENTS} elements"),
        ),
    }
}

impl Tensor {
    /// An f32 tensor holding `data` in row-major order.
    pub fn from_vec(device: &Device, shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        check_len("from_vec", shape, data.len())?;
        let storage = match device {
            Device::Cpu => Storage::F32(Arc::new(data)),
            Device::Gpu(gpu) => Storage::Gpu(gpu.upload(bytemuck::cast_slice(&data))?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::F32,
            storage,
            device: device.clone(),
        })
    }

    /// A u32 tensor (indices, labels).
    pub fn from_u32(device: &Device, shape: &[usize], data: Vec<u32>) -> Result<Tensor> {
        check_len("from_u32", shape, data.len())?;
        let storage = match device {
            Device::Cpu => Storage::U32(Arc::new(data)),
            Device::Gpu(gpu) => Storage::Gpu(gpu.upload(bytemuck::cast_slice(&data))?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::U32,
            storage,
            device: device.clone(),
        })
    }

    /// A scalar (shape `[]`).
    pub fn scalar(device: &Device, value: f32) -> Result<Tensor> {
        Self::from_vec(device, &[], vec![value])
    }

    /// An f32 tensor of zeros.
    pub fn zeros(device: &Device, shape: &[usize]) -> Result<Tensor> {
        check_len("zeros", shape, numel(shape))?;
        let storage = match device {
            Device::Cpu => Storage::F32(Arc::new(vec![0.0; numel(shape)])),
            Device::Gpu(gpu) => Storage::Gpu(gpu.zeros(4 * numel(shape) as u64)?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::F32,
            storage,
            device: device.clone(),
        })
    }

    pub(crate) fn from_gpu(gpu: &Arc<Gpu>, shape: &[usize], dtype: DType, buf: GpuBuf) -> Tensor {
        debug_assert_eq!(buf.bytes(), 4 * numel(shape) as u64);
        Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Storage::Gpu(buf),
            device: Device::Gpu(gpu.clone()),
        }
    }

    /// Size of each axis, outermost first (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements, the product of the shape (1 for a scalar).
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the data lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Identifies the data this tensor shares with its clones (not its shape): the graph uses
    /// it to recognise a parameter used twice, as in weight tying.
    pub fn storage_id(&self) -> usize {
        match &self.storage {
            Storage::F32(v) => Arc::as_ptr(v) as usize,
            Storage::U32(v) => Arc::as_ptr(v) as usize,
            Storage::Gpu(b) => b.id(),
        }
    }

    /// The same data under another shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        check_len("reshape", shape, self.numel())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// The elements in row-major order (reads back from the GPU).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        self.expect_dtype("to_vec", DType::F32)?;
        match &self.storage {
            Storage::F32(v) => Ok(v.as_ref().clone()),
            Storage::Gpu(buf) => Ok(bytemuck::pod_collect_to_vec(&self.gpu()?.read(buf)?)),
            Storage::U32(_) => unreachable!("dtype checked"),
        }
    }

    /// The elements of a u32 tensor.
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        self.expect_dtype("to_vec_u32", DType::U32)?;
        match &self.storage {
            Storage::U32(v) => Ok(v.as_ref().clone()),
            Storage::Gpu(buf) => Ok(bytemuck::pod_collect_to_vec(&self.gpu()?.read(buf)?)),
            Storage::F32(_) => unreachable!("dtype checked"),
        }
    }

    /// The elements of several f32 tensors, with one GPU wait for all of them.
    pub fn read_many(tensors: &[&Tensor]) -> Result<Vec<Vec<f32>>> {
        let gpu_bufs: Vec<&GpuBuf> = tensors.iter().filter_map(|t| t.gpu_buf()).collect();
        let mut gpu_data = match tensors.iter().find_map(|t| t.device.as_gpu()) {
            Some(gpu) if !gpu_bufs.is_empty() => gpu.read_many(&gpu_bufs)?.into_iter(),
            _ => Vec::new().into_iter(),
        };
        tensors
            .iter()
            .map(|t| {
                t.expect_dtype("read_many", DType::F32)?;
                match &t.storage {
                    Storage::F32(v) => Ok(v.as_ref().clone()),
                    Storage::Gpu(_) => Ok(bytemuck::pod_collect_to_vec(
                        &gpu_data.next().expect("one read per GPU tensor"),
                    )),
                    Storage::U32(_) => unreachable!("dtype checked"),
                }
            })
            .collect()
    }

    /// The single element of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return crate::error::shape_err(
                "item",
                format!("needs one element, shape is {:?}", self.shape),
            );
        }
        Ok(self.to_vec()?[0])
    }

    /// A copy on `device` (a cheap clone when already there).
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if self.device.same(device) {
            return Ok(self.clone());
        }
        // From the host: uploaded from the tensor's own elements, without a copy first.
        if let (Device::Gpu(gpu), Storage::F32(v)) = (device, &self.storage) {
            return Ok(Tensor {
                shape: self.shape.clone(),
                dtype: DType::F32,
                storage: Storage::Gpu(gpu.upload(bytemuck::cast_slice(v.as_slice()))?),
                device: device.clone(),
            });
        }
        match self.dtype {
            DType::F32 => Tensor::from_vec(device, &self.shape, self.to_vec()?),
            DType::U32 => Tensor::from_u32(device, &self.shape, self.to_vec_u32()?),
        }
    }

    pub(crate) fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype == dtype {
            Ok(())
        } else {
            Err(Error::DType {
                op,
                expected: dtype.name(),
                got: self.dtype.name(),
            })
        }
    }

    pub(crate) fn same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.device.same(&other.device) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                op,
                a: self.device.to_string(),
                b: other.device.to_string(),
            })
        }
    }

    /// CPU f32 data, or `None` on the GPU.
    pub(crate) fn cpu_f32(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::F32(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn cpu_u32(&self) -> Option<&[u32]> {
        match &self.storage {
            Storage::U32(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn gpu_buf(&self) -> Option<&GpuBuf> {
        match &self.storage {
            Storage::Gpu(b) => Some(b),
            _ => None,
        }
    }

    fn gpu(&self) -> Result<&Arc<Gpu>> {
        match &self.device {
            Device::Gpu(g) => Ok(g),
            Device::Cpu => Err(Error::Gpu("tensor is on the CPU".into())),
        }
    }

    /// Mutable CPU data, copied first if shared.
    pub(crate) fn cpu_f32_mut(&mut self) -> Option<&mut Vec<f32>> {
        match &mut self.storage {
            Storage::F32(v) => Some(Arc::make_mut(v)),
            _ => None,
        }
    }

    /// Gives this tensor a GPU buffer of its own, copying the data first if a clone shares
    /// it, so that it can be written in place. A no-op on the CPU (see `cpu_f32_mut`).
    pub(crate) fn make_unique(&mut self) -> Result<()> {
        let (Device::Gpu(gpu), Storage::Gpu(buf)) = (&self.device, &mut self.storage) else {
            return Ok(());
        };
        if !buf.is_unique() {
            let copy = gpu.alloc(buf.bytes())?;
            gpu.copy(buf, 0, &copy, 0, buf.bytes());
            *buf = copy;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?} {:?} on {})",
            self.shape, self.dtype, self.device
        )
    }
}
