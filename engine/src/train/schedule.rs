//! Learning-rate schedules and gradient clipping.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use rayon::prelude::*;

use crate::kernels::binary::{binary, Binary};
use crate::kernels::reduce::{reduce_ref, Reduce};
use crate::tensor::{Device, Tensor};

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
    let on_cpu: Option<Vec<&[f32]>> = grads.iter().map(|g| g.cpu_f32()).collect();
    let cpu = on_cpu.is_some();
    let total = match on_cpu {
        Some(values) => Tensor::scalar(&device, cpu_sum_of_squares(&values))?,
        None => {
            let mut total = Tensor::scalar(&device, 0.0)?;
            for g in grads.iter() {
                total = total.add(&g.mul(g)?.sum_all()?)?;
            }
            total
        }
    };
    let norm = total.sqrt()?;
    // factor = min(1, max_norm / (norm + 1e-6))
    let factor = Tensor::scalar(&device, max_norm)?.div(&norm.affine(1.0, 1e-6)?)?;
    let factor = binary(&factor, &Tensor::scalar(&device, 1.0)?, Binary::Min)?;
    if cpu {
        cpu_scale(grads, factor.item()?)?;
    } else {
        for g in grads.iter_mut() {
            *g = g.mul(&factor)?;
        }
    }
    Ok(norm)
}

/// What the device loop sums, `sum(g * g)` per tensor and those sums in order, with its
/// bits: the squares as the multiply kernel rounds them, each tensor's sum in `sum_all`'s
/// order, the tensors' sums added one by one. In one parallel pass over the tensors, where
/// the loop ran four kernels a tensor: 1.46 ms a step of the GPT's 1.9 ms update on the
/// 2-core Xeon (throwaway timer), nearly all of it the kernels' start and allocations.
fn cpu_sum_of_squares(grads: &[&[f32]]) -> f32 {
    let sums: Vec<f32> = grads
        .par_iter()
        .map(|g| {
            let squares: Vec<f32> = g.iter().map(|&v| Binary::Mul.apply(v, v)).collect();
            reduce_ref(&squares, 1, squares.len(), 1, Reduce::Sum, 1.0)[0]
        })
        .collect();
    sums.into_iter()
        .fold(0.0, |total, s| Binary::Add.apply(total, s))
}

/// `g * factor` for every gradient on the CPU (the multiply kernel's arithmetic), in one
/// parallel pass over the tensors.
fn cpu_scale(grads: &mut [Tensor], factor: f32) -> Result<()> {
    let scaled: Vec<Vec<f32>> = grads
        .par_iter()
        .map(|g| {
            let values = g.cpu_f32().expect("a CPU gradient");
            values
                .iter()
                .map(|&v| Binary::Mul.apply(v, factor))
                .collect()
        })
        .collect();
    for (g, values) in grads.iter_mut().zip(scaled) {
        *g = Tensor::from_vec(&Device::Cpu, g.shape(), values)?;
    }
    Ok(())
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

    #[test]
    fn the_cpu_pass_gives_the_kernels_bits() {
        // Tensors summed in each of `sum_all`'s plans (one invocation, one workgroup, two
        // passes), values whose sums depend on the order, clipped and not.
        let d = Device::Cpu;
        let grads: Vec<Tensor> = [1usize, 200, 257, 4099, 70_001]
            .iter()
            .enumerate()
            .map(|(t, &n)| {
                let values = (0..n)
                    .map(|i| ((i * 7919 + t * 31) % 2003) as f32 * 1e-3 - 1.0)
                    .map(|v| if v.abs() < 0.01 { v * 1e6 } else { v })
                    .collect();
                Tensor::from_vec(&d, &[n], values).unwrap()
            })
            .collect();
        for max_norm in [1.0, 1e9] {
            let (mut want, mut got) = (grads.clone(), grads.clone());
            // The definition, kernel by kernel.
            let mut total = Tensor::scalar(&d, 0.0).unwrap();
            for g in &want {
                total = total.add(&g.mul(g).unwrap().sum_all().unwrap()).unwrap();
            }
            let norm = total.sqrt().unwrap();
            let factor = Tensor::scalar(&d, max_norm)
                .unwrap()
                .div(&norm.affine(1.0, 1e-6).unwrap())
                .unwrap();
            let factor = binary(&factor, &Tensor::scalar(&d, 1.0).unwrap(), Binary::Min).unwrap();
            for g in want.iter_mut() {
                *g = g.mul(&factor).unwrap();
            }
            let got_norm = clip_global_norm(&mut got, max_norm).unwrap();
            let bits = |t: &Tensor| {
                t.to_vec()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&got_norm), bits(&norm), "norm, max {max_norm}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.shape(), w.shape());
                assert_eq!(
                    bits(g),
                    bits(w),
                    "gradient of {:?}, max {max_norm}",
                    w.shape()
                );
            }
        }
    }
}
