//! Clapping's logistic regression (clapping.md §6 E1 and §7 R1): a two-stage pipeline whose
//! only cut carries one scalar per sample, compressed forward, with the paper's methods
//! compared by their optimality gap `f(w) − f*`.
//!
//! The paper leaves the data generator, |D| and the halving milestones open; the choices here
//! follow the spec's suggestions (§9 A12): N = 10,000 samples of dimension 200,
//! `ξ = ξ* + ε` with `ξ* ~ N(0, 0.5)` and `ε ~ N(0, 0.3)` (variances), labels
//! `ζ = sign(ξ*ᵀw* + noise)`, and the step size halved five times over the run with the
//! momentum cleared at each halving. The compressor is a real quantizer of the batch vector
//! `y_1 ∈ R^B` (A12's alternative to additive noise, which would make error feedback a no-op).

use murmur_engine::pipeline::message::RowCodec;
use murmur_engine::pipeline::mirror::{Mirror, OnFresh, Policy};
use murmur_engine::pipeline::{LazySampler, PSchedule, Rule};
use murmur_engine::rng::Rng;

pub const DIM: usize = 200;
pub const SAMPLES: usize = 10_000;
const REG: f64 = 0.005;

/// The synthetic classification set.
pub struct Problem {
    xi: Vec<f32>,
    zeta: Vec<f32>,
    /// `f*`, the optimum of the objective.
    pub f_star: f64,
}

impl Problem {
    pub fn new(seed: u64) -> Problem {
        let mut rng = Rng::new(seed, 0x10_6157);
        let w_star: Vec<f32> = (0..DIM)
            .map(|_| rng.normal() / (DIM as f32).sqrt())
            .collect();
        let (mut xi, mut zeta) = (Vec::with_capacity(SAMPLES * DIM), Vec::new());
        for _ in 0..SAMPLES {
            let clean: Vec<f32> = (0..DIM).map(|_| rng.normal() * 0.5f32.sqrt()).collect();
            let margin: f32 = clean.iter().zip(&w_star).map(|(a, b)| a * b).sum();
            zeta.push(if margin + 0.3 * rng.normal() >= 0.0 {
                1.0
            } else {
                -1.0
            });
            xi.extend(clean.iter().map(|c| c + rng.normal() * 0.3f32.sqrt()));
        }
        let mut problem = Problem {
            xi,
            zeta,
            f_star: f64::NAN,
        };
        problem.f_star = problem.optimum();
        problem
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.xi[i * DIM..(i + 1) * DIM]
    }

    /// `y_1 = −ζ(ξᵀw + b)` of sample `i` (stage 1's output).
    fn activation(&self, i: usize, w: &[f64], b: f64) -> f64 {
        let dot: f64 = self.row(i).iter().zip(w).map(|(x, w)| *x as f64 * w).sum();
        -(self.zeta[i] as f64) * (dot + b)
    }

    /// The full objective `f(w, b)`, in f64.
    pub fn objective(&self, w: &[f64], b: f64) -> f64 {
        let loss: f64 = (0..SAMPLES)
            .map(|i| softplus(self.activation(i, w, b)))
            .sum::<f64>()
            / SAMPLES as f64;
        loss + REG * (w.iter().map(|v| v * v).sum::<f64>() + b * b)
    }

    /// `f*`, by full-batch gradient descent (the objective is smooth and strongly convex).
    fn optimum(&self) -> f64 {
        let (mut w, mut b) = (vec![0.0f64; DIM], 0.0f64);
        for _ in 0..3000 {
            let (mut gw, mut gb) = (vec![0.0f64; DIM], 0.0f64);
            for i in 0..SAMPLES {
                let v = sigmoid(self.activation(i, &w, b)) * -(self.zeta[i] as f64);
                for (g, x) in gw.iter_mut().zip(self.row(i)) {
                    *g += v * *x as f64;
                }
                gb += v;
            }
            for (wj, g) in w.iter_mut().zip(&gw) {
                *wj -= 2.0 * (g / SAMPLES as f64 + 2.0 * REG * *wj);
            }
            b -= 2.0 * (gb / SAMPLES as f64 + 2.0 * REG * b);
        }
        self.objective(&w, b)
    }
}

