//! The update the error-feedback family ends with, once the averaged gradient `u` is back from
//! the servers: plain SGD (liec-sgd.md), Nesterov momentum (byteps-clan.md's NAG suite), AdamW
//! (loco.md) or LANS (byteps-clan.md Algorithm 2, CLAN's optimizer). Every worker applies it
//! to the same bytes on flat host vectors in a fixed order, so replicas stay bit-identical.
//!
//! The algorithms (`crate::algo`, which re-exports these as `algo::optimizer`), the servers
//! that own their key's parameters (`crate::comm::owner`) and pipeline stages all step it, so it
//! lives here, below all of them.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::kernels::optim::{adamw_ref, sgd_ref, AdamWStep, SgdStep};

/// The step's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// Global iteration t (never reset at epoch ends).
    pub step: u64,
    /// η_t.
    pub lr: f32,
    /// λ, applied locally and uncompressed except where an algorithm says otherwise.
    pub weight_decay: f32,
}

/// The local SGD step every method ends with: `x ← x − η(u + λx)`.
pub(crate) fn sgd_step(x: &mut [f32], u: &[f32], hyper: Hyper) {
    let (lr, wd) = (hyper.lr, hyper.weight_decay);
    x.iter_mut()
        .zip(u)
        .for_each(|(x, u)| *x -= lr * (u + wd * *x));
}

/// Which update, with its constants (the learning rate and weight decay come per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerSpec {
    /// `x ← x − η(u + λx)`.
    Sgd,
    /// torch.optim.SGD with Nesterov momentum μ, weight decay added to the gradient.
    Nag {
        /// The momentum μ, in [0, 1).
        momentum: f32,
    },
    /// Momentum in the moving-average form of clapping.md eq. (3): `u ← (1−m)u + m(g + λx)`,
    /// `x ← x − η u`, with `u` starting at zero and no bias correction (so the first step
    /// moves by `η m g`). PyTorch's momentum μ with learning rate `lr` is `m = 1 − μ`,
    /// `η = lr / m`.
    Ema {
        /// The weight `m` of the new gradient, in (0, 1].
        m: f32,
    },
    /// Adam as clapping.md eq. (107) writes it (Algorithm 5): `β1` and `β2` weigh the *new*
    /// gradient, ε sits inside the square root, no bias correction, no weight decay:
    /// `u ← (1−β1)u + β1 g`, `s ← (1−β2)s + β2 g²`, `x ← x − η u / √(s + ε)`.
    AdamPaper {
        /// Weight of the new gradient in the first moment (the paper's β1, PyTorch's 1 − β1).
        beta1: f32,
        /// Weight of the new squared gradient in the second moment (PyTorch's 1 − β2).
        beta2: f32,
        /// Added to the second moment inside the square root.
        eps: f32,
    },
    /// torch.optim.AdamW (decoupled weight decay, bias correction).
    AdamW {
        /// Decay of the first-moment estimate.
        beta1: f32,
        /// Decay of the second-moment estimate.
        beta2: f32,
        /// Added to the denominator outside the square root.
        eps: f32,
    },
    /// LANS without gradient normalization, φ = identity, ε outside the square root
    /// (byteps-clan.md §3.3 and §9.1); the block norms are per parameter tensor.
    Lans {
        /// Decay of the first-moment estimate.
        beta1: f32,
        /// Decay of the second-moment estimate.
        beta2: f32,
        /// Added to the denominator outside the square root.
        eps: f32,
    },
}

