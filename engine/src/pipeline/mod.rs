//! Pipeline-parallel training with compressed activations: Clapping (FC, FU, FC with the
//! cache reset) against the uncompressed pipeline, direct compression, EF21 and AQ-SGD
//! (shared/specs/clapping.md).
//!
//! A model ([`model::ModelSpec`]: an MLP, or a GPT cut between blocks) is cut into E stages
//! ([`stage::Stage`]). Each step, stage e receives its input
//! across cut e−1 ([`mirror::Mirror`] turns the payload back into `ỹ_{e−1}`), sends its output
//! across cut e, and later receives `ṽ_e` and sends `v_{e−1}` back; both gradients are taken at
//! the weights of the forward pass, then its optimizer steps. Every stage draws the same
//! lazily sampled batch from its own copy of the seeded sampler ([`sampler`]), so only
//! activations cross the [`StageLink`](crate::comm::stage::StageLink)s.
//! [`Pipeline`] runs the stages in one process over in-process links; `murmur-net` runs each
//! stage in its own process over QUIC with the same code, hence the same bits.
//!
//! shared/DESIGN.md lists the pipeline variants under `algo/`; they live here because they
//! share nothing with the data-parallel exchange there (no collective, no parameter servers).

pub mod data;
pub mod message;
pub mod mirror;
pub mod model;
pub mod run;
pub mod sampler;
pub mod stage;

use std::fmt;
use std::str::FromStr;

pub use data::{PipelineData, TextWindows};
pub use mirror::{OnFresh, Policy};
pub use model::ModelSpec;
pub use run::{image_accuracy, Pipeline, StepReport};
pub use sampler::{LazySampler, PSchedule, Rule};
pub use stage::Stage;

use crate::algo::OptimizerSpec;
use crate::error::{Error, Result};

/// The method: what the buffers at every cut do (clapping.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Every activation and gradient in f32 (§3.1).
    Uncompressed,
    /// `C(y)`, `C(v)` with no memory (§3.2).
    Direct,
    /// Error feedback across samples without lazy sampling: Clapping-FC at p = 1 (§3.4).
    Ef21,
    /// Clapping-FC: compressed differences at every step (§3.9).
    Fc,
    /// FC with the buffers cleared on a fresh draw (§3.12).
    FcReset,
    /// Clapping-FU: fresh samples travel uncompressed (§3.9).
    Fu,
    /// AQ-SGD: one forward buffer per sample, first visits raw; backward compressed directly
    /// (§3.3). Ordinary sampling.
    AqSgd,
}

impl Variant {
    /// Every variant, in the order of the paper's comparison.
    pub const ALL: [Variant; 7] = [
        Variant::Uncompressed,
        Variant::Direct,
        Variant::Ef21,
        Variant::Fc,
        Variant::FcReset,
        Variant::Fu,
        Variant::AqSgd,
    ];

    /// What the forward and the backward buffers of every cut do.
    pub fn policies(self) -> (Policy, Policy) {
        match self {
            Variant::Uncompressed => (Policy::Uncompressed, Policy::Uncompressed),
            Variant::Direct => (Policy::Direct, Policy::Direct),
            Variant::Ef21 | Variant::Fc => (
                Policy::Carried(OnFresh::Compress),
                Policy::Carried(OnFresh::Compress),
            ),
            Variant::FcReset => (
                Policy::Carried(OnFresh::Reset),
                Policy::Carried(OnFresh::Reset),
            ),
            Variant::Fu => (Policy::Carried(OnFresh::Raw), Policy::Carried(OnFresh::Raw)),
            Variant::AqSgd => (Policy::PerSample, Policy::Direct),
        }
    }

    /// The sampling the variant runs with: EF21 and AQ-SGD are defined without lazy sampling,
    /// so they draw fresh samples every step whatever `p` was asked for.
    pub fn sampling(self, p: PSchedule) -> PSchedule {
        match self {
            Variant::Ef21 | Variant::AqSgd => PSchedule::Constant(1.0),
            _ => p,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Uncompressed => "none",
            Variant::Direct => "direct",
            Variant::Ef21 => "ef21",
            Variant::Fc => "fc",
            Variant::FcReset => "fc-reset",
            Variant::Fu => "fu",
            Variant::AqSgd => "aq-sgd",
        })
    }
}

impl FromStr for Variant {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Variant::ALL
            .into_iter()
            .find(|v| v.to_string() == s)
            .ok_or_else(|| {
                Error::Config(format!(
                    "variant {s:?}: use none, direct, ef21, fc, fc-reset, fu or aq-sgd"
                ))
            })
    }
}

