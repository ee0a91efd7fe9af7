//! Outer rounds of local steps (DiLoCo) through the in-process collective, on a small
//! made-up problem on the CPU: what the outer loop computes, that replicas stay identical,
//! and that a snapshot carries the outer loop's state.

use murmur_engine::comm::local::{local_collectives, LocalCollective};
use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::train::{rank_share, Classifier, ClassifierConfig, DataParallel, OuterConfig};
use murmur_engine::Device;

const FEATURES: usize = 6;
const CLASSES: usize = 3;
const SAMPLES: usize = 16;

/// Sixteen samples of six features in three classes, made up from `mix`.
fn samples(mix: usize) -> (Vec<f32>, Vec<u32>) {
    let x = (0..FEATURES * SAMPLES)
        .map(|i| ((i * mix % 23) as f32 - 11.0) / 7.0)
        .collect();
    let y = (0..SAMPLES as u32)
        .map(|i| (i * 5 + 1) % CLASSES as u32)
        .collect();
    (x, y)
}

fn config() -> ClassifierConfig {
    ClassifierConfig {
        hidden: vec![16],
        seed: 9,
        ..ClassifierConfig::default()
    }
}

fn values(c: &Classifier) -> Vec<f32> {
    c.parameter_bits()
        .unwrap()
        .into_iter()
        .map(f32::from_bits)
        .collect()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// A rank of `plan`'s codecs and worker memory `memory`, in outer rounds of `outer`.
fn rank(
    c: LocalCollective,
    plan: &PartitionPlan,
    memory: &str,
    outer: OuterConfig,
) -> DataParallel<LocalCollective> {
    let clf = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config()).unwrap();
    let mut dp = DataParallel::new(clf, c, plan, memory).unwrap();
    dp.take_local_steps(outer).unwrap();
    dp
}

fn f32_plan() -> PartitionPlan {
    PartitionPlan {
        min_compress_bytes: usize::MAX,
        ..PartitionPlan::default()
    }
}

