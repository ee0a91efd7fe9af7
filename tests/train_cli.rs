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
