//! `murmur repro clapping`: Clapping-FC and -FU with a sweep over p, against the uncompressed
//! pipeline, direct compression, EF21 and AQ-SGD, on an MLP cut into E stages
//! (shared/specs/clapping.md §7, R2, R5 and R6). Writes docs/results/clapping.md (raw numbers
//! beside it as JSON) and checks the spec's expected orderings.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use murmur_engine::algo::OptimizerSpec;
use murmur_engine::data::ImageSet;
use murmur_engine::pipeline::{
    ModelSpec, PSchedule, Pipeline, PipelineConfig, PipelineData, Rule, Variant,
};
use murmur_engine::Device;
use serde::Serialize;

use super::arms::{load_images, open_device};
use super::clapping_logistic;
use super::pipeline_steps::checked_step;
use super::report::{command_line, keep_arms, mean_std, pm, results_path, write_keeping_notes};
use crate::commands::machine::Machine;
use murmur_node::DeviceKind;

#[derive(Args, Debug, Clone)]
pub struct ClappingArgs {
    /// A short run (1 seed, 2 epochs on 10,000 samples, fewer arms) that finishes in minutes;
    /// writes to target/repro/ unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// Seeds per arm [default: 3, quick 1].
    #[arg(long)]
    seeds: Option<u64>,
    /// Passes' worth of steps (every arm runs the same number of steps, so Clapping sees
    /// about a p fraction of the samples) [default: 3, quick 2].
    #[arg(long)]
    epochs: Option<u32>,
    /// mnist or fashion-mnist.
    #[arg(long, default_value = "fashion-mnist")]
    dataset: String,
    /// Use only the first N training samples [default: all, quick 10000].
    #[arg(long)]
    train_limit: Option<usize>,
    /// Hidden layer widths; E stages need at least E layers.
    #[arg(long, value_delimiter = ',', default_value = "256,128,64")]
    hidden: Vec<usize>,
    /// Stages of the main table (the depth table runs 1 to this many).
    #[arg(long, default_value_t = 4)]
    stages: usize,
    /// Samples per step.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Codec of the activations at every cut (top-20% is the compressor of the paper's sweep
    /// over E, Table 7).
    #[arg(long, default_value = "topk:0.2")]
    forward_codec: String,
    /// Codec of the activation gradients at every cut.
    #[arg(long, default_value = "topk:0.2")]
    backward_codec: String,
    /// Step size γ of the moving-average momentum (PyTorch's lr is γ·m).
    #[arg(long, default_value_t = 0.5)]
    lr: f32,
    /// Weight m of the new gradient in the momentum (PyTorch's momentum is 1 − m).
    #[arg(long, default_value_t = 0.1)]
    m: f32,
    #[arg(long, default_value_t = 1e-4)]
    weight_decay: f32,
    /// Steps of the logistic regression (E = 2) [default: 30000, quick 6000; 0 skips it].
    #[arg(long)]
    logistic_steps: Option<u64>,
    /// Quantizers of the logistic regression's batch vector y_1, one table each (the spec's
    /// 2-bit and 4-bit choices).
    #[arg(long, value_delimiter = ',', default_value = "qsgd:bits=2,qsgd:bits=4")]
    logistic_codecs: Vec<String>,
    /// Arms to run, by label, separated by semicolons [default: all].
    #[arg(long, value_delimiter = ';')]
    arms: Option<Vec<String>>,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// Where the table goes [default: docs/results/clapping.md, quick
    /// target/repro/clapping.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Which table an arm belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Table {
    /// The method comparison at E stages with a sweep over p (R2).
    Main,
    /// Clapping-FC at one p for E = 1 .. stages (R5).
    Depth,
    /// One pass over the data: AQ-SGD never revisits a sample (R6).
    Stream,
}

#[derive(Debug, Clone, Serialize)]
struct Arm {
    label: String,
    table: Table,
    variant: String,
    p: f32,
    stages: usize,
}

fn arm(label: String, table: Table, variant: Variant, p: f32, stages: usize) -> Arm {
    Arm {
        label,
        table,
        variant: variant.to_string(),
        p,
        stages,
    }
}

/// The p of the depth and streaming tables (the middle of the paper's good range).
const DEPTH_P: f32 = 0.6;

