//! Optimizers: state per parameter, updated in place by the kernels of `kernels::optim`.
//! [`host`] holds the ones over flat host vectors that algorithms and parameter servers step.

pub mod host;

use crate::error::{shape_err, Error, Result};
use crate::kernels::optim::{adamw_step, sgd_step, AdamWStep, SgdStep};
use crate::tensor::Tensor;

/// Updates parameters from their gradients.
/// `Sync` so that a model and its optimizer can be read from a pool thread (`cpu::pool`).
pub trait Optimizer: Send + Sync {
    /// One update; `grads[i]` is the gradient of `params[i]`.
    fn step(&mut self, params: &mut [&mut Tensor], grads: &[Tensor]) -> Result<()>;
    /// The learning rate the next step uses.
    fn lr(&self) -> f32;
    /// Sets the learning rate of the following steps, for schedules.
    fn set_lr(&mut self, lr: f32);

    /// Everything needed to continue exactly where this optimizer is: its step count and its
    /// state tensors (empty before the first step).
    fn export(&self) -> OptimizerState;

    /// Restores an [`OptimizerState`] exported by an optimizer of the same kind and shapes.
    fn import(&mut self, state: OptimizerState) -> Result<()>;
}

/// An optimizer's resumable state.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// Steps taken so far.
    pub steps: u64,
    /// Named state tensors, e.g. `m.0`, `v.0`, ... or `momentum.0`, ...
    pub tensors: Vec<(String, Tensor)>,
}

fn named<'a>(prefix: &str, ts: &'a [Tensor]) -> impl Iterator<Item = (String, Tensor)> + 'a {
    let prefix = prefix.to_string();
    ts.iter()
        .enumerate()
        .map(move |(i, t)| (format!("{prefix}.{i}"), t.clone()))
}

/// The tensors `prefix.0, prefix.1, ...` of a state, in order.
fn take(state: &OptimizerState, prefix: &str) -> Vec<Tensor> {
    let mut found: Vec<(usize, Tensor)> = state
        .tensors
        .iter()
        .filter_map(|(name, t)| {
            name.strip_prefix(prefix)?
                .strip_prefix('.')?
                .parse()
                .ok()
                .map(|i: usize| (i, t.clone()))
        })
        .collect();
    found.sort_by_key(|(i, _)| *i);
    found.into_iter().map(|(_, t)| t).collect()
}

/// Constants of [`Sgd`]; the default is plain SGD at learning rate 0.01.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (0: no momentum buffer).
    pub momentum: f32,
    /// Dampening of the gradient in the momentum update; must be 0 with Nesterov.
    pub dampening: f32,
    /// L2 penalty added to the gradient, `g + weight_decay * w`.
    pub weight_decay: f32,
    /// Whether to use Nesterov momentum (needs `momentum > 0`).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 0.01,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

/// SGD with optional (Nesterov) momentum and weight decay, as torch.optim.SGD.
pub struct Sgd {
    /// The constants, of which `lr` may change between steps.
    pub config: SgdConfig,
    buffers: Vec<Tensor>,
    steps: u64,
}

impl Sgd {
    /// An optimizer with no state yet; fails on Nesterov without momentum or with dampening.
    pub fn new(config: SgdConfig) -> Result<Self> {
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::Config(
                "Nesterov momentum needs momentum > 0 and zero dampening".into(),
            ));
        }
        Ok(Sgd {
            config,
            buffers: vec![],
            steps: 0,
        })
    }
}

/// `update(param, grad, its state tensors)` for every parameter: on the CPU, parameters side
/// by side on rayon's pool (each update is its own, so the bits are those of one after
/// another), on a GPU one after another, as their kernels are queued. A GPT's tensors are at
/// most 16,384 floats, each below an update's own split into parallel chunks, so the whole
/// step ran on one thread: 0.33 ms of a 14.9 ms step (the per-op timer, session 22).
fn each_parameter<const S: usize>(
    params: &mut [&mut Tensor],
    grads: &[Tensor],
    state: [&mut Vec<Tensor>; S],
    update: impl Fn(&mut Tensor, &Tensor, [&mut Tensor; S]) -> Result<()> + Sync,
) -> Result<()> {
    // The state of parameter `i`: its tensor in each of the `S` lists, which `check_pairs`
    // found as long as `params` (or empty, before `zeros_like` filled them).
    let mut lists = state.map(|list| list.iter_mut());
    let per_param: Vec<[&mut Tensor; S]> = (0..params.len())
        .map(|_| {
            lists
                .each_mut()
                .map(|list| list.next().expect("a state tensor a parameter"))
        })
        .collect();
    if params.iter().any(|p| p.device().is_gpu()) {
        for ((p, g), s) in params.iter_mut().zip(grads).zip(per_param) {
            update(p, g, s)?;
        }
        return Ok(());
    }
    use rayon::prelude::*;
    params
        .par_iter_mut()
        .zip(grads)
        .zip(per_param)
        .try_for_each(|((p, g), s)| update(p, g, s))
}

