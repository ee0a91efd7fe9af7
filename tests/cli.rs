//! The `murmur` binary end to end: training prints a JSON summary, errors are clear and
//! non-zero, never panics.

mod common;

use common::have_mnist;
use std::process::Command;

fn murmur() -> Command {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
}

#[test]
fn train_prints_progress_and_a_json_summary() {
    if !have_mnist() {
        return;
    }
    let out = murmur()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "train",
            "--model",
            "mlp",
            "--dataset",
            "mnist",
            "--epochs",
            "1",
            "--max-steps",
            "40",
        ])
        .args([
            "--train-limit",
            "6000",
            "--hidden",
            "64",
            "--quiet",
            "--seed",
            "5",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "murmur train failed:\n{stderr}");
    assert!(
        stderr.contains("epoch 1/1") && stderr.contains("test accuracy"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("a summary line");
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(v["steps"], 40);
    assert_eq!(v["hidden"], serde_json::json!([64]));
    let acc = v["final_test_accuracy"].as_f64().unwrap();
    assert!(
        acc > 0.7,
        "40 steps of AdamW reach well above chance, got {acc}"
    );
    assert!(v["epoch_seconds"][0].as_f64().unwrap() > 0.0);
}

#[test]
fn info_names_the_adapter() {
    // Its matmul kernels too: measured on the first run, read back on the next.
    let cache = tempfile::tempdir().unwrap();
    let info = || {
        let out = murmur()
            .arg("info")
            .env("MURMUR_CACHE_DIR", cache.path())
            .env_remove("MURMUR_MATMUL")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stdout = info();
    assert!(
        stdout.contains("selected GPU adapter") && stdout.contains("subgroup size"),
        "{stdout}"
    );
    assert!(
        stdout.contains("matmul kernels: small ") && stdout.contains("measured now, kept in"),
        "{stdout}"
    );
    assert!(info().contains("measured before, read from"));
}

#[test]
fn no_adapter_is_a_clear_error_not_a_panic() {
    // Hide every Vulkan driver from the loader.
    let out = murmur()
        .arg("info")
        .env("VK_DRIVER_FILES", "/nonexistent.json")
        .env("VK_ICD_FILENAMES", "/nonexistent.json")
        .env("MURMUR_BACKEND", "vulkan")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mesa-vulkan-drivers"),
        "the error says how to get an adapter: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn auto_device_trains_on_the_cpu_path_where_the_adapter_is_software_or_absent() {
    if !have_mnist() {
        return;
    }
    let train = |hide_drivers: bool| {
        let mut cmd = murmur();
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "train",
            "--max-steps",
            "3",
            "--train-limit",
            "1000",
            "--hidden",
            "16",
            "--quiet",
        ]);
        if hide_drivers {
            cmd.env("VK_DRIVER_FILES", "/nonexistent.json")
                .env("VK_ICD_FILENAMES", "/nonexistent.json");
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .to_string();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        v["device"].as_str().unwrap().to_string()
    };
    // No adapter at all: the default device is no longer an error.
    assert_eq!(train(true), "cpu");
    // With the machine's adapters: a software one (lavapipe in CI) loses to the CPU path,
    // a hardware one wins.
    let info = murmur().args(["info", "--json"]).output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let software = info["selected"]["device_type"] == "Cpu";
    let auto = info["device_auto"].as_str().unwrap();
    assert_eq!(auto.starts_with("cpu"), software, "{info}");
    assert_eq!(train(false) == "cpu", software);

    // `murmur info` without any adapter says what auto does instead of failing.
    let out = murmur()
        .arg("info")
        .env("VK_DRIVER_FILES", "/nonexistent.json")
        .env("VK_ICD_FILENAMES", "/nonexistent.json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("device auto (the default): cpu"),
        "{stdout}"
    );
}

#[test]
fn unknown_adapter_names_and_missing_data_are_clear_errors() {
    let out = murmur()
        .arg("info")
        .env("MURMUR_ADAPTER", "no-such-gpu")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("no adapter matches") && stderr.contains("adapters seen"),
        "{stderr}"
    );

    let out = murmur()
        .args(["train", "--data", "/nonexistent", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("scripts/fetch-data.sh"), "{stderr}");
}

#[test]
fn flags_a_model_does_not_use_are_refused_not_ignored() {
    for (args, named) in [
        ("--model gpt --hidden 32 --epochs 2", "--epochs, --hidden"),
        ("--model cnn --layers 2 --hidden 8", "--layers, --hidden"),
        ("--model mlp --dropout 0.1", "--dropout"),
        ("--model gpt --optim sgd", "--optim"),
    ] {
        let out = murmur()
            .arg("train")
            .args(args.split_whitespace())
            .args(["--data", "/nonexistent", "--quiet"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "a usage error: {args}: {stderr}"
        );
        assert!(
            stderr.contains("does not use") && stderr.contains(named),
            "{args}: {stderr}"
        );
    }
}
