//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::OnceLock;

use murmur_engine::rng::Rng;
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

/// `n` values uniform in [-scale, scale).
pub fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform_in(-scale, scale)).collect()
}

/// Fails with the worst element when `got` and `want` differ by more than
/// `atol + rtol * |want|` anywhere.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
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
