//! `murmur swarm` end to end: separate server and worker processes over loopback QUIC with
//! swarm credentials, a compressed codec, and a JSON outcome whose byte counts add up, as do
//! the per-round metrics lines of every rank.

mod common;

use common::{have_mnist, RemovedOnDrop};
use std::process::Command;

#[test]
fn a_local_swarm_trains_and_reports_the_bytes_it_saved() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("swarm-test");
    let metrics_dir = RemovedOnDrop::temp("swarm-test-metrics");
    std::fs::create_dir_all(&metrics_dir.0).unwrap();
    let metrics = metrics_dir.0.join("run.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(
            "swarm --workers 2 --servers 2 --codec topk:0.05 --min-compress-bytes 0 --epochs 1 \
             --max-steps 40 --train-limit 12000 --hidden 64 --quiet --dir"
                .split_whitespace(),
        )
        .arg(&dir.0)
        .arg("--metrics")
        .arg(&metrics)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "murmur swarm failed:\n{stderr}");
    assert!(stderr.contains("less traffic"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("an outcome line");
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let acc = v["final_test_accuracy"].as_f64().expect("an accuracy");
    assert!(acc > 0.6, "40 steps reach well above chance, got {acc}");
    // Top 5% as (u32 index, f32 value) pairs: a tenth of f32's bytes, plus headers.
    let reduction = v["reduction"].as_f64().unwrap();
    assert!(
        (9.0..10.5).contains(&reduction),
        "top-5% should send about a tenth of f32's bytes, got {reduction}x less"
    );
    // Every rank wrote a line per round, in order, and their bytes are the outcome's.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut bytes = 0;
    for rank in 0..2 {
        let of_rank = lines
            .iter()
            .filter(|l| l["rank"] == rank && l["loss"].is_f64());
        let steps: Vec<u64> = of_rank.map(|l| l["step"].as_u64().unwrap()).collect();
        assert_eq!(steps, (1..=40).collect::<Vec<_>>(), "rank {rank}");
    }
    for l in &lines {
        bytes += l["bytes_up"].as_u64().unwrap_or(0) + l["bytes_down"].as_u64().unwrap_or(0);
    }
    assert_eq!(bytes, v["total_bytes"].as_u64().unwrap());
    let mut evaluated: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["accuracy"].is_f64()).collect();
    // The ranks' lines arrive in either order.
    evaluated.sort_by_key(|l| l["rank"].as_u64());
    // One epoch: every worker evaluates the last round, and the replicas agree.
    assert_eq!(evaluated.len(), 2, "each rank evaluates the last round");
    for (l, rank) in evaluated.iter().zip([0, 1]) {
        assert_eq!((&l["step"], &l["rank"]), (&40.into(), &rank.into()));
    }
    assert_eq!(evaluated[0]["accuracy"], evaluated[1]["accuracy"]);
    // Both shards took part: each heard both workers introduce their rank, and shard 0
    // handed the job to both (the workers were given no job flags).
    for shard in 0..2 {
        let log = std::fs::read_to_string(dir.0.join(format!("logs/server-{shard}.log"))).unwrap();
        assert_eq!(log.matches(" is rank ").count(), 2, "{log}");
    }
    let log = std::fs::read_to_string(dir.0.join("logs/server-0.log")).unwrap();
    assert_eq!(log.matches("joins the job as rank").count(), 2, "{log}");
}

/// `murmur swarm --local-steps`: workers take 8 steps between exchanges of sign-coded
/// pseudo-gradients; the swarm learns, and its bytes are those of 8 steps' f32 exchanges
/// over the sign codec's ratio, not of every step's.
#[test]
fn a_swarm_of_local_steps_exchanges_once_a_round() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("swarm-local-steps");
    let out = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(
            "swarm --workers 2 --servers 2 --codec sign --min-compress-bytes 0 --epochs 1 \
             --local-steps 8 --outer-lr 1 --outer-momentum 0 --max-steps 5 --train-limit 12000 \
             --hidden 64 --quiet --dir"
                .split_whitespace(),
        )
        .arg(&dir.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "murmur swarm failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("an outcome line");
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(v["steps"], 5, "rounds, each of 8 steps: {line}");
    let acc = v["final_test_accuracy"].as_f64().expect("an accuracy");
    assert!(
        acc > 0.7,
        "40 steps of 2 x 128 reach well above chance, got {acc}"
    );
    // Sign codes take a bit an element (and a scale per partition): about 32x fewer bytes
    // than f32 a round, 8 steps' exchanges of f32 in a round.
    let reduction = v["reduction"].as_f64().unwrap();
    assert!(
        (8.0 * 25.0..8.0 * 33.0).contains(&reduction),
        "one sign exchange a round for 8 of f32: got {reduction}x less"
    );
}
