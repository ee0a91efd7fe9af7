//! Where a tensor's data lives.

use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::gpu::Gpu;

/// The CPU or a GPU (WGSL kernels).
#[derive(Clone)]
pub enum Device {
    /// The host: the CPU path (`crate::cpu`), giving the CPU references' bits.
    Cpu,
    /// A GPU, running the WGSL kernels.
    Gpu(Arc<Gpu>),
}

impl Device {
    /// Opens the GPU chosen by `MURMUR_ADAPTER` / `MURMUR_BACKEND`, or the best one found.
    pub fn gpu() -> Result<Device> {
        Ok(Device::Gpu(Gpu::new()?))
    }

    /// The fastest device on this machine: the selected GPU adapter, or the CPU path where
    /// the adapter is a software one or there is none (see
    /// [`Gpu::open_if_faster_than_cpu`]). The second value says what was chosen and why.
    pub fn auto() -> Result<(Device, String)> {
        Ok(match Gpu::open_if_faster_than_cpu()? {
            Ok(gpu) => {
                let why = format!("gpu {}: a hardware adapter", gpu.describe());
                (Device::Gpu(gpu), why)
            }
            Err(reason) => (
                Device::Cpu,
                format!("cpu ({}): {reason}", crate::cpu::gemm::describe()),
            ),
        })
    }

    /// Whether this is a GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Gpu(_))
    }

    /// The GPU, when this is one.
    pub fn as_gpu(&self) -> Option<&Arc<Gpu>> {
        match self {
            Device::Gpu(g) => Some(g),
            Device::Cpu => None,
        }
    }

    /// Same device (the same opened GPU, not merely the same adapter).
    pub fn same(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Gpu(a), Device::Gpu(b)) => a.id() == b.id(),
            _ => false,
        }
    }

    /// Submits recorded GPU work and waits for it; a no-op on the CPU.
    pub fn sync(&self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Gpu(g) => g.sync(),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(g) => write!(f, "gpu {}", g.describe()),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
