//! `murmur repro liec`: LIEC-SGD and its six baselines on Fashion-MNIST (or MNIST) with an MLP,
//! N simulated workers, the scaled sign on one block and block-wise, several seeds
//! (shared/specs/liec-sgd.md §5, "Small-scale CPU reproduction"). Writes the table to
//! docs/results/liec-sgd.md (raw per-epoch numbers beside it as JSON) and checks the spec's
//! expected orderings, saying which show.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use murmur_engine::algo::cost::{bytes_over_steps, paper_mib_per_iteration};
use murmur_engine::algo::sim::{simulate, steps_per_epoch, EpochReport, SimConfig};
use murmur_engine::algo::{blocks, Blocking, MethodSpec, OptimizerSpec};
use murmur_engine::nn::Module;
use murmur_engine::train::{Classifier, ClassifierConfig, OptimizerKind};
use murmur_engine::Device;
use serde::Serialize;

use super::arms::{load_images, open_device};
use super::report::{command_line, mean_std, pm, results_path, write_keeping_notes};
use crate::commands::machine::Machine;
use murmur_node::DeviceKind;

#[derive(Args, Debug)]
pub struct LiecArgs {
    /// A short run (4 workers, 1 seed, 3 epochs on 30,000 samples) that finishes in minutes;
    /// writes to target/repro/ unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// Simulated workers [default: 8, quick 4].
    #[arg(long)]
    workers: Option<usize>,
    /// Seeds per configuration [default: 3, quick 1].
    #[arg(long)]
    seeds: Option<u64>,
    /// Passes over the training set; the learning rate drops 10x after two thirds of them
    /// [default: 12, quick 3].
    #[arg(long)]
    epochs: Option<u32>,
    /// mnist or fashion-mnist.
    #[arg(long, default_value = "fashion-mnist")]
    dataset: String,
    /// Use only the first N training samples [default: all, quick 30000].
    #[arg(long)]
    train_limit: Option<usize>,
    /// Algorithms to run (comma-separated) [default: all of Table III].
    #[arg(long, value_delimiter = ',')]
    methods: Option<Vec<String>>,
    /// Hidden layer widths of the MLP.
    #[arg(long, value_delimiter = ',', default_value = "256,128")]
    hidden: Vec<usize>,
    /// Samples per worker per step (the paper's 128).
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Learning rate of plain SGD, momentum 0 (the paper's 0.1).
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
    /// Weight decay, applied locally and uncompressed (the paper's 5e-4).
    #[arg(long, default_value_t = 5e-4)]
    weight_decay: f32,
    /// Byte limit of a block for block-wise sign (whole tensors in order, like the paper's
    /// 5 MiB buckets over ResNet18, about a tenth of the model here).
    #[arg(long, default_value = "bucket:64k")]
    blockwise: String,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// Where the table goes [default: docs/results/liec-sgd.md, quick target/repro/liec-sgd.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Serialize)]
struct RunRecord {
    method: String,
    blocking: String,
    seed: u64,
    epochs: Vec<EpochReport>,
}

/// One row of a table: a method with one blocking, over seeds.
struct Row {
    method: MethodSpec,
    blocking: Blocking,
    runs: Vec<Vec<EpochReport>>,
}

impl Row {
    fn best_accuracy(&self) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| r.iter().map(|e| e.test_accuracy).fold(0.0, f64::max) * 100.0)
            .collect()
    }

    fn last<T>(&self, f: impl Fn(&EpochReport) -> T) -> Vec<T> {
        self.runs
            .iter()
            .map(|r| f(r.last().expect("epochs")))
            .collect()
    }

    /// Mean over seeds and epochs of an optional per-epoch figure.
    fn mean_of(&self, f: impl Fn(&EpochReport) -> Option<f64>) -> Option<f64> {
        let all: Vec<f64> = self.runs.iter().flatten().filter_map(f).collect();
        (!all.is_empty()).then(|| mean_std(&all).0)
    }

    fn error_norms(&self) -> Vec<f64> {
        // Mean over the epochs' end-of-epoch norms (liec-sgd.md Fig. 8 logs once per epoch).
        self.runs
            .iter()
            .map(|r| mean_std(&r.iter().map(|e| e.error_norm).collect::<Vec<_>>()).0)
            .collect()
    }
}