fn check_pairs(params: &[&mut Tensor], grads: &[Tensor], state: &[Tensor]) -> Result<()> {
    if params.len() != grads.len() || (!state.is_empty() && state.len() != params.len()) {
        return shape_err(
            "optimizer step",
            format!(
                "{} parameters, {} gradients, state for {}",
                params.len(),
                grads.len(),
                state.len()
            ),
        );
    }
    Ok(())
}

fn zeros_like(params: &[&mut Tensor]) -> Result<Vec<Tensor>> {
    params
        .iter()
        .map(|p| Tensor::zeros(p.device(), p.shape()))
        .collect()
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &mut [&mut Tensor], grads: &[Tensor]) -> Result<()> {
        check_pairs(params, grads, &self.buffers)?;
        if self.buffers.is_empty() {
            self.buffers = zeros_like(params)?;
        }
        let c = self.config;
        let s = SgdStep {
            lr: c.lr,
            momentum: c.momentum,
            dampening: c.dampening,
            weight_decay: c.weight_decay,
            nesterov: c.nesterov,
            first: self.steps == 0,
        };
        each_parameter(params, grads, [&mut self.buffers], |p, g, [b]| {
            sgd_step(p, g, b, &s)
        })?;
        self.steps += 1;
        Ok(())
    }

    fn lr(&self) -> f32 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.config.lr = lr;
    }

    fn export(&self) -> OptimizerState {
        OptimizerState {
            steps: self.steps,
            tensors: named("momentum", &self.buffers).collect(),
        }
    }

    fn import(&mut self, state: OptimizerState) -> Result<()> {
        self.buffers = take(&state, "momentum");
        self.steps = state.steps;
        Ok(())
    }
}

/// Constants of [`AdamW`]; the default is torch.optim.AdamW's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first-moment estimate.
    pub beta1: f32,
    /// Decay of the second-moment estimate.
    pub beta2: f32,
    /// Added to the denominator for numerical stability.
    pub eps: f32,
    /// Decoupled weight decay: weights are scaled by `1 - lr * weight_decay` each step.
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    /// torch.optim.AdamW's defaults.
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Adam with decoupled weight decay, as torch.optim.AdamW.
pub struct AdamW {
    /// The constants, of which `lr` may change between steps.
    pub config: AdamWConfig,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    steps: u64,
}

impl AdamW {
    /// An optimizer with no state yet; its moment buffers are allocated at the first step.
    pub fn new(config: AdamWConfig) -> Self {
        AdamW {
            config,
            m: vec![],
            v: vec![],
            steps: 0,
        }
    }

    /// Updates taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &mut [&mut Tensor], grads: &[Tensor]) -> Result<()> {
        check_pairs(params, grads, &self.m)?;
        if self.m.is_empty() {
            self.m = zeros_like(params)?;
            self.v = zeros_like(params)?;
        }
        self.steps += 1;
        let c = self.config;
        let s = AdamWStep {
            lr: c.lr,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
            step: self.steps,
        };
        each_parameter(params, grads, [&mut self.m, &mut self.v], |p, g, [m, v]| {
            adamw_step(p, g, m, v, &s)
        })?;
        Ok(())
    }

    fn lr(&self) -> f32 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.config.lr = lr;
    }

    fn export(&self) -> OptimizerState {
        OptimizerState {
            steps: self.steps,
            tensors: named("m", &self.m).chain(named("v", &self.v)).collect(),
        }
    }

    fn import(&mut self, state: OptimizerState) -> Result<()> {
        let (m, v) = (take(&state, "m"), take(&state, "v"));
        if m.len() != v.len() {
            return Err(Error::Data(format!(
                "AdamW state has {} first and {} second moments",
                m.len(),
                v.len()
            )));
        }
        self.m = m;
        self.v = v;
        self.steps = state.steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Device;

    /// Parameters updated side by side give the bits of each updated alone, with its own
    /// moments, step after step.
    #[test]
    fn parameters_updated_side_by_side_are_each_updated_alone() {
        let cpu = Device::Cpu;
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 * 1e-3 - 1.0)
                .collect()
        };
        // Sizes below and above an update's own parallel chunks, and one of a single float.
        let sizes = [1usize, 4096, 16_384, 40_000, 300];
        let mut together: Vec<Tensor> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Tensor::from_vec(&cpu, &[n], values(n, i)).unwrap())
            .collect();
        let mut alone = together.clone();
        let mut optimizer = AdamW::new(AdamWConfig::default());
        let mut singles: Vec<AdamW> = sizes
            .iter()
            .map(|_| AdamW::new(AdamWConfig::default()))
            .collect();
        for step in 0..3 {
            let grads: Vec<Tensor> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| Tensor::from_vec(&cpu, &[n], values(n, 10 * step + i + 7)).unwrap())
                .collect();
            optimizer
                .step(&mut together.iter_mut().collect::<Vec<_>>(), &grads)
                .unwrap();
            for ((p, g), single) in alone.iter_mut().zip(&grads).zip(&mut singles) {
                single.step(&mut [p], std::slice::from_ref(g)).unwrap();
            }
            for (a, b) in together.iter().zip(&alone) {
                let bits = |t: &Tensor| {
                    t.to_vec()
                        .unwrap()
                        .into_iter()
                        .map(f32::to_bits)
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(a), bits(b), "step {step}, {:?}", a.shape());
            }
        }
    }
}
