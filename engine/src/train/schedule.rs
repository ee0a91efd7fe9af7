//! Learning-rate schedules and gradient clipping.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kernels::binary::{binary, Binary};
use crate::tensor::Tensor;

/// Linear warm-up from 0 to `peak` over `warmup` steps, then cosine decay to
/// `peak * min_ratio` at `total` steps (held there after).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WarmupCosine {
    /// Largest learning rate, reached at the end of the warm-up.
    pub peak: f32,
    /// Steps of linear warm-up.
    pub warmup: u64,
    /// Step at which the decay ends.
    pub total: u64,
    /// Final learning rate as a fraction of `peak`.
    pub min_ratio: f32,
}

impl WarmupCosine {
    /// The learning rate of step `step` (counting from 0).
    pub fn lr(&self, step: u64) -> f32 {
        if step < self.warmup {
            return self.peak * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.peak * (self.min_ratio as f64 + (1.0 - self.min_ratio as f64) * cosine) as f32
    }
}

/// Scales `grads` in place so that their global L2 norm is at most `max_norm`, and returns
/// the norm before clipping as a one-element tensor. Everything stays on the device: no
/// wait for the GPU.
pub fn clip_global_norm(grads: &mut [Tensor], max_norm: f32) -> Result<Tensor> {
    if max_norm.is_nan() || max_norm <= 0.0 {
        return Err(Error::Config(format!(
            "clip norm {max_norm} must be positive"
        )));
    }
    let Some(first) = grads.first() else {
        return Err(Error::Config("no gradients to clip".into()));
    };
    let device = first.device().clone();
    let mut total = Tensor::scalar(&device, 0.0)?;
    for g in grads.iter() {
        total = total.add(&g.mul(g)?.sum_all()?)?;
    }
    let norm = total.sqrt()?;
    // factor = min(1, max_norm / (norm + 1e-6))
    let factor = Tensor::scalar(&device, max_norm)?.div(&norm.affine(1.0, 1e-6)?)?;
    let factor = binary(&factor, &Tensor::scalar(&device, 1.0)?, Binary::Min)?;
    for g in grads.iter_mut() {
        *g = g.mul(&factor)?;
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Device;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let s = WarmupCosine {
            peak: 1.0,
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert_eq!(s.lr(0), 0.1);
        assert_eq!(s.lr(9), 1.0);
        assert_eq!(s.lr(10), 1.0);
        assert!((s.lr(60) - 0.55).abs() < 1e-6, "{}", s.lr(60));
        assert!((s.lr(110) - 0.1).abs() < 1e-6);
        assert!((s.lr(500) - 0.1).abs() < 1e-6);
        assert!((11..110).all(|i| s.lr(i) < s.lr(i - 1)));
    }

    #[test]
    fn clipping_scales_only_norms_above_the_limit() {
        let d = Device::Cpu;
        let mut g = vec![
            Tensor::from_vec(&d, &[2], vec![3.0, 0.0]).unwrap(),
            Tensor::from_vec(&d, &[1], vec![4.0]).unwrap(),
        ];
        let norm = clip_global_norm(&mut g, 1.0).unwrap();
        assert_eq!(norm.item().unwrap(), 5.0);
        let after: Vec<f32> = g.iter().flat_map(|t| t.to_vec().unwrap()).collect();
        let n2: f32 = after.iter().map(|v| v * v).sum();
        assert!((n2.sqrt() - 1.0).abs() < 1e-5, "{after:?}");
        let mut g = vec![Tensor::from_vec(&d, &[2], vec![0.3, 0.4]).unwrap()];
        clip_global_norm(&mut g, 1.0).unwrap();
        assert_eq!(g[0].to_vec().unwrap(), [0.3, 0.4]);
        assert!(clip_global_norm(&mut g, 0.0).is_err());
    }
}