impl OptimizerSpec {
    /// Nesterov momentum 0.9, the usual choice for SGD on image models.
    pub const NAG: OptimizerSpec = OptimizerSpec::Nag { momentum: 0.9 };
    /// AdamW with PyTorch's default constants.
    pub const ADAMW: OptimizerSpec = OptimizerSpec::AdamW {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    /// Eq. (107) with PyTorch's default constants mapped to the paper's convention.
    pub const ADAM_PAPER: OptimizerSpec = OptimizerSpec::AdamPaper {
        beta1: 0.1,
        beta2: 0.001,
        eps: 1e-8,
    };
    /// LANS with the constants of byteps-clan.md (ε = 1e-6).
    pub const LANS: OptimizerSpec = OptimizerSpec::Lans {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
    };

    /// The optimizer's state for a model whose tensors have `sizes` elements.
    pub fn build(self, sizes: &[usize]) -> HostOptimizer {
        HostOptimizer {
            spec: self,
            sizes: sizes.to_vec(),
            m: Vec::new(),
            v: Vec::new(),
        }
    }
}

impl fmt::Display for OptimizerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OptimizerSpec::Sgd => write!(f, "sgd"),
            OptimizerSpec::Nag { momentum } => write!(f, "nag:{momentum}"),
            OptimizerSpec::Ema { m } => write!(f, "ema:{m}"),
            OptimizerSpec::AdamPaper { .. } => write!(f, "adam-paper"),
            OptimizerSpec::AdamW { .. } => write!(f, "adamw"),
            OptimizerSpec::Lans { .. } => write!(f, "lans"),
        }
    }
}

impl FromStr for OptimizerSpec {
    type Err = Error;

