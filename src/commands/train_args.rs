//! The flags of `murmur train`, for the image models and the language model alike (both
//! runs read them, so they live apart from either).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use murmur_node::DeviceKind;

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A multi-layer perceptron on images (`--hidden`).
    Mlp,
    /// A small convolutional network on 28x28 images.
    Cnn,
    /// A byte-level decoder-only transformer on text (`--dataset shakespeare`).
    Gpt,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[arg(long, value_enum, default_value = "mlp")]
    pub(super) model: ModelKind,
    /// mnist or fashion-mnist for mlp and cnn; shakespeare for gpt [default: mnist, or
    /// shakespeare for gpt].
    #[arg(long)]
    pub(super) dataset: Option<String>,
    /// mlp, cnn: passes over the training set [default: 5].
    #[arg(long)]
    pub(super) epochs: Option<u32>,
    /// Samples (sequences for gpt) per step [default: 128, or 32 for gpt].
    #[arg(long)]
    pub(super) batch: Option<usize>,
    /// Learning rate (the peak of the schedule for gpt) [default: 1e-3, or 3e-3 for gpt].
    #[arg(long)]
    pub(super) lr: Option<f32>,
    /// mlp, cnn: adamw or sgd [default: adamw; gpt always uses AdamW].
    #[arg(long = "optim")]
    pub(super) optim: Option<String>,
    /// mlp: hidden layer widths [default: 512,256].
    #[arg(long, value_delimiter = ',')]
    pub(super) hidden: Option<Vec<usize>>,
    /// mlp: relu or gelu [default: relu].
    #[arg(long)]
    pub(super) activation: Option<String>,
    /// AdamW's decoupled weight decay [default: 0, or 0.1 for gpt].
    #[arg(long)]
    pub(super) weight_decay: Option<f32>,
    /// mlp, cnn: SGD momentum [default: 0.9].
    #[arg(long)]
    pub(super) momentum: Option<f32>,
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    #[arg(long, value_enum, default_value_t)]
    pub(super) device: DeviceKind,
    /// Stop after this many steps in total (for quick checks; for gpt the schedule still
    /// spans --steps).
    #[arg(long)]
    pub(super) max_steps: Option<u64>,
    /// Dropout rate of the cnn's hidden layer or the gpt's blocks [default: 0.25 cnn, 0 gpt].
    #[arg(long)]
    pub(super) dropout: Option<f32>,
    /// Write a checkpoint (safetensors: parameters by module name, optimizer state, step, the
    /// run as JSON metadata) here after every epoch (every --eval-every steps for gpt) and at
    /// the end; `murmur export`, `eval` and `sample` read it.
    #[arg(long)]
    pub(super) save: Option<PathBuf>,
    /// Continue from a checkpoint written by --save with the same model and flags; the run
    /// then matches an uninterrupted one bit for bit.
    #[arg(long)]
    pub(super) resume: Option<PathBuf>,
    /// Linear warm-up over this many steps, then cosine decay of the learning rate to a
    /// tenth at the last step [default: none for mlp and cnn (constant rate), min(100,
    /// steps / 10) for gpt].
    #[arg(long)]
    pub(super) warmup: Option<u64>,
    /// Clip gradients to this global L2 norm [default: none for mlp and cnn, 1 for gpt].
    #[arg(long)]
    pub(super) clip: Option<f32>,
    #[command(flatten)]
    pub(super) lm: LmArgs,
    /// Use only the first N training samples.
    #[arg(long)]
    pub(super) train_limit: Option<usize>,
    /// Folder holding mnist/, fashion-mnist/ and text/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    pub(super) data: Option<std::path::PathBuf>,
    /// Read the loss back every this many steps (each read waits for the GPU).
    #[arg(long, default_value_t = 25)]
    pub(super) log_every: u64,
    /// Write metrics here as JSON lines (created at the start; `murmur plot` draws them): a
    /// line whenever the loss is read, every --log-every steps and at the end of each epoch
    /// (--log-every 1 for every step), with step, epoch, loss, learning rate, bytes (0 on
    /// one machine) and mean seconds per step since the previous line; and a line with the
    /// test accuracy after each epoch (the validation loss for gpt).
    #[arg(long)]
    pub(super) metrics: Option<PathBuf>,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    pub(super) quiet: bool,
}

