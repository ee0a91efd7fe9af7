//! `murmur train` checkpoints end to end: a run stopped part-way through an epoch and resumed
//! from its checkpoint ends with the same bytes as an uninterrupted run (parameters, optimizer
//! state and step; the learning-rate schedule, clipping and the batch order all continue
//! where they were). The CNN's dropout across a resume is covered in
//! engine/tests/models_training.rs; a small MLP keeps this test fast.

mod common;

use common::{have_mnist, RemovedOnDrop};
use std::path::Path;
use std::process::Command;

fn train(extra: &str, save: &Path, resume: Option<&Path>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_murmur"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(
        "train --model mlp --hidden 32 --dataset mnist --train-limit 256 --batch 64 --epochs 2 --warmup 2 \
         --clip 0.5 --quiet --seed 4"
            .split_whitespace(),
    );
    cmd.args(extra.split_whitespace()).arg("--save").arg(save);
    if let Some(r) = resume {
        cmd.arg("--resume").arg(r);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "murmur train failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_resumed_run_ends_with_the_bytes_of_an_uninterrupted_one() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("train-resume");
    std::fs::create_dir_all(&dir.0).unwrap();
    let (straight, part, resumed) = (
        dir.0.join("straight"),
        dir.0.join("part"),
        dir.0.join("resumed"),
    );
    // 4 steps per epoch: stop after 3 (inside the first epoch), resume to 6.
    train("--max-steps 6", &straight, None);
    train("--max-steps 3", &part, None);
    train("--max-steps 6", &resumed, Some(&part));
    let (a, b) = (
        std::fs::read(&straight).unwrap(),
        std::fs::read(&resumed).unwrap(),
    );
    assert_ne!(
        std::fs::read(&part).unwrap(),
        a,
        "the partial run must differ"
    );
    assert!(
        a == b,
        "resumed checkpoint differs from the uninterrupted one"
    );
}

/// `--metrics` writes a line per step (with `--log-every 1`) and one per evaluation, as it
/// goes: steps in order, finite losses, the learning rate, no traffic on one machine.
#[test]
fn metrics_hold_a_line_per_step_and_per_evaluation() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("train-metrics");
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("run.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(
            "train --device cpu --model mlp --hidden 16 --train-limit 256 --batch 64 --epochs 2 \
             --max-steps 6 --log-every 1 --quiet --lr 0.01"
                .split_whitespace(),
        )
        .arg("--metrics")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (steps, evals): (Vec<_>, Vec<_>) = lines.iter().partition(|l| l.get("loss").is_some());
    let numbers = |v: &[&serde_json::Value], f: &str| -> Vec<f64> {
        v.iter().map(|l| l[f].as_f64().unwrap()).collect()
    };
    // 4 steps per epoch: steps 1 to 6, an evaluation after epoch 1 (step 4) and at the stop.
    assert_eq!(numbers(&steps, "step"), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(numbers(&steps, "epoch"), [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]);
    assert!(numbers(&steps, "loss")
        .iter()
        .all(|l| l.is_finite() && *l > 0.0));
    assert!(numbers(&steps, "lr")
        .iter()
        .all(|&lr| (lr - 0.01).abs() < 1e-6));
    assert!(numbers(&steps, "step_seconds").iter().all(|s| *s >= 0.0));
    assert!(numbers(&steps, "bytes_up").iter().all(|b| *b == 0.0));
    assert_eq!(numbers(&evals, "step"), [4.0, 6.0]);
    assert!(numbers(&evals, "accuracy")
        .iter()
        .all(|a| (0.0..=1.0).contains(a)));
}

/// A metrics path that cannot be written fails at once, before the data is even read.
#[test]
fn an_unwritable_metrics_path_fails_before_any_work() {
    let out = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args(["train", "--device", "cpu", "--data", "/nonexistent-data"])
        .args(["--metrics", "/nonexistent-murmur-dir/run.jsonl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {err}");
    assert!(
        err.contains("--metrics /nonexistent-murmur-dir/run.jsonl: there is no folder"),
        "{err}"
    );
}
