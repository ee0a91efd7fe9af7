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
        dp.step((&x, &y), 0).unwrap();
    }
    assert_eq!(
        bits(&dp.replica),
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
                        dp.step((&x, &y), first).unwrap();
                    }
                    dp.replica
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
    dp.step((&x, &y), 0).unwrap(); // rayon's pool starts its threads once, here
    let before = next_thread_number();
    for _ in 0..5 {
        dp.step((&x, &y), 0).unwrap();
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
    dp.step((&x, &y), 0).unwrap();
    x[3] = f32::NAN;
    let err = dp.step((&x, &y), 0).unwrap_err();
    assert!(
        matches!(err, murmur_engine::Error::NonFinite { round: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("not sent"), "{err}");
}

/// Eight data-parallel rounds on MNIST with 4-bit LoCo codes and `memory`: the replica's
/// parameters and the last round's code statistics.
fn loco_rounds(
    train: &ImageSet,
    codec: &str,
    memory: &str,
) -> (Vec<u32>, murmur_engine::train::CodeStats) {
    let clf = Classifier::new(&Device::Cpu, 784, 10, &config()).unwrap();
    let plan = PartitionPlan {
        partition_bytes: 100_000,
        min_compress_bytes: 0,
        push: codec.into(),
        pull: "f32".into(),
        ..PartitionPlan::default()
    };
    let mut dp =
        DataParallel::new(clf, local_collectives(1).pop().unwrap(), &plan, memory).unwrap();
    for batch in epoch_batches(train.len(), 64, 5, 0).iter().take(8) {
        let (x, y) = train.batch(batch);
        dp.step((&x, &y), 0).unwrap();
    }
    (bits(&dp.replica), dp.code_stats())
}

#[test]
fn loco_left_to_calibration_neither_clips_nor_idles() {
    use murmur_engine::algo::calibrate::{loco_log2s, with_calibrated_scale};
    let Some((train, _)) = common::mnist_or_skip("loco_calibration") else {
        return;
    };
    // The codec's default scale, 2^19, on a real gradient: nearly every code clips and nearly
    // every int8 error entry is nonzero, pinned near its limit. This is what `murmur swarm
    // --codec loco` ran before the product path calibrated.
    let (_, uncalibrated) = loco_rounds(&train, "loco:bits=4", "loco-ema");
    let clipped = uncalibrated.saturated.unwrap();
    assert!(clipped > 0.5, "default scale: {uncalibrated:?}");
    // Calibrated as the node does it: the first batch's gradient at the initial model.
    let clf = Classifier::new(&Device::Cpu, 784, 10, &config()).unwrap();
    let first = &epoch_batches(train.len(), 64, 5, 0)[0];
    let (x, y) = train.batch(first);
    let (_, grads) = clf.loss_and_grads(&x, &y, 0).unwrap();
    let flat = murmur_engine::Tensor::read_many(&grads.iter().collect::<Vec<_>>())
        .unwrap()
        .concat();
    let log2s = loco_log2s(&flat, 4).unwrap();
    let (codec, memory) = with_calibrated_scale("loco:bits=4", "loco-ema", log2s);
    let (loco, stats) = loco_rounds(&train, &codec, &memory);
    let (clipped, nonzero) = (stats.saturated.unwrap(), stats.error_nonzero.unwrap());
    assert!(clipped < 0.05, "calibrated 2^{log2s}: {stats:?}");
    // Mode B's int8 memory rounds ordinary rounding residuals away (loco.md §7.2: beta * r
    // is below half a step of s_e = 4s), so few entries hold an error early on; but some do,
    // and they are not pinned.
    assert!(
        nonzero > 0.0 && nonzero < 0.5,
        "calibrated 2^{log2s}: {stats:?}"
    );
    // And the memory does something: LoCo's replica is not naive 4-bit's.
    let (naive, _) = loco_rounds(&train, &codec, "none");
    assert_ne!(loco, naive, "LoCo's pushes equal naive 4-bit's");
}

/// Two ranks, six rounds of rescalable 4-bit LoCo both ways; with `rescale_to`, both ranks
/// move the scale before round 3. Each rank's parameters and push scale.
fn rescaled_pair(train: &ImageSet, rescale_to: Option<i32>) -> Vec<(Vec<u32>, Option<i32>)> {
    let plan = PartitionPlan {
        partition_bytes: 100_000,
        min_compress_bytes: 0,
        push: "loco:bits=4:log2s=8:rescalable".into(),
        pull: "loco:bits=4:log2s=8:rescalable".into(),
        server_memory: "loco-ema:beta=0.5:se=1024".into(),
        seed: 2,
    };
    let world = 2;
    std::thread::scope(|s| {
        let joins: Vec<_> = local_collectives(world)
            .into_iter()
            .map(|c| {
                let plan = plan.clone();
                s.spawn(move || {
                    let rank = murmur_engine::comm::Collective::rank(&c);
                    let clf = Classifier::new(&Device::Cpu, 784, 10, &config()).unwrap();
                    let mut dp =
                        DataParallel::new(clf, c, &plan, "loco-ema:beta=0.5:se=1024").unwrap();
                    let batches = epoch_batches(train.len(), 64 * world, 5, 0);
                    for (round, global) in batches.iter().take(6).enumerate() {
                        if let (3, Some(log2s)) = (round, rescale_to) {
                            dp.rescale(log2s).unwrap();
                        }
                        let share = rank_share(global.len(), rank, world);
                        let first = share.start;
                        let (x, y) = train.batch(&global[share]);
                        dp.step((&x, &y), first).unwrap();
                    }
                    (bits(&dp.replica), dp.push_log2s())
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

#[test]
fn a_loco_scale_recalibrated_mid_run_moves_pushes_and_replies_alike() {
    let Some((train, _)) = common::mnist_or_skip("loco_rescale") else {
        return;
    };
    let moved = rescaled_pair(&train, Some(11));
    assert_eq!(moved[0], moved[1], "replicas differ after the rescale");
    assert_eq!(moved[0].1, Some(11));
    let kept = rescaled_pair(&train, None);
    assert_eq!(kept[0].1, Some(8));
    assert_ne!(moved[0].0, kept[0].0, "the new scale changed nothing");

    // A rank that missed the recalibration (a catch-up) adopts the scale of the replies.
    let plan = PartitionPlan {
        partition_bytes: 100_000,
        min_compress_bytes: 0,
        push: "loco:bits=4:log2s=8:rescalable".into(),
        pull: "loco:bits=4:log2s=8:rescalable".into(),
        server_memory: "none".into(),
        seed: 2,
    };
    let clf = Classifier::new(&Device::Cpu, 784, 10, &config()).unwrap();
    let mut late =
        DataParallel::new(clf, local_collectives(1).pop().unwrap(), &plan, "loco-ema").unwrap();
    let reply_codec = murmur_engine::compress::parse("loco:bits=4:log2s=11:rescalable").unwrap();
    let replies: Vec<_> = late
        .partitions()
        .iter()
        .map(|p| {
            let ctx = murmur_engine::comm::codec_context(2, 0, p.key);
            (p.key, reply_codec.encode(&vec![0.0; p.len], &ctx))
        })
        .collect();
    late.apply_replies(&replies).unwrap();
    assert_eq!(late.push_log2s(), Some(11));
}

/// Eight samples of six features in three classes, made up from `mix`, and the CPU
/// classifier's configuration the tests below train on them.
fn eight_samples(mix: usize) -> (Vec<f32>, Vec<u32>, ClassifierConfig) {
    let x = (0..FEATURES * 8)
        .map(|i| ((i * mix % 23) as f32 - 11.0) / 7.0)
        .collect();
    let y = (0..8u32).map(|i| (i * 5 + 1) % CLASSES as u32).collect();
    let config = ClassifierConfig {
        hidden: vec![16],
        seed: 9,
        ..ClassifierConfig::default()
    };
    (x, y, config)
}

const FEATURES: usize = 6;
const CLASSES: usize = 3;

/// Two in-process ranks, each trained by `rank` on its own thread from the same classifier
/// with f32 pushes and replies and worker memory `memory`; their replicas, in rank order.
fn two_ranks(
    config: &ClassifierConfig,
    memory: &str,
    rank: impl Fn(usize, &mut DataParallel<murmur_engine::comm::local::LocalCollective>) + Sync,
) -> Vec<Classifier> {
    let plan = PartitionPlan {
        min_compress_bytes: usize::MAX,
        ..PartitionPlan::default()
    };
    std::thread::scope(|s| {
        let joins: Vec<_> = local_collectives(2)
            .into_iter()
            .map(|c| {
                let (plan, rank) = (&plan, &rank);
                s.spawn(move || {
                    let r = murmur_engine::comm::Collective::rank(&c);
                    let clf = Classifier::new(&Device::Cpu, FEATURES, CLASSES, config).unwrap();
                    let mut dp = DataParallel::new(clf, c, plan, memory).unwrap();
                    rank(r, &mut dp);
                    dp.replica
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// Shares of unequal size weigh by their samples: two ranks holding 6 and 2 samples of a
/// batch of 8 take the step one process takes on all 8 (up to rounding), where a plain mean
/// of the two shares' gradients would count each of the 2 samples three times as much.
#[test]
fn unequal_shares_weigh_as_the_whole_batch() {
    let (x, y, config) = eight_samples(37);
    let mut whole = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config).unwrap();
    whole.step(&x, &y).unwrap();
    let ranks = two_ranks(&config, "none", |rank, dp| {
        let share = if rank == 0 { 0..6 } else { 6..8 };
        let rows = &x[share.start * FEATURES..share.end * FEATURES];
        dp.step((rows, &y[share.clone()]), share.start).unwrap();
    });
    assert_eq!(bits(&ranks[0]), bits(&ranks[1]), "replicas agree");
    let values = |c: &Classifier| bits(c).into_iter().map(f32::from_bits).collect::<Vec<_>>();
    let worst = values(&ranks[0])
        .iter()
        .zip(&values(&whole))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-6, "the split step is off by up to {worst}");
}

/// A rank without a share pushes zeros standing for no samples: the round's mean is the other
/// rank's gradient alone, bit for bit what one process steps, and the share-less rank's
/// replica follows it exactly.
#[test]
fn a_rank_without_a_share_changes_nothing() {
    let (x, y, config) = eight_samples(29);
    let ranks = two_ranks(&config, "ef", |rank, dp| {
        for _ in 0..3 {
            if rank == 0 {
                dp.step((&x, &y), 0).unwrap();
            } else {
                dp.step_without_share().unwrap();
            }
        }
    });
    let mut whole = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config).unwrap();
    for _ in 0..3 {
        whole.step(&x, &y).unwrap();
    }
    assert_eq!(bits(&ranks[0]), bits(&whole), "the sharer's steps alone");
    assert_eq!(bits(&ranks[1]), bits(&whole), "the replicas agree");
}

/// An emulated device sets a round's compute time (samples × its pace, whatever the machine
/// would take), so the same bits come out; a pace the machine cannot keep is counted, not hidden.
#[test]
fn an_emulated_device_paces_the_rounds_and_counts_overruns() {
    let (x, y, config) = eight_samples(0);
    let rounds = |pace: Option<f64>| {
        let clf = Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config).unwrap();
        let c = local_collectives(1).pop().unwrap();
        let mut dp = DataParallel::new(clf, c, &PartitionPlan::default(), "ef").unwrap();
        dp.emulate_device(pace);
        let started = std::time::Instant::now();
        for _ in 0..3 {
            dp.step((&x, &y), 0).unwrap();
        }
        (
            started.elapsed(),
            dp.emulation_overruns(),
            bits(&dp.replica),
        )
    };
    let (free, none, plain) = rounds(None);
    // 8 samples at 10 ms each: 80 ms a round.
    let (paced, overruns, emulated) = rounds(Some(0.01));
    assert!(paced >= std::time::Duration::from_millis(240), "{paced:?}");
    assert!(paced > free, "{paced:?} against {free:?}");
    assert_eq!((none, overruns), (0, 0));
    assert_eq!(emulated, plain, "emulation changes no bits");
    // A nanosecond a sample: no machine keeps that pace.
    assert_eq!(rounds(Some(1e-9)).1, 3);
}

/// A rank on the GPU and one on the CPU take the same update bit for bit, because the update
/// runs on the CPU for both: the GPU computes gradients but never compiles the optimizer's
/// kernels, so a driver that fuses their multiply-adds (lavapipe does not) cannot split the
/// replicas. AdamW with clipping, the most arithmetic an update has.
#[test]
fn a_gpu_rank_and_a_cpu_rank_take_the_update_on_the_cpu_alike() {
    let (x, y, mut config) = eight_samples(11);
    config.optimizer = murmur_engine::train::OptimizerKind::AdamW;
    config.clip = Some(0.05);
    // A device of its own: the tests in this binary share the other one.
    let gpu = Device::gpu().expect("GPU tests need an adapter (scripts/test.sh installs lavapipe)");
    let plan = PartitionPlan {
        min_compress_bytes: usize::MAX,
        ..PartitionPlan::default()
    };
    let replicas: Vec<Vec<u32>> = std::thread::scope(|s| {
        let joins: Vec<_> = local_collectives(2)
            .into_iter()
            .zip([gpu.clone(), Device::Cpu])
            .map(|(c, device)| {
                let (plan, config, x, y) = (&plan, &config, &x, &y);
                s.spawn(move || {
                    let r = murmur_engine::comm::Collective::rank(&c);
                    let clf = Classifier::new(&device, FEATURES, CLASSES, config).unwrap();
                    let mut dp = DataParallel::new(clf, c, plan, "ef").unwrap();
                    let share = rank_share(8, r, 2);
                    for _ in 0..4 {
                        let rows = &x[share.start * FEATURES..share.end * FEATURES];
                        dp.step((rows, &y[share.clone()]), share.start).unwrap();
                    }
                    bits(&dp.replica)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert_eq!(
        replicas[0], replicas[1],
        "the GPU rank and the CPU rank differ"
    );
    let shaders = gpu.as_gpu().unwrap().shaders_compiled();
    assert!(!shaders.is_empty(), "the GPU rank computed nothing");
    assert!(
        !shaders.contains(&"optim.wgsl"),
        "the update ran on the GPU: {shaders:?}"
    );
}
