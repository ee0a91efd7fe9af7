//! `murmur repro clapping-gpt`: a byte-level GPT on the Shakespeare plays cut into E stages
//! between its blocks, top-40% activations and gradients at every cut (shared/specs/clapping.md
//! §7 R4, the analogue of the paper's GPT-2 strategy S1). Clapping-FC with a sweep over p
//! against the uncompressed pipeline, direct compression and EF21; validation loss on the
//! held-out plays. Writes docs/results/clapping-gpt.md (raw numbers beside it as JSON).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use murmur_engine::algo::OptimizerSpec;
use murmur_engine::data::{default_root, TextCorpus};
use murmur_engine::nn::GptConfig;
use murmur_engine::pipeline::{
    ModelSpec, PSchedule, Pipeline, PipelineConfig, PipelineData, Rule, TextWindows, Variant,
};
use serde::Serialize;

use super::arms::open_device;
use super::pipeline_steps::{checked_step, evaluates_after};
use super::report::{command_line, keep_arms, mean_std, pm, results_path, write_keeping_notes};
use crate::commands::machine::Machine;
use murmur_node::DeviceKind;

#[derive(Args, Debug, Clone)]
pub struct ClappingGptArgs {
    /// A short run (1 seed, 150 steps, fewer arms) that finishes in minutes; writes to
    /// target/repro/ unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// Seeds per arm [default: 2, quick 1].
    #[arg(long)]
    seeds: Option<u64>,
    /// Optimizer steps of every arm [default: 2000, quick 150].
    #[arg(long)]
    steps: Option<u64>,
    /// Transformer blocks (E stages need at least E).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    #[arg(long, default_value_t = 64)]
    dim: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Bytes per sample (a sample is one window of the training text).
    #[arg(long, default_value_t = 64)]
    context: usize,
    #[arg(long, default_value_t = 4)]
    stages: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Codec of activations and activation gradients at every cut (S1: top-40% both ways).
    #[arg(long, default_value = "topk:0.4")]
    codec: String,
    /// The p of Clapping-FC's sweep (and of the uncompressed lazy-sampling controls).
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.4,0.6")]
    ps: Vec<f32>,
    /// Arms to run, by label, separated by semicolons [default: all].
    #[arg(long, value_delimiter = ';')]
    arms: Option<Vec<String>>,
    /// AdamW's step size (dropping 10x after two thirds of the steps).
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f32,
    /// Steps at the start that travel uncompressed (clapping.md §3.12's compression warm-up;
    /// the paper's GPT-2 runs fine-tune a pretrained model, which this approximates).
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Held-out windows in each validation [default: 512, quick 128].
    #[arg(long)]
    eval_windows: Option<usize>,
    /// Validations per run, evenly spaced.
    #[arg(long, default_value_t = 3)]
    evals: u64,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// Runs trained at once, each on its own thread [default: the CPU cores].
    #[arg(long)]
    jobs: Option<usize>,
    /// Train on the first N bytes of the training plays (the spec's TinyShakespeare is about
    /// 1 MB), so that a run of a few thousand steps revisits samples as lazy sampling needs
    /// [default: 400000; 0 = all].
    #[arg(long, default_value_t = 400_000)]
    train_bytes: usize,
    /// Where the table goes [default: docs/results/clapping-gpt.md, quick
    /// target/repro/clapping-gpt.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
struct Arm {
    label: String,
    variant: String,
    p: f32,
}

#[derive(Debug, Clone, Serialize)]
struct Validation {
    step: u64,
    /// Mean next-byte loss on the held-out plays, nats, evaluated without compression.
    loss: f64,
    /// Mean training loss (on the compressed forward pass) since the previous validation.
    train_loss: f64,
    seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Run {
    seed: u64,
    validations: Vec<Validation>,
    bytes_per_step: f64,
    memory_floats: usize,
    samples_seen: f64,
    failed_at: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct ArmResult {
    arm: Arm,
    runs: Vec<Run>,
}

impl ArmResult {
    /// Each run's last validation loss (infinite for a run that failed).
    fn final_loss(&self) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| match (&r.failed_at, r.validations.last()) {
                (None, Some(v)) => v.loss,
                _ => f64::INFINITY,
            })
            .collect()
    }

