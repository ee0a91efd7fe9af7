//! Robust aggregation over QUIC: the rules give the bits of the same run in process, and a
//! worker whose pushes keep standing out is evicted.

mod common;

use common::*;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::local::aggregating_collectives;
use murmur_engine::comm::Collective;
use murmur_engine::compress::parse;
use murmur_net::identity::Swarm;
use murmur_net::ps::state::{MISALIGNED_STRIKES_TO_EVICT, STRIKES_TO_EVICT};
use murmur_net::ps::ServerOptions;

fn with_rule(rule: Aggregate) -> ServerOptions {
    ServerOptions {
        aggregate: rule,
        ..every_member()
    }
}

#[test]
fn robust_rules_over_quic_give_the_bits_of_the_same_run_in_process() {
    let (world, steps) = (4u16, 6u64);
    let plan = plan("topk:0.3", "f32");
    for rule in ["centered-clip", "trimmed-mean", "median"] {
        let rule: Aggregate = rule.parse().unwrap();
        let in_process =
            train_in_process(aggregating_collectives(world as usize, rule), &plan, steps);
        let swarm = Swarm::generate("robust").unwrap();
        let servers = start_servers(&swarm, 2, with_rule(rule));
        let over_quic = on_every_rank(
            &swarm,
            &servers,
            world,
            &plan,
            client_options(),
            |_, mut dp| {
                train(&mut dp, steps);
                bits(&dp.replica)
            },
        );
        assert!(
            over_quic.iter().all(|b| *b == over_quic[0]),
            "{rule}: replicas differ"
        );
        assert_eq!(
            over_quic[0], in_process[0],
            "{rule}: QUIC and in-process differ"
        );
        let mean = train_in_process(
            murmur_engine::comm::local::local_collectives(world as usize),
            &plan,
            steps,
        );
        assert_ne!(
            in_process[0], mean[0],
            "{rule} changed nothing against the mean"
        );
    }
}

#[test]
fn a_worker_whose_pushes_keep_standing_out_is_evicted_and_the_others_go_on() {
    let swarm = Swarm::generate("evict").unwrap();
    let servers = start_servers(
        &swarm,
        1,
        with_rule(Aggregate::CenteredClip { iterations: 3 }),
    );
    let key = 1;
    let rounds = u64::from(STRIKES_TO_EVICT) + 3;
    let outcomes: Vec<Result<Vec<Vec<f32>>, String>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..4u16)
            .map(|rank| {
                let (swarm, addrs) = (&swarm, &servers.addrs);
                s.spawn(move || {
                    let mut c = worker(swarm, addrs, rank, 4);
                    c.register(&[f32_key(key)]).unwrap();
                    let mut replies = Vec::new();
                    for step in 0..rounds {
                        let r = rank as f32 * 0.1;
                        let mine = if rank == 3 {
                            [1e6, -1e6, 1e6, -1e6]
                        } else {
                            [1.0 + r, 2.0 - r, 3.0, 4.0 + r]
                        };
                        match c.push_pull(step, 1, vec![(key, f32_payload(&mine))]) {
                            Ok(reply) => replies.push(
                                parse("f32")
                                    .unwrap()
                                    .decode(&reply[0].1, 4, &Default::default())
                                    .unwrap(),
                            ),
                            Err(e) => return Err(format!("round {step}: {e}")),
                        }
                    }
                    Ok(replies)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let evicted = outcomes[3]
        .as_ref()
        .expect_err("the outlier was never evicted");
    assert!(evicted.contains("evicted"), "{evicted}");
    for (rank, outcome) in outcomes.iter().enumerate().take(3) {
        let replies = outcome
            .as_ref()
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(replies.len() as u64, rounds, "rank {rank}");
        for (step, reply) in replies.iter().enumerate() {
            assert!(
                reply.iter().all(|v| v.abs() < 10.0),
                "round {step}: the outlier moved the result to {reply:?}"
            );
        }
    }
}

/// A worker that pushes with an honest norm in the wrong direction: each round every worker
/// sends one coordinate of the common direction (a different one each, as top-k does), the
/// fourth negated. No round singles it out (every push lies as far from the result as the
/// others), but its history points against the others' and it is evicted once that has lasted;
/// the honest workers are never struck.
#[test]
fn a_worker_whose_pushes_keep_pointing_against_the_others_is_evicted() {
    use murmur_engine::comm::history::HISTORY_ROUNDS;

    let swarm = Swarm::generate("evict-flip").unwrap();
    let servers = start_servers(
        &swarm,
        1,
        with_rule(Aggregate::CenteredClip { iterations: 3 }),
    );
    let (key, numel) = (1, 8usize);
    let spec = murmur_engine::comm::KeySpec {
        numel: numel as u32,
        ..f32_key(key)
    };
    let rounds = u64::from(HISTORY_ROUNDS + MISALIGNED_STRIKES_TO_EVICT) + 3;
    let outcomes: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..4u16)
            .map(|rank| {
                let (swarm, addrs, spec) = (&swarm, &servers.addrs, spec.clone());
                s.spawn(move || {
                    let mut c = worker(swarm, addrs, rank, 4);
                    c.register(&[spec]).unwrap();
                    for step in 0..rounds {
                        let mut mine = vec![0.0f32; numel];
                        mine[(step as usize + 2 * rank as usize) % numel] =
                            if rank == 3 { -1.0 } else { 1.0 };
                        if let Err(e) = c.push_pull(step, 1, vec![(key, f32_payload(&mine))]) {
                            return Err(format!("round {step}: {e}"));
                        }
                    }
                    Ok(rounds)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let evicted = outcomes[3]
        .as_ref()
        .expect_err("the worker pushing against the others was never evicted");
    assert!(evicted.contains("evicted"), "{evicted}");
    for (rank, outcome) in outcomes.iter().enumerate().take(3) {
        assert_eq!(outcome.as_ref(), Ok(&rounds), "rank {rank}");
    }
}
