//! Outer rounds (DiLoCo, arXiv 2311.08105): each rank takes `local_steps` optimizer steps of
//! its own on its share of a round, then pushes its pseudo-gradient, the shared parameters the
//! round started from minus its own; the servers aggregate the pseudo-gradients as they would
//! gradients (any codec, error feedback, robust rule), and an outer optimizer steps the shared
//! parameters with the aggregate. Every rank applies the same reply to the same start, so the
//! shared parameters stay bit-identical; the inner optimizer's state stays each rank's own.
//!
//! [`OuterRounds`] holds what a rank needs for that beyond its replica: the shared parameters
//! (the anchor each round starts from), the outer optimizer (SGD with Nesterov momentum, or
//! plain SGD at momentum 0: an outer rate of 1 without momentum is federated averaging) and
//! the rounds played. Snapshots and state files carry it beside the replica's checkpoint, as
//! extra tensors ([`OuterRounds::save_into`]).

use std::collections::BTreeMap;

use super::shares::rank_share;
use super::Learner;
use crate::checkpoint::{self, Precision};
use crate::error::{Error, Result};
use crate::optim::{Optimizer, OptimizerState, Sgd, SgdConfig};
use crate::tensor::{Device, Tensor};

/// The outer loop's settings, which every rank of a job shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OuterConfig {
    /// Inner optimizer steps a rank takes on a full share of a round before it pushes.
    pub local_steps: u32,
    /// Samples a local step takes (the job's batch): a share takes
    /// `ceil(samples / step_samples)` steps, at most `local_steps`, so a rank given a smaller
    /// share (a slow one, or the short last round of an epoch) takes fewer steps, not smaller
    /// ones, and its pseudo-gradient weighs by the samples it stands for.
    pub step_samples: usize,
    /// The outer optimizer's learning rate (DiLoCo: 0.7).
    pub lr: f32,
    /// The outer optimizer's Nesterov momentum (DiLoCo: 0.9); 0 for plain SGD.
    pub momentum: f32,
}