/// Flags of `murmur train` that only the language model reads. They are options, so that
/// giving one to an image model is an error rather than silently ignored; defaults are
/// applied in [`LmArgs::resolved`].
#[derive(Args, Debug, Default)]
pub struct LmArgs {
    /// gpt: optimizer steps in the schedule [default: 3000].
    #[arg(long)]
    pub(super) steps: Option<u64>,
    /// gpt: bytes of context [default: 64].
    #[arg(long)]
    pub(super) context: Option<usize>,
    /// gpt: transformer blocks [default: 4].
    #[arg(long)]
    pub(super) layers: Option<usize>,
    /// gpt: model width [default: 64].
    #[arg(long)]
    pub(super) dim: Option<usize>,
    /// gpt: attention heads [default: 4].
    #[arg(long)]
    pub(super) heads: Option<usize>,
    /// gpt: validate (and checkpoint, with --save) every this many steps [default: 250].
    #[arg(long)]
    pub(super) eval_every: Option<u64>,
    /// gpt: validation windows of --context bytes, spread over the held-out plays
    /// [default: 256].
    #[arg(long)]
    pub(super) eval_windows: Option<usize>,
    /// gpt: bytes of text to sample at the end [default: 400].
    #[arg(long)]
    pub(super) sample_bytes: Option<usize>,
    /// gpt: sampling temperature, 0 = always the likeliest byte [default: 0.8].
    #[arg(long)]
    pub(super) temperature: Option<f32>,
}

impl TrainArgs {
    /// Refuses values no run could use, before any data is read or any step taken.
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        use super::flag_checks::{below_one, non_negative, positive, readable, writable};
        for (flag, value) in [("--lr", self.lr), ("--clip", self.clip)] {
            if let Some(v) = value {
                positive(flag, v)?;
            }
        }
        if let Some(t) = self.lm.temperature {
            non_negative("--temperature", t)?;
        }
        if let Some(w) = self.weight_decay {
            non_negative("--weight-decay", w)?;
        }
        if let Some(m) = self.momentum {
            below_one("--momentum", m)?;
        }
        if let Some(d) = self.dropout {
            below_one("--dropout", d)?;
        }
        for (flag, value) in [
            ("--batch", self.batch.map(|b| b as u64)),
            ("--epochs", self.epochs.map(u64::from)),
            ("--max-steps", self.max_steps),
            ("--train-limit", self.train_limit.map(|n| n as u64)),
            ("--log-every", Some(self.log_every)),
            ("--steps", self.lm.steps),
            ("--eval-every", self.lm.eval_every),
        ] {
            if value == Some(0) {
                return Err(crate::exit::usage(format!("{flag} must be at least 1")));
            }
        }
        if let Some(name) = &self.optim {
            (name.parse::<murmur_engine::train::OptimizerKind>())
                .map_err(|e| crate::exit::usage(e.to_string()))?;
        }
        if let Some(name) = &self.activation {
            (name.parse::<murmur_engine::nn::Activation>())
                .map_err(|e| crate::exit::usage(e.to_string()))?;
        }
        if let Some(path) = &self.save {
            writable("--save", path)?;
        }
        if let Some(path) = &self.metrics {
            writable("--metrics", path)?;
        }
        if let Some(path) = &self.resume {
            readable("--resume", path)?;
        }
        Ok(())
    }

    /// Image-model flags that were given (for refusing them with the language model).
    pub(super) fn image_flags_given(&self) -> Vec<&'static str> {
        [
            ("--epochs", self.epochs.is_some()),
            ("--optim", self.optim.is_some()),
            ("--hidden", self.hidden.is_some()),
            ("--activation", self.activation.is_some()),
            ("--momentum", self.momentum.is_some()),
            ("--train-limit", self.train_limit.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}