pub fn run(a: LiecArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let workers = a.workers.unwrap_or(if a.quick { 4 } else { 8 });
    let seeds = a.seeds.unwrap_or(if a.quick { 1 } else { 3 });
    let epochs = a.epochs.unwrap_or(if a.quick { 3 } else { 12 });
    let train_limit = a.train_limit.or(a.quick.then_some(30_000));
    let out = results_path(&a.out, a.quick, "liec-sgd.md");
    let methods: Vec<MethodSpec> = match &a.methods {
        Some(names) => names
            .iter()
            .map(|n| n.parse())
            .collect::<murmur_engine::Result<_>>()?,
        None => MethodSpec::liec_table(),
    };
    let blockwise: Blocking = a.blockwise.parse()?;
    let (dataset, train, test) = load_images(&a.dataset, train_limit)?;
    let (device, adapter) = open_device(a.device)?;
    let model = ClassifierConfig {
        hidden: a.hidden.clone(),
        optimizer: OptimizerKind::Sgd,
        momentum: 0.0,
        lr: a.lr,
        ..ClassifierConfig::default()
    };
    let probe = Classifier::new(&Device::Cpu, train.features(), train.classes, &model)?;
    let sizes: Vec<usize> = probe.model.parameters().iter().map(|p| p.numel()).collect();
    let d: usize = sizes.iter().sum();
    let per_epoch = steps_per_epoch(train.len(), workers, a.batch);
    // Every method with both blockings, except P-SGD, which compresses nothing.
    let mut plan: Vec<(MethodSpec, Blocking)> = Vec::new();
    for blocking in [Blocking::Whole, blockwise] {
        for &m in &methods {
            if m != MethodSpec::PSgd || blocking == Blocking::Whole {
                plan.push((m, blocking));
            }
        }
    }
    eprintln!(
        "LIEC-SGD reproduction: {} configurations x {seeds} seeds, {workers} workers, {epochs} \
         epochs of {per_epoch} steps on {} ({} samples), MLP {:?} ({d} parameters), {adapter}",
        plan.len(),
        dataset.name(),
        train.len(),
        a.hidden
    );
    let total = plan.len() as u64 * seeds;
    let mut rows: Vec<Row> = Vec::new();
    let mut records: Vec<RunRecord> = Vec::new();
    let mut done = 0;
    for (method, blocking) in plan {
        let mut row = Row {
            method,
            blocking,
            runs: Vec::new(),
        };
        for seed in 0..seeds {
            done += 1;
            let config = SimConfig {
                method,
                codec: if method == MethodSpec::PSgd {
                    "f32"
                } else {
                    "sign"
                }
                .into(),
                optimizer: OptimizerSpec::Sgd,
                blocking,
                workers,
                batch: a.batch,
                epochs,
                lr: a.lr,
                decay_at: vec![(2 * epochs).div_ceil(3)],
                weight_decay: a.weight_decay,
                seed,
                model: ClassifierConfig {
                    seed,
                    ..model.clone()
                },
            };
            let label = format!("[{done}/{total}] {method} {blocking} seed {seed}");
            let reports = simulate(&config, &train, &test, &device, |r| {
                eprintln!(
                    "{label}: epoch {}/{epochs} test {:.2}% loss {:.4} error {:.4} ({:.0} s)",
                    r.epoch + 1,
                    100.0 * r.test_accuracy,
                    r.train_loss,
                    r.error_norm,
                    r.seconds
                );
            })
            .with_context(|| label.clone())?;
            records.push(RunRecord {
                method: method.to_string(),
                blocking: blocking.to_string(),
                seed,
                epochs: reports.clone(),
            });
            row.runs.push(reports);
        }
        rows.push(row);
    }
    let mut text = String::new();
    let w = |text: &mut String, s: String| {
        text.push_str(&s);
        text.push('\n');
    };
    w(
        &mut text,
        "# LIEC-SGD and its baselines: reproduction\n".into(),
    );
    w(
        &mut text,
        format!(
            "Generated by `{}` on {}, {adapter}, in {:.0} minutes. Raw per-epoch numbers: `{}`.\n",
            command_line(),
            Machine::detect(),
            started.elapsed().as_secs_f64() / 60.0,
            out.with_extension("json").display()
        ),
    );
    w(
        &mut text,
        format!(
            "Setup (shared/specs/liec-sgd.md §5, scaled down): {} with an MLP {:?} ({d} parameters, \
             {} tensors); {workers} workers x {} samples per step, {} samples ({per_epoch} steps \
             per epoch), {epochs} epochs; plain SGD, momentum 0, lr {} dropping 10x at epoch {}, \
             weight decay {} applied locally; the scaled sign as one block (`whole`) and \
             block-wise over whole tensors (`{blockwise}`: {} blocks); CSER H_c = 8, Neolithic \
             R = 2; {seeds} seed(s). Accuracy is the average model's (LIEC and CSER train local \
             models), best over epochs, mean ± std over seeds.\n",
            dataset.name(),
            a.hidden,
            sizes.len(),
            a.batch,
            train.len(),
            a.lr,
            (2 * epochs).div_ceil(3) + 1,
            a.weight_decay,
            blocks::blocks(&sizes, blockwise)?.len()
        ),
    );
    for blocking in [Blocking::Whole, blockwise] {
        let table_rows: Vec<&Row> = rows
            .iter()
            .filter(|r| r.blocking == blocking || r.method == MethodSpec::PSgd)
            .collect();
        let bl = blocks::blocks(&sizes, blocking)?;
        w(&mut text, format!("## Scaled sign, `{blocking}`\n"));
        w(
            &mut text,
            "| Algorithm | MiB/iter, Table III model (d = 11,171,146, N = 8) | bytes/step here, all workers (counted) | count = formula | best test acc % | final test acc % | final train loss | error norm, mean over epochs | worker δ | server δ |".into(),
        );
        w(
            &mut text,
            "|---|---|---|---|---|---|---|---|---|---|".into(),
        );
        for row in table_rows {
            // Every run's whole count against the formula for its number of steps.
            let steps = (per_epoch * epochs as usize) as u64;
            let codec = if row.method == MethodSpec::PSgd {
                "f32"
            } else {
                "sign"
            };
            let formula = bytes_over_steps(row.method, codec, &bl, workers as u64, steps)?;
            let counted: Vec<u64> = row
                .runs
                .iter()
                .map(|r| r.iter().map(|e| e.bytes).sum())
                .collect();
            let agrees = counted.iter().all(|&c| c == formula);
            let opt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "–".into());
            w(
                &mut text,
                format!(
                    "| {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                    row.method,
                    paper_mib_per_iteration(row.method, 11_171_146, 8),
                    counted[0] as f64 / steps as f64,
                    if agrees { "yes" } else { "NO" },
                    pm(&row.best_accuracy(), 2),
                    pm(&row.last(|e| e.test_accuracy * 100.0), 2),
                    pm(&row.last(|e| e.train_loss), 4),
                    pm(&row.error_norms(), 4),
                    opt(row.mean_of(|e| e.worker_contraction)),
                    opt(row.mean_of(|e| e.server_contraction)),
                ),
            );
        }
        w(&mut text, String::new());
    }
    w(&mut text, "## Expected orderings (liec-sgd.md §5)\n".into());
    for line in orderings(&rows, blockwise) {
        w(&mut text, format!("- {line}"));
    }
    write_keeping_notes(&out, &text)?;
    let json = serde_json::to_string_pretty(&records)?;
    std::fs::write(out.with_extension("json"), json)
        .with_context(|| format!("writing {}", out.with_extension("json").display()))?;
    let figures = super::figures::liec(&out.with_extension("json"))?;
    println!("{text}");
    eprintln!(
        "wrote {} and {} in {:.1} minutes",
        out.display(),
        figures[0].display(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// The spec's robust orderings, each stated with the measured numbers and whether it shows.
fn orderings(rows: &[Row], blockwise: Blocking) -> Vec<String> {
    let find = |m: MethodSpec, b: Blocking| rows.iter().find(|r| r.method == m && r.blocking == b);
    let acc = |r: &Row| mean_std(&r.best_accuracy()).0;
    let err = |r: &Row| mean_std(&r.error_norms()).0;
    let shown = |ok: bool| if ok { "shown" } else { "NOT shown" };
    let mut out = Vec::new();
    for b in [Blocking::Whole, blockwise] {
        let liec = find(MethodSpec::Liec { period: 32 }, b);
        if let (Some(l), Some(m), Some(d)) = (
            liec,
            find(MethodSpec::MemSgd, b),
            find(MethodSpec::DoubleSqueeze, b),
        ) {
            out.push(format!(
                "(a) `{b}`: error norms LIEC(32) {:.4} < MEM-SGD {:.4} < DoubleSqueeze {:.4}: {}",
                err(l),
                err(m),
                err(d),
                shown(err(l) < err(m) && err(m) < err(d))
            ));
        }
        let compressed: Vec<&Row> = rows
            .iter()
            .filter(|r| r.blocking == b && r.method != MethodSpec::PSgd)
            .collect();
        if let Some(ef21) = find(MethodSpec::Ef21P, b) {
            let others_min = compressed
                .iter()
                .filter(|r| r.method != MethodSpec::Ef21P)
                .map(|r| acc(r))
                .fold(f64::INFINITY, f64::min);
            out.push(format!(
                "(b) `{b}`: EF21-P worst ({:.2}% against the next worst {:.2}%): {}",
                acc(ef21),
                others_min,
                shown(acc(ef21) < others_min)
            ));
        }
        if let Some(l) = liec {
            if let (Some(w), Some(s)) = (
                l.mean_of(|e| e.worker_contraction),
                l.mean_of(|e| e.server_contraction),
            ) {
                out.push(format!(
                    "(e) `{b}`: LIEC's worker δ {w:.3} < server δ {s:.3}: {}",
                    shown(w < s)
                ));
            }
        }
    }
    if let (Some(w), Some(b)) = (
        find(MethodSpec::Ef21P, Blocking::Whole),
        find(MethodSpec::Ef21P, blockwise),
    ) {
        out.push(format!(
            "(b) EF21-P far worse with one block ({:.2}%) than block-wise ({:.2}%): {}",
            acc(w),
            acc(b),
            shown(acc(w) < acc(b))
        ));
    }
    let ef_methods = rows
        .iter()
        .filter(|r| r.blocking == Blocking::Whole && r.method != MethodSpec::PSgd);
    for whole in ef_methods {
        if let Some(block) = find(whole.method, blockwise) {
            // "No worse": within one seed-spread of each other or better.
            let spread = mean_std(&whole.best_accuracy())
                .1
                .max(mean_std(&block.best_accuracy()).1);
            out.push(format!(
                "(c) {}: block-wise {:.2}% ≥ one block {:.2}% (spread {spread:.2}): {}",
                whole.method,
                acc(block),
                acc(whole),
                shown(acc(block) >= acc(whole) - spread)
            ));
        }
    }
    if let Some(p) = find(MethodSpec::PSgd, Blocking::Whole) {
        // (d) names these; CSER and EF21-P are expected further off.
        let close = [
            MethodSpec::MemSgd,
            MethodSpec::DoubleSqueeze,
            MethodSpec::Neolithic { rounds: 2 },
            MethodSpec::Liec { period: 32 },
            MethodSpec::Liec { period: 100 },
        ];
        for b in [Blocking::Whole, blockwise] {
            let compared: Vec<&Row> = close.iter().filter_map(|&m| find(m, b)).collect();
            let near: Vec<String> = compared
                .iter()
                .map(|r| format!("{} {:+.2}", r.method, acc(r) - acc(p)))
                .collect();
            let all_near = compared.iter().all(|r| (acc(r) - acc(p)).abs() <= 1.0);
            out.push(format!(
                "(d) `{b}`: within about 1 point of P-SGD ({:.2}%): {}: {}",
                acc(p),
                near.join(", "),
                shown(all_near)
            ));
        }
    }
    out
}
