//! Which GPU kernel computes a product: the kernels, the shape classes a choice is made per,
//! and the choices GPUs were tuned to ([`super::matmul_tune`] measures and registers them).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::matmul_dims::MatmulDims;
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Which GPU kernel computes a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulKernel {
    /// Shared-memory tiled kernel, any layout (GPUs).
    Tiled,
    /// Row-broadcast kernel over padded row-major operands (CPU adapters).
    Rows,
}

impl MatmulKernel {
    /// Every kernel.
    pub const ALL: [MatmulKernel; 2] = [MatmulKernel::Rows, MatmulKernel::Tiled];

    /// The kernel `MURMUR_MATMUL` forces on every product, if it names one.
    pub fn forced() -> Result<Option<Self>> {
        match std::env::var("MURMUR_MATMUL").ok().as_deref() {
            None | Some("") => Ok(None),
            Some("tiled") => Ok(Some(MatmulKernel::Tiled)),
            Some("rows") => Ok(Some(MatmulKernel::Rows)),
            Some(other) => Err(Error::Config(format!(
                "MURMUR_MATMUL={other}: use tiled or rows"
            ))),
        }
    }

    /// The kernel for a product of `dims` on this GPU: [`Self::forced`] if set, else the
    /// tuned choice for the product's shape class, else by adapter type.
    pub fn for_gpu(gpu: &Gpu, dims: &MatmulDims) -> Result<Self> {
        Ok(Self::forced()?.unwrap_or_else(|| {
            tuning(gpu)
                .and_then(|t| t.kernel(ShapeClass::of(dims)))
                .unwrap_or_else(|| Self::by_adapter_type(gpu))
        }))
    }

    /// The guess before measuring: rows on a software adapter, tiled on a GPU.
    pub fn by_adapter_type(gpu: &Gpu) -> Self {
        if gpu.info().adapter.device_type == wgpu::DeviceType::Cpu {
            MatmulKernel::Rows
        } else {
            MatmulKernel::Tiled
        }
    }
}

/// Products grouped by their work (m·n·k per batch entry): each class gets its own kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShapeClass {
    /// Up to 128³ multiply-adds (small layers, attention heads).
    Small,
    /// Up to 512³.
    Medium,
    /// Beyond.
    Large,
}

impl ShapeClass {
    /// Every class, smallest first.
    pub const ALL: [ShapeClass; 3] = [ShapeClass::Small, ShapeClass::Medium, ShapeClass::Large];

    /// The class of a product.
    pub fn of(d: &MatmulDims) -> ShapeClass {
        let work = (d.m as u128) * (d.n as u128) * (d.k as u128);
        if work <= 128u128.pow(3) {
            ShapeClass::Small
        } else if work <= 512u128.pow(3) {
            ShapeClass::Medium
        } else {
            ShapeClass::Large
        }
    }
}

/// One class's measurement and the kernel it chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassChoice {
    /// The class.
    pub class: ShapeClass,
    /// The fastest kernel on its probe.
    pub kernel: MatmulKernel,
    /// Seconds per probe product of each kernel, in [`MatmulKernel::ALL`]'s order.
    pub seconds: Vec<f64>,
}

/// Where a GPU's choice came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Measured now (and written to the cache when the path is given).
    Measured {
        /// The file written, if it could be.
        cache: Option<PathBuf>,
    },
    /// Read from the cache.
    Cached(PathBuf),
}

/// A tuned GPU's kernels.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// One choice per class.
    pub choices: Vec<ClassChoice>,
    /// Measured or read back.
    pub source: Source,
}

impl Tuning {
    /// The kernel for a class.
    pub fn kernel(&self, class: ShapeClass) -> Option<MatmulKernel> {
        self.choices
            .iter()
            .find(|c| c.class == class)
            .map(|c| c.kernel)
    }

    /// One line for logs and `murmur info`.
    pub fn describe(&self) -> String {
        let kernels: Vec<String> = self
            .choices
            .iter()
            .map(|c| format!("{:?} {:?}", c.class, c.kernel).to_lowercase())
            .collect();
        let from = match &self.source {
            Source::Measured { cache: Some(p) } => format!("measured now, kept in {}", p.display()),
            Source::Measured { cache: None } => "measured now (no cache could be written)".into(),
            Source::Cached(p) => format!("measured before, read from {}", p.display()),
        };
        format!("{} ({from})", kernels.join(", "))
    }
}

/// Tuned GPUs by [`Gpu::id`].
static TUNED: Mutex<Option<HashMap<u64, Arc<Tuning>>>> = Mutex::new(None);

/// Keeps `tuning` as `gpu`'s choice for the products that follow.
pub fn register(gpu: &Gpu, tuning: Arc<Tuning>) {
    let mut tuned = TUNED.lock().unwrap_or_else(|p| p.into_inner());
    tuned
        .get_or_insert_with(HashMap::new)
        .insert(gpu.id(), tuning);
}

/// This GPU's tuning, if [`super::matmul_tune::tune`] ran for it.
pub fn tuning(gpu: &Gpu) -> Option<Arc<Tuning>> {
    let tuned = TUNED.lock().unwrap_or_else(|p| p.into_inner());
    tuned.as_ref()?.get(&gpu.id()).cloned()
}