    fn loss(&self) -> f64 {
        mean_std(&self.final_loss()).0
    }
}

fn arms(a: &ClappingGptArgs) -> anyhow::Result<Vec<Arm>> {
    let arm = |label: &str, variant: Variant, p: f32| Arm {
        label: label.into(),
        variant: variant.to_string(),
        p,
    };
    let mut out = vec![
        arm("uncompressed", Variant::Uncompressed, 1.0),
        arm("direct", Variant::Direct, 1.0),
        arm("EF21 (FC, p = 1)", Variant::Ef21, 1.0),
    ];
    let ps: Vec<f32> = if a.quick { vec![0.4] } else { a.ps.clone() };
    for &p in &ps {
        out.push(arm(&format!("Clapping-FC p = {p}"), Variant::Fc, p));
    }
    // Lazy sampling without compression: what drawing a p fraction of fresh samples costs by
    // itself, so that the FC arms' gap can be split into sampling and compression.
    for &p in &ps {
        out.push(arm(
            &format!("uncompressed p = {p}"),
            Variant::Uncompressed,
            p,
        ));
    }
    keep_arms(out, &a.arms, |x| &x.label)
}

struct Setup {
    train: Arc<PipelineData>,
    valid: TextWindows,
    device: murmur_engine::Device,
    steps: u64,
    eval_windows: usize,
}

fn config(a: &ClappingGptArgs, s: &Setup, arm: &Arm, seed: u64) -> anyhow::Result<PipelineConfig> {
    Ok(PipelineConfig {
        model: ModelSpec::Gpt(GptConfig {
            vocab: 256,
            context: a.context,
            layers: a.layers,
            dim: a.dim,
            heads: a.heads,
            dropout: 0.0,
        }),
        stages: a.stages,
        batch: a.batch,
        variant: arm.variant.parse()?,
        forward_codec: a.codec.clone(),
        backward_codec: a.codec.clone(),
        p: PSchedule::Constant(arm.p),
        rule: Rule::Batch,
        warmup: a.warmup,
        optimizer: OptimizerSpec::ADAMW,
        lr: a.lr,
        weight_decay: a.weight_decay,
        lr_drop_at: Some(s.steps * 2 / 3),
        seed,
    })
}

fn train_one(
    a: &ClappingGptArgs,
    s: &Setup,
    arm: &Arm,
    seed: u64,
    label: &str,
) -> anyhow::Result<Run> {
    let mut pipeline = Pipeline::new(config(a, s, arm, seed)?, &s.device, s.train.clone())?;
    let started = Instant::now();
    let mut run = Run {
        seed,
        validations: Vec::new(),
        bytes_per_step: 0.0,
        memory_floats: 0,
        samples_seen: 0.0,
        failed_at: None,
    };
    let (mut loss_sum, mut losses, mut bytes) = (0.0f64, 0u64, 0usize);
    for step in 0..s.steps {
        match checked_step(&mut pipeline) {
            Ok(r) => {
                loss_sum += r.loss as f64;
                losses += 1;
                bytes += r.bytes;
            }
            Err(why) => {
                run.failed_at = Some(format!("step {step}: {why}"));
                break;
            }
        }
        if evaluates_after(step + 1, s.steps, a.evals) {
            let v = Validation {
                step: step + 1,
                loss: pipeline.text_loss(&s.valid, s.eval_windows, 64)?,
                train_loss: loss_sum / losses.max(1) as f64,
                seconds: started.elapsed().as_secs_f64(),
            };
            eprintln!(
                "{label}: step {}/{} validation {:.4} nats/byte, train {:.4} ({:.0} s)",
                v.step, s.steps, v.loss, v.train_loss, v.seconds
            );
            run.validations.push(v);
            (loss_sum, losses) = (0.0, 0);
        }
    }
    if let Some(why) = &run.failed_at {
        eprintln!("{label}: stopped, {why}");
    }
    run.bytes_per_step = bytes as f64 / s.steps.max(1) as f64;
    run.memory_floats = pipeline.memory_floats();
    run.samples_seen = pipeline.stages()[0].epochs_drawn();
    Ok(run)
}

pub fn run(a: ClappingGptArgs) -> anyhow::Result<()> {
    // An unknown --arms name is refused before any work.
    let arms = arms(&a)?;
    let seeds = a.seeds.unwrap_or(if a.quick { 1 } else { 2 });
    let steps = a.steps.unwrap_or(if a.quick { 150 } else { 2000 });
    let eval_windows = a.eval_windows.unwrap_or(if a.quick { 128 } else { 512 });
    let out = results_path(&a.out, a.quick, "clapping-gpt.md");
    let corpus = TextCorpus::load_shakespeare(&default_root())?;
    let mut train_text = corpus.train;
    if a.train_bytes > 0 {
        train_text.truncate(a.train_bytes);
    }
    let train = TextWindows::new(train_text, a.context)?;
    let valid = TextWindows::new(corpus.valid, a.context)?;
    let (train_windows, valid_windows) = (train.len(), valid.len());
    let (device, adapter) = open_device(a.device)?;
    let setup = Setup {
        train: Arc::new(train.into()),
        valid,
        device,
        steps,
        eval_windows,
    };
    eprintln!(
        "Clapping GPT reproduction: {} arms x {seeds} seeds, {steps} steps, {adapter}",
        arms.len()
    );
    let started = Instant::now();
    let jobs: Vec<(usize, u64)> = (0..arms.len())
        .flat_map(|i| (0..seeds).map(move |seed| (i, seed)))
        .collect();
    let threads = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runs = run_in_parallel(&jobs, threads.max(1), |n, &(i, seed)| {
        let label = format!("[{}/{}] {} seed {seed}", n + 1, jobs.len(), arms[i].label);
        train_one(&a, &setup, &arms[i], seed, &label).with_context(|| label.clone())
    })?;
    let mut runs = runs.into_iter();
    let results: Vec<ArmResult> = arms
        .into_iter()
        .map(|arm| ArmResult {
            arm,
            runs: runs.by_ref().take(seeds as usize).collect(),
        })
        .collect();
    let text = report(
        &a,
        &results,
        &ReportFacts {
            seeds,
            steps,
            eval_windows,
            train_windows,
            valid_windows,
            adapter,
            minutes: started.elapsed().as_secs_f64() / 60.0,
            json: out.with_extension("json"),
        },
    );
    write_keeping_notes(&out, &text)?;
    let json = out.with_extension("json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!("{text}");
    eprintln!("wrote {} and {}", out.display(), json.display());
    Ok(())
}

/// `work(n, job)` for every job on `threads` threads, results in the order of `jobs`; the
/// first error stops the threads from taking more work.
fn run_in_parallel<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    work: impl Fn(usize, &J) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let slots: Vec<Mutex<Option<anyhow::Result<R>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.min(jobs.len()) {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= jobs.len() || failed.load(Ordering::Relaxed) {
                    break;
                }
                let result = work(n, &jobs[n]);
                failed.fetch_or(result.is_err(), Ordering::Relaxed);
                *slots[n].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| Err(anyhow::anyhow!("not run after an earlier failure")))
        })
        .collect()
}

