//! Data-parallel training through the in-process collective on real MNIST.

mod common;

use murmur_engine::comm::local::local_collectives;
use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::data::{epoch_batches, ImageSet};
use murmur_engine::train::{rank_share, rank_slice, Classifier, ClassifierConfig, DataParallel};
use murmur_engine::Device;

fn config() -> ClassifierConfig {
    ClassifierConfig {
        hidden: vec![128],
        seed: 5,
        ..ClassifierConfig::default()
    }
}

fn bits(c: &Classifier) -> Vec<u32> {
    c.parameter_bits().unwrap()
}

#[test]
fn one_rank_with_the_identity_codec_is_plain_training_bit_for_bit() {
    let Some((train, _)) = common::mnist_or_skip("one_rank_identity") else {
        return;
    };
    let device = common::gpu();
    let mut plain = Classifier::new(&device, 784, 10, &config()).unwrap();
    let clf = Classifier::new(&device, 784, 10, &config()).unwrap();
    let plan = PartitionPlan {
        partition_bytes: 40_000,
        min_compress_bytes: 0,
        ..PartitionPlan::default()
    };
    let mut dp = DataParallel::new(clf, local_collectives(1).pop().unwrap(), &plan, "ef").unwrap();
    for batch in epoch_batches(train.len(), 64, 5, 0).iter().take(6) {
        let (x, y) = train.batch(batch);
        plain.step(&x, &y).unwrap();
        dp.step(&x, &y, 0).unwrap();
    }
    assert_eq!(
        bits(&dp.clf),
        bits(&plain),
        "f32 push and pull with EF (always zero) change nothing"
    );
}

/// Trains `world` ranks in threads for `steps` rounds; returns each rank's classifier.
fn swarm(
    train: &ImageSet,
    world: usize,
    steps: usize,
    plan: &PartitionPlan,
    memory: &str,
    device: &Device,
) -> Vec<Classifier> {
    let handles = local_collectives(world);
    std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|c| {
                let plan = plan.clone();
                s.spawn(move || {
                    let rank = murmur_engine::comm::Collective::rank(&c);
                    let clf = Classifier::new(device, 784, 10, &config()).unwrap();
                    let mut dp = DataParallel::new(clf, c, &plan, memory).unwrap();
                    for global in epoch_batches(train.len(), 64 * world, 5, 0)
                        .iter()
                        .take(steps)
                    {
                        let share = rank_share(global.len(), rank, world);
                        let first = share.start;
                        let (x, y) = train.batch(&global[share]);
                        dp.step(&x, &y, first).unwrap();
                    }
                    dp.clf
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

#[test]
fn four_ranks_with_two_way_top_k_and_error_feedback_learn_and_stay_identical() {
    let Some((train, mut test)) = common::mnist_or_skip("four_ranks_top_k") else {
        return;
    };
    test.truncate(2000);
    let plan = PartitionPlan {
        partition_bytes: 100_000,
        min_compress_bytes: 10_000,
        push: "topk:0.01".into(),
        pull: "topk:0.01".into(),
        server_memory: "ef".into(),
        seed: 1,
    };
    let ranks = swarm(&train, 4, 120, &plan, "ef", &common::gpu());
    let first = bits(&ranks[0]);
    assert!(ranks.iter().all(|r| bits(r) == first), "replicas differ");
    let acc = ranks[0].accuracy(&test, 500).unwrap();
    assert!(
        acc > 0.75,
        "120 rounds of 4x64 with two-way top-1% + EF: {acc} (chance is 0.1)"
    );
}

#[test]
fn rank_slices_partition_the_global_batch() {
    let global: Vec<usize> = (0..10).collect();
    let parts: Vec<&[usize]> = (0..3).map(|r| rank_slice(&global, r, 3)).collect();
    assert_eq!(parts, [&[0, 1, 2, 3][..], &[4, 5, 6], &[7, 8, 9]]);
}

/// The number std gives the next thread it starts: thread ids count every thread ever started.
fn next_thread_number() -> u64 {
    let id = std::thread::spawn(|| std::thread::current().id())
        .join()
        .unwrap();
    format!("{id:?}")
        .trim_start_matches("ThreadId(")
        .trim_end_matches(')')
        .parse()
        .unwrap()
}

#[test]
fn rounds_start_no_threads() {
    // A round used to start an OS thread for its encoding; on a long run that is one thread
    // start (and stack) per round. The encoding now runs on rayon's pool.
    let device = common::gpu();
    let clf = Classifier::new(&device, 784, 10, &config()).unwrap();
    let plan = PartitionPlan {
        partition_bytes: 40_000,
        min_compress_bytes: 0,
        ..PartitionPlan::default()
    };
    let collective = local_collectives(1).pop().unwrap();
    let mut dp = DataParallel::new(clf, collective, &plan, "ef").unwrap();
    let x: Vec<f32> = (0..8 * 784).map(|i| (i % 7) as f32 / 7.0).collect();
    let y: Vec<u32> = (0..8).map(|i| i % 10).collect();
    dp.step(&x, &y, 0).unwrap(); // rayon's pool starts its threads once, here
    let before = next_thread_number();
    for _ in 0..5 {
        dp.step(&x, &y, 0).unwrap();
    }
    let after = next_thread_number();
    assert_eq!(after, before + 1, "threads started during 5 rounds");
}

#[test]
fn a_non_finite_gradient_is_reported_not_sent() {
    // The codecs read NaN and infinity as zero, so a faulty rank's round used to go out as a
    // zero gradient and the fault went unseen.
    let device = common::gpu();
    let clf = Classifier::new(&device, 784, 10, &config()).unwrap();
    let plan = PartitionPlan::default();
    let mut dp = DataParallel::new(clf, local_collectives(1).pop().unwrap(), &plan, "ef").unwrap();
    let mut x: Vec<f32> = (0..4 * 784).map(|i| (i % 5) as f32 / 5.0).collect();
    let y: Vec<u32> = (0..4).collect();
    dp.step(&x, &y, 0).unwrap();
    x[3] = f32::NAN;
    let err = dp.step(&x, &y, 0).unwrap_err();
    assert!(
        matches!(err, murmur_engine::Error::NonFinite { round: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("not sent"), "{err}");
}