    /// `sgd`, `nag[:momentum]`, `ema:m`, `adamw` or `lans` (constants as byteps-clan.md §8
    /// and PyTorch).
    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "optimizer {text:?}: use sgd, nag[:momentum] (default 0.9), ema:<m in (0, 1]>, \
                 adamw, adam-paper or lans"
            ))
        };
        match text.split_once(':') {
            None => match text {
                "sgd" => Ok(OptimizerSpec::Sgd),
                "nag" => Ok(OptimizerSpec::NAG),
                "adamw" => Ok(OptimizerSpec::ADAMW),
                "adam-paper" => Ok(OptimizerSpec::ADAM_PAPER),
                "lans" => Ok(OptimizerSpec::LANS),
                _ => Err(bad()),
            },
            Some(("nag", m)) => match m.parse::<f32>() {
                Ok(momentum) if (0.0..1.0).contains(&momentum) => {
                    Ok(OptimizerSpec::Nag { momentum })
                }
                _ => Err(bad()),
            },
            Some(("ema", m)) => match m.parse::<f32>() {
                Ok(m) if m > 0.0 && m <= 1.0 => Ok(OptimizerSpec::Ema { m }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// An optimizer's state over one flat model.
pub struct HostOptimizer {
    spec: OptimizerSpec,
    /// Element counts of the parameter tensors (LANS's blocks).
    sizes: Vec<usize>,
    /// Momentum buffer (NAG) or first moment (AdamW, LANS); empty before the first step.
    m: Vec<f32>,
    /// Second moment (AdamW, LANS).
    v: Vec<f32>,
}

impl HostOptimizer {
    /// The update and constants this optimizer runs.
    pub fn spec(&self) -> OptimizerSpec {
        self.spec
    }

    /// Elements of the model the optimizer steps.
    pub fn moments_len(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// The moments: momentum or first moment, and second moment (each empty before the
    /// first step, and the second where the update keeps none).
    pub fn moments(&self) -> (&[f32], &[f32]) {
        (&self.m, &self.v)
    }

    /// Takes back moments from [`HostOptimizer::moments`] of the same optimizer over the same
    /// sizes; lengths that another optimizer or model would have are an error.
    pub fn set_moments(&mut self, m: Vec<f32>, v: Vec<f32>) -> Result<()> {
        let n: usize = self.sizes.iter().sum();
        let second = matches!(
            self.spec,
            OptimizerSpec::AdamW { .. }
                | OptimizerSpec::Lans { .. }
                | OptimizerSpec::AdamPaper { .. }
        );
        let fits = match (m.len(), v.len()) {
            (0, 0) => true,
            (a, 0) => a == n && !second,
            (a, b) => a == n && b == n && second,
        };
        if !fits {
            return Err(Error::Data(format!(
                "saved moments of {} and {} elements do not fit {} over {n} elements",
                m.len(),
                v.len(),
                self.spec
            )));
        }
        (self.m, self.v) = (m, v);
        Ok(())
    }

    /// Applies the averaged gradient `u` to `x` at step `hyper.step` (counting from 0).
    pub fn step(&mut self, x: &mut [f32], u: &[f32], hyper: Hyper) -> Result<()> {
        if u.len() != x.len() || self.sizes.iter().sum::<usize>() != x.len() {
            return Err(Error::Shape {
                op: "optimizer",
                detail: format!(
                    "model of {} elements in tensors of {:?}, update of {}",
                    x.len(),
                    self.sizes,
                    u.len()
                ),
            });
        }
        let first = self.m.is_empty();
        if first {
            self.m = vec![0.0; x.len()];
            if matches!(
                self.spec,
                OptimizerSpec::AdamW { .. }
                    | OptimizerSpec::Lans { .. }
                    | OptimizerSpec::AdamPaper { .. }
            ) {
                self.v = vec![0.0; x.len()];
            }
        }
        match self.spec {
            OptimizerSpec::Sgd => sgd_step(x, u, hyper),
            OptimizerSpec::Nag { momentum } => {
                let step = SgdStep {
                    lr: hyper.lr,
                    momentum,
                    dampening: 0.0,
                    weight_decay: hyper.weight_decay,
                    nesterov: true,
                    first,
                };
                sgd_ref(x, u, &mut self.m, &step);
            }
            OptimizerSpec::Ema { m } => ema_momentum_step(x, u, &mut self.m, m, hyper),
            OptimizerSpec::AdamPaper { beta1, beta2, eps } => {
                for i in 0..x.len() {
                    let g = u[i];
                    self.m[i] = (1.0 - beta1) * self.m[i] + beta1 * g;
                    self.v[i] = (1.0 - beta2) * self.v[i] + beta2 * g * g;
                    x[i] -= hyper.lr * self.m[i] / (self.v[i] + eps).sqrt();
                }
            }
            OptimizerSpec::AdamW { beta1, beta2, eps }
            | OptimizerSpec::Lans { beta1, beta2, eps } => {
                let constants = AdamWStep {
                    lr: hyper.lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay: hyper.weight_decay,
                    step: hyper.step + 1,
                };
                if let OptimizerSpec::AdamW { .. } = self.spec {
                    adamw_ref(x, u, &mut self.m, &mut self.v, &constants);
                    return Ok(());
                }
                let mut offset = 0;
                for &n in &self.sizes {
                    let r = offset..offset + n;
                    lans_block(
                        &mut x[r.clone()],
                        &u[r.clone()],
                        &mut self.m[r.clone()],
                        &mut self.v[r],
                        &constants,
                    );
                    offset += n;
                }
            }
        }
        Ok(())
    }
}

/// One step of clapping.md eq. (3), the moving-average momentum (weight decay added to the
/// gradient, as torch.optim.SGD does).
fn ema_momentum_step(x: &mut [f32], g: &[f32], u: &mut [f32], m: f32, hyper: Hyper) {
    for ((x, &g), u) in x.iter_mut().zip(g).zip(u) {
        let g = g + hyper.weight_decay * *x;
        *u = (1.0 - m) * *u + m * g;
        *x -= hyper.lr * *u;
    }
}

/// LANS on one block (one parameter tensor), byteps-clan.md Algorithm 2, with Adam's
/// constants (`step` counts from 1):
///
/// ```text
/// m = β1 m + (1−β1) g ;  v = β2 v + (1−β2) g²
/// r = m̂ / (√v̂ + ε) ;  c = g / (√v̂ + ε)          (m̂, v̂ bias-corrected)
/// x −= η |x| [ β1 (r+λx)/|r+λx| + (1−β1) (c+λx)/|c+λx| ]
/// ```
///
/// Both terms use the pre-update `x`. A trust ratio `|x| / |·|` whose numerator or
/// denominator is zero counts as 1, so zero-initialised biases move (§3.3).
pub fn lans_block(x: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWStep) {
    let t = s.step.min(i32::MAX as u64) as i32;
    let bc1 = (1.0 - (s.beta1 as f64).powi(t)) as f32;
    let bc2 = (1.0 - (s.beta2 as f64).powi(t)) as f32;
    // r + λx and c + λx of element i, from the updated moments and the pre-update x; the
    // norms need all of them before any x moves, so they are computed twice instead of stored.
    let directions = |i: usize, m: &[f32], v: &[f32], x: &[f32]| {
        let denom = (v[i] / bc2).sqrt() + s.eps;
        (
            (m[i] / bc1) / denom + s.weight_decay * x[i],
            g[i] / denom + s.weight_decay * x[i],
        )
    };
    let (mut x_sq, mut r_sq, mut c_sq) = (0f64, 0f64, 0f64);
    for i in 0..x.len() {
        m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * g[i];
        v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * g[i] * g[i];
        let (r, c) = directions(i, m, v, x);
        x_sq += (x[i] as f64).powi(2);
        r_sq += (r as f64).powi(2);
        c_sq += (c as f64).powi(2);
    }
    let ratio = |update_sq: f64| {
        if x_sq > 0.0 && update_sq > 0.0 {
            (x_sq.sqrt() / update_sq.sqrt()) as f32
        } else {
            1.0
        }
    };
    let (a, b) = (s.beta1 * ratio(r_sq), (1.0 - s.beta1) * ratio(c_sq));
    for i in 0..x.len() {
        let (r, c) = directions(i, m, v, x);
        x[i] -= s.lr * (a * r + b * c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyper(step: u64) -> Hyper {
        Hyper {
            step,
            lr: 0.1,
            weight_decay: 0.01,
        }
    }

    #[test]
    fn moving_average_momentum_starts_at_m_times_the_gradient() {
        // clapping.md invariant 11: u(1) = m g with no bias correction; m = 1 is plain SGD.
        let mut opt = OptimizerSpec::Ema { m: 0.25 }.build(&[2]);
        let mut x = vec![1.0f32, -2.0];
        let g = [0.5f32, 4.0];
        let h = Hyper {
            step: 0,
            lr: 0.5,
            weight_decay: 0.0,
        };
        opt.step(&mut x, &g, h).unwrap();
        assert_eq!(x, [1.0 - 0.5 * 0.125, -2.0 - 0.5 * 1.0]);
        opt.step(&mut x, &g, h).unwrap();
        // u(2) = 0.75 u(1) + 0.25 g = 0.4375 g
        assert_eq!(x, [1.0 - 0.5 * 0.125 - 0.5 * 0.21875, -2.5 - 0.5 * 1.75]);
        // Eq. (107) with β1 = β2 = 1 steps by g / √(g² + ε) (invariant 11).
        let mut adam = OptimizerSpec::AdamPaper {
            beta1: 1.0,
            beta2: 1.0,
            eps: 1e-3,
        }
        .build(&[2]);
        let mut y = vec![0.0f32, 0.0];
        adam.step(&mut y, &g, h).unwrap();
        assert_eq!(
            y,
            [
                -0.5 * 0.5 / (0.25f32 + 1e-3).sqrt(),
                -0.5 * 4.0 / (16.0f32 + 1e-3).sqrt()
            ]
        );
        let mut sgd = OptimizerSpec::Ema { m: 1.0 }.build(&[2]);
        let mut plain = OptimizerSpec::Sgd.build(&[2]);
        let (mut a, mut b) = (vec![0.3f32, 0.7], vec![0.3f32, 0.7]);
        for step in 0..3 {
            let h = hyper(step);
            sgd.step(&mut a, &g, h).unwrap();
            plain.step(&mut b, &g, h).unwrap();
        }
        assert_eq!(a, b);
    }

    #[test]
    fn names_round_trip_and_bad_ones_explain() {
        for o in [
            OptimizerSpec::Sgd,
            OptimizerSpec::NAG,
            OptimizerSpec::Nag { momentum: 0.5 },
            OptimizerSpec::Ema { m: 0.1 },
        ] {
            assert_eq!(o.to_string().parse::<OptimizerSpec>().unwrap(), o);
        }
        assert_eq!(
            "adamw".parse::<OptimizerSpec>().unwrap(),
            OptimizerSpec::ADAMW
        );
        assert_eq!(
            "lans".parse::<OptimizerSpec>().unwrap(),
            OptimizerSpec::LANS
        );
        for bad in [
            "", "adam", "nag:1.5", "nag:x", "lans:3", "ema", "ema:0", "ema:1.5",
        ] {
            assert!(bad.parse::<OptimizerSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn lans_moves_each_tensor_by_lr_times_its_norm_and_zero_tensors_by_the_raw_step() {
        // Two tensors: a nonzero weight and a zero bias.
        let mut opt = OptimizerSpec::LANS.build(&[3, 2]);
        let mut x = vec![1.0f32, -2.0, 2.0, 0.0, 0.0];
        let before = x.clone();
        let g = vec![0.5f32, 0.1, -0.3, 0.2, -0.4];
        let h = Hyper {
            step: 0,
            lr: 0.01,
            weight_decay: 0.0,
        };
        opt.step(&mut x, &g, h).unwrap();
        // At t = 1, m̂ = g and v̂ = g², so r = c = sign(g) (up to ε): both unit directions
        // agree and the step is exactly lr·|x| along −sign(g)/|sign(g)|.
        let moved: f64 = (0..3)
            .map(|i| ((x[i] - before[i]) as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((moved - 0.01 * 3.0).abs() < 1e-5, "moved {moved}");
        for i in 0..3 {
            assert_eq!((x[i] - before[i]).signum(), -g[i].signum());
        }
        // The zero bias takes the raw step −lr·(β1 r + (1−β1) c) = −lr·sign(g).
        assert!((x[3] + 0.01).abs() < 1e-6 && (x[4] - 0.01).abs() < 1e-6);
    }

    #[test]
    fn lans_block_matches_a_literal_f64_transcription_over_steps() {
        let sizes = [7usize, 4];
        let mut opt = OptimizerSpec::LANS.build(&sizes);
        let mut x: Vec<f32> = (0..11).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let (mut m, mut v) = (vec![0f64; 11], vec![0f64; 11]);
        let (b1, b2, eps, lr, wd) = (0.9f64, 0.999f64, 1e-6f64, 0.1f64, 0.01f64);
        for t in 0..6u64 {
            let g: Vec<f32> = (0..11)
                .map(|i| ((i + 3 * t as usize) as f32).cos())
                .collect();
            opt.step(&mut x, &g, hyper(t)).unwrap();
            let k = (t + 1) as i32;
            let mut off = 0;
            for &n in &sizes {
                let blk = off..off + n;
                let mut r = vec![0f64; n];
                let mut c = vec![0f64; n];
                for (j, i) in blk.clone().enumerate() {
                    let gi = g[i] as f64;
                    m[i] = b1 * m[i] + (1.0 - b1) * gi;
                    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                    let d = (v[i] / (1.0 - b2.powi(k))).sqrt() + eps;
                    r[j] = m[i] / (1.0 - b1.powi(k)) / d + wd * x64[i];
                    c[j] = gi / d + wd * x64[i];
                }
                let nx = blk.clone().map(|i| x64[i] * x64[i]).sum::<f64>().sqrt();
                let nr = r.iter().map(|a| a * a).sum::<f64>().sqrt();
                let nc = c.iter().map(|a| a * a).sum::<f64>().sqrt();
                for (j, i) in blk.enumerate() {
                    x64[i] -= lr * nx * (b1 * r[j] / nr + (1.0 - b1) * c[j] / nc);
                }
                off += n;
            }
            for i in 0..11 {
                assert!((x[i] as f64 - x64[i]).abs() < 1e-5, "step {t} element {i}");
            }
        }
    }

    #[test]
    fn nag_and_adamw_are_the_kernels_cpu_references() {
        let g = vec![0.3f32, -0.2, 0.1];
        let mut nag = OptimizerSpec::NAG.build(&[3]);
        let (mut x, mut y) = (vec![1.0f32, 2.0, 3.0], vec![1.0f32, 2.0, 3.0]);
        let mut buf = vec![0.0f32; 3];
        for t in 0..3 {
            nag.step(&mut x, &g, hyper(t)).unwrap();
            let s = SgdStep {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 0.01,
                nesterov: true,
                first: t == 0,
            };
            sgd_ref(&mut y, &g, &mut buf, &s);
            assert_eq!(x, y);
        }
        let mut adam = OptimizerSpec::ADAMW.build(&[3]);
        assert!(adam.step(&mut x, &g[..2], hyper(0)).is_err());
        adam.step(&mut x, &g, hyper(0)).unwrap();
        assert!(x.iter().zip(&y).all(|(a, b)| a != b));
    }
}