impl OuterConfig {
    /// Refuses settings no run can use.
    pub fn validate(&self) -> Result<()> {
        if self.local_steps == 0 || self.step_samples == 0 {
            return Err(Error::Config(
                "an outer round takes at least 1 local step of at least 1 sample".into(),
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(Error::Config(format!(
                "the outer learning rate must be positive, not {}",
                self.lr
            )));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(Error::Config(format!(
                "the outer momentum must be in [0, 1), not {}",
                self.momentum
            )));
        }
        Ok(())
    }
}

/// Prefix of the outer optimizer's tensors in a snapshot (`outer.momentum.3`); a checkpoint's
/// own tensors are parameters or `optim.*`.
const PREFIX: &str = "outer.";
/// Metadata key of the outer rounds played.
const ROUNDS: &str = "outer_rounds";
/// Metadata key of the outer optimizer's step count.
const OUTER_STEPS: &str = "outer_optimizer_steps";

/// A rank's outer loop: the shared parameters, the outer optimizer and the rounds played.
pub struct OuterRounds {
    config: OuterConfig,
    /// The shared parameters the current round started from, on the CPU.
    anchor: Vec<Tensor>,
    optimizer: Sgd,
    rounds: u64,
    /// Whether this round's local work has moved the replica off the anchor (until the round
    /// ends): a retried round starts again from the anchor.
    moved: bool,
}

impl OuterRounds {
    /// The outer loop of a replica whose parameters are now `parameters` (host values, with
    /// their shapes), before its first round.
    pub fn new(
        config: OuterConfig,
        parameters: Vec<Vec<f32>>,
        shapes: &[Vec<usize>],
    ) -> Result<Self> {
        config.validate()?;
        let anchor = parameters
            .into_iter()
            .zip(shapes)
            .map(|(v, s)| Tensor::from_vec(&Device::Cpu, s, v))
            .collect::<Result<_>>()?;
        let optimizer = Sgd::new(SgdConfig {
            lr: config.lr,
            momentum: config.momentum,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: config.momentum > 0.0,
        })?;
        Ok(OuterRounds {
            config,
            anchor,
            optimizer,
            rounds: 0,
            moved: false,
        })
    }

    /// The settings.
    pub fn config(&self) -> OuterConfig {
        self.config
    }

    /// Outer rounds played.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// The shared parameters the current round started from, as CPU tensors.
    pub fn anchor(&self) -> &[Tensor] {
        &self.anchor
    }

    /// The anchor's values, one slice per tensor.
    fn anchor_values(&self) -> impl Iterator<Item = &[f32]> {
        self.anchor
            .iter()
            .map(|t| t.cpu_f32().expect("the anchor is f32 on the CPU"))
    }

    /// The digest of the shared parameters ([`crate::nn::Module::parameter_digest`] of a
    /// replica holding them): what the replicas compare, whatever local steps moved their own.
    pub fn digest(&self) -> Result<u64> {
        Ok(crate::nn::digest_of_values(self.anchor_values()))
    }

    /// The pseudo-gradient of a rank whose parameters are now `local`: anchor minus local,
    /// in place.
    fn pseudo_gradient(&self, local: &mut [Vec<f32>]) -> Result<()> {
        if local.len() != self.anchor.len() {
            return Err(Error::Data(format!(
                "{} tensors for an anchor of {}",
                local.len(),
                self.anchor.len()
            )));
        }
        for (l, a) in local.iter_mut().zip(self.anchor_values()) {
            if a.len() != l.len() {
                return Err(Error::Data("a tensor's size changed within a round".into()));
            }
            // Separately rounded, as every rank computes it.
            l.iter_mut().zip(a).for_each(|(l, a)| *l = a - *l);
        }
        Ok(())
    }

    /// A round's local work on a rank's share `batch`, whose first sample is sample
    /// `first_sample` of the round's global batch: from the anchor, steps of
    /// [`OuterConfig::step_samples`] each (the last one shorter; a share past `local_steps`
    /// of them is cut into `local_steps` equal steps), each a [`Learner::apply`] of the
    /// replica's own optimizer. Returns the mean loss of the steps, weighted by their samples,
    /// and the pseudo-gradient (the anchor minus the parameters reached) per parameter tensor.
    pub fn local_work<M: Learner>(
        &mut self,
        replica: &mut M,
        batch: M::Batch<'_>,
        first_sample: usize,
    ) -> Result<(f32, Vec<Vec<f32>>)> {
        let config = self.config;
        // From the round's anchor, which the replica holds unless an earlier try of this
        // round failed after its local steps and before its pushes.
        if self.moved {
            replica.set_parameters(&self.anchor)?;
        }
        self.moved = true;
        let samples = replica.samples(&batch);
        let steps = samples
            .div_ceil(config.step_samples)
            .clamp(1, config.local_steps as usize);
        let mut losses = Vec::with_capacity(steps);
        for i in 0..steps {
            let slice = if samples <= steps * config.step_samples {
                let start = i * config.step_samples;
                start..(start + config.step_samples).min(samples)
            } else {
                rank_share(samples, i, steps)
            };
            let sub = replica.sub_batch(&batch, slice.clone());
            let (loss, grads) = replica.loss_and_grads(sub, first_sample + slice.start)?;
            // The step reads the gradients to the CPU, where the replica's optimizer steps.
            replica.apply(&grads)?;
            losses.push((loss, slice.len()));
        }
        let read = Tensor::read_many(&losses.iter().map(|(l, _)| l).collect::<Vec<_>>())?;
        let loss = read
            .iter()
            .zip(&losses)
            .map(|(l, (_, n))| f64::from(l[0]) * *n as f64)
            .sum::<f64>()
            / samples.max(1) as f64;
        let mut pseudo = Tensor::read_many(&replica.parameters())?;
        self.pseudo_gradient(&mut pseudo)?;
        Ok((loss as f32, pseudo))
    }

    /// Ends the round: the outer optimizer steps the anchor with the aggregated
    /// pseudo-gradient `aggregate` (on the CPU, where its arithmetic is the same on every
    /// rank). The new shared parameters are [`OuterRounds::anchor`]'s, which the replica takes.
    pub fn step(&mut self, aggregate: &[Tensor]) -> Result<()> {
        let mut anchor: Vec<&mut Tensor> = self.anchor.iter_mut().collect();
        self.optimizer.step(&mut anchor, aggregate)?;
        self.rounds += 1;
        self.moved = false;
        Ok(())
    }

    /// Adds the outer loop to checkpoint bytes of the replica (taken at a round's end, when
    /// the replica holds the anchor): the outer optimizer's state as `outer.*` tensors and
    /// the rounds in the metadata. A checkpoint reader that knows nothing of outer rounds
    /// still reads the parameters (the servers' snapshot check does).
    pub fn save_into(&self, replica: &[u8]) -> Result<Vec<u8>> {
        let (mut tensors, mut meta) = checkpoint::from_bytes(replica, &Device::Cpu)?;
        let state = self.optimizer.export();
        for (name, t) in state.tensors {
            tensors.push((format!("{PREFIX}{name}"), t));
        }
        meta.insert(ROUNDS.into(), self.rounds.to_string());
        meta.insert(OUTER_STEPS.into(), state.steps.to_string());
        checkpoint::to_bytes(&tensors, &meta, Precision::F32)
    }

    /// Splits bytes of [`OuterRounds::save_into`] into the replica's checkpoint and the
    /// outer loop's state, which [`OuterRounds::restore`] takes once the replica has loaded
    /// its part. Refuses bytes without the outer loop's state.
    pub fn split(bytes: &[u8]) -> Result<(Vec<u8>, SavedOuter)> {
        let (tensors, mut meta) = checkpoint::from_bytes(bytes, &Device::Cpu)?;
        let number = |meta: &mut BTreeMap<String, String>, key: &str| -> Result<u64> {
            meta.remove(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    Error::Data(format!(
                        "the snapshot holds no outer-round state ({key}): it is of a run \
                         without local steps"
                    ))
                })
        };
        let rounds = number(&mut meta, ROUNDS)?;
        let steps = number(&mut meta, OUTER_STEPS)?;
        let (outer, replica): (Vec<_>, Vec<_>) = tensors
            .into_iter()
            .partition(|(n, _)| n.starts_with(PREFIX));
        let outer = outer
            .into_iter()
            .map(|(n, t)| (n[PREFIX.len()..].to_string(), t))
            .collect();
        Ok((
            checkpoint::to_bytes(&replica, &meta, Precision::F32)?,
            SavedOuter {
                rounds,
                state: OptimizerState {
                    steps,
                    tensors: outer,
                },
            },
        ))
    }

    /// Takes back the state [`OuterRounds::split`] read, with the replica's parameters (the
    /// anchor of the round it was saved after). Refuses a state that does not fit them; on
    /// refusal nothing changes.
    pub fn restore(&mut self, saved: SavedOuter, parameters: Vec<Vec<f32>>) -> Result<()> {
        let shapes: Vec<Vec<usize>> = self.anchor.iter().map(|t| t.shape().to_vec()).collect();
        let fits = |tensors: &[(String, Tensor)]| {
            tensors.is_empty()
                || (tensors.len() == shapes.len()
                    && (0..shapes.len()).all(|i| {
                        tensors
                            .iter()
                            .any(|(n, t)| *n == format!("momentum.{i}") && t.shape() == shapes[i])
                    }))
        };
        if !fits(&saved.state.tensors) || parameters.len() != shapes.len() {
            return Err(Error::Data(
                "the snapshot's outer-round state does not fit this model".into(),
            ));
        }
        let anchor = parameters
            .into_iter()
            .zip(&shapes)
            .map(|(v, s)| Tensor::from_vec(&Device::Cpu, s, v))
            .collect::<Result<Vec<_>>>()?;
        self.optimizer.import(saved.state)?;
        self.anchor = anchor;
        self.rounds = saved.rounds;
        self.moved = false;
        Ok(())
    }
}

/// The outer loop's state read from a snapshot ([`OuterRounds::split`]).
pub struct SavedOuter {
    /// Outer rounds played.
    pub rounds: u64,
    state: OptimizerState,
}
