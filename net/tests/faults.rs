//! Bad input and failing peers: a malformed or dishonest frame costs its connection and
//! nothing else; a worker that stops mid-round is evicted at the deadline and can rejoin.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use murmur_engine::comm::{Collective, Key, KeySpec};
use murmur_engine::compress::parse;
use murmur_engine::train::DataParallel;
use murmur_net::identity::{Credentials, Swarm};
use murmur_net::ps::ServerOptions;
use murmur_net::transport::{client_endpoint, connect, receive, send, send_bytes, Link};
use murmur_net::wire::{Frame, Hello, Kind, Limits, Register};

const KEY: Key = 0x10001;
/// The servers' payload limit in these tests.
const MAX_PAYLOAD: usize = 4096;

fn keys() -> Vec<KeySpec> {
    vec![f32_key(KEY)]
}

/// What a misbehaving rank 2 does in round 1, after an honest round 0.
#[derive(Clone, Copy, Debug)]
enum Misdeed {
    Garbage,
    Truncated,
    Oversized,
    UnknownKey,
    WrongSize,
    Overflow,
}

/// Says hello as rank 2 of 3, registers, pushes round 0 honestly and takes its reply.
async fn rank_2_through_round_0(conn: &quinn::Connection, node: &str) {
    let hello = Hello {
        rank: 2,
        world: 3,
        shard: 0,
        shards: 1,
        node: node.into(),
        ticket: None,
    };
    send(conn, Frame::control(Kind::Hello, 2, 0, &hello))
        .await
        .unwrap();
    let register = Register {
        keys: keys(),
        replica_digests: false,
    };
    send(conn, Frame::control(Kind::Register, 2, 0, &register))
        .await
        .unwrap();
    let limits = Limits::default();
    let registered = receive(conn, &limits).await.unwrap().unwrap();
    assert_eq!(registered.kind, Kind::Registered);
    let push = Frame::new(Kind::Push, 2, KEY, 0, 4, f32_push(&[2.0, 0.0, 1.0, 2.0]));
    send(conn, push).await.unwrap();
    // The round's summary travels beside its reply, in either order.
    let mut reply = receive(conn, &limits).await.unwrap().unwrap();
    if reply.kind == Kind::Closed {
        reply = receive(conn, &limits).await.unwrap().unwrap();
    }
    assert_eq!((reply.kind, reply.step), (Kind::Reply, 0));
}

/// Rank 2 of 3: registers, pushes round 0 honestly, then commits `misdeed`. Returns the reason
/// the server gave when it closed the connection.
async fn rogue(creds: Credentials, addr: std::net::SocketAddr, misdeed: Misdeed) -> String {
    let endpoint = client_endpoint(&creds, &Link::default()).unwrap();
    let conn = connect(&endpoint, addr).await.unwrap();
    rank_2_through_round_0(&conn, "rogue").await;
    let push = |step, key, numel, payload| Frame::new(Kind::Push, 2, key, step, numel, payload);
    let valid = push(1, KEY, 4, f32_push(&[9.0; 4])).encode();
    let bad: Vec<u8> = match misdeed {
        Misdeed::Garbage => (0..200u32).map(|i| (i * 37 % 251) as u8).collect(),
        Misdeed::Truncated => valid[..valid.len() - 3].to_vec(),
        Misdeed::Oversized => push(1, KEY, 4, vec![0; 2 * MAX_PAYLOAD]).encode(),
        Misdeed::UnknownKey => push(1, 0xdead, 4, f32_push(&[1.0; 4])).encode(),
        Misdeed::WrongSize => push(1, KEY, 5, f32_push(&[1.0; 5])).encode(),
        Misdeed::Overflow => push(1, KEY, 4, f32_push(&[3e38; 4])).encode(),
    };
    send_bytes(&conn, bad.into()).await.unwrap();
    match conn.closed().await {
        quinn::ConnectionError::ApplicationClosed(c) => {
            String::from_utf8_lossy(&c.reason).into_owned()
        }
        other => {
            panic!("{misdeed:?}: the server did not close the connection with a reason: {other}")
        }
    }
}

