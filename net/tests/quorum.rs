//! Rounds that close on a quorum: a member that falls behind does not hold the others, and
//! comes back in step, with the same bits, without leaving; the servers' participant sets
//! replayed in-process give the run's bits; and every shard closes a round over shard 0's
//! participants.

mod common;

use std::time::{Duration, Instant};

use common::*;
use murmur_engine::comm::local::{local_collectives, replay_collectives, Participants};
use murmur_engine::comm::partition::shard_of;
use murmur_engine::comm::{Collective, Key};
use murmur_engine::train::DataParallel;
use murmur_net::identity::Swarm;
use murmur_net::ps::queue::QueueSpec;
use murmur_net::ps::JobOffer;
use murmur_net::transport::{client_endpoint, connect, receive, send, Link};
use murmur_net::wire::{Assignment, Frame, Hello, Kind, Limits, Register};

/// Ranks 0 and 1 of 3 train on while rank 2 stops for 3 s in the middle of the run with its
/// connections open (a busy GPU, a slow disk: it is alive, only late). With the default
/// quorum (half the members, then the recent median push time, at least 0.5 s), no round
/// of the others waits for it; its pushes of the rounds it missed are ignored, it applies
/// their replies like everyone, takes part again, and all three replicas end identical.
/// Before quorum rounds, the round in flight waited the whole 3 s (the deadline is 60 s).
#[test]
fn a_member_that_falls_behind_holds_no_round_and_comes_back_in_step() {
    let swarm = Swarm::generate("quorum").unwrap();
    let servers = quorum_servers(&swarm, None);
    let (world, steps, stall_at) = (3u16, 40u64, 8u64);
    let stall = Duration::from_secs(3);
    let plan = plan("topk:0.25", "f16");
    let results = on_every_rank(
        &swarm,
        &servers,
        world,
        &plan,
        client_options(),
        |rank, mut dp| {
            let (mut longest, mut late, mut logged) = (Duration::ZERO, 0, Vec::new());
            while dp.round() < steps {
                if rank == 2 && dp.round() == stall_at {
                    std::thread::sleep(stall);
                }
                let step = dp.round();
                let (x, y) = batch(step, rank as usize);
                let began = Instant::now();
                dp.step((&x, &y), rank as usize * BATCH).unwrap();
                longest = longest.max(began.elapsed());
                // The shards' summaries say whether this rank's push counted.
                let summaries = dp.collective.closed(step).unwrap();
                if summaries.iter().any(|c| !c.participants.contains(&rank)) {
                    late += 1;
                }
                logged.push(
                    summaries
                        .into_iter()
                        .map(|c| c.participants)
                        .collect::<Vec<_>>(),
                );
                // Pace the rounds so that the stall spans several of them.
                std::thread::sleep(Duration::from_millis(20));
            }
            (bits(&dp.replica), longest, late, logged)
        },
    );
    eprintln!("rank 2 was late in {} rounds", results[2].2);
    assert!(results[2].2 >= 1, "rank 2's late pushes counted");
    for (rank, (_, longest, _, _)) in results.iter().enumerate().take(2) {
        eprintln!("rank {rank}: longest round {longest:?}");
        assert!(
            *longest < stall * 2 / 3,
            "rank {rank} waited {longest:?} in one round for the member that fell behind"
        );
    }
    assert_eq!(results[0].0, results[1].0, "ranks 0 and 1 differ");
    assert_eq!(
        results[2].0, results[0].0,
        "the rank that fell behind ended with another replica"
    );
    // Every rank was told the same participants; replayed in-process, they give the bits of
    // the run, which differ from those of the run with every rank in every round.
    assert_eq!(results[0].3, results[2].3, "one participant log");
    let logged = results[0].3.clone();
    let participants: Participants = Box::new(move |step, key| {
        logged[step as usize][shard_of(key, 2)]
            .iter()
            .map(|r| *r as usize)
            .collect()
    });
    let replayed = train_in_process(
        replay_collectives(world as usize, participants),
        &plan,
        steps,
    );
    assert_eq!(replayed[0], results[0].0, "the replay differs from the run");
    let everyone = train_in_process(local_collectives(world as usize), &plan, steps);
    assert_ne!(everyone[0], results[0].0, "no round closed without rank 2");
}

