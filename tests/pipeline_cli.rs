//! `murmur pipeline` end to end: three stage processes over loopback QUIC train the bits of
//! the in-process pipeline (the same test accuracy, exactly), report bytes that match the
//! formula, and refuse a split that cannot work.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{have_mnist, RemovedOnDrop};
use murmur::engine::algo::OptimizerSpec;
use murmur::engine::data::{default_root, ImageDataset, Split};
use murmur::engine::pipeline::message::RowCodec;
use murmur::engine::pipeline::{ModelSpec, PSchedule, Pipeline, PipelineConfig, Rule, Variant};
use murmur::engine::Device;

fn murmur() -> Command {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
}

#[test]
fn stage_processes_over_quic_train_the_in_process_bits() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("pipeline-test");
    std::fs::create_dir_all(&dir.0).unwrap();
    let out = murmur()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["pipeline", "--stages=3", "--variant=fu", "--codec=topk:0.2"])
        .args(["--backward-codec=qsgd:bits=6", "--p=0.5", "--dataset=mnist"])
        .args([
            "--epochs=1",
            "--train-limit=1280",
            "--hidden=32,16",
            "--seed=1",
        ])
        .arg("--device=cpu")
        .arg(format!("--dir={}", dir.0.display()))
        .arg(format!(
            "--save={}",
            dir.0.join("model.safetensors").display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "murmur pipeline failed:\n{stderr}");
    assert!(stderr.contains("step 10/10"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("a summary line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();

    let config = PipelineConfig {
        model: ModelSpec::Mlp(vec![784, 32, 16, 10]),
        stages: 3,
        batch: 128,
        variant: Variant::Fu,
        forward_codec: "topk:0.2".into(),
        backward_codec: "qsgd:bits=6".into(),
        p: PSchedule::Constant(0.5),
        rule: Rule::Batch,
        warmup: 0,
        optimizer: OptimizerSpec::Ema { m: 0.1 },
        lr: 0.5,
        weight_decay: 1e-4,
        lr_drop_at: None,
        seed: 1,
    };
    let root = default_root();
    let mut train = ImageDataset::Mnist.load(&root, Split::Train).unwrap();
    train.truncate(1280);
    let test = ImageDataset::Mnist.load(&root, Split::Test).unwrap();
    let mut p = Pipeline::new(config.clone(), &Device::Cpu, Arc::new(train.into())).unwrap();
    let mut bytes = 0;
    for _ in 0..10 {
        bytes += p.step().unwrap().bytes;
    }
    let accuracy = p.accuracy(&test, 1000).unwrap();
    assert_eq!(
        v["test_accuracy"].as_f64().unwrap(),
        accuracy,
        "same bits, same accuracy"
    );
    assert_eq!(v["bytes_per_step"].as_f64().unwrap(), bytes as f64 / 10.0);
    // FU sends fresh batches raw: at least the compressed size every step, at most f32.
    let (fwd, bwd): (RowCodec, RowCodec) =
        ("topk:0.2".parse().unwrap(), "qsgd:bits=6".parse().unwrap());
    let coded: usize = [32, 16]
        .iter()
        .map(|&d| 128 * (fwd.payload_len(d) + bwd.payload_len(d)))
        .sum();
    let per_step = bytes as f64 / 10.0;
    assert!(per_step > coded as f64 && per_step < v["f32_bytes_per_step"].as_f64().unwrap());
    assert_eq!(v["memory_floats"], 4 * 128 * (32 + 16));

    // The model left behind is the one the run tested.
    let out = murmur()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("eval")
        .arg(dir.0.join("model.safetensors"))
        .arg("--device=cpu")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "murmur eval failed:\n{stderr}");
    let e: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(e["test_accuracy"], v["test_accuracy"], "{stderr}");
}

#[test]
fn a_split_that_cannot_work_is_a_clear_error() {
    let out = murmur()
        .args(["pipeline", "--stages=5", "--hidden=8", "--epochs=1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("5 stages for 2 layers") || stderr.contains("not found"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
