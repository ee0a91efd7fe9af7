//! Durable server shards: `murmur server --state DIR` killed with SIGKILL mid-run and started
//! again with the same flags goes on from the last round it saved. Two shards serve two
//! workers (threads of this process); shard 0 is killed, then shard 1. The workers notice a
//! dead shard within the peer timeout, reconnect on their own with back-off, take the rounds
//! the live shard closed from its log, push the round whose replies they missed again with the
//! same bytes, and finish with replicas equal bit for bit to those of the same job run without
//! a kill.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{have_mnist, wait_for, RemovedOnDrop};
use murmur_node::swarm::prepare;
use murmur_node::{
    DeviceKind, Event, Job, LinkConfig, ServerConfig, ServerNode, Worker, WorkerConfig,
    WorkerHandle,
};

const WORKERS: u16 = 2;
const SHARDS: u16 = 2;
/// How long any awaited event may take.
const MINUTES: Duration = Duration::from_secs(120);
const STEPS: u64 = 60;

fn job() -> Job {
    Job {
        workers: WORKERS,
        hidden: vec![32],
        batch: 32,
        epochs: 1,
        max_steps: Some(STEPS),
        train_limit: Some(4000),
        codec: "topk:0.1".into(),
        // The server compresses its replies with error feedback: its memory must survive.
        pull_codec: Some("topk:0.2".into()),
        server_memory: "ef".into(),
        min_compress_bytes: 0,
        snapshot_every: 20,
        // Every round waits for every worker, and every round is cut equally, so that the
        // run without kills gives the same bits whatever the timing.
        quorum: 1.0,
        shares: "equal".into(),
        ..Job::default()
    }
}

fn workers(dir: &std::path::Path, servers: &[String], run: &str) -> Vec<WorkerHandle> {
    (0..WORKERS as usize)
        .map(|i| {
            Worker::start(WorkerConfig {
                servers: servers.to_vec(),
                swarm: dir.to_path_buf(),
                node: format!("worker-{i}"),
                device: DeviceKind::Cpu,
                // Notice a dead shard after 3 s of silence rather than the default 5 s.
                link: LinkConfig {
                    peer_timeout_s: 3.0,
                    ..LinkConfig::default()
                },
                save: Some(dir.join(format!("{run}-{i}.state"))),
                ..WorkerConfig::default()
            })
            .unwrap()
        })
        .collect()
}

/// Waits for the workers and returns their final states.
fn finish(dir: &std::path::Path, run: &str, workers: Vec<WorkerHandle>) -> Vec<Vec<u8>> {
    for w in workers {
        let report = w.join().unwrap();
        assert_eq!(report.steps, STEPS);
        assert!(!report.stopped);
    }
    (0..WORKERS)
        .map(|i| std::fs::read(dir.join(format!("{run}-{i}.state"))).unwrap())
        .collect()
}

/// `murmur server` for `shard` on `listen`, with the state folder `shard-N` in `dir`; returns
/// it and its address.
fn server_process(dir: &std::path::Path, shard: u16, listen: &str) -> (Child, String) {
    let job_file = dir.join("job.toml");
    std::fs::write(&job_file, job().to_toml()).unwrap();
    let state = dir.join(format!("shard-{shard}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args(["server", "--listen", listen])
        .arg(format!("--node=server-{shard}"))
        .arg(format!("--shard={shard}"))
        .arg(format!("--shards={SHARDS}"))
        .arg("--swarm")
        .arg(dir)
        .arg("--config")
        .arg(&job_file)
        .arg("--state")
        .arg(&state)
        .args(["--peer-timeout-s", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening: serde_json::Value = serde_json::from_str(&line).expect("a listening line");
    let addr = listening["addr"].as_str().unwrap().to_string();
    (child, addr)
}

/// Kills the child when dropped, so that a failing test leaves no server behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn killed_shards_restarted_with_their_state_go_on_from_their_last_round() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("durable-server");
    prepare(&dir.0, SHARDS, WORKERS).unwrap();

    // The same job without a kill, on in-process shards.
    let reference = {
        let servers: Vec<_> = (0..SHARDS)
            .map(|shard| {
                ServerNode::start(ServerConfig {
                    listen: "127.0.0.1:0".into(),
                    swarm: dir.0.clone(),
                    node: format!("server-{shard}"),
                    shard,
                    shards: SHARDS,
                    job: job(),
                    ..ServerConfig::default()
                })
                .unwrap()
            })
            .collect();
        let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
        finish(&dir.0, "reference", workers(&dir.0, &addrs, "reference"))
    };
    assert_eq!(reference[0], reference[1]);

    let (mut servers, addrs): (Vec<Killed>, Vec<String>) = (0..SHARDS)
        .map(|shard| {
            let (child, addr) = server_process(&dir.0, shard, "127.0.0.1:0");
            (Killed(child), addr)
        })
        .unzip();
    let running = workers(&dir.0, &addrs, "killed");
    let mut events: Vec<_> = running.iter().map(|w| w.events()).collect();
    // Shard 0 past the first snapshot (round 20), so that it restarts with a snapshot and a
    // log to serve; shard 1 later.
    for (shard, kill_at) in [(0, 30), (1, 45)] {
        wait_for(&mut events[0], MINUTES, |e| match e {
            Event::Step { step, .. } if *step >= kill_at => Some(()),
            _ => None,
        });
        servers[shard].0.kill().unwrap();
        servers[shard].0.wait().unwrap();
        let killed = Instant::now();
        let (child, _) = server_process(&dir.0, shard as u16, &addrs[shard]);
        servers[shard] = Killed(child);
        let rejoined: Vec<u64> = events
            .iter_mut()
            .map(|e| {
                wait_for(e, MINUTES, |e| match e {
                    Event::Rejoined { step, .. } => Some(*step),
                    _ => None,
                })
            })
            .collect();
        eprintln!(
            "shard {shard} killed at round {kill_at} or after; both workers back at rounds {rejoined:?}, {:?} after the kill",
            killed.elapsed()
        );
        for step in &rejoined {
            assert!(
                *step >= kill_at && *step < STEPS,
                "rejoined at round {step}, not where shard {shard} was killed ({kill_at} or after)"
            );
        }
    }
    let states = finish(&dir.0, "killed", running);
    assert!(
        states == reference,
        "the replicas differ from those of the run without the kills"
    );
}
