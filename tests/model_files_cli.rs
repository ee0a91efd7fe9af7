//! What `murmur train --save` leaves behind, used end to end: `murmur export` (weights alone,
//! f16), `murmur eval` (the accuracy or validation loss the training run measured in process)
//! and `murmur sample`; old and damaged files are clear errors. Tiny models on the CPU device.

mod common;

use common::{have_mnist, have_shakespeare, RemovedOnDrop};
use std::path::Path;
use std::process::{Command, Output};

fn murmur(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap()
}

/// The last stdout line of a successful run, as JSON.
fn summary(out: &Output, what: &str) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("a summary line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"))
}

/// The stderr of a run that must fail cleanly (exit 1, no panic).
fn refusal(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// 200 steps of a small MLP on the CPU (2 epochs of 100 batches), with `extra` flags.
fn train_mlp(extra: &[&str]) -> Output {
    let flags = "train --device cpu --hidden 32 --train-limit 3200 --batch 32 --epochs 2 --quiet \
                 --seed 3";
    murmur(
        &flags
            .split_whitespace()
            .chain(extra.iter().copied())
            .collect::<Vec<_>>(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn exported_weights_evaluate_to_the_accuracy_measured_in_training() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("export-eval");
    std::fs::create_dir_all(&dir.0).unwrap();
    let (run, f32_weights, f16_weights) = (
        dir.0.join("run.safetensors"),
        dir.0.join("w32.safetensors"),
        dir.0.join("w16.safetensors"),
    );
    // The summary's accuracy is evaluated in process.
    let trained = summary(&train_mlp(&["--save", path(&run)]), "train");
    assert_eq!(trained["steps"], 200);
    let in_process = trained["final_test_accuracy"].as_f64().unwrap();
    for (out, dtype) in [(&f32_weights, "f32"), (&f16_weights, "f16")] {
        let exported = murmur(&[
            "export",
            path(&run),
            "--weights-only",
            "--dtype",
            dtype,
            "-o",
            path(out),
        ]);
        assert!(
            exported.status.success(),
            "{}",
            String::from_utf8_lossy(&exported.stderr)
        );
    }
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    // Weights alone are a third of the AdamW checkpoint; f16 halves them again.
    assert!(3 * size(&f32_weights) < size(&run) + 4096);
    assert!(2 * size(&f16_weights) < size(&f32_weights) + 4096);
    // The model is rebuilt from the file's metadata alone: no model flags, the dataset
    // read from the file.
    let eval = |p: &Path| {
        summary(&murmur(&["eval", path(p), "--device", "cpu"]), "eval")["test_accuracy"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(eval(&f32_weights), in_process);
    assert_eq!(eval(&run), in_process);
    let f16 = eval(&f16_weights);
    assert!(
        (f16 - in_process).abs() <= 0.003,
        "f16 weights score {f16}, f32 {in_process}"
    );
    // A classifier does not sample, weights alone do not resume.
    assert!(refusal(&murmur(&["sample", path(&f16_weights)])).contains("needs a gpt"));
    let resumed = train_mlp(&["--resume", path(&f32_weights)]);
    assert!(refusal(&resumed).contains("weights alone"));
}

#[test]
fn a_gpt_checkpoint_evaluates_and_samples() {
    if !have_shakespeare() {
        return;
    }
    let dir = RemovedOnDrop::temp("gpt-sample");
    std::fs::create_dir_all(&dir.0).unwrap();
    let (run, weights) = (
        dir.0.join("gpt.safetensors"),
        dir.0.join("bf16.safetensors"),
    );
    let trained = summary(
        &murmur(&[
            "train",
            "--model",
            "gpt",
            "--device",
            "cpu",
            "--steps",
            "20",
            "--context",
            "16",
            "--layers",
            "1",
            "--dim",
            "16",
            "--heads",
            "2",
            "--batch",
            "4",
            "--eval-every",
            "20",
            "--eval-windows",
            "16",
            "--sample-bytes",
            "4",
            "--quiet",
            "--save",
            path(&run),
        ]),
        "train --model gpt",
    );
    let valid = |p: &Path| {
        summary(
            &murmur(&["eval", path(p), "--device", "cpu", "--eval-windows", "16"]),
            "eval",
        )["valid_loss"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(valid(&run), trained["final_valid_loss"].as_f64().unwrap());
    let out = murmur(&[
        "export",
        path(&run),
        "--weights-only",
        "--dtype",
        "bf16",
        "-o",
        path(&weights),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!((valid(&weights) - valid(&run)).abs() < 0.05);
    let sample = |seed: &str| {
        let out = murmur(&[
            "sample",
            path(&weights),
            "--bytes",
            "24",
            "--prompt",
            "KING:",
            "--seed",
            seed,
            "--device",
            "cpu",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let (a, b, c) = (sample("1"), sample("1"), sample("2"));
    assert!(a.starts_with(b"KING:") && a.len() == 5 + 24 + 1, "{a:?}");
    assert_eq!(a, b, "the same seed gives the same text");
    assert_ne!(a, c, "another seed, another text");
}

#[test]
fn old_and_damaged_files_are_clear_errors() {
    let dir = RemovedOnDrop::temp("bad-model-files");
    std::fs::create_dir_all(&dir.0).unwrap();
    let old = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("engine/tests/fixtures/murmur-0.1-mlp.safetensors");
    let stderr = refusal(&murmur(&["eval", path(&old), "--device", "cpu"]));
    assert!(stderr.contains("older murmur"), "{stderr}");
    let (cut, out) = (dir.0.join("cut.safetensors"), dir.0.join("out.safetensors"));
    std::fs::write(&cut, &std::fs::read(&old).unwrap()[..600]).unwrap();
    for args in [
        vec!["eval", path(&cut), "--device", "cpu"],
        vec!["sample", path(&cut), "--device", "cpu"],
        vec!["export", path(&cut), "--weights-only", "-o", path(&out)],
    ] {
        let stderr = refusal(&murmur(&args));
        assert!(stderr.contains("not a valid checkpoint"), "{stderr}");
    }
    let stderr = refusal(&murmur(&[
        "export",
        path(&old),
        "--dtype",
        "f16",
        "-o",
        path(&out),
    ]));
    assert!(stderr.contains("--weights-only"), "{stderr}");
}
