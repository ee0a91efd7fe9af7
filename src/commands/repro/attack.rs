//! `murmur repro attack`: what one attacking worker in four does to an MNIST swarm under each
//! of the servers' aggregation rules (issue 21 item 6). Every arm is a local swarm of 4
//! workers and 2 shards as threads of this process, over QUIC on loopback, with the top-k or
//! the sign codec; the last worker attacks (or none does, in the honest rows). Rounds wait
//! for every worker; a worker the servers evict leaves the rounds to the others. The model
//! the first (honest) worker saves at the end is evaluated on the test set here.
//!
//! Finished arms are kept in the JSON beside the table and skipped when the command runs
//! again with the same settings, so a long run can be stopped and resumed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use murmur_engine::data::{default_root, ImageDataset, Split};
use murmur_engine::train::{Classifier, Saved};
use murmur_node::attack::Attack;
use murmur_node::swarm::{Launch, LocalSwarm, SwarmConfig, SwarmEvent};
use murmur_node::Job;
use serde::{Deserialize, Serialize};

use super::report::{
    command_line, list_or, results_path, write_json, write_keeping_notes, KeptArms,
};
use crate::commands::machine::Machine;

#[derive(Args, Debug, Clone)]
pub struct AttackArgs {
    /// A short run (1 epoch on 12,000 samples, the ×1e30 and sign-flip attacks) that
    /// finishes in minutes; writes to target/repro/ unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// Passes over the training set [default: 3, quick 1].
    #[arg(long)]
    epochs: Option<u32>,
    /// Use only the first N training samples [default: all, quick 12000].
    #[arg(long)]
    train_limit: Option<usize>,
    /// Codecs, separated by semicolons [default: topk:0.01;sign].
    #[arg(long, value_delimiter = ';')]
    codecs: Option<Vec<String>>,
    /// Aggregation rules, separated by semicolons [default:
    /// mean;trimmed-mean;median;centered-clip].
    #[arg(long, value_delimiter = ';')]
    rules: Option<Vec<String>>,
    /// Attacks, separated by semicolons, `none` for the honest row [default:
    /// none;scale:1e30;scale:100;sign-flip;noise;lr:1000;replay:10].
    #[arg(long, value_delimiter = ';')]
    attacks: Option<Vec<String>>,
    /// Seed of the model, the data order and the codecs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Warm the learning rate up linearly over this many rounds, then decay it along a
    /// cosine to a tenth at the end [default: a tenth of the rounds].
    #[arg(long, conflicts_with = "constant_lr")]
    warmup: Option<u64>,
    /// Keep the learning rate at its peak throughout (the tables before 2026-11-27): the
    /// final model then sits wherever the last rounds threw it, and a cell moves by 1 to 2
    /// points from seed to seed.
    #[arg(long)]
    constant_lr: bool,
    #[command(flatten)]
    run: KeptArms,
    /// Where the table goes [default: docs/results/robustness.md, quick
    /// target/repro/robustness.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What every arm shares; arms kept from an earlier run must have been made with the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Settings {
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    warmup: Option<u64>,
    epochs: u32,
    train_limit: Option<usize>,
    workers: u16,
    servers: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ArmResult {
    codec: String,
    rule: String,
    attack: String,
    /// Test accuracy of the model the first worker saved, in [0, 1].
    accuracy: f64,
    /// Whether the servers evicted the attacker, and after how many rounds.
    evicted_after: Option<u64>,
    seconds: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Results {
    settings: Settings,
    arms: Vec<ArmResult>,
}

const WORKERS: u16 = 4;
const SERVERS: u16 = 2;

pub fn run(a: AttackArgs) -> anyhow::Result<()> {
    let epochs = a.epochs.unwrap_or(if a.quick { 1 } else { 3 });
    let train_limit = a.train_limit.or(a.quick.then_some(12_000));
    let settings = Settings {
        seed: a.seed,
        warmup: (!a.constant_lr).then(|| {
            a.warmup
                .unwrap_or_else(|| default_warmup(epochs, train_limit))
        }),
        epochs,
        train_limit,
        workers: WORKERS,
        servers: SERVERS,
    };
    let codecs = list_or(&a.codecs, &["topk:0.01", "sign"]);
    let rules = list_or(
        &a.rules,
        &["mean", "trimmed-mean", "median", "centered-clip"],
    );
    let attacks = list_or(
        &a.attacks,
        if a.quick {
            &["none", "scale:1e30", "sign-flip"]
        } else {
            &[
                "none",
                "scale:1e30",
                "scale:100",
                "sign-flip",
                "noise",
                "lr:1000",
                "replay:10",
            ]
        },
    );
    let parsed: Vec<Option<Attack>> = attacks
        .iter()
        .map(|t| match t.as_str() {
            "none" => Ok(None),
            t => t.parse().map(Some),
        })
        .collect::<Result<_, _>>()
        .map_err(|e: murmur_node::NodeError| crate::exit::usage(e.to_string()))?;
    let out = results_path(&a.out, a.quick, "robustness.md");
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
    let root = a.run.data.clone().unwrap_or_else(default_root);
    let test = ImageDataset::Mnist.load(&root, Split::Test)?;
    let device = a.run.device.open()?;
    let total = codecs.len() * rules.len() * attacks.len();
    let mut done = 0;
    for codec in &codecs {
        for rule in &rules {
            for (name, attack) in attacks.iter().zip(&parsed) {
                done += 1;
                let kept = results
                    .arms
                    .iter()
                    .any(|r| (&r.codec, &r.rule, &r.attack) == (codec, rule, name));
                if kept {
                    continue;
                }
                eprintln!("attack [{done}/{total}]: {codec}, {rule}, attack {name}");
                let arm = run_arm(&a, &settings, codec, rule, name, *attack, &test, &device)?;
                eprintln!(
                    "attack: {codec}, {rule}, {name}: {:.2}% in {:.0} s{}",
                    100.0 * arm.accuracy,
                    arm.seconds,
                    arm.evicted_after.map_or(String::new(), |r| format!(
                        ", attacker evicted after round {r}"
                    ))
                );
                results.arms.push(arm);
                write_json(&json, &results)?;
            }
        }
    }
    // In the table's order, whatever order the arms ran in (the figure follows the JSON):
    // arms run again after the others go back in their place; arms of other lists, last.
    let place = |r: &ArmResult| {
        let at = |list: &[String], v: &str| list.iter().position(|x| x == v).unwrap_or(usize::MAX);
        (
            at(&codecs, &r.codec),
            at(&rules, &r.rule),
            at(&attacks, &r.attack),
        )
    };
    results.arms.sort_by_key(place);
    if !results.arms.is_empty() {
        write_json(&json, &results)?;
    }
    let stem = out
        .file_stem()
        .map_or_else(|| "robustness".into(), |s| s.to_string_lossy().into_owned());
    let text = report(
        &settings,
        &stem,
        &codecs,
        &rules,
        &attacks,
        &results.arms,
        &device,
    );
    write_keeping_notes(&out, &text)?;
    println!("{text}");
    for png in super::figures::robustness(&json)? {
        eprintln!("wrote {}", png.display());
    }
    eprintln!("wrote {} and {}", out.display(), json.display());
    Ok(())
}

/// A tenth of the arm's rounds (over MNIST's training set, or its first `train_limit`).
fn default_warmup(epochs: u32, train_limit: Option<usize>) -> u64 {
    let job = Job {
        workers: WORKERS,
        epochs,
        ..Job::default()
    };
    let samples = ImageDataset::Mnist.train_samples();
    let (_, rounds) = job.steps(train_limit.map_or(samples, |n| n.min(samples)));
    (rounds / 10).max(1)
}

#[allow(clippy::too_many_arguments)]
fn run_arm(
    a: &AttackArgs,
    settings: &Settings,
    codec: &str,
    rule: &str,
    name: &str,
    attack: Option<Attack>,
    test: &murmur_engine::data::ImageSet,
    device: &murmur_engine::Device,
) -> anyhow::Result<ArmResult> {
    let dir = crate::commands::fresh_temp_dir("murmur-repro-attack-")?;
    let model = dir.join("model.mmst");
    let job = Job {
        workers: WORKERS,
        dataset: "mnist".into(),
        epochs: settings.epochs,
        train_limit: settings.train_limit,
        codec: codec.into(),
        memory: "ef".into(),
        server_memory: "ef".into(),
        aggregate: rule.into(),
        seed: settings.seed,
        warmup: settings.warmup,
        // Every round waits for every worker, cut equally: the arms compare rules and
        // attacks, not the machine's timing.
        quorum: 1.0,
        shares: "equal".into(),
        ..Job::default()
    };
    job.validate()?;
    let started = Instant::now();
    let swarm = LocalSwarm::start(
        SwarmConfig {
            device: a.run.device,
            data: a.run.data.clone(),
            deadline_s: 120.0,
            save: Some(model.clone()),
            attacker: attack,
            ..SwarmConfig::new(SERVERS, job, dir.clone())
        },
        Launch::Threads,
    )?;
    let attacker = usize::from(WORKERS) - 1;
    let (mut ended, mut evicted_after, mut last_round) = (0, None, 0u64);
    while ended < usize::from(WORKERS) {
        let Some(event) = swarm.next_event(Duration::from_secs(600)) else {
            anyhow::bail!("the swarm said nothing for 10 minutes");
        };
        match event {
            SwarmEvent::Ended { index, error } => {
                ended += 1;
                match error {
                    Some(_) if index == attacker => evicted_after = Some(last_round),
                    Some(e) => anyhow::bail!("honest worker {index} failed: {e}"),
                    None => {}
                }
            }
            SwarmEvent::Worker {
                index,
                event: murmur_node::Event::Step { step, .. },
            } if index != attacker => last_round = last_round.max(step),
            _ => {}
        }
    }
    // An evicted attacker ends in an error; only an honest worker's fails the arm.
    let finished = swarm.finish();
    if evicted_after.is_none() {
        finished?;
    }
    let bytes = std::fs::read(&model)
        .with_context(|| format!("the first worker's model, {}", model.display()))?;
    let clf = Classifier::from_saved(Saved::from_bytes(&bytes, device)?)?;
    let accuracy = clf.accuracy(test, 1000)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ArmResult {
        codec: codec.into(),
        rule: rule.into(),
        attack: name.into(),
        accuracy,
        evicted_after,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn report(
    settings: &Settings,
    stem: &str,
    codecs: &[String],
    rules: &[String],
    attacks: &[String],
    arms: &[ArmResult],
    device: &murmur_engine::Device,
) -> String {
    let find = |codec: &str, rule: &str, attack: &str| {
        arms.iter()
            .find(|r| r.codec == codec && r.rule == rule && r.attack == attack)
    };
    let mut text = format!(
        "# One attacker in four: what each aggregation rule withstands\n\nGenerated by `{}` on \
         {}, device {device}; the arms took {:.0} minutes (arms are kept from earlier runs of \
         the same settings). Raw numbers: `{stem}.json`; figure: `{stem}-accuracy.png`.\n\nSetup: MNIST, the MLP 784-512-256-10 with AdamW at lr \
         2e-3{}, seed {}, {} epochs{}, {} workers of batch 128 and {} parameter-server shards as \
         threads of one process over QUIC on loopback; worker and server error feedback; \
         every round waits for every worker, cut equally; a worker the servers evict leaves \
         the rounds to the other three. The last worker attacks (it starts once the others \
         hold their ranks, so it always holds rank 3): its gradients ×1e30 or ×100 \
         (`scale`), negated (`sign-flip`), replaced by Gaussian noise of their norm \
         (`noise`), computed on its own replica trained at 1000× the learning rate \
         (`lr:1000`), or those of 10 rounds before (`replay:10`). Each cell is the test \
         accuracy of the model the first (honest) worker holds at the end, with the round \
         after which the servers evicted the attacker, if they did.\n\n",
        command_line(),
        Machine::detect(),
        arms.iter().map(|a| a.seconds).sum::<f64>() / 60.0,
        settings.warmup.map_or(" throughout".into(), |w| format!(
            " (warmed up over {w} rounds, then decayed along a cosine to a tenth)"
        )),
        settings.seed,
        settings.epochs,
        settings
            .train_limit
            .map_or(String::new(), |n| format!(" on the first {n} samples")),
        settings.workers,
        settings.servers,
    );
    for codec in codecs {
        text.push_str(&format!("## {codec}\n\n| attack |"));
        for rule in rules {
            text.push_str(&format!(" {rule} |"));
        }
        text.push_str("\n|---|");
        text.push_str(&"---|".repeat(rules.len()));
        text.push('\n');
        for attack in attacks {
            text.push_str(&format!("| {attack} |"));
            for rule in rules {
                let cell = match find(codec, rule, attack) {
                    Some(r) => {
                        let honest = find(codec, rule, "none").map(|h| h.accuracy);
                        let drop = honest
                            .filter(|_| attack != "none")
                            .map_or(String::new(), |h| {
                                format!(" ({:+.2})", 100.0 * (r.accuracy - h))
                            });
                        let evicted = r
                            .evicted_after
                            .map_or(String::new(), |n| format!(", evicted at {n}"));
                        format!(" {:.2}%{drop}{evicted} |", 100.0 * r.accuracy)
                    }
                    None => " – |".into(),
                };
                text.push_str(&cell);
            }
            text.push('\n');
        }
        text.push('\n');
    }
    text.push_str(
        "In parentheses: points against the same rule without attack. Acceptance (issue 21): \
         with the best rule for each codec, every attack within 1 pt of that rule's honest \
         run, and that honest run within 0.5 pt of the mean's.\n",
    );
    text
}
