//! What every stage of a pipeline run must agree on, as flags: the launcher forwards them to
//! its stage processes flag for flag, and each stage builds the same `PipelineConfig`.

use std::path::PathBuf;

use clap::Args;
use murmur_engine::algo::OptimizerSpec;
use murmur_engine::data::{default_root, ImageDataset, ImageSet, Split};
use murmur_engine::pipeline::{ModelSpec, PSchedule, PipelineConfig, Rule};

use murmur_node::DeviceKind;

#[derive(Args, Debug, Clone)]
pub struct PipelineJob {
    /// Stages E; the MLP's layers are split into E contiguous stages.
    #[arg(long, default_value_t = 4)]
    pub stages: usize,
    /// none, direct, ef21, fc (Clapping-FC), fc-reset, fu (Clapping-FU) or aq-sgd.
    #[arg(long, default_value = "fc")]
    pub variant: String,
    /// Codec of the activations, row by row (e.g. topk:0.2, qsgd:bits=6, natural,
    /// qsgd:bits=8+natural, hybrid:bits=6:topk=0.3).
    #[arg(long, default_value = "topk:0.2")]
    pub codec: String,
    /// Codec of the activation gradients (default: the activations' codec).
    #[arg(long)]
    pub backward_codec: Option<String>,
    /// Lazy sampling: the probability of a fresh batch at each step.
    #[arg(long, default_value_t = 0.6)]
    pub p: f32,
    /// Take the keep-or-draw decision per sample instead of per batch.
    #[arg(long)]
    pub per_sample: bool,
    /// Steps at the start that travel uncompressed.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// mnist or fashion-mnist.
    #[arg(long, default_value = "fashion-mnist")]
    pub dataset: String,
    /// Passes' worth of steps over the training set.
    #[arg(long, default_value_t = 3)]
    pub epochs: u32,
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Hidden layer widths.
    #[arg(long, default_value = "256,128,64", value_delimiter = ',')]
    pub hidden: Vec<usize>,
    /// Step size γ of the moving-average momentum (PyTorch's lr is γ·m).
    #[arg(long, default_value_t = 0.5)]
    pub lr: f32,
    /// Weight of the new gradient in the momentum (PyTorch's momentum is 1 − m).
    #[arg(long, default_value_t = 0.1)]
    pub m: f32,
    /// ema (momentum in the paper's moving-average form, with --m), adamw (PyTorch's), or
    /// adam-paper (the paper's eq. 107).
    #[arg(long, default_value = "ema")]
    pub optimizer: String,
    #[arg(long, default_value_t = 1e-4)]
    pub weight_decay: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Use only the first N training samples.
    #[arg(long)]
    pub train_limit: Option<usize>,
    /// Folder holding mnist/ and fashion-mnist/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "gpu")]
    pub device: DeviceKind,
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
            format!(
                "--device={}",
                match self.device {
                    DeviceKind::Cpu => "cpu",
                    DeviceKind::Gpu => "gpu",
                }
            ),
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

    /// The training and test sets.
    pub fn load(&self) -> anyhow::Result<(ImageDataset, ImageSet, ImageSet)> {
        let dataset: ImageDataset = self.dataset.parse()?;
        let root = self.data.clone().unwrap_or_else(default_root);
        let mut train = dataset.load(&root, Split::Train)?;
        if let Some(n) = self.train_limit {
            train.truncate(n);
        }
        Ok((dataset, train, dataset.load(&root, Split::Test)?))
    }

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

    pub fn config(&self, train: &ImageSet) -> anyhow::Result<PipelineConfig> {
        let steps = self.steps(train);
        let config = PipelineConfig {
            model: ModelSpec::Mlp(self.sizes(train)),
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
                other => anyhow::bail!("--optimizer {other}: use ema, adamw or adam-paper"),
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
