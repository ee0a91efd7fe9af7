//! Which matmul kernel runs on an adapter, measured rather than guessed from the adapter
//! type: each kernel ([`MatmulKernel::ALL`]) is timed on one product per shape class, once
//! per adapter, driver and murmur version, and the choice is kept in a small JSON file
//! (`$MURMUR_CACHE_DIR`, else `$XDG_CACHE_HOME/murmur`, else `~/.cache/murmur`) so that
//! later runs on the same machine start at once. Every kernel gives the same bits
//! (engine/tests/kernels_gpu_vs_cpu.rs), so the choice changes the speed only.
//!
//! [`tune`] is what a node calls after opening its GPU; until a GPU is tuned (tests that
//! open one directly), [`MatmulKernel::for_gpu`] falls back to the adapter type's kernel.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::matmul::{matmul_gpu, MatmulDims, MatmulKernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

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

    /// The square side of the product the class is measured on.
    fn probe_side(self) -> usize {
        match self {
            ShapeClass::Small => 96,
            ShapeClass::Medium => 384,
            ShapeClass::Large => 768,
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

/// What the file is keyed by: the same adapter and driver under the same murmur.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CacheKey {
    adapter: String,
    vendor: u32,
    device: u32,
    backend: String,
    driver: String,
    driver_info: String,
    murmur: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheFile {
    key: CacheKey,
    choices: Vec<ClassChoice>,
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

/// This GPU's tuning, if [`tune`] ran for it.
pub fn tuning(gpu: &Gpu) -> Option<Arc<Tuning>> {
    let tuned = TUNED.lock().unwrap_or_else(|p| p.into_inner());
    tuned.as_ref()?.get(&gpu.id()).cloned()
}

/// The cache folder: `$MURMUR_CACHE_DIR`, `$XDG_CACHE_HOME/murmur` or `~/.cache/murmur`.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    env("MURMUR_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("murmur")))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache").join("murmur")))
}

/// Picks this GPU's kernels: read from the cache in `dir` when a file there matches the
/// adapter, driver and murmur version, else measured (a second or two on a software
/// adapter) and written there. Later products on `gpu` use the choice.
pub fn tune(gpu: &Gpu, dir: Option<&Path>) -> Result<Arc<Tuning>> {
    if let Some(t) = tuning(gpu) {
        return Ok(t);
    }
    let key = cache_key(gpu);
    let path = dir.map(|d| d.join(file_name(&key)));
    let cached = path.as_deref().and_then(|p| match read_cache(p, &key) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!("matmul kernel cache {}: {e}; measuring again", p.display());
            None
        }
    });
    let tuning = match (cached, &path) {
        (Some(choices), Some(p)) => Tuning {
            choices,
            source: Source::Cached(p.clone()),
        },
        _ => {
            let choices = measure(gpu)?;
            let written = path.filter(|p| match write_cache(p, &key, &choices) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("matmul kernel cache {}: not written: {e}", p.display());
                    false
                }
            });
            Tuning {
                choices,
                source: Source::Measured { cache: written },
            }
        }
    };
    let tuning = Arc::new(tuning);
    let mut tuned = TUNED.lock().unwrap_or_else(|p| p.into_inner());
    tuned
        .get_or_insert_with(HashMap::new)
        .insert(gpu.id(), tuning.clone());
    Ok(tuning)
}

fn cache_key(gpu: &Gpu) -> CacheKey {
    let a = &gpu.info().adapter;
    CacheKey {
        adapter: a.name.clone(),
        vendor: a.vendor,
        device: a.device,
        backend: format!("{:?}", a.backend),
        driver: a.driver.clone(),
        driver_info: a.driver_info.clone(),
        murmur: env!("CARGO_PKG_VERSION").into(),
    }
}

/// A file per key: its hash in the name, the key itself inside (checked on reading).
fn file_name(key: &CacheKey) -> String {
    let text = serde_json::to_string(key).expect("plain data");
    format!(
        "matmul-kernels-{:016x}.json",
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    )
}

/// The largest cache file read; a real one is a few hundred bytes.
const MAX_CACHE_BYTES: u64 = 64 << 10;

/// The file's choices when it is for `key` and whole; `Ok(None)` when there is none or it
/// is for another adapter, driver or version; an error when it is damaged.
fn read_cache(path: &Path, key: &CacheKey) -> Result<Option<Vec<ClassChoice>>> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Data(e.to_string())),
    };
    let mut text = String::new();
    file.take(MAX_CACHE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::Data(e.to_string()))?;
    if text.len() as u64 > MAX_CACHE_BYTES {
        return Err(Error::Data(format!("larger than {MAX_CACHE_BYTES} bytes")));
    }
    let file: CacheFile = serde_json::from_str(&text).map_err(|e| Error::Data(e.to_string()))?;
    if file.key != *key {
        return Ok(None);
    }
    let whole = ShapeClass::ALL
        .iter()
        .all(|c| file.choices.iter().filter(|x| x.class == *c).count() == 1);
    if !whole {
        return Err(Error::Data("not one choice per shape class".into()));
    }
    Ok(Some(file.choices))
}

fn write_cache(path: &Path, key: &CacheKey, choices: &[ClassChoice]) -> std::io::Result<()> {
    let dir = path.parent().expect("a file in a folder");
    std::fs::create_dir_all(dir)?;
    let text = serde_json::to_string_pretty(&CacheFile {
        key: key.clone(),
        choices: choices.to_vec(),
    })
    .expect("plain data");
    // Written aside and renamed, so that a reader never sees half a file.
    let tmp = dir.join(format!(
        ".{}.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("cache"),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Times every kernel on each class's probe: the best of three after a warm-up.
fn measure(gpu: &Gpu) -> Result<Vec<ClassChoice>> {
    let mut choices = Vec::new();
    for class in ShapeClass::ALL {
        let n = class.probe_side();
        let d = MatmulDims::square(n);
        let values: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
        let a = gpu.upload(bytemuck::cast_slice(&values))?;
        let b = gpu.upload(bytemuck::cast_slice(&values))?;
        let mut seconds = Vec::new();
        for kernel in MatmulKernel::ALL {
            matmul_gpu(gpu, &a, &b, &d, kernel)?;
            gpu.sync()?;
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let t = Instant::now();
                matmul_gpu(gpu, &a, &b, &d, kernel)?;
                gpu.sync()?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            seconds.push(best);
        }
        gpu.check()?;
        let fastest = (0..seconds.len())
            .min_by(|&i, &j| seconds[i].total_cmp(&seconds[j]))
            .expect("kernels");
        choices.push(ClassChoice {
            class,
            kernel: MatmulKernel::ALL[fastest],
            seconds,
        });
    }
    Ok(choices)
}
