//! The papers' data-parallel algorithms over QUIC: the same bits as the same run in-process
//! (LIEC-SGD with its sync rounds and the baselines whose rounds differ from it; CLAN's two
//! algorithms with LANS; LoCo with AdamW on the replicated path, with the integer-sum downlink,
//! and on the sharded path, where the servers own the parameters).

mod common;

use common::*;
use murmur_engine::algo::{Blocking, ClassifierReplica, MethodSpec, OptimizerSpec, Worker};
use murmur_engine::comm::local::local_collectives;
use murmur_engine::comm::Collective;
use murmur_net::identity::Swarm;

const STEPS: u64 = 9;

/// One algorithm as a run configures it.
#[derive(Clone, Copy)]
struct Case {
    method: MethodSpec,
    codec: &'static str,
    optimizer: OptimizerSpec,
    world: u16,
}

/// Trains `STEPS` steps of `case` on `collective`; returns the model's bits after each step.
fn train_steps(case: Case, rank: usize, collective: Box<dyn Collective>) -> Vec<Vec<u32>> {
    let mut replica = ClassifierReplica::new(classifier(), move |step| batch(step, rank));
    let mut worker = Worker::new(
        case.method,
        case.codec,
        case.optimizer,
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
    let swarm = Swarm::generate("algorithms").unwrap();
    let sgd = |method| Case {
        method,
        codec: "sign",
        optimizer: OptimizerSpec::Sgd,
        world: 3,
    };
    let lans = |method, codec| Case {
        method,
        codec,
        optimizer: OptimizerSpec::LANS,
        world: 3,
    };
    let loco = |method: &str, world| Case {
        method: method.parse().unwrap(),
        codec: "loco:bits=4:log2s=10",
        optimizer: OptimizerSpec::ADAMW,
        world,
    };
    for case in [
        // Sync rounds at t = 3 and 7 (plain both ways, the servers' error flushed).
        sgd(MethodSpec::Liec { period: 4 }),
        // A second round in some steps.
        sgd(MethodSpec::Cser { period: 3 }),
        // The recursive codec, on workers and servers.
        sgd(MethodSpec::Neolithic { rounds: 2 }),
        // CLAN, Algorithm 4 (top-k with error feedback both sides) and Algorithm 3 (stochastic
        // dithering both ways, its randomness from the shared codec context).
        lans(MethodSpec::DoubleSqueeze, "topk:0.25"),
        lans(MethodSpec::TwoWay, "dither:linear:s=7"),
        // LoCo: int8 moving-average memories, and 2 workers so that the servers reply with the
        // integer sum of the 4-bit codes.
        loco("loco:beta=0.5:reset=4", 2),
        // LoCo's sharded path: the servers own the parameters (a parameter round, then
        // optimizer steps on the servers and bf16 parameters back).
        loco("loco:beta=0.5:reset=4:sharded", 3),
    ] {
        let (method, world) = (case.method, case.world);
        let in_process: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
            let joins: Vec<_> = local_collectives(world as usize)
                .into_iter()
                .enumerate()
                .map(|(rank, c)| s.spawn(move || train_steps(case, rank, Box::new(c))))
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let servers = start_servers(&swarm, 2, every_member());
        let over_quic: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
            let joins: Vec<_> = (0..world)
                .map(|rank| {
                    let (swarm, addrs) = (&swarm, &servers.addrs);
                    s.spawn(move || {
                        let c = worker(swarm, addrs, rank, world);
                        train_steps(case, rank as usize, Box::new(c))
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
