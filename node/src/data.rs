//! What a node computes on and learns from: the device it opens and the image sets it loads.

use std::path::{Path, PathBuf};

use murmur_engine::data::{default_root, ImageDataset, ImageSet, Split};
use murmur_engine::Device;
use serde::{Deserialize, Serialize};

use crate::error::{NodeError, Result};

/// Where a node computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// The fastest here: a hardware GPU, else the CPU path (a software adapter such as
    /// lavapipe is slower than the CPU path at the same bits).
    #[default]
    Auto,
    /// The best GPU adapter, lavapipe included (where there is no GPU).
    Gpu,
    /// The CPU path: vectorised, multi-threaded kernels with the CPU references' bits
    /// (lavapipe's too).
    Cpu,
}

/// Picks `gpu`'s matmul kernels by measuring them (once per adapter, driver and version;
/// kept in murmur's cache folder) and says which, unless `MURMUR_MATMUL` names one.
pub fn tune_matmul(gpu: &murmur_engine::gpu::Gpu) -> Result<String> {
    use murmur_engine::kernels::{matmul_choice::MatmulKernel, matmul_tune};
    let said = match MatmulKernel::forced()? {
        Some(k) => format!(
            "{} for every product (MURMUR_MATMUL)",
            format!("{k:?}").to_lowercase()
        ),
        None => matmul_tune::tune(gpu, matmul_tune::cache_dir().as_deref())?.describe(),
    };
    tracing::info!("matmul kernels: {said}");
    Ok(said)
}

impl DeviceKind {
    /// Opens the device (logging what `Auto` chose and why).
    pub fn open(self) -> Result<Device> {
        let device = match self {
            DeviceKind::Cpu => Device::Cpu,
            DeviceKind::Gpu => Device::gpu()?,
            DeviceKind::Auto => {
                let (device, why) = Device::auto()?;
                tracing::info!("device auto: {why}");
                device
            }
        };
        if let Some(gpu) = device.as_gpu() {
            tune_matmul(gpu)?;
        }
        Ok(device)
    }

    /// Its name as a flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Auto => "auto",
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        }
    }
}

/// A dataset's splits, and where they were read from.
pub struct Sets {
    /// The training split (cut to the job's `train_limit`).
    pub train: ImageSet,
    /// The test split.
    pub test: ImageSet,
    /// Which dataset.
    pub dataset: ImageDataset,
    /// The folder they came from.
    pub root: PathBuf,
}

/// Loads a dataset's training split (the first `train_limit` examples, if given) and its test
/// split from `data` (default: `$MURMUR_DATA`, else `./data`).
pub fn load_sets(dataset: &str, data: Option<&Path>, train_limit: Option<usize>) -> Result<Sets> {
    let dataset: ImageDataset = dataset
        .parse()
        .map_err(|e: murmur_engine::Error| NodeError::Job(e.to_string()))?;
    let root = data.map_or_else(default_root, Path::to_path_buf);
    let mut train = dataset.load(&root, Split::Train)?;
    let test = dataset.load(&root, Split::Test)?;
    if let Some(n) = train_limit {
        train.truncate(n);
    }
    Ok(Sets {
        train,
        test,
        dataset,
        root,
    })
}
