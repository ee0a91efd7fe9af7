//! Constant fill (fill.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, FILL};
use crate::error::Result;
use crate::tensor::{numel, DType, Device, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    value: f32,
    _pad: [u32; 2],
}

/// CPU reference.
pub fn fill_ref(n: usize, value: f32) -> Vec<f32> {
    vec![value; n]
}

/// An f32 tensor of `shape` with every element `value`.
pub fn full(device: &Device, shape: &[usize], value: f32) -> Result<Tensor> {
    let n = numel(shape);
    match device {
        Device::Cpu => Tensor::from_vec(device, shape, fill_ref(n, value)),
        Device::Gpu(gpu) => {
            if value.to_bits() == 0 {
                return Tensor::zeros(device, shape);
            }
            let out = gpu.alloc(4 * n as u64)?;
            let pipeline = gpu.pipeline(&FILL, "main", &[]);
            let params = Params {
                n: n as u32,
                value,
                _pad: [0; 2],
            };
            gpu.launch(&pipeline, &params, &[&out], grid_1d(n));
            Ok(Tensor::from_gpu(gpu, shape, DType::F32, out))
        }
    }
}
