//! What the reproductions of the data-parallel papers share: the common options, loading the
//! data and the device, running a list of arms (one algorithm, codec and optimizer each) over
//! seeds with the simulator, and the raw per-epoch records written beside each table.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use murmur_engine::algo::sim::{simulate, steps_per_epoch, EpochReport, SimConfig};
use murmur_engine::algo::{Blocking, MethodSpec, OptimizerSpec};
use murmur_engine::data::{default_root, ImageDataset, ImageSet, Split};
use murmur_engine::nn::Module;
use murmur_engine::train::{Classifier, ClassifierConfig};
use murmur_engine::Device;
use serde::Serialize;

use super::report::{command_line, mean_std, results_path, write_keeping_notes};
use crate::commands::machine::Machine;
use murmur_node::DeviceKind;

#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// A short run (1 seed, 2 epochs on 30,000 samples) that finishes in minutes; writes to
    /// target/repro/ unless --out says otherwise.
    #[arg(long)]
    pub quick: bool,
    /// Simulated workers.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Seeds per arm [default: 2, quick 1].
    #[arg(long)]
    pub seeds: Option<u64>,
    /// Passes over the training set; the learning rate drops 10x after two thirds of them
    /// [default: 6, quick 2].
    #[arg(long)]
    pub epochs: Option<u32>,
    /// mnist or fashion-mnist.
    #[arg(long, default_value = "fashion-mnist")]
    pub dataset: String,
    /// Use only the first N training samples [default: all, quick 30000].
    #[arg(long)]
    pub train_limit: Option<usize>,
    /// Arms to run, by label, separated by semicolons (labels hold commas) [default: all].
    #[arg(long, value_delimiter = ';')]
    pub arms: Option<Vec<String>>,
    /// Hidden layer widths of the MLP.
    #[arg(long, value_delimiter = ',', default_value = "256,128")]
    pub hidden: Vec<usize>,
    /// Samples per worker per step.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceKind,
    /// Where the table goes [default: docs/results/<paper>.md, quick target/repro/<paper>.md].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The data, the device and the model every arm of a reproduction shares.
pub struct Bench {
    pub args: CommonArgs,
    pub seeds: u64,
    pub epochs: u32,
    pub out: PathBuf,
    pub dataset: ImageDataset,
    pub train: ImageSet,
    pub test: ImageSet,
    pub device: Device,
    /// The adapter's name, or the CPU path with its micro-kernel.
    pub adapter: String,
    /// Element counts of the model's parameter tensors.
    pub sizes: Vec<usize>,
    pub per_epoch: usize,
    pub started: Instant,
}

impl Bench {
    /// Loads what `args` names; `paper` names the default output file.
    pub fn new(args: CommonArgs, paper: &str) -> anyhow::Result<Self> {
        let seeds = args.seeds.unwrap_or(if args.quick { 1 } else { 2 });
        let epochs = args.epochs.unwrap_or(if args.quick { 2 } else { 6 });
        let out = results_path(&args.out, args.quick, &format!("{paper}.md"));
        let (dataset, train, test) = load_images(
            &args.dataset,
            args.train_limit.or(args.quick.then_some(30_000)),
        )?;
        let (device, adapter) = open_device(args.device)?;
        let probe = Classifier::new(
            &Device::Cpu,
            train.features(),
            train.classes,
            &Bench::model_of(&args, 0),
        )?;
        let sizes = probe.model.parameters().iter().map(|p| p.numel()).collect();
        let per_epoch = steps_per_epoch(train.len(), args.workers, args.batch);
        Ok(Bench {
            seeds,
            epochs,
            out,
            dataset,
            train,
            test,
            device,
            adapter,
            sizes,
            per_epoch,
            started: Instant::now(),
            args,
        })
    }

    fn model_of(args: &CommonArgs, seed: u64) -> ClassifierConfig {
        ClassifierConfig {
            hidden: args.hidden.clone(),
            seed,
            ..ClassifierConfig::default()
        }
    }

    /// The classifier of seed `seed`, on the CPU: what calibrations probe.
    pub fn classifier(&self, seed: u64) -> anyhow::Result<Classifier> {
        Ok(Classifier::new(
            &Device::Cpu,
            self.train.features(),
            self.train.classes,
            &Bench::model_of(&self.args, seed),
        )?)
    }