struct ReportFacts {
    seeds: u64,
    steps: u64,
    eval_windows: usize,
    train_windows: usize,
    valid_windows: usize,
    adapter: String,
    minutes: f64,
    json: PathBuf,
}

fn report(a: &ClappingGptArgs, results: &[ArmResult], f: &ReportFacts) -> String {
    let mut text = format!(
        "# Clapping on a GPT: reproduction (R4)\n\nGenerated by `{}` on {}, {}, in {:.0} \
         minutes. Raw numbers: `{}`.\n\n",
        command_line(),
        Machine::detect(),
        f.adapter,
        f.minutes,
        f.json.display()
    );
    let mut w = |s: String| {
        text.push_str(&s);
        text.push('\n');
    };
    w(format!(
        "Setup (shared/specs/clapping.md §7 R4, the analogue of the paper's GPT-2 S1): a \
         byte-level GPT of {} blocks, width {}, {} heads, context {}, with its own output \
         projection (initialised as a copy of the token embedding; see \
         engine/src/pipeline/model.rs), cut into E = {} stages between blocks (embeddings with \
         the first, final norm and head with the last). A sample is one window of {} bytes of \
         the training plays ({}, {} windows); {} windows per step, batch-wise lazy \
         sampling, {} steps for every arm ({:.2} passes' worth), AdamW (γ = {}, weight decay \
         {}, γ dropping 10x after two thirds). Activations and activation gradients `{}` per \
         sample at every cut{}. Validation: mean next-byte loss in nats on {} of the {} windows \
         of the held-out plays, evaluated without compression; byte perplexity is its \
         exponential. Mean ± std over {} seed(s).\n",
        a.layers,
        a.dim,
        a.heads,
        a.context,
        a.stages,
        a.context,
        if a.train_bytes > 0 {
            format!("their first {} bytes", a.train_bytes)
        } else {
            "all of them".into()
        },
        f.train_windows,
        a.batch,
        f.steps,
        (f.steps as f64 * a.batch as f64) / f.train_windows as f64,
        a.lr,
        a.weight_decay,
        a.codec,
        if a.warmup > 0 {
            format!(" after {} uncompressed warm-up steps", a.warmup)
        } else {
            String::new()
        },
        f.eval_windows.min(f.valid_windows),
        f.valid_windows,
        f.seeds
    ));
    let f32_bytes = arm_at(results, "none", 1.0).map(|r| mean_std(&bytes(r)).0);
    w("| Arm | variant | p | validation loss (nats/byte) | byte perplexity | final train loss | bytes/step | vs uncompressed | EF state (floats) | samples drawn (passes) |".into());
    w("|---|---|---|---|---|---|---|---|---|---|".into());
    for r in results {
        let b = mean_std(&bytes(r)).0;
        let ratio = f32_bytes
            .filter(|&u| b > 0.0 && u > 0.0)
            .map(|u| format!("{:.1}x", u / b))
            .unwrap_or_else(|| "-".into());
        let failed = r.runs.iter().filter(|x| x.failed_at.is_some()).count();
        let train: Vec<f64> = r
            .runs
            .iter()
            .map(|x| x.validations.last().map_or(f64::NAN, |v| v.train_loss))
            .collect();
        let seen: Vec<f64> = r.runs.iter().map(|x| x.samples_seen).collect();
        w(format!(
            "| {}{} | {} | {} | {} | {:.3} | {} | {b:.0} | {ratio} | {} | {} |",
            r.arm.label,
            if failed > 0 {
                format!(" (failed in {failed} run(s))")
            } else {
                String::new()
            },
            r.arm.variant,
            r.arm.p,
            pm(&r.final_loss(), 4),
            r.loss().exp(),
            pm(&train, 4),
            r.runs.iter().map(|x| x.memory_floats).max().unwrap_or(0),
            pm(&seen, 3),
        ));
    }
    w(String::new());
    w("## Expected ordering (clapping.md §7 R4)\n".into());
    for line in orderings(results) {
        w(format!("- {line}"));
    }
    let split = cost_split(results);
    if !split.is_empty() {
        w(String::new());
        w("## Where Clapping-FC's gap comes from\n".into());
        w(
            "Validation loss above the uncompressed pipeline at p = 1, split into what lazy \
           sampling alone costs (the uncompressed arm at the same p) and what compression adds \
           on top (Clapping-FC against that arm), in nats per byte:\n"
                .into(),
        );
        w("| p | lazy sampling alone | compression on top | Clapping-FC in all |".into());
        w("|---|---|---|---|".into());
        for line in split {
            w(line);
        }
    }
    text
}

