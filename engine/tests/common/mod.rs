//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

pub mod algo;

use std::sync::OnceLock;

use murmur_engine::nn::GptConfig;
use murmur_engine::rng::Rng;
use murmur_engine::train::{LmConfig, WarmupCosine};
use murmur_engine::Device;

/// One GPU per test binary, shared by its tests (pipelines compile once).
pub fn gpu() -> Device {
    static GPU: OnceLock<Device> = OnceLock::new();
    GPU.get_or_init(|| match Device::gpu() {
        Ok(d) => d,
        Err(e) => panic!("GPU tests need an adapter: {e}\n(scripts/test.sh installs Mesa's lavapipe when none exists)"),
    })
    .clone()
}

/// True on adapters known to evaluate every kernel with the CPU reference's exact arithmetic
/// (no fused multiply-adds, IEEE division and square root): lavapipe. Tests then demand equal
/// bits, not closeness; see engine/src/kernels/math.rs.
pub fn exact_adapter() -> bool {
    gpu()
        .as_gpu()
        .is_some_and(|g| g.info().adapter.name.contains("llvmpipe"))
}

/// `n` values uniform in [-scale, scale).
pub fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform_in(-scale, scale)).collect()
}

/// Fails with the worst element when `got` and `want` differ by more than
/// `atol + rtol * |want|` anywhere.
/// On an [`exact_adapter`] the values must be equal bit for bit instead.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if exact_adapter() {
        if let Some(i) = (0..got.len()).find(|&i| {
            got[i].to_bits() != want[i].to_bits() && !(got[i].is_nan() && want[i].is_nan())
        }) {
            panic!("{what}: element {i}: got {} want {} (bits {:#x} vs {:#x}; lavapipe must match exactly)", got[i], want[i], got[i].to_bits(), want[i].to_bits());
        }
        return;
    }
    let mut worst: Option<(usize, f32)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        let bad = excess > 0.0 || g.is_nan() != w.is_nan();
        if bad && worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{what}: element {i}: got {} want {} (atol {atol}, rtol {rtol})",
            got[i], want[i]
        );
    }
}

/// What `load` reads, or `None` (with a visible notice) when the data has not been fetched.
/// Under CI (`CI` set) missing data is a failure, not a skip.
pub fn data_or_skip<T>(
    test: &str,
    what: &str,
    load: impl FnOnce() -> murmur_engine::Result<T>,
) -> Option<T> {
    match load() {
        Ok(data) => Some(data),
        Err(e) if std::env::var_os("CI").is_some() => panic!("{test} needs {what} under CI: {e}"),
        Err(e) => {
            eprintln!("NOTICE: skipping {test}: {e}");
            None
        }
    }
}

/// A dataset's train and test splits; see [`data_or_skip`].
pub fn dataset_or_skip(
    dataset: murmur_engine::data::ImageDataset,
    test: &str,
) -> Option<(murmur_engine::data::ImageSet, murmur_engine::data::ImageSet)> {
    use murmur_engine::data::{default_root, Split};
    let root = default_root();
    data_or_skip(test, dataset.name(), || {
        Ok((
            dataset.load(&root, Split::Train)?,
            dataset.load(&root, Split::Test)?,
        ))
    })
}

/// MNIST's splits; see [`dataset_or_skip`].
pub fn mnist_or_skip(
    test: &str,
) -> Option<(murmur_engine::data::ImageSet, murmur_engine::data::ImageSet)> {
    dataset_or_skip(murmur_engine::data::ImageDataset::Mnist, test)
}

/// Fails unless every element of every input of `f` passes the finite-difference check.
#[track_caller]
pub fn assert_gradcheck(
    name: &str,
    inputs: &[murmur_engine::Tensor],
    f: impl Fn(
        &murmur_engine::Graph,
        &[murmur_engine::Var],
    ) -> murmur_engine::Result<murmur_engine::Var>,
) {
    use murmur_engine::autograd::gradcheck::{gradcheck, GradcheckOptions};
    let report = gradcheck(inputs, f, GradcheckOptions::default()).unwrap();
    assert!(report.checked > 0);
    assert!(
        report.passed(),
        "{name}: {} (ratio {})",
        report.worst,
        report.worst_ratio
    );
}

/// A GPT small enough for any device in a test, with dropout, trained for `steps` steps of
/// 4 sequences.
pub fn tiny_gpt(steps: u64) -> LmConfig {
    LmConfig {
        model: GptConfig {
            context: 16,
            layers: 2,
            dim: 16,
            heads: 2,
            dropout: 0.1,
            ..GptConfig::default()
        },
        batch: 4,
        schedule: WarmupCosine {
            peak: 3e-3,
            warmup: 2,
            total: steps,
            min_ratio: 0.1,
        },
        ..LmConfig::new(steps)
    }
}
