//! `murmur train`: single-machine training with progress, per-epoch evaluation and a final
//! one-line JSON summary on stdout.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use murmur_engine::data::{default_root, epoch_batches, ImageDataset, ImageSet, Split};
use murmur_engine::nn::{Activation, Module};
use murmur_engine::train::{Classifier, ClassifierConfig, OptimizerKind};
use murmur_engine::{Device, Tensor};
use serde::Serialize;

use super::machine::Machine;

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub enum ModelKind {
    Mlp,
}

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The best GPU adapter (lavapipe where there is no GPU).
    Gpu,
    /// The CPU reference kernels (slow; for checking the GPU path).
    Cpu,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[arg(long, value_enum, default_value = "mlp")]
    model: ModelKind,
    /// mnist or fashion-mnist.
    #[arg(long, default_value = "mnist")]
    dataset: String,
    #[arg(long, default_value_t = 5)]
    epochs: u32,
    #[arg(long, default_value_t = 128)]
    batch: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// adamw or sgd.
    #[arg(long = "optim", default_value = "adamw")]
    optim: String,
    /// Hidden layer widths.
    #[arg(long, default_value = "512,256", value_delimiter = ',')]
    hidden: Vec<usize>,
    /// relu or gelu.
    #[arg(long, default_value = "relu")]
    activation: String,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f32,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value = "gpu")]
    device: DeviceKind,
    /// Stop after this many steps in total (for quick checks).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Use only the first N training samples.
    #[arg(long)]
    train_limit: Option<usize>,
    /// Folder holding mnist/ and fashion-mnist/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// Read the loss back every this many steps (each read waits for the GPU).
    #[arg(long, default_value_t = 25)]
    log_every: u64,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    quiet: bool,
}

#[derive(Serialize)]
struct Summary {
    model: String,
    dataset: String,
    device: String,
    machine: String,
    epochs: u32,
    steps: u64,
    batch: usize,
    optimizer: String,
    lr: f32,
    hidden: Vec<usize>,
    parameters: usize,
    seed: u64,
    test_accuracy: Vec<f64>,
    final_test_accuracy: f64,
    epoch_seconds: Vec<f64>,
    mean_epoch_seconds: f64,
    final_train_loss: f32,
    samples_per_second: f64,
}

impl DeviceKind {
    pub fn open(self) -> anyhow::Result<Device> {
        Ok(match self {
            DeviceKind::Cpu => Device::Cpu,
            DeviceKind::Gpu => Device::gpu()?,
        })
    }
}

/// A dataset's splits, and where they were read from.
pub struct Sets {
    pub train: ImageSet,
    pub test: ImageSet,
    pub dataset: ImageDataset,
    pub root: PathBuf,
}

