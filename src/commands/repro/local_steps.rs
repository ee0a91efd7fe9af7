//! `murmur repro local-steps`: outer rounds of H local steps (DiLoCo) with compressed
//! pseudo-gradients against data parallelism that exchanges gradients every step (issue 27).
//! Every arm is a local swarm of 4 workers and 2 shards as threads of this process, over QUIC
//! on loopback, training the MLP on MNIST or Fashion-MNIST for the same epochs (so over the
//! same training samples); the table gives the final test accuracy, the bytes each worker
//! moved (both directions) and how many times fewer they are than the step-wise f32 arm's,
//! as measured in the same run.
//!
//! Finished arms are kept in the JSON beside the table and skipped when the command runs
//! again with the same settings, so a long run can be stopped and resumed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use murmur_engine::data::ImageDataset;
use murmur_node::swarm::{Launch, LocalSwarm, SwarmConfig, SwarmEvent};
use murmur_node::{Event, Job};
use serde::{Deserialize, Serialize};

use super::report::{
    command_line, list_or, results_path, write_json, write_keeping_notes, KeptArms,
};
use crate::commands::machine::Machine;

#[derive(Args, Debug, Clone)]
pub struct LocalStepsArgs {
    /// A short run (1 epoch on 12,000 MNIST samples; f32 and sign, step-wise and H = 8) that
    /// finishes in about a minute; writes to target/repro/ unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// Datasets, separated by semicolons [default: mnist;fashion-mnist, quick mnist];
    /// `shakespeare` trains `murmur repro swarm-gpt`'s GPT for 1,500 optimizer steps of 8
    /// sequences per worker (the image settings below do not apply to it).
    #[arg(long, value_delimiter = ';')]
    datasets: Option<Vec<String>>,
    /// Passes over the training set [default: 8, quick 1].
    #[arg(long)]
    epochs: Option<u32>,
    /// Use only the first N training samples [default: all, quick 12000].
    #[arg(long)]
    train_limit: Option<usize>,
    /// Samples per worker per optimizer step.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Codecs of the step-wise arms, separated by semicolons [default: f32;topk:0.01;sign,
    /// quick f32;sign]. The f32 arm is what the others' bytes are compared with.
    #[arg(long, value_delimiter = ';')]
    stepwise: Option<Vec<String>>,
    /// Local steps per outer round, separated by commas [default: 1,8,32,128, quick 8].
    #[arg(long, value_delimiter = ',')]
    local_steps: Option<Vec<u32>>,
    /// Codecs of the pseudo-gradients, separated by semicolons [default:
    /// f32;topk:0.01;sign;hybrid:bits=2:topk=0.05, quick f32;sign].
    #[arg(long, value_delimiter = ';')]
    codecs: Option<Vec<String>>,
    /// The outer optimizer: `auto` (averaging for sparse and sign pseudo-gradients, whose
    /// error feedback already carries what momentum would; DiLoCo's Nesterov for f32 and
    /// dense quantizers), `nesterov` (lr 0.7, momentum 0.9) or `average` (lr 1, no momentum)
    /// for every arm.
    #[arg(long, value_enum, default_value_t = Outer::Auto)]
    outer: Outer,
    /// Seed of the model, the data order and the codecs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    run: KeptArms,
    /// Where the table goes [default: docs/results/local-steps.md, quick
    /// target/repro/local-steps.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Which outer optimizer the arms take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Outer {
    Auto,
    Nesterov,
    Average,
}

impl Outer {
    /// Learning rate and momentum for pseudo-gradients coded with `codec`.
    fn settings(self, codec: &str) -> (f32, f32) {
        match self {
            Outer::Nesterov => (0.7, 0.9),
            Outer::Average => (1.0, 0.0),
            // Sparse and sign codes leave most of a pseudo-gradient in the error feedback,
            // which then acts as a momentum of its own: Nesterov on top overshoots
            // (docs/results/local-steps.md). Dense codes (f32, block or dithered quantizers)
            // take DiLoCo's Nesterov step.
            Outer::Auto
                if ["topk", "randk", "sign", "hybrid"]
                    .iter()
                    .any(|c| codec.starts_with(c)) =>
            {
                (1.0, 0.0)
            }
            Outer::Auto => (0.7, 0.9),
        }
    }
}