/// A key on each of two shards.
fn key_on(shard: usize) -> Key {
    (1..).find(|k| shard_of(*k, 2) == shard).unwrap()
}

/// Rank 2 of 3 pushes each round to shard 1 at once and to shard 0 a second later, after
/// shard 0 has closed the round on its quorum (ranks 0 and 1, then its 0.5 s wait). Shard 1
/// has every member's push in at once, but it follows shard 0: it closes over ranks 0 and 1
/// only, so rank 2's push counts on no shard. Before shards followed shard 0, shard 1 closed
/// each round with all three (rank 2's samples summed on shard 1's keys and given back to the
/// queue by shard 0).
#[test]
fn every_shard_closes_a_round_over_shard_0s_participants() {
    let swarm = Swarm::generate("follow").unwrap();
    let servers = quorum_servers(&swarm, None);
    let (world, steps) = (3u16, 3u64);
    let keys = [key_on(0), key_on(1)];
    let addrs = servers.addrs.clone();
    let creds = swarm
        .credentials("worker-2", murmur_net::identity::Role::Worker)
        .unwrap();
    let late = servers.runtime.spawn(async move {
        let endpoint = client_endpoint(&creds, &Link::default()).unwrap();
        let limits = Limits::default();
        let mut conns = Vec::new();
        for (shard, addr) in addrs.iter().enumerate() {
            let conn = connect(&endpoint, *addr).await.unwrap();
            let hello = Hello {
                rank: 2,
                world,
                shard: shard as u16,
                shards: 2,
                node: "late on shard 0".into(),
                ticket: None,
            };
            send(&conn, Frame::control(Kind::Hello, 2, 0, &hello))
                .await
                .unwrap();
            let register = Register {
                keys: vec![f32_key(keys[shard])],
                replica_digests: false,
            };
            send(&conn, Frame::control(Kind::Register, 2, 0, &register))
                .await
                .unwrap();
            conns.push(conn);
        }
        let push = |shard: usize, step| {
            Frame::new(Kind::Push, 2, keys[shard], step, 4, f32_push(&[9.0; 4]))
        };
        let mut step = 0;
        while step < steps {
            // Shard 1's frames say when its round `step - 1` is over.
            let frame = receive(&conns[1], &limits).await.unwrap().unwrap();
            let open = match frame.kind {
                Kind::Registered => 0,
                Kind::Closed => frame.step + 1,
                _ => continue,
            };
            if open != step {
                continue;
            }
            send(&conns[1], push(1, step)).await.unwrap();
            let shard_0 = conns[0].clone();
            let frame = push(0, step);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                send(&shard_0, frame).await
            });
            step += 1;
        }
        (endpoint, conns)
    });
    let logged: Vec<Vec<Vec<Vec<u16>>>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..2u16)
            .map(|rank| {
                let (swarm, addrs) = (&swarm, &servers.addrs);
                s.spawn(move || {
                    let mut c = worker(swarm, addrs, rank, world);
                    c.register(&[f32_key(keys[0]), f32_key(keys[1])]).unwrap();
                    (0..steps)
                        .map(|step| {
                            let payload = f32_payload(&[rank as f32; 4]);
                            c.push_pull(
                                step,
                                1,
                                keys.iter().map(|k| (*k, payload.clone())).collect(),
                            )
                            .unwrap();
                            c.closed(step)
                                .unwrap()
                                .into_iter()
                                .map(|c| c.participants)
                                .collect()
                        })
                        .collect()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let _rank_2 = servers.runtime.block_on(late).unwrap();
    assert_eq!(logged[0], logged[1], "ranks 0 and 1 were told alike");
    for (step, shards) in logged[0].iter().enumerate() {
        assert_eq!(
            shards,
            &[vec![0, 1], vec![0, 1]],
            "round {step}: participants by shard"
        );
    }
}

/// The samples at queue positions `positions`: position `p` is the first row of
/// [`batch`]`(p, 0)`, a pure function of `p`.
fn rows(positions: impl Iterator<Item = u64>) -> (Vec<f32>, Vec<u32>) {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for p in positions {
        let (bx, by) = batch(p, 0);
        x.extend_from_slice(&bx[..FEATURES]);
        y.push(by[0]);
    }
    (x, y)
}

/// Plays round `dp.round()` on this rank's share of `assigned` (or none).
fn play<C: Collective>(dp: &mut DataParallel<C>, rank: u16, assigned: &Assignment) {
    match assigned.share_of(rank) {
        Some((share, first)) => {
            let (x, y) = rows(share.positions());
            dp.step((&x, &y), first as usize).unwrap();
        }
        None => {
            dp.step_without_share().unwrap();
        }
    }
}

/// A job with shard 0's sample queue, its shares cut by speed: rank 2 of 3 is slow (150 ms
/// a round more), so its shares shrink, and once it stops for 2 s, so rounds close without
/// it and its shares go back to the queue and are cut again for the others. The servers' log,
/// each round's assignment and participants as every worker was told them, replayed
/// in-process (each rank training on the same positions, each round summing the same pushes)
/// gives the run's bits.
#[test]
fn a_run_with_the_queues_unequal_shares_replays_in_process_to_its_bits() {
    let swarm = Swarm::generate("shares").unwrap();
    let world = 3u16;
    let batch = BATCH as u32;
    let queue = QueueSpec {
        samples: 200,
        global: u32::from(world) * batch,
        per_member: batch,
        by_speed: true,
    };
    let job = JobOffer {
        world,
        start_with: world,
        description: "a test job".into(),
        signature: swarm.sign_job("a test job").unwrap(),
        queue: Some(queue),
        fold_late: false,
    };
    let servers = quorum_servers(&swarm, Some(job));
    let (steps, stall_at) = (24u64, 10u64);
    let plan = plan("topk:0.25", "f16");
    let results = on_every_rank(
        &swarm,
        &servers,
        world,
        &plan,
        client_options(),
        |rank, mut dp| {
            let mut log = Vec::new();
            while dp.round() < steps {
                let step = dp.round();
                if rank == 2 {
                    let pause = if step == stall_at { 2000 } else { 150 };
                    std::thread::sleep(Duration::from_millis(pause));
                }
                let assigned = dp
                    .collective
                    .assignment(step)
                    .expect("shard 0 cut the round");
                play(&mut dp, rank, &assigned);
                let summaries = dp.collective.closed(step).unwrap();
                log.push((assigned, summaries[0].participants.clone()));
            }
            (bits(&dp.replica), log)
        },
    );
    let log = results[0].1.clone();
    assert!(
        results.iter().all(|r| r.1 == log),
        "every rank was told the same"
    );
    let unequal = log
        .iter()
        .filter(|(a, _)| {
            let sizes: Vec<u64> = a.shares.iter().map(|s| s.samples()).collect();
            sizes.iter().any(|n| *n != sizes[0])
        })
        .count();
    let short = log.iter().filter(|(_, p)| p.len() < 3).count();
    eprintln!("{unequal} rounds of unequal shares, {short} closed without a member");
    assert!(unequal >= 3, "the cut never followed rank 2's speed");
    assert!(short >= 1, "no round closed without rank 2");
    assert!(
        results.iter().all(|r| r.0 == results[0].0),
        "the replicas differ"
    );
    let logged = log.clone();
    let participants: Participants = Box::new(move |step, _key| {
        logged[step as usize]
            .1
            .iter()
            .map(|r| *r as usize)
            .collect()
    });
    let replayed: Vec<Vec<u32>> = std::thread::scope(|s| {
        let joins: Vec<_> = replay_collectives(world as usize, participants)
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                let (log, plan) = (&log, &plan);
                s.spawn(move || {
                    let mut dp = DataParallel::new(classifier(), c, plan, "ef").unwrap();
                    for (assigned, _) in log {
                        play(&mut dp, rank as u16, assigned);
                    }
                    bits(&dp.replica)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert_eq!(replayed[0], results[0].0, "the replay differs from the run");
}