fn arms(a: &ClappingArgs) -> anyhow::Result<Vec<Arm>> {
    let e = a.stages;
    let ps: &[f32] = if a.quick {
        &[0.4, 0.8]
    } else {
        &[0.2, 0.4, 0.6, 0.8]
    };
    let mut out = vec![
        arm(
            "uncompressed".into(),
            Table::Main,
            Variant::Uncompressed,
            1.0,
            e,
        ),
        arm("direct".into(), Table::Main, Variant::Direct, 1.0, e),
        arm(
            "EF21 (FC, p = 1)".into(),
            Table::Main,
            Variant::Ef21,
            1.0,
            e,
        ),
        arm("AQ-SGD".into(), Table::Main, Variant::AqSgd, 1.0, e),
    ];
    for (name, v) in [("FC", Variant::Fc), ("FU", Variant::Fu)] {
        for &p in ps {
            out.push(arm(
                format!("Clapping-{name} p = {p}"),
                Table::Main,
                v,
                p,
                e,
            ));
        }
    }
    for stages in 1..e {
        out.push(arm(
            format!("Clapping-FC p = {DEPTH_P}, E = {stages}"),
            Table::Depth,
            Variant::Fc,
            DEPTH_P,
            stages,
        ));
    }
    if !a.quick {
        for (label, v, p) in [
            ("one pass: uncompressed", Variant::Uncompressed, 1.0),
            ("one pass: direct", Variant::Direct, 1.0),
            ("one pass: AQ-SGD", Variant::AqSgd, 1.0),
            ("one pass: Clapping-FC p = 0.6", Variant::Fc, DEPTH_P),
        ] {
            out.push(arm(label.into(), Table::Stream, v, p, e));
        }
    }
    keep_arms(out, &a.arms, |x| &x.label)
}