/// What every arm shares; arms kept from an earlier run must have been made with the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Settings {
    seed: u64,
    epochs: u32,
    train_limit: Option<usize>,
    batch: usize,
    workers: u16,
    servers: u16,
}

/// One measurement of an arm's model during its run.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Point {
    /// Rounds played.
    round: u64,
    /// Test accuracy in [0, 1] (image models), or validation loss in nats per byte (the GPT).
    #[serde(alias = "accuracy")]
    value: f64,
    /// Bytes the first worker had moved by then, both ways.
    bytes: u64,
    /// Seconds since the swarm started.
    seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ArmResult {
    dataset: String,
    /// Local steps per round; `None` for a step-wise arm.
    local_steps: Option<u32>,
    codec: String,
    outer_lr: Option<f32>,
    outer_momentum: Option<f32>,
    /// The final test accuracy, in [0, 1] (every worker measures the last round's model); image
    /// models.
    accuracy: Option<f64>,
    /// The final validation loss in nats per byte; the GPT.
    #[serde(default)]
    valid_loss: Option<f64>,
    /// Bytes per worker, pushed and pulled together, averaged over the workers.
    bytes_per_worker: f64,
    rounds: u64,
    seconds: f64,
    /// The measurements during the run, one per epoch.
    curve: Vec<Point>,
}

impl ArmResult {
    /// The final measure as the table shows it.
    fn measure(&self) -> String {
        match (self.accuracy, self.valid_loss) {
            (Some(a), _) => format!("{:.2}%", 100.0 * a),
            (None, Some(l)) => format!("{l:.4} nats/byte"),
            (None, None) => "–".into(),
        }
    }

