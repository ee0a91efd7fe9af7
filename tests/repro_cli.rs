//! `murmur repro clapping-gpt` end to end on a tiny GPT: the table has a row per arm that ran,
//! the lazy-sampling controls split Clapping-FC's gap, the JSON holds every run, and a rerun
//! keeps the notes people wrote under the table.

mod common;

use std::process::Command;

use common::{have_shakespeare, RemovedOnDrop};

fn repro_clapping_gpt(out: &std::path::Path) -> String {
    let run = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "repro",
            "clapping-gpt",
            "--device=cpu",
            "--seeds=1",
            "--steps=6",
        ])
        .args([
            "--layers=2",
            "--stages=2",
            "--dim=8",
            "--heads=2",
            "--context=8",
        ])
        .args(["--batch=2", "--ps=0.5", "--eval-windows=4", "--evals=2"])
        .args(["--train-bytes=4000", "--warmup=2", "--jobs=2"])
        .arg("--arms=uncompressed;EF21 (FC, p = 1);Clapping-FC p = 0.5;uncompressed p = 0.5")
        .arg(format!("--out={}", out.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "repro clapping-gpt failed:\n{stderr}");
    assert!(stderr.contains("step 6/6 validation"), "{stderr}");
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn the_gpt_reproduction_writes_its_table_and_keeps_the_notes() {
    if !have_shakespeare() {
        return;
    }
    let dir = RemovedOnDrop::temp("repro-gpt");
    let out = dir.0.join("gpt.md");
    let table = repro_clapping_gpt(&out);
    for row in [
        "| uncompressed | none | 1 |",
        "| EF21 (FC, p = 1) | ef21 | 1 |",
        "| Clapping-FC p = 0.5 | fc | 0.5 |",
        "| uncompressed p = 0.5 | none | 0.5 |",
    ] {
        assert!(table.contains(row), "no row {row}:\n{table}");
    }
    assert!(
        !table.contains("| direct |"),
        "an arm that was not asked for"
    );
    assert!(
        table.contains("after 2 uncompressed warm-up steps"),
        "{table}"
    );
    // The split's two parts add up to the whole gap.
    let split = table
        .lines()
        .find(|l| l.starts_with("| 0.5 | "))
        .unwrap_or_else(|| panic!("no split row:\n{table}"));
    let cells: Vec<f64> = split
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert_eq!(cells.len(), 4, "{split}");
    assert!((cells[1] + cells[2] - cells[3]).abs() < 2e-4, "{split}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    let arms = json.as_array().unwrap();
    assert_eq!(arms.len(), 4);
    for arm in arms {
        let runs = arm["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1);
        let steps: Vec<u64> = runs[0]["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, [3, 6], "{}", arm["arm"]);
    }

    let notes = "## Notes\n\n- written by hand\n";
    std::fs::write(&out, format!("{table}\n{notes}")).unwrap();
    let again = repro_clapping_gpt(&out);
    assert!(again.ends_with(notes), "the notes were lost:\n{again}");
    assert_eq!(again.matches("## Notes").count(), 1);
}

#[test]
fn the_swarm_gpt_reproduction_matches_one_process_in_f32() {
    if !have_shakespeare() {
        return;
    }
    let dir = RemovedOnDrop::temp("repro-swarm-gpt");
    let out = dir.0.join("swarm-gpt.md");
    let run = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "repro",
            "swarm-gpt",
            "--device=cpu",
            "--workers=2",
            "--batch=4",
        ])
        .args(["--steps=8", "--eval-every=4", "--context=16", "--layers=1"])
        .args(["--dim=16", "--heads=2", "--lr=0.01"])
        .arg("--arms=one process;swarm, f32")
        .arg(format!("--out={}", out.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "repro swarm-gpt failed:\n{stderr}");
    let table = std::fs::read_to_string(&out).unwrap();
    let loss = |arm: &str| -> f64 {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {arm} |")))
            .unwrap_or_else(|| panic!("no row {arm}:\n{table}"));
        row.split('|').nth(2).unwrap().trim().parse().unwrap()
    };
    let (one, swarm) = (loss("one process"), loss("swarm, f32"));
    // Two workers' halves average to the whole batch's gradient up to rounding: the same
    // trajectory, where a wrong split of the batch would leave it.
    assert!(
        (one - swarm).abs() < 2e-3,
        "{one} against {swarm}:\n{table}"
    );
    assert!(one < 5.4, "the model learns: {table}");
    assert!(!table.contains("top-1%"), "an arm that was not asked for");
    assert!(out.with_extension("json").exists());
}