/// One seed of one arm, epoch by epoch.
#[derive(Debug, Clone, Serialize)]
struct Epoch {
    test_accuracy: f64,
    train_loss: f64,
    bytes_per_step: f64,
    seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Run {
    seed: u64,
    epochs: Vec<Epoch>,
    /// Error-feedback state at the end, in f32 values, whole pipeline.
    memory_floats: usize,
    /// Fresh samples drawn, in passes over the training set.
    samples_seen: f64,
    /// The step at which training failed (non-finite values), if it did.
    failed_at: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct ArmResult {
    arm: Arm,
    runs: Vec<Run>,
}

impl ArmResult {
    fn best(&self) -> Vec<f64> {
        let best = |r: &Run| {
            r.epochs
                .iter()
                .map(|e| 100.0 * e.test_accuracy)
                .fold(f64::NAN, f64::max)
        };
        self.runs.iter().map(best).collect()
    }

    fn accuracy(&self) -> f64 {
        mean_std(&self.best()).0
    }

    fn per_run(&self, f: impl Fn(&Run) -> f64) -> Vec<f64> {
        self.runs.iter().map(f).collect()
    }
}

struct Setup {
    train: Arc<PipelineData>,
    /// The MLP's widths: features, hidden widths, classes.
    sizes: Vec<usize>,
    test: ImageSet,
    device: Device,
    epochs: u32,
    steps_per_epoch: u64,
}

fn config(a: &ClappingArgs, s: &Setup, arm: &Arm, seed: u64) -> anyhow::Result<PipelineConfig> {
    let epochs = if arm.table == Table::Stream {
        1
    } else {
        s.epochs
    };
    let steps = epochs as u64 * s.steps_per_epoch;
    Ok(PipelineConfig {
        model: ModelSpec::Mlp(s.sizes.clone()),
        stages: arm.stages,
        batch: a.batch,
        variant: arm.variant.parse()?,
        forward_codec: a.forward_codec.clone(),
        backward_codec: a.backward_codec.clone(),
        p: PSchedule::Constant(arm.p),
        rule: Rule::Batch,
        warmup: 0,
        optimizer: OptimizerSpec::Ema { m: a.m },
        lr: a.lr,
        weight_decay: a.weight_decay,
        lr_drop_at: (epochs > 1).then(|| steps * 2 / 3),
        seed,
    })
}

fn train_one(
    a: &ClappingArgs,
    s: &Setup,
    arm: &Arm,
    seed: u64,
    label: &str,
) -> anyhow::Result<Run> {
    let c = config(a, s, arm, seed)?;
    let epochs = if arm.table == Table::Stream {
        1
    } else {
        s.epochs
    };
    let mut pipeline = Pipeline::new(c, &s.device, s.train.clone())?;
    let started = Instant::now();
    let mut run = Run {
        seed,
        epochs: Vec::new(),
        memory_floats: 0,
        samples_seen: 0.0,
        failed_at: None,
    };
    'epochs: for epoch in 0..epochs {
        let (mut loss, mut bytes) = (0.0f64, 0usize);
        for step in 0..s.steps_per_epoch {
            match checked_step(&mut pipeline) {
                Ok(r) => {
                    loss += r.loss as f64;
                    bytes += r.bytes;
                }
                Err(why) => {
                    run.failed_at = Some(format!("epoch {} step {step}: {why}", epoch + 1));
                    break 'epochs;
                }
            }
        }
        let n = s.steps_per_epoch as f64;
        let e = Epoch {
            test_accuracy: pipeline.accuracy(&s.test, 1000)?,
            train_loss: loss / n,
            bytes_per_step: bytes as f64 / n,
            seconds: started.elapsed().as_secs_f64(),
        };
        eprintln!(
            "{label}: epoch {}/{epochs} test {:.2}% loss {:.4} {:.0} B/step ({:.0} s)",
            epoch + 1,
            100.0 * e.test_accuracy,
            e.train_loss,
            e.bytes_per_step,
            e.seconds
        );
        run.epochs.push(e);
    }
    if let Some(why) = &run.failed_at {
        eprintln!("{label}: stopped, {why}");
    }
    run.memory_floats = pipeline.memory_floats();
    run.samples_seen = pipeline.stages()[0].epochs_drawn();
    Ok(run)
}

pub fn run(a: ClappingArgs) -> anyhow::Result<()> {
    // An unknown --arms name is refused before any work.
    let arms = arms(&a)?;
    let seeds = a.seeds.unwrap_or(if a.quick { 1 } else { 3 });
    let epochs = a.epochs.unwrap_or(if a.quick { 2 } else { 3 });
    let out = results_path(&a.out, a.quick, "clapping.md");
    let (dataset, train, test) =
        load_images(&a.dataset, a.train_limit.or(a.quick.then_some(10_000)))?;
    let (device, adapter) = open_device(a.device)?;
    let steps_per_epoch = (train.len() / a.batch) as u64;
    let mut sizes = vec![train.features()];
    sizes.extend(&a.hidden);
    sizes.push(train.classes);
    let setup = Setup {
        train: Arc::new(train.into()),
        sizes,
        test,
        device,
        epochs,
        steps_per_epoch,
    };
    let started = Instant::now();
    let logistic = logistic_table(&a, seeds)?;
    eprintln!(
        "Clapping reproduction: {} arms x {seeds} seeds, {epochs} epochs of {steps_per_epoch} \
         steps on {}, {adapter}",
        arms.len(),
        dataset.name()
    );
    let total = arms.len() as u64 * seeds;
    let mut results = Vec::new();
    for (i, arm) in arms.into_iter().enumerate() {
        let mut runs = Vec::new();
        for seed in 0..seeds {
            let label = format!(
                "[{}/{total}] {} seed {seed}",
                i as u64 * seeds + seed + 1,
                arm.label
            );
            runs.push(train_one(&a, &setup, &arm, seed, &label).with_context(|| label.clone())?);
        }
        results.push(ArmResult { arm, runs });
    }

    let mut text = format!(
        "# Clapping: reproduction\n\nGenerated by `{}` on {}, {adapter}, in {:.0} minutes. Raw \
         per-epoch numbers: `{}`.\n\n",
        command_line(),
        Machine::detect(),
        started.elapsed().as_secs_f64() / 60.0,
        out.with_extension("json").display()
    );
    let mut w = |s: String| {
        text.push_str(&s);
        text.push('\n');
    };
    w(format!(
        "Setup (shared/specs/clapping.md §7 R2, R5, R6): {} ({} training samples), an MLP {:?} \
         with ReLU cut into E contiguous stages (layers split as evenly as possible), batch {} \
         with the batch-wise lazy-sampling rule, {epochs} epochs' worth of steps ({} steps \
         each; every arm runs the same steps, so Clapping draws about a p fraction of the \
         samples), momentum in the paper's moving-average form (eq. 3, γ = {}, m = {}, weight \
         decay {}), γ dropping 10x after two thirds of the steps. Activations `{}`, activation \
         gradients `{}`, per row, at every cut. Accuracy: best test accuracy over epochs, \
         evaluated without compression (the paper's \"C. off\"), mean ± std over {seeds} \
         seed(s). Bytes: payload bytes per step over every cut, both ways.\n",
        dataset.name(),
        setup.train.len(),
        a.hidden,
        a.batch,
        steps_per_epoch,
        a.lr,
        a.m,
        a.weight_decay,
        a.forward_codec,
        a.backward_codec
    ));
    let uncompressed_bytes = results
        .iter()
        .find(|r| r.arm.variant == "none" && r.arm.table == Table::Main)
        .map(|r| mean_std(&bytes(r)).0);
    for (table, title) in [
        (Table::Main, format!("## Methods at E = {}\n", a.stages)),
        (
            Table::Depth,
            format!(
                "## Depth: Clapping-FC at p = {DEPTH_P} with fewer stages (E = {} is in the \
                 table above)\n",
                a.stages
            ),
        ),
        (
            Table::Stream,
            "## One pass over the data (the streaming regime: no sample comes back)\n".into(),
        ),
    ] {
        let rows: Vec<&ArmResult> = results.iter().filter(|r| r.arm.table == table).collect();
        if rows.is_empty() {
            continue;
        }
        w(title);
        w("| Arm | variant | p | E | best test acc % | final train loss | bytes/step | vs uncompressed | EF state (floats) | samples drawn (passes) |".into());
        w("|---|---|---|---|---|---|---|---|---|---|".into());
        for r in rows {
            let b = mean_std(&bytes(r)).0;
            let ratio = uncompressed_bytes
                .filter(|&u| b > 0.0 && u > 0.0)
                .map(|u| format!("{:.1}x", u / b))
                .unwrap_or_else(|| "-".into());
            let failed = r.runs.iter().filter(|x| x.failed_at.is_some()).count();
            w(format!(
                "| {}{} | {} | {} | {} | {} | {} | {:.0} | {ratio} | {} | {} |",
                r.arm.label,
                if failed > 0 {
                    format!(" (failed in {failed} run(s))")
                } else {
                    String::new()
                },
                r.arm.variant,
                r.arm.p,
                r.arm.stages,
                pm(&r.best(), 2),
                pm(
                    &r.per_run(|x| x.epochs.last().map_or(f64::NAN, |e| e.train_loss)),
                    4
                ),
                b,
                r.runs.iter().map(|x| x.memory_floats).max().unwrap_or(0),
                pm(&r.per_run(|x| x.samples_seen), 2),
            ));
        }
        w(String::new());
    }
    w(logistic);
    w("## Expected orderings (clapping.md §7)\n".into());
    for line in orderings(&results) {
        w(format!("- {line}"));
    }
    write_keeping_notes(&out, &text)?;
    let json = out.with_extension("json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!("{text}");
    eprintln!("wrote {} and {}", out.display(), json.display());
    for png in super::figures::clapping(&json)? {
        eprintln!("wrote {}", png.display());
    }
    Ok(())
}

/// Mean bytes per step of each run.
fn bytes(r: &ArmResult) -> Vec<f64> {
    r.per_run(|x| {
        x.epochs.iter().map(|e| e.bytes_per_step).sum::<f64>() / x.epochs.len().max(1) as f64
    })
}

fn orderings(results: &[ArmResult]) -> Vec<String> {
    let shown = |ok: bool| if ok { "shown" } else { "NOT shown" };
    let main = |variant: &'static str| {
        results
            .iter()
            .filter(move |r| r.arm.table == Table::Main && r.arm.variant == variant)
    };
    let one = |variant: &'static str| main(variant).next();
    let mut out = Vec::new();
    let best_fc = main("fc").max_by(|a, b| a.accuracy().total_cmp(&b.accuracy()));
    let (Some(none), Some(direct), Some(fc)) = (one("none"), one("direct"), best_fc) else {
        return vec!["the orderings need the uncompressed, direct and Clapping-FC arms".into()];
    };
    let (u, d, c) = (none.accuracy(), direct.accuracy(), fc.accuracy());
    out.push(format!(
        "Clapping at its best p ({}) about as good as uncompressed (at most 1 point below): \
         {c:.2}% vs {u:.2}%: {}",
        fc.arm.label,
        shown(c >= u - 1.0)
    ));
    out.push(format!(
        "Clapping better than direct compression: {c:.2}% vs {d:.2}%: {}",
        shown(c > d)
    ));
    if let Some(ef21) = one("ef21") {
        let e = ef21.accuracy();
        out.push(format!(
            "EF21 between direct and uncompressed: {d:.2}% ≤ {e:.2}% ≤ {u:.2}%: {}",
            shown(d <= e && e <= u + 0.5)
        ));
    }
    if let Some(aq) = one("aq-sgd") {
        let q = aq.accuracy();
        out.push(format!(
            "AQ-SGD behind Clapping in the few-epoch regime: {q:.2}% vs {c:.2}%: {}",
            shown(q < c)
        ));
    }
    let mut depth: Vec<(usize, f64)> = results
        .iter()
        .filter(|r| {
            r.arm.variant == "fc"
                && r.arm.p == DEPTH_P
                && matches!(r.arm.table, Table::Depth | Table::Main)
        })
        .map(|r| (r.arm.stages, r.accuracy()))
        .collect();
    depth.sort_by_key(|&(e, _)| e);
    if depth.len() > 1 {
        let falling = depth.windows(2).all(|w| w[1].1 <= w[0].1 + 0.3);
        let listed: Vec<String> = depth
            .iter()
            .map(|(e, acc)| format!("E = {e}: {acc:.2}%"))
            .collect();
        out.push(format!(
            "quality falling as E grows (within 0.3 points of noise per step): {}: {}",
            listed.join(", "),
            shown(falling)
        ));
    }
    out
}

/// The logistic-regression tables (R1), one per quantizer, with their orderings, as markdown.
fn logistic_table(a: &ClappingArgs, seeds: u64) -> anyhow::Result<String> {
    let steps = a
        .logistic_steps
        .unwrap_or(if a.quick { 6000 } else { 30_000 });
    let mut out = String::new();
    if steps == 0 {
        return Ok(out);
    }
    let problems: Vec<_> = (0..seeds).map(clapping_logistic::Problem::new).collect();
    for codec in &a.logistic_codecs {
        out.push_str(&logistic_codec_table(&problems, codec, steps)?);
    }
    Ok(out)
}

fn logistic_codec_table(
    problems: &[clapping_logistic::Problem],
    codec: &str,
    steps: u64,
) -> anyhow::Result<String> {
    use clapping_logistic::{gaps, Method, DIM, SAMPLES};
    let batch = 128;
    let checkpoints = [steps / 6, steps / 2, steps];
    let methods = [
        Method::NoCompression,
        Method::Compression,
        Method::CompressionEf,
        Method::Fc(0.5),
        Method::Fu(0.5),
        Method::Fc(0.2),
        Method::Fu(0.2),
    ];
    let mut gaps_by_method = vec![vec![Vec::new(); checkpoints.len()]; methods.len()];
    for (seed, problem) in problems.iter().enumerate() {
        for (m, &method) in methods.iter().enumerate() {
            let g = gaps(
                problem,
                method,
                codec,
                batch,
                steps,
                &checkpoints,
                seed as u64,
            )?;
            let shown: Vec<String> = g.iter().map(|v| format!("{v:.2e}")).collect();
            eprintln!(
                "logistic regression, {codec}, seed {seed}: {}: gaps {}",
                method.label(),
                shown.join(", ")
            );
            for (c, v) in g.into_iter().enumerate() {
                gaps_by_method[m][c].push(v);
            }
        }
    }
    let mut t = format!(
        "## Logistic regression, E = 2, `{codec}` (R1)\n\nThe paper's synthetic problem (§6 E1; \
         generator choices in `src/commands/repro/clapping_logistic.rs`): {SAMPLES} samples of \
         dimension {DIM}, batch {batch}, {steps} steps of moving-average momentum (m = 0.1, γ = \
         0.1 halved every {} steps, momentum cleared at each halving). The cut carries y_1 = \
         −ζ(ξᵀw + b), one value per sample, compressed forward as one vector by `{codec}`; the \
         gradient travels back exactly. Optimality gap f(w) − f*, mean ± std over {} seed(s) \
         (f* by full-batch gradient descent).\n\n| method | gap at step {} | at step {} | at \
         step {} |\n|---|---|---|---|\n",
        (steps / 6).max(1),
        problems.len(),
        checkpoints[0],
        checkpoints[1],
        checkpoints[2]
    );
    let sci = |v: &[f64]| {
        let (m, s) = mean_std(v);
        if v.len() > 1 {
            format!("{m:.2e} ± {s:.1e}")
        } else {
            format!("{m:.2e}")
        }
    };
    for (m, method) in methods.iter().enumerate() {
        let cells: Vec<String> = gaps_by_method[m].iter().map(|v| sci(v)).collect();
        t.push_str(&format!("| {} | {} |\n", method.label(), cells.join(" | ")));
    }
    let last = |m: usize| mean_std(&gaps_by_method[m][checkpoints.len() - 1]).0;
    let shown = |ok: bool| if ok { "shown" } else { "NOT shown" };
    let (none, direct, ef, fc, fu) = (last(0), last(1), last(2), last(3), last(4));
    t.push_str(&format!(
        "\nExpected (§7 R1), at p = 0.5: FU below FC at the end ({fu:.2e} vs {fc:.2e}): {}; FC \
         and FU below direct compression ({direct:.2e}) and compression + EF ({ef:.2e}): {}; no \
         compression lowest ({none:.2e}): {}.\n\n",
        shown(fu < fc),
        shown(fc.max(fu) < direct.min(ef)),
        shown(none <= fc.min(fu).min(direct).min(ef)),
    ));
    Ok(t)
}