/// For each p with both a Clapping-FC arm and an uncompressed arm: the FC arm's gap to the
/// uncompressed pipeline at p = 1, split into lazy sampling's share and compression's.
fn cost_split(results: &[ArmResult]) -> Vec<String> {
    let Some(full) = arm_at(results, "none", 1.0) else {
        return vec![];
    };
    results
        .iter()
        .filter(|fc| fc.arm.variant == "fc")
        .filter_map(|fc| {
            let lazy = arm_at(results, "none", fc.arm.p)?;
            let (f, l, u) = (fc.loss(), lazy.loss(), full.loss());
            Some(format!(
                "| {} | {:+.4} | {:+.4} | {:+.4} |",
                fc.arm.p,
                l - u,
                f - l,
                f - u
            ))
        })
        .collect()
}

/// The arm of `variant` at constant `p`, if it ran.
fn arm_at<'a>(results: &'a [ArmResult], variant: &str, p: f32) -> Option<&'a ArmResult> {
    results
        .iter()
        .find(|r| r.arm.variant == variant && r.arm.p == p)
}

fn bytes(r: &ArmResult) -> Vec<f64> {
    r.runs.iter().map(|x| x.bytes_per_step).collect()
}

/// R4: no compression ≤ Clapping at its best p < Clapping at p = 1 (EF21) < direct, and a
/// U-shape in p.
fn orderings(results: &[ArmResult]) -> Vec<String> {
    let by = |variant| arm_at(results, variant, 1.0);
    let fc: Vec<&ArmResult> = results.iter().filter(|r| r.arm.variant == "fc").collect();
    let best = fc
        .iter()
        .min_by(|x, y| x.loss().total_cmp(&y.loss()))
        .copied();
    let (Some(none), Some(direct), Some(ef21), Some(best)) =
        (by("none"), by("direct"), by("ef21"), best)
    else {
        return vec!["not every arm of the ordering ran".into()];
    };
    let shown = |ok: bool| if ok { "shown" } else { "NOT shown" };
    let (n, d, e, b) = (none.loss(), direct.loss(), ef21.loss(), best.loss());
    let mut out = vec![
        format!(
            "Clapping at its best p ({}, {b:.4}) within 0.05 nats of uncompressed ({n:.4}): {}",
            best.arm.p,
            shown(b <= n + 0.05)
        ),
        format!(
            "Clapping at its best p below EF21 (p = 1, {e:.4}): {}",
            shown(b < e)
        ),
        format!("EF21 below direct compression ({d:.4}): {}", shown(e < d)),
    ];
    if fc.len() >= 2 {
        // With EF21 as p = 1, a U means the best p is neither the smallest nor 1.
        let inner = !std::ptr::eq(fc[0], best) && b < e;
        out.push(format!(
            "a U-shape in p (the best of {:?} and 1 neither the smallest nor 1): {}",
            fc.iter().map(|r| r.arm.p).collect::<Vec<_>>(),
            shown(inner)
        ));
    }
    out
}