/// Runs `world` ranks on threads for `rounds` rounds over the sixteen samples of `mix`
/// (each rank its share, by [`rank_share`]); their data-parallel states, in rank order.
fn swarm(
    world: usize,
    rounds: usize,
    plan: &PartitionPlan,
    memory: &str,
    outer: OuterConfig,
) -> Vec<DataParallel<LocalCollective>> {
    std::thread::scope(|s| {
        let joins: Vec<_> = local_collectives(world)
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let r = murmur_engine::comm::Collective::rank(&c);
                    let mut dp = rank(c, plan, memory, outer);
                    for round in 0..rounds {
                        let (x, y) = samples(31 + round);
                        let share = rank_share(SAMPLES, r, world);
                        let rows = &x[share.start * FEATURES..share.end * FEATURES];
                        dp.step((rows, &y[share.clone()]), share.start).unwrap();
                    }
                    dp
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// With an outer rate of 1 and no momentum (federated averaging) and f32 both ways, a round
/// leaves the mean of what each rank's local steps reached on its own (up to the rounding of
/// `anchor - (anchor - local)`), and every replica holds it, bit for bit.
#[test]
fn averaging_outer_rounds_leave_the_mean_of_the_local_models() {
    let averaging = OuterConfig {
        local_steps: 4,
        step_samples: 2,
        lr: 1.0,
        momentum: 0.0,
    };
    let ranks = swarm(2, 1, &f32_plan(), "none", averaging);
    assert_eq!(values(&ranks[0].replica), values(&ranks[1].replica));
    assert_eq!(ranks[0].round(), 1);
    assert_eq!(ranks[0].replica.steps, 4, "a round counts its local steps");
    // Each rank alone: four steps of two samples on its share of eight.
    let (x, y) = samples(31);
    let local: Vec<Vec<f32>> = (0..2)
        .map(|r| {
            let mut clf = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config()).unwrap();
            let share = rank_share(SAMPLES, r, 2);
            for i in 0..4 {
                let slice = rank_share(share.len(), i, 4);
                let rows = share.start + slice.start..share.start + slice.end;
                let (_, grads) = clf
                    .loss_and_grads(
                        &x[rows.start * FEATURES..rows.end * FEATURES],
                        &y[rows.clone()],
                        rows.start,
                    )
                    .unwrap();
                clf.apply(&grads).unwrap();
            }
            values(&clf)
        })
        .collect();
    let mean: Vec<f32> = local[0]
        .iter()
        .zip(&local[1])
        .map(|(a, b)| (a + b) / 2.0)
        .collect();
    let off = worst(&values(&ranks[0].replica), &mean);
    assert!(off < 1e-6, "the averaged round is off by up to {off}");
    assert!(worst(&local[0], &local[1]) > 1e-3, "the shares differ");
}

/// The outer optimizer is SGD with Nesterov momentum: its first step from `anchor` with the
/// pseudo-gradient g moves by `lr * (g + momentum * g)`.
#[test]
fn the_outer_step_is_nesterov_sgd_on_the_pseudo_gradient() {
    let nesterov = OuterConfig {
        local_steps: 2,
        step_samples: 8,
        lr: 0.7,
        momentum: 0.9,
    };
    let start = values(&Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config()).unwrap());
    let one = swarm(1, 1, &f32_plan(), "none", nesterov);
    let plain = swarm(
        1,
        1,
        &f32_plan(),
        "none",
        OuterConfig {
            lr: 1.0,
            momentum: 0.0,
            ..nesterov
        },
    );
    // What the local steps reached (one rank: the average is its own).
    let reached = values(&plain[0].replica);
    let want: Vec<f32> = start
        .iter()
        .zip(&reached)
        .map(|(a, l)| {
            let g = a - l;
            a - 0.7 * (g + 0.9 * g)
        })
        .collect();
    let off = worst(&values(&one[0].replica), &want);
    assert!(off < 1e-5, "off by up to {off}");
    assert!(
        worst(&values(&one[0].replica), &reached) > 1e-4,
        "the outer step moved"
    );
}

/// Compressed pseudo-gradients with error feedback (two-way top-k) and Nesterov outer steps
/// keep the replicas identical over several rounds; the replicas hold the anchor the digest
/// names.
#[test]
fn compressed_outer_rounds_keep_replicas_identical() {
    let plan = PartitionPlan {
        partition_bytes: 256,
        min_compress_bytes: 0,
        push: "topk:0.1".into(),
        pull: "topk:0.1".into(),
        server_memory: "ef".into(),
        seed: 3,
    };
    let outer = OuterConfig {
        local_steps: 3,
        step_samples: 2,
        lr: 0.7,
        momentum: 0.9,
    };
    let ranks = swarm(3, 4, &plan, "ef", outer);
    let first = values(&ranks[0].replica);
    for r in &ranks {
        assert_eq!(values(&r.replica), first);
        assert_eq!(r.round(), 4);
        assert_eq!(
            r.parameter_digest().unwrap(),
            r.replica.parameter_digest().unwrap()
        );
    }
}

/// A snapshot carries the outer loop (its momentum and rounds): a rank restored from one
/// takes the next round bit for bit as the rank that wrote it. Bytes without the outer
/// loop's state are refused, and so is a snapshot of another round.
#[test]
fn a_snapshot_carries_the_outer_state() {
    let outer = OuterConfig {
        local_steps: 2,
        step_samples: 8,
        lr: 0.7,
        momentum: 0.9,
    };
    let plan = f32_plan();
    let round = |dp: &mut DataParallel<LocalCollective>, mix: usize| {
        let (x, y) = samples(mix);
        dp.step((&x, &y), 0).unwrap();
    };
    let one = || local_collectives(1).pop().unwrap();
    let mut writer = rank(one(), &plan, "none", outer);
    round(&mut writer, 3);
    round(&mut writer, 4);
    let snapshot = writer.save_state().unwrap();
    let mut reader = rank(one(), &plan, "none", outer);
    assert!(reader.restore(&snapshot, 3).is_err(), "of another round");
    // The in-process collective of a rank that played two rounds: where the reader goes on.
    let mut stand_in = rank(one(), &plan, "none", outer);
    round(&mut stand_in, 3);
    round(&mut stand_in, 3);
    let mut reader = rank(one(), &plan, "none", outer);
    reader
        .reconnect(std::mem::replace(&mut stand_in.collective, one()))
        .unwrap();
    reader.restore(&snapshot, 2).unwrap();
    assert_eq!(reader.round(), 2);
    assert_eq!(values(&reader.replica), values(&writer.replica));
    round(&mut writer, 5);
    round(&mut reader, 5);
    assert_eq!(values(&reader.replica), values(&writer.replica));
    // The replica's checkpoint alone lacks the momentum: refused, not silently reset.
    let mut bare = rank(one(), &plan, "none", outer);
    let err = bare
        .restore(&writer.replica.save_state().unwrap(), 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("outer"), "{err}");
}

#[test]
fn local_steps_are_chosen_before_the_first_round() {
    let plan = f32_plan();
    let clf = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config()).unwrap();
    let mut dp =
        DataParallel::new(clf, local_collectives(1).pop().unwrap(), &plan, "none").unwrap();
    let (x, y) = samples(7);
    dp.step((&x, &y), 0).unwrap();
    let outer = OuterConfig {
        local_steps: 2,
        step_samples: 8,
        lr: 0.7,
        momentum: 0.9,
    };
    assert!(dp.take_local_steps(outer).is_err());
    for bad in [
        OuterConfig {
            local_steps: 0,
            ..outer
        },
        OuterConfig { lr: 0.0, ..outer },
        OuterConfig {
            momentum: 1.0,
            ..outer
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

/// A share smaller than a full round's takes fewer steps of the job's batch, not as many
/// smaller ones: six samples at four a step are two steps (four, then two), and the round
/// still counts the full round's local steps.
#[test]
fn a_short_share_takes_fewer_steps_not_smaller_ones() {
    let averaging = OuterConfig {
        local_steps: 4,
        step_samples: 4,
        lr: 1.0,
        momentum: 0.0,
    };
    let (x, y) = samples(13);
    let mut dp = rank(
        local_collectives(1).pop().unwrap(),
        &f32_plan(),
        "none",
        averaging,
    );
    dp.step((&x[..6 * FEATURES], &y[..6]), 0).unwrap();
    assert_eq!(dp.replica.steps, 4);
    let mut alone = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config()).unwrap();
    for rows in [0..4, 4..6] {
        let (_, grads) = alone
            .loss_and_grads(
                &x[rows.start * FEATURES..rows.end * FEATURES],
                &y[rows.clone()],
                rows.start,
            )
            .unwrap();
        alone.apply(&grads).unwrap();
    }
    let off = worst(&values(&dp.replica), &values(&alone));
    assert!(off < 1e-6, "off by up to {off}");
}
