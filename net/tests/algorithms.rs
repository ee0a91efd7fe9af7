//! The papers' data-parallel algorithms over QUIC: the same bits as the same run in-process
//! (LIEC-SGD with its sync rounds, and the baselines whose rounds differ from it).

mod common;

use common::*;
use murmur_engine::algo::{Blocking, ClassifierReplica, MethodSpec, Worker};
use murmur_engine::comm::local::local_collectives;
use murmur_engine::comm::Collective;
use murmur_net::identity::Swarm;
use murmur_net::ps::ServerOptions;

const STEPS: u64 = 9;

/// Trains `STEPS` steps of `method` on `collective`; returns the model's bits after each step.
fn train_steps(method: MethodSpec, rank: usize, collective: Box<dyn Collective>) -> Vec<Vec<u32>> {
    let mut replica = ClassifierReplica::new(classifier(), move |step| batch(step, rank));
    let mut worker = Worker::new(
        method,
        "sign",
        Blocking::Bucket { bytes: 256 },
        5,
        &replica,
        collective,
    )
    .unwrap();
    (0..STEPS)
        .map(|_| {
            worker.step(&mut replica, 0.05, 1e-3).unwrap();
            worker.x.iter().map(|v| v.to_bits()).collect()
        })
        .collect()
}

#[test]
fn the_papers_algorithms_over_quic_give_the_bits_of_the_same_runs_in_process() {
    let world = 3u16;
    let swarm = Swarm::generate("algorithms").unwrap();
    for method in [
        // Sync rounds at t = 3 and 7 (plain both ways, the servers' error flushed).
        MethodSpec::Liec { period: 4 },
        // A second round in some steps.
        MethodSpec::Cser { period: 3 },
        // The recursive codec, on workers and servers.
        MethodSpec::Neolithic { rounds: 2 },
    ] {
        let in_process: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
            let joins: Vec<_> = local_collectives(world as usize)
                .into_iter()
                .enumerate()
                .map(|(rank, c)| s.spawn(move || train_steps(method, rank, Box::new(c))))
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let servers = start_servers(&swarm, 2, ServerOptions::default());
        let over_quic: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
            let joins: Vec<_> = (0..world)
                .map(|rank| {
                    let (swarm, addrs) = (&swarm, &servers.addrs);
                    s.spawn(move || {
                        let c = worker(swarm, addrs, rank, world);
                        train_steps(method, rank as usize, Box::new(c))
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(
            over_quic, in_process,
            "{method}: QUIC and in-process differ"
        );
        if let MethodSpec::Liec { .. } = method {
            // The local models differ between syncs and agree right after them.
            assert_ne!(
                in_process[0][2], in_process[1][2],
                "{method}: no local drift"
            );
            assert_eq!(
                in_process[0][3], in_process[1][3],
                "{method}: sync did not average"
            );
        }
    }
}
