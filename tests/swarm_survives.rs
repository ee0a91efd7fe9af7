//! A local swarm of processes trains on through its nodes' deaths: a worker killed with
//! SIGKILL costs the others one peer timeout, not the round deadline; started again it gets
//! its rank back, takes its own saved state (memories included) back, catches up and
//! finishes; a shard killed and started again goes on from its state folder. Every worker
//! ends at the job's last round.

mod common;

use std::time::{Duration, Instant};

use common::{have_mnist, RemovedOnDrop};
use murmur_node::swarm::{Launch, LocalSwarm, SwarmConfig, SwarmEvent};
use murmur_node::{DeviceKind, Event, Job, LinkConfig};

const STEPS: u64 = 400;

#[test]
fn a_swarm_trains_on_through_a_killed_worker_and_a_killed_shard() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("swarm-survives");
    let peer_timeout = Duration::from_secs(3);
    let job = Job {
        workers: 3,
        hidden: vec![32],
        batch: 32,
        epochs: 5,
        max_steps: Some(STEPS),
        train_limit: Some(8000),
        codec: "topk:0.1".into(),
        min_compress_bytes: 0,
        snapshot_every: 20,
        ..Job::default()
    };
    let mut swarm = LocalSwarm::start(
        SwarmConfig {
            servers: 2,
            job,
            device: DeviceKind::Cpu,
            data: None,
            link: LinkConfig {
                peer_timeout_s: peer_timeout.as_secs_f64(),
                ..LinkConfig::default()
            },
            deadline_s: 30.0,
            dir: dir.0.clone(),
            save: None,
            save_every: None,
            durable: true,
            emulated_seconds_per_sample: None,
            slow_worker: None,
            attacker: None,
        },
        Launch::Processes {
            exe: env!("CARGO_BIN_EXE_murmur").into(),
        },
    )
    .unwrap();

    // What happens at which of worker 0's rounds.
    let (kill_worker_at, respawn_at, kill_shard_at) = (20, 60, 150);
    let (mut killed, mut respawned, mut shard_killed) = (false, false, false);
    let mut done = [false; 3];
    let mut rejoined_from = None;
    let mut last_round = Instant::now();
    let mut longest_wait = Duration::ZERO;
    let started = Instant::now();
    while done.iter().any(|d| !d) {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the swarm did not finish within 5 minutes"
        );
        let Some(event) = swarm.next_event(Duration::from_millis(100)) else {
            continue;
        };
        match event {
            SwarmEvent::Worker {
                index: 0,
                event: Event::Step { step, .. },
            } => {
                longest_wait = longest_wait.max(last_round.elapsed());
                last_round = Instant::now();
                if step >= kill_worker_at && !killed {
                    swarm.kill_worker(1).unwrap();
                    killed = true;
                }
                if step >= respawn_at && !respawned {
                    swarm.respawn_worker(1).unwrap();
                    respawned = true;
                }
                if step >= kill_shard_at && !shard_killed {
                    swarm.kill_server(1).unwrap();
                    swarm.restart_server(1).unwrap();
                    shard_killed = true;
                }
            }
            SwarmEvent::Worker {
                index: 1,
                event:
                    Event::Joined {
                        from_step,
                        resumed_from,
                        ..
                    },
            } if respawned => rejoined_from = Some((from_step, resumed_from)),
            SwarmEvent::Worker {
                index,
                event: Event::Done { steps, .. },
            } => {
                assert_eq!(steps, STEPS, "worker {index} ended early");
                done[index] = true;
            }
            SwarmEvent::Worker {
                index,
                event: Event::Error { message, .. },
            } => panic!("worker {index} failed: {message}"),
            // The killed worker's end.
            SwarmEvent::Ended { index: 1, .. } if killed && !respawned => {}
            SwarmEvent::Ended {
                index,
                error: Some(why),
            } => panic!("worker {index} ended: {why}"),
            _ => {}
        }
    }
    swarm.finish().unwrap();
    let (rejoined_from, resumed_from) = rejoined_from.expect("the respawned worker joined");
    eprintln!(
        "worker 1 killed at round {kill_worker_at}, started again at {respawn_at}, took its own state of round {resumed_from:?} back and rejoined at round {rejoined_from}; shard 1 killed and restarted at {kill_shard_at}; worker 0 waited at most {longest_wait:?} for a round"
    );
    let resumed_from = resumed_from.expect("the respawned worker took its saved state back");
    assert!(
        resumed_from >= kill_worker_at - 1 && resumed_from <= rejoined_from,
        "it took back the state of round {resumed_from}"
    );
    assert!(
        rejoined_from >= respawn_at,
        "the respawned worker started from round {rejoined_from}"
    );
    // A dead worker or shard holds the rounds up for about the peer timeout (then the
    // restart), not for the 30 s deadline.
    assert!(
        longest_wait < peer_timeout + Duration::from_secs(5),
        "a round waited {longest_wait:?}"
    );
}
