//! Finite-difference gradient checks: the analytic gradients of a graph against central
//! differences of its forward pass.
//!
//! The output `y = f(inputs)` is projected to a scalar `L = sum(y * r)` with a fixed random
//! `r`, so every output element influences the check. The numerical side evaluates the
//! projection in f64 on the CPU, so its only noise is the f32 rounding of `y` itself.

use super::{Graph, Var};
use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// Tolerances and seed of [`gradcheck`]: an element passes when `|analytic - numeric| <= atol +
/// rtol * |numeric|`.
#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f32,
    /// Absolute tolerance.
    pub atol: f32,
    /// Tolerance relative to the numeric gradient.
    pub rtol: f32,
    /// Seed of the random projection `r` of the output to a scalar.
    pub seed: u64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-3,
            atol: 2e-3,
            rtol: 1e-2,
            seed: 1,
        }
    }
}

/// The outcome of a check: the worst element and whether everything was within tolerance.
#[derive(Debug, Clone)]
pub struct GradcheckReport {
    /// Input elements compared.
    pub checked: usize,
    /// Largest `|analytic - numeric| / (atol + rtol * |numeric|)`; at most 1 when passed.
    pub worst_ratio: f32,
    /// Where the worst ratio was found, with both gradients, for the failure message (empty when
    /// nothing was checked).
    pub worst: String,
}

impl GradcheckReport {
    /// Whether every element was within tolerance, i.e. `worst_ratio <= 1`.
    pub fn passed(&self) -> bool {
        self.worst_ratio <= 1.0
    }
}

fn projection(shape: &[usize], seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed, 77);
    (0..shape.iter().product::<usize>())
        .map(|_| rng.uniform_in(-1.0, 1.0))
        .collect()
}

fn project(y: &Tensor, r: &[f32]) -> Result<f64> {
    Ok(y.to_vec()?
        .iter()
        .zip(r)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum())
}

/// Checks every element of every input of `f` (all inputs are treated as parameters).
pub fn gradcheck(
    inputs: &[Tensor],
    f: impl Fn(&Graph, &[Var]) -> Result<Var>,
    opts: GradcheckOptions,
) -> Result<GradcheckReport> {
    let device = inputs
        .first()
        .map(|t| t.device().clone())
        .unwrap_or(Device::Cpu);
    // Analytic gradients.
    let g = Graph::new(&device);
    let vars: Vec<Var> = inputs.iter().map(|t| g.param(t)).collect();
    let y = f(&g, &vars)?;
    let y_shape = g.shape(y);
    let r = projection(&y_shape, opts.seed);
    let rv = g.input(&Tensor::from_vec(&device, &y_shape, r.clone())?);
    let weighted = g.mul(y, rv)?;
    let loss = g.sum_all(weighted)?;
    let grads = g.backward(loss)?;
    let analytic = grads.for_params(&inputs.iter().collect::<Vec<_>>())?;

    let eval = |perturbed: &[Tensor]| -> Result<f64> {
        let g = Graph::new(&device);
        let vars: Vec<Var> = perturbed.iter().map(|t| g.param(t)).collect();
        let y = f(&g, &vars)?;
        project(&g.value(y), &r)
    };

    let mut report = GradcheckReport {
        checked: 0,
        worst_ratio: 0.0,
        worst: String::new(),
    };
    for (i, input) in inputs.iter().enumerate() {
        let base = input.to_vec()?;
        let ana = analytic[i].to_vec()?;
        for j in 0..base.len() {
            let at = |delta: f32| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                let mut perturbed = inputs.to_vec();
                perturbed[i] = Tensor::from_vec(&device, input.shape(), v)?;
                eval(&perturbed)
            };
            let numeric = ((at(opts.eps)? - at(-opts.eps)?) / (2.0 * opts.eps as f64)) as f32;
            let ratio = (ana[j] - numeric).abs() / (opts.atol + opts.rtol * numeric.abs());
            report.checked += 1;
            if ratio > report.worst_ratio || ratio.is_nan() {
                report.worst_ratio = if ratio.is_nan() { f32::INFINITY } else { ratio };
                report.worst = format!(
                    "input {i} element {j}: analytic {} numeric {numeric}",
                    ana[j]
                );
            }
        }
    }
    Ok(report)
}