/// Checks the batch and epoch counts, then loads a dataset's training split (the first
/// `train_limit` examples, if given) and its test split.
pub fn load_sets(
    dataset: &str,
    data: Option<&Path>,
    train_limit: Option<usize>,
    batch: usize,
    epochs: u32,
) -> anyhow::Result<Sets> {
    if batch == 0 || epochs == 0 {
        bail!("--batch and --epochs must be at least 1");
    }
    let dataset: ImageDataset = dataset.parse()?;
    let root = data.map_or_else(default_root, Path::to_path_buf);
    let mut train = dataset.load(&root, Split::Train)?;
    let test = dataset.load(&root, Split::Test)?;
    if let Some(n) = train_limit {
        train.truncate(n);
    }
    Ok(Sets {
        train,
        test,
        dataset,
        root,
    })
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    let Sets {
        train,
        test,
        dataset,
        root,
    } = load_sets(
        &a.dataset,
        a.data.as_deref(),
        a.train_limit,
        a.batch,
        a.epochs,
    )?;
    let device = a.device.open()?;
    let config = ClassifierConfig {
        hidden: a.hidden.clone(),
        activation: a.activation.parse::<Activation>()?,
        optimizer: a.optim.parse::<OptimizerKind>()?,
        lr: a.lr,
        weight_decay: a.weight_decay,
        momentum: a.momentum,
        nesterov: false,
        seed: a.seed,
    };
    let mut clf = Classifier::new(&device, train.features(), train.classes, &config)?;
    eprintln!(
        "murmur train: {:?} {:?} on {} ({} train / {} test samples), {} parameters, device {}",
        a.model,
        dataset.name(),
        root.display(),
        train.len(),
        test.len(),
        clf.model.parameter_count(),
        device
    );

    let steps_per_epoch = train.len().div_ceil(a.batch) as u64;
    let total_steps = (steps_per_epoch * a.epochs as u64).min(a.max_steps.unwrap_or(u64::MAX));
    let (mut epoch_seconds, mut accuracies) = (vec![], vec![]);
    let mut last_loss = f32::NAN;
    let mut samples = 0usize;
    let started = Instant::now();
    let mut train_seconds = 0.0;
    'epochs: for epoch in 0..a.epochs {
        let bar = progress_bar(
            a.quiet,
            steps_per_epoch.min(total_steps - clf.steps),
            epoch,
            a.epochs,
        );
        let epoch_start = Instant::now();
        let mut epoch_samples = 0usize;
        // The newest loss, read back only every --log-every steps: a read waits for the GPU.
        let mut latest: Option<Tensor> = None;
        for batch in epoch_batches(train.len(), a.batch, a.seed, epoch) {
            if clf.steps >= total_steps {
                break;
            }
            let (x, y) = train.batch(&batch);
            latest = Some(clf.step(&x, &y)?);
            samples += batch.len();
            epoch_samples += batch.len();
            bar.inc(1);
            if clf.steps % a.log_every.max(1) == 0 || clf.steps == total_steps {
                last_loss = latest
                    .take()
                    .map(|t| t.item())
                    .transpose()?
                    .unwrap_or(last_loss);
                let rate = samples as f64 / (train_seconds + epoch_start.elapsed().as_secs_f64());
                bar.set_message(format!("loss {last_loss:.4}  {rate:.0} samples/s"));
            }
        }
        last_loss = latest
            .take()
            .map(|t| t.item())
            .transpose()?
            .unwrap_or(last_loss);
        device.sync()?;
        let seconds = epoch_start.elapsed().as_secs_f64();
        train_seconds += seconds;
        bar.finish_and_clear();
        let accuracy = clf
            .accuracy(&test, 1000)
            .context("evaluating on the test set")?;
        eprintln!(
            "epoch {}/{}: train loss {last_loss:.4}, test accuracy {:.2}%, {seconds:.1} s ({:.0} samples/s)",
            epoch + 1,
            a.epochs,
            100.0 * accuracy,
            epoch_samples as f64 / seconds
        );
        epoch_seconds.push(seconds);
        accuracies.push(accuracy);
        if clf.steps >= total_steps {
            break 'epochs;
        }
    }
    let summary = Summary {
        model: format!("{:?}", a.model).to_lowercase(),
        dataset: a.dataset.clone(),
        device: device.to_string(),
        machine: Machine::detect().to_string(),
        epochs: epoch_seconds.len() as u32,
        steps: clf.steps,
        batch: a.batch,
        optimizer: a.optim.clone(),
        lr: a.lr,
        hidden: a.hidden.clone(),
        parameters: clf.model.parameter_count(),
        seed: a.seed,
        final_test_accuracy: *accuracies.last().unwrap_or(&0.0),
        test_accuracy: accuracies,
        mean_epoch_seconds: epoch_seconds.iter().sum::<f64>() / epoch_seconds.len().max(1) as f64,
        epoch_seconds,
        final_train_loss: last_loss,
        samples_per_second: samples as f64 / train_seconds.max(1e-9),
    };
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

fn progress_bar(quiet: bool, len: u64, epoch: u32, epochs: u32) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
    bar
}
