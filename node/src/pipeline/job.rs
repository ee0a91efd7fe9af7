//! What every stage of a pipeline run must agree on: the launcher hands it to every stage
//! (as flags, flag for flag, to a stage process), and each stage builds the same
//! `PipelineConfig` from it.

use std::path::PathBuf;

use murmur_engine::algo::OptimizerSpec;
use murmur_engine::data::ImageSet;
use murmur_engine::pipeline::{ModelSpec, PSchedule, PipelineConfig, Rule};
use serde::{Deserialize, Serialize};

use crate::data::{load_sets, DeviceKind, Sets};
use crate::error::{NodeError, Result};

/// A pipeline job: the model, its cut into stages, the method, the data and the schedule.
/// Defaults are the demo's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct PipelineJob {
    /// Stages E; the MLP's layers are split into E contiguous stages.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().stages))]
    pub stages: usize,
    /// none, direct, ef21, fc (Clapping-FC), fc-reset, fu (Clapping-FU) or aq-sgd.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().variant))]
    pub variant: String,
    /// Codec of the activations, row by row (e.g. topk:0.2, qsgd:bits=6, natural,
    /// qsgd:bits=8+natural, hybrid:bits=6:topk=0.3).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().codec))]
    pub codec: String,
    /// Codec of the activation gradients (default: the activations' codec).
    #[cfg_attr(feature = "cli", arg(long))]
    pub backward_codec: Option<String>,
    /// Lazy sampling: the probability of a fresh batch at each step.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().p))]
    pub p: f32,
    /// Take the keep-or-draw decision per sample instead of per batch.
    #[cfg_attr(feature = "cli", arg(long))]
    pub per_sample: bool,
    /// Steps at the start that travel uncompressed.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().warmup))]
    pub warmup: u64,
    /// mnist or fashion-mnist.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().dataset))]
    pub dataset: String,
    /// Passes' worth of steps over the training set.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().epochs))]
    pub epochs: u32,
    /// Samples per step.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().batch))]
    pub batch: usize,
    /// Hidden layer widths.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', default_values_t = PipelineJob::default().hidden)
    )]
    pub hidden: Vec<usize>,
    /// Step size γ of the moving-average momentum (PyTorch's lr is γ·m).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().lr))]
    pub lr: f32,
    /// Weight of the new gradient in the momentum (PyTorch's momentum is 1 − m).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().m))]
    pub m: f32,
    /// ema (momentum in the paper's moving-average form, with --m), adamw (PyTorch's), or
    /// adam-paper (the paper's eq. 107).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().optimizer))]
    pub optimizer: String,
    /// Weight decay.
    #[cfg_attr(
        feature = "cli",
        arg(long, default_value_t = PipelineJob::default().weight_decay)
    )]
    pub weight_decay: f32,
    /// Seed of the initial model, the data order and every codec's randomness.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = PipelineJob::default().seed))]
    pub seed: u64,
    /// Use only the first N training samples.
    #[cfg_attr(feature = "cli", arg(long))]
    pub train_limit: Option<usize>,
    /// Folder holding mnist/ and fashion-mnist/ (default: $MURMUR_DATA or ./data).
    #[cfg_attr(feature = "cli", arg(long))]
    pub data: Option<PathBuf>,
    /// Write the trained model here at the end (weights alone, which `murmur eval` reads).
    /// Only the launcher reads it: the stages are not told.
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(skip)]
    pub save: Option<PathBuf>,
    /// Where every stage computes.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_enum, default_value_t = PipelineJob::default().device)
    )]
    pub device: DeviceKind,
}

impl Default for PipelineJob {
    fn default() -> Self {
        PipelineJob {
            stages: 4,
            variant: "fc".into(),
            codec: "topk:0.2".into(),
            backward_codec: None,
            p: 0.6,
            per_sample: false,
            warmup: 0,
            dataset: "fashion-mnist".into(),
            epochs: 3,
            batch: 128,
            hidden: vec![256, 128, 64],
            lr: 0.5,
            m: 0.1,
            optimizer: "ema".into(),
            weight_decay: 1e-4,
            seed: 0,
            train_limit: None,
            data: None,
            save: None,
            device: DeviceKind::Auto,
        }
    }
}