    pub fn parameters(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// The epoch at whose start the learning rate drops 10x (1-based, for the text).
    pub fn decay_epoch(&self) -> u32 {
        (2 * self.epochs).div_ceil(3) + 1
    }

    /// The shared part of a results file's setup paragraph: data, model, workers, schedule.
    pub fn setup(&self) -> String {
        format!(
            "{} ({} training samples) with an MLP {:?} ({} parameters); {} workers x {} samples \
             per step ({} steps per epoch), {} epochs, learning rate dropping 10x at epoch {}",
            self.dataset.name(),
            self.train.len(),
            self.args.hidden,
            self.parameters(),
            self.args.workers,
            self.args.batch,
            self.per_epoch,
            self.epochs,
            self.decay_epoch()
        )
    }

    /// Runs `arms` (those `--arms` selected, through `report::keep_arms`) over the seeds,
    /// announcing the plan as `title` (with `detail`) and showing progress on stderr.
    pub fn run(&self, title: &str, detail: &str, arms: Vec<Arm>) -> anyhow::Result<Vec<ArmResult>> {
        eprintln!(
            "{title}: {} arms x {} seeds, {} workers, {} epochs of {} steps on {}{detail}, {}",
            arms.len(),
            self.seeds,
            self.args.workers,
            self.epochs,
            self.per_epoch,
            self.dataset.name(),
            self.adapter
        );
        let total = arms.len() as u64 * self.seeds;
        let mut done = 0;
        let mut results = Vec::new();
        for arm in arms {
            let mut runs = Vec::new();
            for seed in 0..self.seeds {
                done += 1;
                let config = SimConfig {
                    method: arm.method,
                    codec: arm.codec.clone(),
                    optimizer: arm.optimizer,
                    blocking: arm.blocking,
                    workers: self.args.workers,
                    batch: self.args.batch,
                    epochs: self.epochs,
                    lr: arm.lr,
                    decay_at: vec![self.decay_epoch() - 1],
                    weight_decay: arm.weight_decay,
                    seed,
                    model: Bench::model_of(&self.args, seed),
                };
                let label = format!("[{done}/{total}] {} seed {seed}", arm.label);
                let reports = simulate(&config, &self.train, &self.test, &self.device, |r| {
                    eprintln!(
                        "{label}: epoch {}/{} test {:.2}% loss {:.4} ({:.0} s)",
                        r.epoch + 1,
                        self.epochs,
                        100.0 * r.test_accuracy,
                        r.train_loss,
                        r.seconds
                    );
                })
                .with_context(|| label.clone())?;
                runs.push(reports);
            }
            results.push(ArmResult { arm, runs });
        }
        Ok(results)
    }

    /// The first lines of a results file: its title and how it was made.
    pub fn header(&self, title: &str) -> String {
        format!(
            "# {title}\n\nGenerated by `{}` on {}, {}, in {:.0} minutes. Raw per-epoch numbers: \
             `{}`.\n\n",
            command_line(),
            Machine::detect(),
            self.adapter,
            self.started.elapsed().as_secs_f64() / 60.0,
            self.out.with_extension("json").display()
        )
    }

    /// Writes the table (keeping its notes) and the raw numbers beside it, and shows both.
    pub fn finish(&self, text: &str, results: &[ArmResult]) -> anyhow::Result<()> {
        write_keeping_notes(&self.out, text)?;
        self.write_records(results)?;
        println!("{text}");
        eprintln!(
            "wrote {} in {:.1} minutes",
            self.out.display(),
            self.started.elapsed().as_secs_f64() / 60.0
        );
        Ok(())
    }

    /// Writes the raw per-epoch numbers beside the table.
    fn write_records(&self, results: &[ArmResult]) -> anyhow::Result<()> {
        let records: Vec<RunRecord> = results
            .iter()
            .flat_map(|r| {
                r.runs.iter().enumerate().map(|(seed, epochs)| RunRecord {
                    arm: r.arm.label.clone(),
                    method: r.arm.method.to_string(),
                    codec: r.arm.codec.clone(),
                    optimizer: r.arm.optimizer.to_string(),
                    seed: seed as u64,
                    epochs: epochs.clone(),
                })
            })
            .collect();
        let path = self.out.with_extension("json");
        std::fs::write(&path, serde_json::to_string_pretty(&records)?)
            .with_context(|| format!("writing {}", path.display()))?;
        for png in super::figures::arms(&path)? {
            eprintln!("wrote {}", png.display());
        }
        Ok(())
    }
}

/// An image dataset by name, its training split cut to `train_limit` samples if given.
pub fn load_images(
    name: &str,
    train_limit: Option<usize>,
) -> anyhow::Result<(ImageDataset, ImageSet, ImageSet)> {
    let dataset: ImageDataset = name.parse()?;
    let root = default_root();
    let mut train = dataset.load(&root, Split::Train)?;
    let test = dataset.load(&root, Split::Test)?;
    if let Some(n) = train_limit {
        train.truncate(n);
    }
    Ok((dataset, train, test))
}

/// The device a reproduction trains on, and the name its results file gives it.
pub fn open_device(kind: DeviceKind) -> anyhow::Result<(Device, String)> {
    let device = kind.open()?;
    let adapter = device.as_gpu().map_or_else(
        || format!("the CPU path ({})", murmur_engine::cpu::gemm::describe()),
        |g| g.info().adapter.name.clone(),
    );
    Ok((device, adapter))
}

/// One configuration of a reproduction.
#[derive(Debug, Clone)]
pub struct Arm {
    /// Its name in the table and in `--arms`.
    pub label: String,
    pub method: MethodSpec,
    pub codec: String,
    pub optimizer: OptimizerSpec,
    pub blocking: Blocking,
    pub lr: f32,
    pub weight_decay: f32,
}

/// An arm's runs, one per seed.
pub struct ArmResult {
    pub arm: Arm,
    pub runs: Vec<Vec<EpochReport>>,
}

impl ArmResult {
    /// Best test accuracy over epochs, per seed, in %.
    pub fn best_accuracy(&self) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| {
                r.iter()
                    .map(|e| e.test_accuracy * 100.0)
                    .fold(0.0, f64::max)
            })
            .collect()
    }

    /// A figure of the last epoch, per seed.
    pub fn last(&self, f: impl Fn(&EpochReport) -> f64) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| f(r.last().expect("epochs")))
            .collect()
    }

    /// Mean over seeds of the best accuracy.
    pub fn accuracy(&self) -> f64 {
        mean_std(&self.best_accuracy()).0
    }

    /// Mean over seeds of the final training loss.
    pub fn final_loss(&self) -> f64 {
        mean_std(&self.last(|e| e.train_loss)).0
    }

    /// Bytes one worker moved per step, both ways (counted, first seed).
    pub fn bytes_per_step(&self, workers: usize, per_epoch: usize) -> f64 {
        let total: u64 = self.runs[0].iter().map(|e| e.bytes).sum();
        total as f64 / (workers * per_epoch * self.runs[0].len()) as f64
    }
}

#[derive(Serialize)]
struct RunRecord {
    arm: String,
    method: String,
    codec: String,
    optimizer: String,
    seed: u64,
    epochs: Vec<EpochReport>,
}
