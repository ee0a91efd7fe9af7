//! `murmur bench aggregate`: what each aggregation rule costs a shard per round, beside the
//! sample-weighted mean measured in the same run. A round is one key's decoded pushes kept
//! and closed by the shard's own key state ([`KeyState`]): combined by the rule, under a
//! robust rule added to their ranks' histories and judged, and the result encoded as an f32
//! reply (what the shard does for every key it holds when a round closes).

use std::collections::BTreeMap;

use clap::Args;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::push::Push;
use murmur_engine::comm::shard::KeyState;
use murmur_engine::comm::KeySpec;
use murmur_engine::rng::Rng;
use serde::Serialize;

use super::super::machine::Machine;

/// Half of the MNIST MLP's 535,818 parameters: one of two shards' part of a round.
const MLP_HALF: usize = 267_909;

#[derive(Args)]
pub struct AggregateArgs {
    /// Elements of the key combined each round [default: half the MNIST MLP, 267909].
    #[arg(long, default_value_t = MLP_HALF)]
    numel: usize,
    /// Pushes a round combines, comma-separated.
    #[arg(long, default_value = "4,8,16", value_delimiter = ',')]
    pushes: Vec<usize>,
    /// Rules, separated by semicolons.
    #[arg(
        long,
        default_value = "mean;trimmed-mean;median;centered-clip",
        value_delimiter = ';'
    )]
    rules: Vec<String>,
    /// Seconds per measurement (median of five trials).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    rule: String,
    pushes: usize,
    /// Milliseconds per round.
    ms: f64,
    /// Against the mean of as many pushes.
    vs_mean: f64,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date: String,
    machine: Machine,
    numel: usize,
    rows: Vec<Row>,
}

/// `count` pushes of Gaussian values, 128 samples each.
fn round(numel: usize, count: usize) -> BTreeMap<usize, Push> {
    (0..count)
        .map(|rank| {
            let mut rng = Rng::new(rank as u64, 0);
            let push = Push {
                values: (0..numel).map(|_| rng.normal()).collect(),
                header: None,
                log2s: None,
                samples: 128,
            };
            (rank, push)
        })
        .collect()
}

pub fn run(a: AggregateArgs) -> anyhow::Result<()> {
    let rules: Vec<Aggregate> = a
        .rules
        .iter()
        .map(|r| r.parse())
        .collect::<Result<_, _>>()
        .map_err(|e: murmur_engine::Error| crate::exit::usage(e.to_string()))?;
    if a.pushes.contains(&0) || a.numel == 0 {
        return Err(crate::exit::usage("--pushes and --numel are at least 1"));
    }
    if !a.json {
        println!("| rule | pushes | ms per round | × mean |");
        println!("|---|---:|---:|---:|");
    }
    let mut rows = Vec::new();
    for &count in &a.pushes {
        let pending = round(a.numel, count);
        let ms_per_round = |rule: Aggregate| -> anyhow::Result<f64> {
            let spec = KeySpec {
                key: 1,
                numel: u32::try_from(a.numel)?,
                push: "f32".into(),
                pull: "f32".into(),
                server_memory: "none".into(),
                seed: 0,
                sync_every: 0,
                owner: String::new(),
            };
            let mut key = KeyState::new(spec, rule)?;
            // The copies stand for the pushes the shard decodes each round (the mean pays
            // them too).
            let mut failed = None;
            let seconds = super::seconds_per_call(
                a.seconds,
                1 << 16,
                || {},
                || {
                    let closed = pending
                        .iter()
                        .try_for_each(|(&rank, push)| key.insert(rank, push.clone()))
                        .and_then(|()| key.close());
                    match closed {
                        Ok(reply) => drop(std::hint::black_box(reply)),
                        Err(e) => failed = Some(e),
                    }
                },
            );
            match failed {
                Some(e) => Err(e.into()),
                None => Ok(1e3 * seconds),
            }
        };
        // The reference, whether or not the mean is among the rules.
        let mean_ms = ms_per_round(Aggregate::Mean)?;
        for &rule in &rules {
            let ms = if rule == Aggregate::Mean {
                mean_ms
            } else {
                ms_per_round(rule)?
            };
            let row = Row {
                rule: rule.to_string(),
                pushes: count,
                ms,
                vs_mean: ms / mean_ms,
            };
            if !a.json {
                println!(
                    "| {} | {} | {:.2} | {:.1} |",
                    row.rule, row.pushes, row.ms, row.vs_mean
                );
            }
            rows.push(row);
        }
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: super::today(),
        machine: Machine::detect(),
        numel: a.numel,
        rows,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!(
            "one key of {} elements, one thread; {} on {}",
            a.numel, report.date, report.machine
        );
    }
    Ok(())
}
