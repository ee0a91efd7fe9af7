//! Replicas checked every round: each worker sends shard 0 the digest of the replica it enters
//! a round with, and every shard's summary of the round says who took part and (shard 0)
//! whether the replicas agreed.

mod common;

use common::*;
use murmur_engine::nn::Module;
use murmur_engine::train::DataParallel;
use murmur_engine::Tensor;
use murmur_net::identity::Swarm;
use murmur_net::ps::ClientOptions;

/// Three ranks train ten rounds; after round 5, rank 2's replica is changed behind the
/// swarm's back (one extra optimizer step of its own: a flipped bit in memory, a GPU that
/// rounds differently). From round 6 on, shard 0's summaries name the majority's digest,
/// which is ranks 0 and 1's, so rank 2 can tell that it went astray and they that they did
/// not; until then the replicas agree. Every shard names all three ranks as participants.
#[test]
fn a_replica_that_goes_astray_is_named_in_the_next_rounds_summary() {
    let swarm = Swarm::generate("replicas").unwrap();
    let servers = start_servers(&swarm, 2, every_member());
    let (world, steps, astray_after) = (3u16, 10u64, 6u64);
    let plan = plan("topk:0.25", "f16");
    let with_digests = ClientOptions {
        replica_digests: true,
        ..client_options()
    };
    let seen = on_every_rank(
        &swarm,
        &servers,
        world,
        &plan,
        with_digests,
        |rank, mut dp| {
            let mut seen = Vec::new();
            while dp.round() < steps {
                if rank == 2 && dp.round() == astray_after {
                    go_astray(&mut dp);
                }
                let step = dp.round();
                let digest = dp.replica.parameter_digest().unwrap();
                dp.collective.send_digest(step, digest).unwrap();
                let (x, y) = batch(step, rank as usize);
                dp.step((&x, &y), rank as usize * BATCH).unwrap();
                let summaries = dp.collective.closed(step).unwrap();
                assert_eq!(summaries.len(), 2);
                for summary in &summaries {
                    assert_eq!(summary.participants, [0, 1, 2], "round {step}");
                }
                assert_eq!(summaries[1].replicas, None, "only shard 0 compares");
                seen.push((digest, summaries[0].replicas));
            }
            seen
        },
    );
    for (step, ((zero, one), two)) in seen[0].iter().zip(&seen[1]).zip(&seen[2]).enumerate() {
        let verdict = zero.1.expect("shard 0 compared the digests");
        assert_eq!(Some(verdict), one.1, "one verdict for all");
        assert_eq!(zero.0, one.0, "ranks 0 and 1 agree");
        assert_eq!(verdict.majority, Some(zero.0), "round {step}");
        let astray = step as u64 >= astray_after;
        assert_eq!(verdict.disagreed, astray, "round {step}");
        assert_eq!(two.0 != zero.0, astray, "round {step}");
    }
    assert_eq!(seen[0].len(), steps as usize);
}

/// One optimizer step of this rank's own, with a made-up gradient, uncounted.
fn go_astray<C: murmur_engine::comm::Collective>(dp: &mut DataParallel<C>) {
    let device = dp.replica.device.clone();
    let grads: Vec<Tensor> = dp
        .replica
        .model
        .parameters()
        .iter()
        .map(|p| Tensor::from_vec(&device, p.shape(), vec![1e-3; p.numel()]).unwrap())
        .collect();
    dp.replica.apply(&grads).unwrap();
    // The step was not a round: the rank's round counter stays where the swarm's is.
    dp.replica.steps -= 1;
}
