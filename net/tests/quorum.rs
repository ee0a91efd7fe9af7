//! Rounds that close on a quorum: a member that falls behind does not hold the others, and
//! comes back in step, with the same bits, without leaving; and the servers' participant sets
//! replayed in-process give the run's bits.

mod common;

use std::time::{Duration, Instant};

use common::*;
use murmur_engine::comm::local::{local_collectives, replay_collectives, Participants};
use murmur_engine::comm::partition::shard_of;
use murmur_net::identity::Swarm;
use murmur_net::ps::ServerOptions;

/// Ranks 0 and 1 of 3 train on while rank 2 stops for 3 s in the middle of the run with its
/// connections open (a busy GPU, a slow disk: it is alive, only late). With the default
/// quorum (half the members, then the recent median push time, at least 0.5 s), no round
/// of the others waits for it; its pushes of the rounds it missed are ignored, it applies
/// their replies like everyone, takes part again, and all three replicas end identical.
/// Before quorum rounds, the round in flight waited the whole 3 s (the deadline is 60 s).
#[test]
fn a_member_that_falls_behind_holds_no_round_and_comes_back_in_step() {
    let swarm = Swarm::generate("quorum").unwrap();
    let servers = start_servers(
        &swarm,
        2,
        ServerOptions {
            deadline: Duration::from_secs(60),
            ..ServerOptions::default()
        },
    );
    let (world, steps, stall_at) = (3u16, 40u64, 8u64);
    let stall = Duration::from_secs(3);
    let plan = plan("topk:0.25", "f16");
    let results = on_every_rank(
        &swarm,
        &servers.addrs,
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