impl PipelineJob {
    /// The flags that rebuild this job in a stage process.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec![
            format!("--stages={}", self.stages),
            format!("--variant={}", self.variant),
            format!("--codec={}", self.codec),
            format!("--p={}", self.p),
            format!("--warmup={}", self.warmup),
            format!("--dataset={}", self.dataset),
            format!("--epochs={}", self.epochs),
            format!("--batch={}", self.batch),
            format!(
                "--hidden={}",
                self.hidden
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            format!("--lr={}", self.lr),
            format!("--m={}", self.m),
            format!("--optimizer={}", self.optimizer),
            format!("--weight-decay={}", self.weight_decay),
            format!("--seed={}", self.seed),
            format!("--device={}", self.device.name()),
        ];
        if let Some(b) = &self.backward_codec {
            out.push(format!("--backward-codec={b}"));
        }
        if self.per_sample {
            out.push("--per-sample".into());
        }
        if let Some(n) = self.train_limit {
            out.push(format!("--train-limit={n}"));
        }
        if let Some(d) = &self.data {
            out.push(format!("--data={}", d.display()));
        }
        out
    }

    /// Refuses a job no run could use, before any data is read: every field the stages'
    /// config checks (with the data's widths left open), and those only the launcher reads.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(NodeError::Job(m));
        if self.epochs == 0 {
            return bad("epochs must be at least 1".into());
        }
        if !(self.p > 0.0 && self.p <= 1.0) {
            return bad(format!(
                "p must be above 0 and at most 1 (the chance of a fresh batch), not {}",
                self.p
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("lr must be a number above 0, not {}", self.lr));
        }
        if self.train_limit == Some(0) {
            return bad("train_limit must be at least 1 when given".into());
        }
        self.dataset
            .parse::<murmur_engine::data::ImageDataset>()
            .map_err(|e| NodeError::Job(format!("dataset: {e}")))?;
        // The images' widths change the first and last layer's sizes, not whether the rest
        // fits: stand-ins do.
        let sizes = [1]
            .into_iter()
            .chain(self.hidden.iter().copied())
            .chain([1]);
        self.config_for(sizes.collect(), 1).map(|_| ())
    }

    /// The training set (cut to `train_limit`) and the test set.
    pub fn load(&self) -> Result<Sets> {
        load_sets(&self.dataset, self.data.as_deref(), self.train_limit)
    }

    /// Steps in the whole run: `epochs` passes' worth of batches over `train`.
    pub fn steps(&self, train: &ImageSet) -> u64 {
        self.epochs as u64 * (train.len() / self.batch.max(1)) as u64
    }

    /// The MLP's widths: the images' features, the hidden widths, the classes.
    pub fn sizes(&self, train: &ImageSet) -> Vec<usize> {
        let mut sizes = vec![train.features()];
        sizes.extend(&self.hidden);
        sizes.push(train.classes);
        sizes
    }

    /// The config every stage builds, checked (the split must fit the model).
    pub fn config(&self, train: &ImageSet) -> Result<PipelineConfig> {
        self.config_for(self.sizes(train), self.steps(train))
    }

    /// The config for an MLP of widths `sizes` trained for `steps` steps, checked.
    fn config_for(&self, sizes: Vec<usize>, steps: u64) -> Result<PipelineConfig> {
        let config = PipelineConfig {
            model: ModelSpec::Mlp(sizes),
            stages: self.stages,
            batch: self.batch,
            variant: self.variant.parse()?,
            forward_codec: self.codec.clone(),
            backward_codec: self.backward_codec.clone().unwrap_or(self.codec.clone()),
            p: PSchedule::Constant(self.p),
            rule: if self.per_sample {
                Rule::Sample
            } else {
                Rule::Batch
            },
            warmup: self.warmup,
            optimizer: match self.optimizer.as_str() {
                "ema" => OptimizerSpec::Ema { m: self.m },
                "adamw" => OptimizerSpec::ADAMW,
                "adam-paper" => OptimizerSpec::ADAM_PAPER,
                other => {
                    return Err(NodeError::Job(format!(
                        "optimizer {other}: use ema, adamw or adam-paper"
                    )))
                }
            },
            lr: self.lr,
            weight_decay: self.weight_decay,
            lr_drop_at: (self.epochs > 1).then(|| steps * 2 / 3),
            seed: self.seed,
        };
        config.check()?;
        Ok(config)
    }
}
