//! `murmur repro swarm-gpt`: the byte-level GPT trained data parallel by a local swarm (one
//! shard and the workers as threads of this process, over QUIC on loopback) beside the same
//! model trained in one process on the same total batch (issue 20 item 7). Every arm sees
//! the same global batches: round r's are the windows that (seed, r) picks, cut into the
//! workers' shares.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use murmur_engine::data::{default_root, TextCorpus};
use murmur_engine::train::LanguageModel;
use murmur_node::swarm::{Launch, LocalSwarm, SwarmConfig, SwarmEvent};
use murmur_node::{DeviceKind, Event, Job};
use serde::Serialize;

use super::report::{command_line, keep_arms, results_path, write_keeping_notes};
use crate::commands::machine::Machine;

#[derive(Args, Debug, Clone)]
pub struct SwarmGptArgs {
    /// A short run (200 rounds) that finishes in a few minutes; writes to target/repro/
    /// unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// Workers of the swarm arms.
    #[arg(long, default_value_t = 4)]
    workers: u16,
    /// Rounds (optimizer steps) of every arm [default: 1500, quick 200].
    #[arg(long)]
    steps: Option<u64>,
    /// Sequences in a round's global batch: the single process's batch, split evenly over
    /// the workers.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// AdamW's peak learning rate (warm-up over a tenth of the rounds up to 100, then cosine
    /// decay to a tenth), as `murmur train --model gpt` has it.
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
    /// Measure the validation loss every this many rounds.
    #[arg(long, default_value_t = 250)]
    eval_every: u64,
    /// The GPT's context in bytes [default: the engine's, 64].
    #[arg(long)]
    context: Option<usize>,
    /// The GPT's transformer blocks [default: 4].
    #[arg(long)]
    layers: Option<usize>,
    /// The GPT's width [default: 64].
    #[arg(long)]
    dim: Option<usize>,
    /// The GPT's attention heads per block [default: 4].
    #[arg(long)]
    heads: Option<usize>,
    /// Seed of the model, the batches and the codecs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Arms to run, by label, separated by semicolons [default: all].
    #[arg(long, value_delimiter = ';')]
    arms: Option<Vec<String>>,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// The datasets' folder [default: $MURMUR_DATA, else ./data].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where the table goes [default: docs/results/swarm-gpt.md, quick
    /// target/repro/swarm-gpt.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One arm: the single process (no codec), or a swarm pushing and replying with `codec`.
struct Arm {
    label: &'static str,
    codec: Option<&'static str>,
}

fn arms() -> Vec<Arm> {
    vec![
        Arm {
            label: "one process",
            codec: None,
        },
        Arm {
            label: "swarm, f32",
            codec: Some("f32"),
        },
        Arm {
            label: "swarm, top-10% + EF",
            codec: Some("topk:0.1"),
        },
        Arm {
            label: "swarm, top-1% + EF",
            codec: Some("topk:0.01"),
        },
    ]
}

#[derive(Serialize)]
struct ArmResult {
    label: String,
    codec: Option<String>,
    /// (round, validation nats per byte).
    valid_loss: Vec<(u64, f64)>,
    /// Bytes a worker sent and received per round, and the same in f32 (0 for one process).
    bytes_per_round: f64,
    f32_bytes_per_round: f64,
    seconds: f64,
}

impl ArmResult {
    fn last(&self) -> f64 {
        self.valid_loss.last().map_or(f64::NAN, |(_, l)| *l)
    }
}

pub fn run(a: SwarmGptArgs) -> anyhow::Result<()> {
    let arms = keep_arms(arms(), &a.arms, |x| x.label)?;
    if a.workers == 0 || a.batch < a.workers as usize || a.eval_every == 0 {
        return Err(crate::exit::usage(
            "--workers must be at least 1, --batch at least --workers and --eval-every at least 1",
        ));
    }
    let steps = a.steps.unwrap_or(if a.quick { 200 } else { 1500 });
    let out = results_path(&a.out, a.quick, "swarm-gpt.md");
    let started = Instant::now();
    let job = Job {
        model: "gpt".into(),
        dataset: "shakespeare".into(),
        workers: a.workers,
        batch: a.batch / a.workers as usize,
        steps: Some(steps),
        eval_every: Some(a.eval_every),
        context: a.context,
        layers: a.layers,
        dim: a.dim,
        heads: a.heads,
        lr: a.lr,
        seed: a.seed,
        memory: "ef".into(),
        server_memory: "ef".into(),
        min_compress_bytes: 0,
        // Every round waits for every worker, cut equally: the arms compare algorithms, not
        // churn or the machine's timing, and rerun to the same bits.
        quorum: 1.0,
        shares: "equal".into(),
        ..Job::default()
    };
    if job.batch * a.workers as usize != a.batch {
        return Err(crate::exit::usage(format!(
            "--batch {} does not split evenly over {} workers",
            a.batch, a.workers
        )));
    }
    job.validate()?;
    let device = a.device.open()?;
    let mut results = Vec::new();
    for arm in &arms {
        eprintln!("swarm-gpt: {} ({steps} rounds)", arm.label);
        let result = match arm.codec {
            None => one_process(&a, arm, &job, steps, &device)?,
            Some(codec) => swarm(&a, arm, &job, codec)?,
        };
        eprintln!(
            "swarm-gpt: {}: validation loss {:.4} nats/byte in {:.0} s",
            arm.label,
            result.last(),
            result.seconds
        );
        results.push(result);
    }
    let text = report(&a, &job, steps, &device, &results, started);
    write_keeping_notes(&out, &text)?;
    let json = out.with_extension("json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    println!("{text}");
    eprintln!("wrote {} and {}", out.display(), json.display());
    Ok(())
}

/// The reference: the same model, schedule and global batches, in this process.
fn one_process(
    a: &SwarmGptArgs,
    arm: &Arm,
    job: &Job,
    steps: u64,
    device: &murmur_engine::Device,
) -> anyhow::Result<ArmResult> {
    let root = a.data.clone().unwrap_or_else(default_root);
    let corpus = TextCorpus::load_shakespeare(&root)?;
    let started = Instant::now();
    let mut lm = LanguageModel::new(device, &job.lm_config())?;
    let mut valid_loss = Vec::new();
    for step in 1..=steps {
        lm.step(&corpus.train)?;
        if step % a.eval_every == 0 || step == steps {
            valid_loss.push((step, lm.evaluate(&corpus.valid, 256, 32)?));
        }
    }
    Ok(ArmResult {
        label: arm.label.to_string(),
        codec: arm.codec.map(str::to_string),
        valid_loss,
        bytes_per_round: 0.0,
        f32_bytes_per_round: 0.0,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A local swarm of threads with one shard, pushing and replying with `codec`.
fn swarm(a: &SwarmGptArgs, arm: &Arm, job: &Job, codec: &str) -> anyhow::Result<ArmResult> {
    let dir = crate::commands::fresh_temp_dir("murmur-repro-swarm-gpt-")?;
    let started = Instant::now();
    let swarm = LocalSwarm::start(
        SwarmConfig {
            device: a.device,
            data: a.data.clone(),
            deadline_s: 60.0,
            ..SwarmConfig::new(
                1,
                Job {
                    codec: codec.into(),
                    ..job.clone()
                },
                dir.clone(),
            )
        },
        Launch::Threads,
    )?;
    let mut valid_loss = std::collections::BTreeMap::new();
    let (mut bytes, mut f32_bytes, mut rounds) = (0u64, 0u64, 0u64);
    let mut ended = 0;
    while ended < a.workers as usize {
        let Some(event) = swarm.next_event(Duration::from_secs(600)) else {
            anyhow::bail!("the swarm said nothing for 10 minutes");
        };
        match event {
            SwarmEvent::Ended { error: Some(e), .. } => anyhow::bail!("a worker failed: {e}"),
            SwarmEvent::Ended { .. } => ended += 1,
            SwarmEvent::Worker { event, .. } => match event {
                Event::Validated {
                    step,
                    valid_loss: l,
                    ..
                } => {
                    valid_loss.insert(step, l);
                }
                Event::Done {
                    steps,
                    bytes_pushed,
                    bytes_pulled,
                    f32_bytes_each_way,
                    ..
                } => {
                    bytes += bytes_pushed + bytes_pulled;
                    f32_bytes += 2 * f32_bytes_each_way;
                    rounds += steps;
                }
                _ => {}
            },
        }
    }
    swarm.finish()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ArmResult {
        label: arm.label.to_string(),
        codec: arm.codec.map(str::to_string),
        valid_loss: valid_loss.into_iter().collect(),
        bytes_per_round: bytes as f64 / rounds.max(1) as f64,
        f32_bytes_per_round: f32_bytes as f64 / rounds.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn report(
    a: &SwarmGptArgs,
    job: &Job,
    steps: u64,
    device: &murmur_engine::Device,
    results: &[ArmResult],
    started: Instant,
) -> String {
    let gpt = job.gpt_config();
    let lm = job.lm_config();
    let mut text = format!(
        "# The byte-level GPT trained by a swarm, beside one process\n\nGenerated by `{}` on {}, \
         device {device}, in {:.0} minutes. Raw numbers: `swarm-gpt.json`.\n\n\
         Setup: GPT of {} blocks, width {}, {} heads, context {} ({} parameters) on the \
         Shakespeare plays (validation: the held-out plays, 256 windows); {steps} rounds of a \
         {}-sequence global batch; AdamW at peak lr {} (warm-up {} rounds, cosine to a tenth), \
         weight decay {}, gradients clipped to norm {}. The swarm arms: {} workers of {} \
         sequences each as threads of one process, one parameter-server shard, QUIC on \
         loopback, every round waiting for every worker; worker and server error feedback \
         where the codec compresses, every tensor compressed. Bytes are one worker's payload \
         per round, pushed plus pulled; f32 is what the same rounds move uncompressed.\n\n",
        command_line(),
        Machine::detect(),
        started.elapsed().as_secs_f64() / 60.0,
        gpt.layers,
        gpt.dim,
        gpt.heads,
        gpt.context,
        gpt.parameter_count().unwrap_or(0),
        a.batch,
        a.lr,
        lm.schedule.warmup,
        lm.weight_decay,
        lm.clip,
        a.workers,
        job.batch,
    );
    let reference = results
        .iter()
        .find(|r| r.codec.is_none())
        .map(ArmResult::last);
    text.push_str(
        "| arm | validation nats/byte | against one process | bytes per worker and round | less than f32 | wall s |\n",
    );
    text.push_str("|---|---|---|---|---|---|\n");
    for r in results {
        let against = match (reference, r.codec.is_some()) {
            (Some(one), true) => format!("{:+.4}", r.last() - one),
            _ => "–".into(),
        };
        let (bytes, less) = if r.codec.is_some() {
            (
                format!("{:.0}", r.bytes_per_round),
                format!("{:.1}×", r.f32_bytes_per_round / r.bytes_per_round.max(1.0)),
            )
        } else {
            ("–".into(), "–".into())
        };
        text.push_str(&format!(
            "| {} | {:.4} | {against} | {bytes} | {less} | {:.0} |\n",
            r.label,
            r.last(),
            r.seconds
        ));
    }
    text.push_str("\nValidation loss by round:\n\n| round |");
    for r in results {
        text.push_str(&format!(" {} |", r.label));
    }
    text.push_str("\n|---|");
    text.push_str(&"---|".repeat(results.len()));
    text.push('\n');
    let rounds: std::collections::BTreeSet<u64> = results
        .iter()
        .flat_map(|r| r.valid_loss.iter().map(|(s, _)| *s))
        .collect();
    for round in rounds {
        text.push_str(&format!("| {round} |"));
        for r in results {
            match r.valid_loss.iter().find(|(s, _)| *s == round) {
                Some((_, l)) => text.push_str(&format!(" {l:.4} |")),
                None => text.push_str(" – |"),
            }
        }
        text.push('\n');
    }
    text
}