/// Everything every stage must agree on.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The model the stages split among themselves.
    pub model: ModelSpec,
    /// E: the model's layers (an MLP's) or blocks (a GPT's) are split into this many
    /// contiguous stages.
    pub stages: usize,
    /// Samples per step.
    pub batch: usize,
    /// What crosses the cuts: which compression and error-feedback scheme the pipeline runs.
    pub variant: Variant,
    /// Row codecs of the activations and of the activation gradients (`fA-bB` in the paper
    /// is `qsgd:bits=A` and `qsgd:bits=B`).
    pub forward_codec: String,
    /// Row codec of the activation gradients, sent backward.
    pub backward_codec: String,
    /// `p_t`: the probability that a batch slot draws a fresh sample at step `t`.
    pub p: PSchedule,
    /// Whether lazy sampling decides per batch or per slot.
    pub rule: Rule,
    /// Steps at the start that travel uncompressed, buffers storing exact values (§3.12).
    pub warmup: u64,
    /// The update each stage applies to its own parameters.
    pub optimizer: OptimizerSpec,
    /// Learning rate, until `lr_drop_at`.
    pub lr: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// The step from which the learning rate is a tenth.
    pub lr_drop_at: Option<u64>,
    /// Initial weights, sampling and stochastic codecs.
    pub seed: u64,
}

impl PipelineConfig {
    /// Which of the model's layers or blocks stage `e` holds: contiguous, as even as
    /// possible, the earlier stages taking the remainder.
    pub fn layers_of(&self, e: usize) -> std::ops::Range<usize> {
        let layers = self.model.units();
        let (base, extra) = (layers / self.stages, layers % self.stages);
        let start = e * base + e.min(extra);
        start..start + base + usize::from(e < extra)
    }

    /// Values per sample across cut `e` (between stages e and e+1).
    pub fn cut_width(&self, e: usize) -> usize {
        self.model.activation_width(self.layers_of(e).end)
    }

    /// Checks that the configuration can run: a valid model, 1 to `units` stages, a non-empty
    /// batch, `p` a probability throughout, and codecs that parse.
    pub fn check(&self) -> Result<()> {
        self.model.check()?;
        let layers = self.model.units();
        if self.stages == 0 || self.stages > layers {
            return Err(Error::Config(format!(
                "{} stages for {layers} layers: each stage needs at least one layer",
                self.stages
            )));
        }
        if self.batch == 0 {
            return Err(Error::Config("a batch of zero samples".into()));
        }
        for (name, p) in [("p", self.p.at(0)), ("p at the end", self.p.at(u64::MAX))] {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::Config(format!("{name} = {p} is not a probability")));
            }
        }
        // 0 freezes the weights (tests do, to isolate the messages); NaN or a negative rate
        // is never meant.
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(Error::Config(format!(
                "the learning rate must be a number of at least 0, not {}",
                self.lr
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(Error::Config(format!(
                "the weight decay must be a number of at least 0, not {}",
                self.weight_decay
            )));
        }
        if let OptimizerSpec::Ema { m } = self.optimizer {
            if !(m > 0.0 && m <= 1.0) {
                return Err(Error::Config(format!(
                    "the momentum weight m must be above 0 and at most 1, not {m}"
                )));
            }
        }
        self.forward_codec.parse::<message::RowCodec>()?;
        self.backward_codec.parse::<message::RowCodec>()?;
        Ok(())
    }

    /// The learning rate of step `step`: `lr`, a tenth of it from `lr_drop_at` on.
    pub fn lr_at(&self, step: u64) -> f32 {
        match self.lr_drop_at {
            Some(at) if step >= at => self.lr * 0.1,
            _ => self.lr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sizes: &[usize], stages: usize) -> PipelineConfig {
        PipelineConfig {
            model: ModelSpec::Mlp(sizes.to_vec()),
            stages,
            batch: 4,
            variant: Variant::Fc,
            forward_codec: "topk:0.1".into(),
            backward_codec: "topk:0.1".into(),
            p: PSchedule::Constant(0.5),
            rule: Rule::Batch,
            warmup: 0,
            optimizer: OptimizerSpec::Ema { m: 0.1 },
            lr: 0.1,
            weight_decay: 0.0,
            lr_drop_at: None,
            seed: 1,
        }
    }

    #[test]
    fn layers_split_into_contiguous_stages_and_bad_splits_explain() {
        let c = config(&[8, 7, 6, 5, 4, 3], 3);
        let split: Vec<_> = (0..3).map(|e| c.layers_of(e)).collect();
        assert_eq!(split, [0..2, 2..4, 4..5]);
        assert_eq!((c.cut_width(0), c.cut_width(1)), (6, 4));
        assert!(c.check().is_ok());
        assert!(config(&[8, 7], 2).check().is_err());
        assert!(config(&[8, 7], 0).check().is_err());
        let mut bad = config(&[8, 7, 6], 2);
        bad.forward_codec = "topk".into();
        assert!(bad.check().is_err());
        bad = config(&[8, 7, 6], 2);
        bad.p = PSchedule::Constant(1.5);
        assert!(bad.check().is_err());
    }

    #[test]
    fn variant_names_round_trip() {
        for v in Variant::ALL {
            assert_eq!(v.to_string().parse::<Variant>().unwrap(), v);
        }
        assert!("clapping".parse::<Variant>().is_err());
        assert_eq!(
            Variant::Ef21.sampling(PSchedule::Constant(0.3)),
            PSchedule::Constant(1.0)
        );
    }
}