fn softplus(z: f64) -> f64 {
    if z > 30.0 {
        z
    } else {
        z.exp().ln_1p()
    }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// The methods of the paper's Figure 5.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    NoCompression,
    Compression,
    CompressionEf,
    Fc(f32),
    Fu(f32),
}

impl Method {
    pub fn label(self) -> String {
        match self {
            Method::NoCompression => "no compression".into(),
            Method::Compression => "compression (direct)".into(),
            Method::CompressionEf => "compression + EF (EF21, no lazy sampling)".into(),
            Method::Fc(p) => format!("Clapping-FC p = {p}"),
            Method::Fu(p) => format!("Clapping-FU p = {p}"),
        }
    }

    fn policy_and_p(self) -> (Policy, f32) {
        match self {
            Method::NoCompression => (Policy::Uncompressed, 1.0),
            Method::Compression => (Policy::Direct, 1.0),
            Method::CompressionEf => (Policy::Carried(OnFresh::Compress), 1.0),
            Method::Fc(p) => (Policy::Carried(OnFresh::Compress), p),
            Method::Fu(p) => (Policy::Carried(OnFresh::Raw), p),
        }
    }
}

/// The optimality gap at each of `checkpoints` (steps), training with moving-average momentum
/// (m = 0.1, γ = 0.1, halved five times) on batches of `batch`, the cut compressed by `codec`.
pub fn gaps(
    problem: &Problem,
    method: Method,
    codec: &str,
    batch: usize,
    steps: u64,
    checkpoints: &[u64],
    seed: u64,
) -> anyhow::Result<Vec<f64>> {
    let (policy, p) = method.policy_and_p();
    // The whole batch vector is one row: the quantizer sees all of y_1 at once.
    let mut cut = Mirror::new(policy, codec.parse::<RowCodec>()?, 1, batch, seed, 0);
    let mut sampler = LazySampler::new(SAMPLES, batch, Rule::Batch, PSchedule::Constant(p), seed);
    let (mut w, mut b) = (vec![0.0f64; DIM], 0.0f64);
    let (mut uw, mut ub) = (vec![0.0f64; DIM], 0.0f64);
    let (m, mut gamma) = (0.1f64, 0.1f64);
    let halve_every = (steps / 6).max(1);
    let mut out = Vec::new();
    for step in 0..steps {
        if step > 0 && step % halve_every == 0 {
            gamma *= 0.5;
            uw.iter_mut().for_each(|u| *u = 0.0);
            ub = 0.0;
        }
        let draw = sampler.next_draw();
        let y: Vec<f32> = draw
            .ids
            .iter()
            .map(|&i| problem.activation(i, &w, b) as f32)
            .collect();
        let (_, received) = cut.send(&y, &draw, true);
        // Stage 2: the loss's gradient at the received activations, sent back exactly.
        let (mut gw, mut gb) = (vec![0.0f64; DIM], 0.0f64);
        for (slot, &i) in draw.ids.iter().enumerate() {
            let v = sigmoid(received[slot] as f64) / batch as f64;
            let dz = v * -(problem.zeta[i] as f64);
            for (g, x) in gw.iter_mut().zip(problem.row(i)) {
                *g += dz * *x as f64;
            }
            gb += dz;
        }
        for j in 0..DIM {
            uw[j] = (1.0 - m) * uw[j] + m * (gw[j] + 2.0 * REG * w[j]);
            w[j] -= gamma * uw[j];
        }
        ub = (1.0 - m) * ub + m * (gb + 2.0 * REG * b);
        b -= gamma * ub;
        if checkpoints.contains(&(step + 1)) {
            out.push(problem.objective(&w, b) - problem.f_star);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_optimum_is_below_every_trained_point_and_uncompressed_training_approaches_it() {
        let problem = Problem::new(1);
        let g = gaps(
            &problem,
            Method::NoCompression,
            "f32",
            64,
            2000,
            &[200, 2000],
            0,
        )
        .unwrap();
        assert!(g.iter().all(|&x| x > -1e-9), "{g:?}");
        assert!(g[1] < g[0] && g[1] < 0.01, "{g:?}");
    }
}