    fn label(&self) -> String {
        match self.local_steps {
            None => format!("{} every step", self.codec),
            Some(h) => format!("{} H={h}", self.codec),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Results {
    settings: Settings,
    arms: Vec<ArmResult>,
}

const WORKERS: u16 = 4;
const SERVERS: u16 = 2;

/// An arm to run: dataset, local steps (or step-wise), codec, outer optimizer.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    dataset: String,
    local_steps: Option<u32>,
    codec: String,
    outer: Option<(f32, f32)>,
}

impl Plan {
    fn matches(&self, r: &ArmResult) -> bool {
        r.dataset == self.dataset
            && r.local_steps == self.local_steps
            && r.codec == self.codec
            && self.outer.map(|o| o.0) == r.outer_lr
            && self.outer.map(|o| o.1) == r.outer_momentum
    }
}

pub fn run(a: LocalStepsArgs) -> anyhow::Result<()> {
    let epochs = a.epochs.unwrap_or(if a.quick { 1 } else { 8 });
    let train_limit = a.train_limit.or(a.quick.then_some(12_000));
    let settings = Settings {
        seed: a.seed,
        epochs,
        train_limit,
        batch: a.batch,
        workers: WORKERS,
        servers: SERVERS,
    };
    let datasets = list_or(
        &a.datasets,
        if a.quick {
            &["mnist"]
        } else {
            &["mnist", "fashion-mnist"]
        },
    );
    let stepwise = list_or(
        &a.stepwise,
        if a.quick {
            &["f32", "sign"]
        } else {
            &["f32", "topk:0.01", "sign"]
        },
    );
    let codecs = list_or(
        &a.codecs,
        if a.quick {
            &["f32", "sign"]
        } else {
            &["f32", "topk:0.01", "sign", "hybrid:bits=2:topk=0.05"]
        },
    );
    let hs = a.local_steps.clone().unwrap_or_else(|| {
        if a.quick {
            vec![8]
        } else {
            vec![1, 8, 32, 128]
        }
    });
    let mut plans = Vec::new();
    for dataset in &datasets {
        for codec in &stepwise {
            plans.push(Plan {
                dataset: dataset.clone(),
                local_steps: None,
                codec: codec.clone(),
                outer: None,
            });
        }
        for &h in &hs {
            for codec in &codecs {
                plans.push(Plan {
                    dataset: dataset.clone(),
                    local_steps: Some(h),
                    codec: codec.clone(),
                    outer: Some(a.outer.settings(codec)),
                });
            }
        }
    }
    // Every arm's job is checked before the first one runs: a typo costs no hour.
    for plan in &plans {
        job(&settings, plan)
            .validate()
            .map_err(|e| crate::exit::usage(format!("{} {}: {e}", plan.dataset, plan.codec)))?;
    }
    let out = results_path(&a.out, a.quick, "local-steps.md");
    let json = out.with_extension("json");
    let mut results = Results {
        settings: settings.clone(),
        arms: Vec::new(),
    };
    if let Some(kept) = a
        .run
        .kept::<Results>(&json)?
        .filter(|r| r.settings == settings)
    {
        results.arms = kept.arms;
    }
    for (i, plan) in plans.iter().enumerate() {
        if results.arms.iter().any(|r| plan.matches(r)) {
            continue;
        }
        eprintln!(
            "local-steps [{}/{}]: {}, {}, {}",
            i + 1,
            plans.len(),
            plan.dataset,
            plan.local_steps
                .map_or("every step".into(), |h| format!("H = {h}")),
            plan.codec
        );
        let arm = run_arm(&a, &settings, plan)?;
        eprintln!(
            "local-steps: {} {}: {} with {:.1} MB per worker in {:.0} s",
            arm.dataset,
            arm.label(),
            arm.measure(),
            arm.bytes_per_worker / 1e6,
            arm.seconds
        );
        results.arms.push(arm);
        write_json(&json, &results)?;
    }
    // One order whichever runs made the arms (the figure follows the JSON): by dataset, the
    // step-wise arms first, then H rising, and the codecs in the default list's order.
    const DATASETS: [&str; 3] = ["mnist", "fashion-mnist", GPT_DATASET];
    const CODECS: [&str; 4] = ["f32", "topk:0.01", "sign", "hybrid:bits=2:topk=0.05"];
    let at = |list: &[&str], v: &str| list.iter().position(|x| *x == v).unwrap_or(list.len());
    let place = |r: &ArmResult| {
        (
            at(&DATASETS, &r.dataset),
            r.dataset.clone(),
            r.local_steps.map_or(0, |h| u64::from(h) + 1),
            at(&CODECS, &r.codec),
            r.codec.clone(),
        )
    };
    results.arms.sort_by_key(place);
    if !results.arms.is_empty() {
        write_json(&json, &results)?;
    }
    let stem = out.file_stem().map_or_else(
        || "local-steps".into(),
        |s| s.to_string_lossy().into_owned(),
    );
    let device = a.run.device.open()?;
    // Every dataset the JSON holds (in the arms' order): one table for all the runs.
    let mut shown: Vec<String> = Vec::new();
    for arm in &results.arms {
        if !shown.contains(&arm.dataset) {
            shown.push(arm.dataset.clone());
        }
    }
    let text = report(&settings, &stem, &shown, &results.arms, &device);
    write_keeping_notes(&out, &text)?;
    println!("{text}");
    for png in super::figures::local_steps(&json)? {
        eprintln!("wrote {}", png.display());
    }
    eprintln!("wrote {} and {}", out.display(), json.display());
    Ok(())
}

/// The dataset of the GPT's arms.
const GPT_DATASET: &str = "shakespeare";
/// Optimizer steps of a GPT arm (`murmur repro swarm-gpt`'s rounds).
const GPT_STEPS: u64 = 1500;

/// The job of one arm. Images: the demo's model, the learning rate warmed up over a tenth of
/// the rounds, then decayed along a cosine to a tenth. Text: `murmur repro swarm-gpt`'s GPT
/// and schedule, over the same optimizer steps whatever the local steps. Every round waits
/// for every worker and is cut equally: the arms compare algorithms, not the machine's
/// timing.
fn job(settings: &Settings, plan: &Plan) -> Job {
    let per_round = u64::from(plan.local_steps.unwrap_or(1));
    let mut job = Job {
        workers: WORKERS,
        dataset: plan.dataset.clone(),
        epochs: settings.epochs,
        batch: settings.batch,
        train_limit: settings.train_limit,
        codec: plan.codec.clone(),
        memory: "ef".into(),
        server_memory: "ef".into(),
        // Every tensor but the biases travels compressed (BytePS's 1 MB threshold would send
        // the second layer in f32 and dominate the bytes).
        min_compress_bytes: 4096,
        seed: settings.seed,
        quorum: 1.0,
        shares: "equal".into(),
        local_steps: plan.local_steps,
        ..Job::default()
    };
    if let Some((lr, momentum)) = plan.outer {
        (job.outer_lr, job.outer_momentum) = (lr, momentum);
    }
    if plan.dataset == GPT_DATASET {
        return Job {
            model: "gpt".into(),
            batch: 8,
            steps: Some(GPT_STEPS.div_ceil(per_round)),
            eval_every: Some((250 / per_round).max(1)),
            // swarm-gpt's 100 steps of warm-up, in rounds.
            warmup: Some((100 / per_round).max(1)),
            lr: 3e-3,
            train_limit: None,
            ..job
        };
    }
    let samples = plan
        .dataset
        .parse::<ImageDataset>()
        .map(|d| d.train_samples())
        .unwrap_or(60_000);
    let (_, rounds) = job.steps(settings.train_limit.map_or(samples, |n| n.min(samples)));
    job.warmup = Some((rounds / 10).max(1));
    job
}

fn run_arm(a: &LocalStepsArgs, settings: &Settings, plan: &Plan) -> anyhow::Result<ArmResult> {
    let dir = crate::commands::fresh_temp_dir("murmur-repro-local-steps-")?;
    let job = job(settings, plan);
    let started = Instant::now();
    let swarm = LocalSwarm::start(
        SwarmConfig {
            device: a.run.device,
            data: a.run.data.clone(),
            deadline_s: 120.0,
            ..SwarmConfig::new(SERVERS, job, dir.clone())
        },
        Launch::Threads,
    )?;
    let (mut ended, mut done) = (0, Vec::new());
    // The first worker's bytes after each round, for the curve.
    let mut moved = vec![0u64];
    let mut curve = Vec::new();
    while ended < usize::from(WORKERS) {
        let Some(event) = swarm.next_event(Duration::from_secs(600)) else {
            anyhow::bail!("the swarm said nothing for 10 minutes");
        };
        match event {
            SwarmEvent::Ended { index, error } => {
                ended += 1;
                if let Some(e) = error {
                    anyhow::bail!("worker {index} failed: {e}");
                }
            }
            SwarmEvent::Worker { index, event } => match event {
                Event::Step {
                    step,
                    pushed,
                    pulled,
                    ..
                } if index == 0 => {
                    let last = *moved.last().expect("starts with 0");
                    moved.resize(step as usize, last);
                    moved.push(last + (pushed + pulled) as u64);
                }
                Event::Evaluated {
                    step,
                    accuracy: value,
                    ..
                }
                | Event::Validated {
                    step,
                    valid_loss: value,
                    ..
                } => curve.push(Point {
                    round: step,
                    value,
                    bytes: 0,
                    seconds: started.elapsed().as_secs_f64(),
                }),
                Event::Done {
                    steps,
                    final_accuracy,
                    final_valid_loss,
                    bytes_pushed,
                    bytes_pulled,
                    ..
                } => done.push((
                    steps,
                    final_accuracy,
                    final_valid_loss,
                    bytes_pushed + bytes_pulled,
                )),
                _ => {}
            },
        }
    }
    swarm.finish()?;
    let _ = std::fs::remove_dir_all(&dir);
    for point in &mut curve {
        point.bytes = moved
            .get(point.round as usize)
            .or(moved.last())
            .copied()
            .unwrap_or(0);
    }
    // Every worker measures the last round; ranks in turn measure the epochs before.
    curve.sort_by_key(|p| p.round);
    curve.dedup_by_key(|p| p.round);
    let accuracy = done.iter().find_map(|d| d.1);
    let valid_loss = done.iter().find_map(|d| d.2);
    if accuracy.is_none() && valid_loss.is_none() {
        anyhow::bail!("no worker measured the final model");
    }
    let rounds = done.iter().map(|d| d.0).max().unwrap_or(0);
    let bytes_per_worker = done.iter().map(|d| d.3 as f64).sum::<f64>() / done.len().max(1) as f64;
    Ok(ArmResult {
        dataset: plan.dataset.clone(),
        local_steps: plan.local_steps,
        codec: plan.codec.clone(),
        outer_lr: plan.outer.map(|o| o.0),
        outer_momentum: plan.outer.map(|o| o.1),
        accuracy,
        valid_loss,
        bytes_per_worker,
        rounds,
        seconds: started.elapsed().as_secs_f64(),
        curve,
    })
}

fn report(
    settings: &Settings,
    stem: &str,
    datasets: &[String],
    arms: &[ArmResult],
    device: &murmur_engine::Device,
) -> String {
    let mut text = format!(
        "# Local steps: outer rounds of H steps against exchanging every step\n\nGenerated by \
         `{}` on {}, device {device}; the arms took {:.0} minutes (arms are kept from earlier \
         runs of the same settings). Raw numbers: `{stem}.json`; figure: \
         `{stem}-accuracy.png`.\n\nSetup: {} workers and {} parameter-server shards as threads \
         of one process over QUIC on loopback, seed {}; worker and server error feedback; \
         every tensor over 4 kB compressed; every round waits for every worker, cut equally. \
         Images: the MLP 784-512-256-10 with AdamW at lr 2e-3 (warmed up over a tenth of the \
         rounds, then decayed along a cosine to a tenth), {} epochs{}, {} samples per worker \
         and step. Text: the byte-level GPT of `murmur repro swarm-gpt` (4 blocks, width 64, \
         context 64) on Shakespeare, {GPT_STEPS} optimizer steps of 8 sequences per worker, \
         AdamW at peak lr 3e-3 (its warm-up and cosine), clipped to norm 1.\n\nA step-wise \
         arm exchanges gradients every step; an arm of H local steps has each worker take H \
         AdamW steps on its share of the round (H global batches), push its pseudo-gradient \
         (the round's starting parameters minus its own) through the codec with error \
         feedback, and step the shared parameters with the outer optimizer (`outer`: learning \
         rate and Nesterov momentum). Every arm trains on the same samples. Bytes are each \
         worker's, pushed and pulled together; there is no initial parameter download (every \
         worker builds the seed's model) and no catch-up (no worker leaves). `× fewer` \
         divides the step-wise f32 arm's bytes by the arm's; `against f32` is the final \
         measure against that arm's.\n\n",
        command_line(),
        Machine::detect(),
        arms.iter().map(|a| a.seconds).sum::<f64>() / 60.0,
        settings.workers,
        settings.servers,
        settings.seed,
        settings.epochs,
        settings
            .train_limit
            .map_or(String::new(), |n| format!(" on the first {n} samples")),
        settings.batch,
    );
    for dataset in datasets {
        let rows: Vec<&ArmResult> = arms.iter().filter(|r| &r.dataset == dataset).collect();
        if rows.is_empty() {
            continue;
        }
        let f32_arm = rows
            .iter()
            .find(|r| r.local_steps.is_none() && r.codec == "f32")
            .copied();
        let measure = if dataset == GPT_DATASET {
            "validation nats/byte"
        } else {
            "test accuracy"
        };
        text.push_str(&format!(
            "## {dataset}\n\n| H | codec | outer | {measure} | against f32 | MB per worker | × fewer | rounds | seconds |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n"
        ));
        for r in rows {
            let against = match (f32_arm, r.accuracy, r.valid_loss) {
                (Some(f), Some(a), _) => f
                    .accuracy
                    .map_or("–".into(), |fa| format!("{:+.2} pt", 100.0 * (a - fa))),
                (Some(f), None, Some(l)) => f
                    .valid_loss
                    .map_or("–".into(), |fl| format!("{:+.4}", l - fl)),
                _ => "–".into(),
            };
            let fewer = f32_arm.map_or("–".into(), |f| {
                format!("{:.0}", f.bytes_per_worker / r.bytes_per_worker.max(1.0))
            });
            text.push_str(&format!(
                "| {} | {} | {} | {} | {against} | {:.2} | {fewer} | {} | {:.0} |\n",
                r.local_steps.map_or("every step".into(), |h| h.to_string()),
                r.codec,
                r.outer_lr
                    .zip(r.outer_momentum)
                    .map_or("–".into(), |(lr, m)| format!("{lr}, {m}")),
                r.measure(),
                r.bytes_per_worker / 1e6,
                r.rounds,
                r.seconds,
            ));
        }
        text.push('\n');
    }
    text.push_str(
        "Acceptance (issue 27): on MNIST, an arm with at least 1000× fewer bytes per worker \
         than the step-wise f32 arm, at no more than 0.5 pt lower test accuracy; on the GPT, \
         at least 100× fewer within 0.05 nats/byte.\n",
    );
    text
}