/// Ranks 0 and 1 do four honest rounds while rank 2 misbehaves in round 1. Every round must
/// complete with the honest ranks' mean, long before the deadline.
fn honest_ranks_are_served_while(misdeed: Misdeed, expected_reason: &str) {
    let swarm = Swarm::generate("faults").unwrap();
    let options = ServerOptions {
        deadline: Duration::from_secs(60),
        limits: Limits {
            max_payload: MAX_PAYLOAD,
            ..Limits::default()
        },
        ..every_member()
    };
    let servers = start_servers(&swarm, 1, options);
    let started = Instant::now();
    let creds = swarm
        .credentials("rogue", murmur_net::identity::Role::Worker)
        .unwrap();
    let rogue_task = servers
        .runtime
        .spawn(rogue(creds, servers.addrs[0], misdeed));
    let means: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..2u16)
            .map(|rank| {
                let (swarm, addrs) = (&swarm, &servers.addrs);
                s.spawn(move || {
                    let mut c = worker(swarm, addrs, rank, 3);
                    c.register(&keys()).unwrap();
                    (0..4u64)
                        .map(|step| {
                            let mine = [rank as f32, step as f32, 1.0, 2.0];
                            let reply = c
                                .push_pull(step, 1, vec![(KEY, f32_payload(&mine))])
                                .unwrap();
                            parse("f32")
                                .unwrap()
                                .decode(&reply[0].1, 4, &Default::default())
                                .unwrap()
                        })
                        .collect()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let reason = servers.runtime.block_on(rogue_task).unwrap();
    assert!(
        reason.contains(expected_reason),
        "{misdeed:?}: closed with {reason:?}"
    );
    assert_eq!(
        means[0], means[1],
        "{misdeed:?}: ranks got different replies"
    );
    assert_eq!(
        means[0][0],
        [1.0, 0.0, 1.0, 2.0],
        "round 0 averages all three ranks"
    );
    for (step, mean) in means[0].iter().enumerate().skip(1) {
        assert_eq!(
            mean,
            &[0.5, step as f32, 1.0, 2.0],
            "{misdeed:?}: round {step} averages the two honest ranks"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{misdeed:?}: the honest ranks waited for the deadline"
    );
}

#[test]
fn a_garbage_frame_costs_only_its_connection() {
    honest_ranks_are_served_while(Misdeed::Garbage, "magic");
}

#[test]
fn a_truncated_frame_costs_only_its_connection() {
    honest_ranks_are_served_while(Misdeed::Truncated, "announces");
}

#[test]
fn an_oversized_frame_costs_only_its_connection() {
    honest_ranks_are_served_while(Misdeed::Oversized, "exceeds the limit");
}

#[test]
fn an_unknown_key_costs_only_its_connection() {
    honest_ranks_are_served_while(Misdeed::UnknownKey, "unknown key");
}

#[test]
fn a_wrong_size_costs_only_its_connection() {
    honest_ranks_are_served_while(Misdeed::WrongSize, "wrong size");
}

#[test]
fn a_push_that_could_overflow_the_sum_costs_its_connection_and_is_not_summed() {
    honest_ranks_are_served_while(Misdeed::Overflow, "could overflow");
}

#[test]
fn a_worker_that_stalls_mid_round_is_evicted_at_the_deadline_and_rejoins_in_step() {
    let swarm = Swarm::generate("rejoin").unwrap();
    let deadline = Duration::from_millis(1500);
    let servers = start_servers(
        &swarm,
        2,
        ServerOptions {
            deadline,
            ..every_member()
        },
    );
    let (world, steps, stall_at) = (3u16, 40u64, 5u64);
    let plan = plan("topk:0.25", "f16");
    let (evicted_tx, evicted_rx) = mpsc::channel::<()>();
    let results: Vec<(Vec<u32>, Option<u64>)> = std::thread::scope(|s| {
        let mut joins = Vec::new();
        for rank in 0..2u16 {
            let (plan, swarm, addrs) = (plan.clone(), &swarm, &servers.addrs);
            joins.push(s.spawn(move || {
                let c = worker(swarm, addrs, rank, world);
                let mut dp = DataParallel::new(classifier(), c, &plan, "ef").unwrap();
                while dp.round() < steps {
                    let (x, y) = batch(dp.round(), rank as usize);
                    let began = Instant::now();
                    dp.step((&x, &y), rank as usize * BATCH).unwrap();
                    if dp.round() == stall_at + 1 {
                        assert!(
                            began.elapsed() >= deadline / 2,
                            "round {stall_at} closed before the deadline"
                        );
                    }
                    // One snapshot, after the eviction: the rejoining worker loads it and replays
                    // the rounds since.
                    if rank == 0 && dp.round() == stall_at + 1 {
                        let state = dp.replica.save_state().unwrap();
                        let step = dp.round();
                        dp.collective.snapshot(step, state).unwrap();
                    }
                    // Pace the rounds so the rejoining worker finds the swarm still running.
                    std::thread::sleep(Duration::from_millis(40));
                }
                (bits(&dp.replica), None)
            }));
        }
        let (plan, swarm, addrs) = (plan.clone(), &swarm, &servers.addrs);
        joins.push(s.spawn(move || {
            let c = worker(swarm, addrs, 2, world);
            let mut dp = DataParallel::new(classifier(), c, &plan, "ef").unwrap();
            train(&mut dp, stall_at);
            // Push one partition of round `stall_at`, then hang with the connection open.
            let first = dp.partitions()[0].clone();
            let payload = parse("topk:0.25")
                .unwrap()
                .encode(&vec![0.0; first.len], &Default::default());
            dp.collective.push(stall_at, first.key, 1, payload).unwrap();
            let keys: Vec<Key> = dp.partitions().iter().map(|p| p.key).collect();
            let err = dp.collective.pull(stall_at, &keys).unwrap_err().to_string();
            assert!(err.contains("deadline"), "stalled worker told: {err}");
            evicted_tx.send(()).unwrap();
            drop(dp);
            // Rejoin with a fresh process's state: same seed, nothing trained.
            let c = worker(swarm, addrs, 2, world);
            let mut dp = DataParallel::new(classifier(), c, &plan, "ef").unwrap();
            let caught = murmur_net::ps::catch_up(&mut dp)
                .unwrap()
                .expect("the swarm is underway");
            assert_eq!(
                caught.snapshot.as_ref().map(|s| s.0),
                Some(stall_at + 1),
                "rejoined from the snapshot"
            );
            assert!(
                caught.from < caught.to,
                "replayed rounds after the snapshot: {caught:?}"
            );
            train(&mut dp, steps);
            (bits(&dp.replica), Some(caught.to))
        }));
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    evicted_rx
        .recv_timeout(Duration::from_secs(1))
        .expect("the stalled worker was evicted");
    let rejoined_at = results[2].1.unwrap();
    eprintln!("evicted at step {stall_at}, rejoined at step {rejoined_at} of {steps}");
    assert!(
        rejoined_at > stall_at && rejoined_at < steps,
        "rejoined at step {rejoined_at}"
    );
    assert_eq!(
        results[0].0, results[1].0,
        "the two workers that stayed differ"
    );
    assert_eq!(
        results[2].0, results[0].0,
        "the rejoined worker's replica differs"
    );
}

/// Rank 2 of 3 registers, pushes round 0, then falls silent with its connection open (its
/// process frozen, its machine cut off): no close frame, no keep-alive. The honest ranks'
/// round 1 closes without it once the peer timeout passes, long before the 60 s deadline.
#[test]
fn a_silent_worker_is_out_of_the_round_within_the_peer_timeout() {
    let swarm = Swarm::generate("silent").unwrap();
    let servers = start_servers(
        &swarm,
        1,
        ServerOptions {
            deadline: Duration::from_secs(60),
            ..every_member()
        },
    );
    let addr = servers.addrs[0];
    let creds = swarm
        .credentials("silent", murmur_net::identity::Role::Worker)
        .unwrap();
    // The silent rank lives on a runtime of its own, which stops (without closing anything)
    // once it has pushed round 0.
    let silent = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let endpoint = client_endpoint(&creds, &Link::default()).unwrap();
            let conn = connect(&endpoint, addr).await.unwrap();
            rank_2_through_round_0(&conn, "silent").await;
            // Neither dropped (which would close them) nor driven any more.
            std::mem::forget(conn);
            std::mem::forget(endpoint);
        });
        runtime.shutdown_background();
    });
    let round_1: Vec<Duration> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..2u16)
            .map(|rank| {
                let (swarm, addrs) = (&swarm, &servers.addrs);
                s.spawn(move || {
                    let mut c = worker(swarm, addrs, rank, 3);
                    c.register(&keys()).unwrap();
                    c.push_pull(0, 1, vec![(KEY, f32_payload(&[rank as f32; 4]))])
                        .unwrap();
                    let began = Instant::now();
                    c.push_pull(1, 1, vec![(KEY, f32_payload(&[rank as f32; 4]))])
                        .unwrap();
                    began.elapsed()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    silent.join().unwrap();
    eprintln!("round 1 closed without the silent rank after {round_1:?}");
    for waited in round_1 {
        assert!(
            waited < murmur_net::transport::PEER_TIMEOUT + Duration::from_secs(2),
            "round 1 waited {waited:?} for a silent rank"
        );
    }
}

/// Rank 2 pushes every round but never takes a reply: once the shard has
/// `MAX_UNSENT_ROUNDS` rounds of replies it cannot hand over (after the stream credit the
/// rogue granted is spent), it drops the rank, and the honest ranks' rounds go on without it.
#[test]
fn a_worker_that_never_takes_its_replies_is_dropped_and_pins_a_bounded_backlog() {
    use murmur_net::ps::MAX_UNSENT_ROUNDS;
    use std::sync::atomic::{AtomicU64, Ordering};
    let swarm = Swarm::generate("unread").unwrap();
    let servers = start_servers(&swarm, 1, every_member());
    // Two reply frames a round (the reply and the summary) fill the rogue's stream credit
    // after half of it; the backlog then grows by a round a round.
    let streams = murmur_net::transport::MAX_STREAMS_IN_FLIGHT as u64;
    let rounds = streams / 2 + MAX_UNSENT_ROUNDS as u64 + 40;
    // Rounds the honest rank 0 has finished: the rogue pushes the next one.
    let finished = AtomicU64::new(1);
    let creds = swarm
        .credentials("rogue", murmur_net::identity::Role::Worker)
        .unwrap();
    let addr = servers.addrs[0];
    let (reason, means) = std::thread::scope(|s| {
        let rogue = s.spawn(|| {
            servers.runtime.block_on(async {
                let endpoint = client_endpoint(&creds, &Link::default()).unwrap();
                let conn = connect(&endpoint, addr).await.unwrap();
                rank_2_through_round_0(&conn, "rogue").await;
                for step in 1..rounds {
                    while finished.load(Ordering::Acquire) < step {
                        if conn.close_reason().is_some() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                    let push = Frame::new(Kind::Push, 2, KEY, step, 4, f32_push(&[9.0; 4]));
                    if conn.close_reason().is_some() || send(&conn, push).await.is_err() {
                        break;
                    }
                }
                match conn.close_reason() {
                    Some(quinn::ConnectionError::ApplicationClosed(c)) => {
                        String::from_utf8_lossy(&c.reason).into_owned()
                    }
                    other => format!("not closed by the shard: {other:?}"),
                }
            })
        });
        let honest: Vec<_> = (0..2u16)
            .map(|rank| {
                let (swarm, addrs, finished) = (&swarm, &servers.addrs, &finished);
                s.spawn(move || {
                    let mut c = worker(swarm, addrs, rank, 3);
                    c.register(&keys()).unwrap();
                    let mut means = Vec::new();
                    for step in 0..rounds {
                        let mine = [rank as f32, 0.0, 1.0, 2.0];
                        let reply = c
                            .push_pull(step, 1, vec![(KEY, f32_payload(&mine))])
                            .unwrap();
                        means.push(
                            parse("f32")
                                .unwrap()
                                .decode(&reply[0].1, 4, &Default::default())
                                .unwrap(),
                        );
                        if rank == 0 {
                            finished.store(step + 1, Ordering::Release);
                        }
                    }
                    means
                })
            })
            .collect();
        let means: Vec<Vec<Vec<f32>>> = honest.into_iter().map(|j| j.join().unwrap()).collect();
        (rogue.join().unwrap(), means)
    });
    assert!(reason.contains("rounds of replies not taken"), "{reason}");
    assert_eq!(means[0], means[1]);
    let with_rogue = [(0.0 + 1.0 + 9.0) / 3.0, 3.0, 11.0 / 3.0, 13.0 / 3.0];
    let without = [0.5, 0.0, 1.0, 2.0];
    let dropped_after = means[0]
        .iter()
        .position(|m| m[..] == without)
        .expect("the rounds went on without the rogue");
    assert!(
        dropped_after as u64 >= streams / 2
            && dropped_after as u64 <= streams / 2 + MAX_UNSENT_ROUNDS as u64 + 8,
        "dropped after round {dropped_after}"
    );
    assert!(means[0][dropped_after..].iter().all(|m| m[..] == without));
    assert!(means[0][1..dropped_after]
        .iter()
        .all(|m| (m[0] - with_rogue[0]).abs() < 1e-6));
}
