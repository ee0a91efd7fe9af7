//! Which matmul kernel runs on an adapter, measured rather than guessed from the adapter
//! type: each kernel ([`MatmulKernel::ALL`]) is timed on one product per shape class, once
//! per adapter, driver and murmur version, and the choice is kept in a small JSON file
//! (`$MURMUR_CACHE_DIR`, else `$XDG_CACHE_HOME/murmur`, else `~/.cache/murmur`) so that
//! later runs on the same machine start at once. Every kernel gives the same bits
//! (engine/tests/kernels_gpu_vs_cpu.rs), so the choice changes the speed only.
//!
//! [`tune`] is what a node calls after opening its GPU; it registers the choice with
//! [`super::matmul_choice`]. Until a GPU is tuned (tests that
//! open one directly), [`MatmulKernel::for_gpu`] falls back to the adapter type's kernel.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::matmul::{matmul_gpu, MatmulDims};
use super::matmul_choice::{
    register, tuning, ClassChoice, MatmulKernel, ShapeClass, Source, Tuning,
};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

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

/// The square side of the product a class is measured on.
fn probe_side(class: ShapeClass) -> usize {
    match class {
        ShapeClass::Small => 96,
        ShapeClass::Medium => 384,
        ShapeClass::Large => 768,
    }
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
    register(gpu, tuning.clone());
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
        let n = probe_side(class);
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
