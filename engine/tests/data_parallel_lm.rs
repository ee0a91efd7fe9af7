//! The byte-level GPT trained data parallel through the in-process collective: the same
//! `DataParallel` as the classifiers, with each rank's share of the step's sequences.

mod common;

use murmur_engine::comm::local::local_collectives;
use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::comm::Collective;
use murmur_engine::data::lm_batch;
use murmur_engine::nn::Module;
use murmur_engine::train::{rank_share, DataParallel, LanguageModel, LmConfig};
use murmur_engine::Device;

/// The tests' tiny GPT (it has dropout, so a share's masks depend on where its sequences sit
/// in the global batch) over 12 steps of `batch` sequences.
fn config(batch: usize) -> LmConfig {
    LmConfig {
        batch,
        seed: 9,
        ..common::tiny_gpt(12)
    }
}

fn text() -> Vec<u8> {
    b"It was the best of times, it was the worst of times, it was the age of wisdom, \
      it was the age of foolishness, it was the epoch of belief, it was the epoch of \
      incredulity, it was the season of Light, it was the season of Darkness."
        .repeat(3)
}

fn bits(lm: &LanguageModel) -> Vec<u32> {
    lm.model.parameter_bits().unwrap()
}

fn f32_plan() -> PartitionPlan {
    PartitionPlan {
        partition_bytes: 4_000,
        min_compress_bytes: 0,
        ..PartitionPlan::default()
    }
}

/// Trains `world` ranks in threads for `steps` rounds over a global batch of `batch`
/// sequences; returns each rank's model and its losses.
fn ranks(world: usize, batch: usize, steps: u64, plan: &PartitionPlan) -> Vec<LanguageModel> {
    let text = text();
    let whole = config(batch);
    std::thread::scope(|s| {
        let joins: Vec<_> = local_collectives(world)
            .into_iter()
            .map(|c| {
                let (text, whole) = (&text, &whole);
                s.spawn(move || {
                    let rank = c.rank();
                    let lm = LanguageModel::new(&Device::Cpu, whole).unwrap();
                    let mut dp = DataParallel::new(lm, c, plan, "ef").unwrap();
                    let context = whole.model.context;
                    for step in 0..steps {
                        let (ids, targets) =
                            lm_batch(text, batch, context, whole.seed, step).unwrap();
                        let share = rank_share(batch, rank, world);
                        let rows = share.start * context..share.end * context;
                        dp.step((&ids[rows.clone()], &targets[rows]), share.start)
                            .unwrap();
                    }
                    dp.replica
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

#[test]
fn one_rank_with_the_identity_codec_is_the_language_models_own_step_bit_for_bit() {
    let text = text();
    let mut plain = LanguageModel::new(&Device::Cpu, &config(4)).unwrap();
    for _ in 0..5 {
        plain.step(&text).unwrap();
    }
    let one = ranks(1, 4, 5, &f32_plan()).pop().unwrap();
    assert_eq!(one.steps, 5);
    assert_eq!(
        bits(&one),
        bits(&plain),
        "f32 both ways, one rank: the same clipping, schedule and AdamW step"
    );
}

#[test]
fn two_ranks_compute_the_whole_batchs_step() {
    // Each rank keys its dropout masks by its share's place in the global batch, so two
    // halves average to the whole batch's gradient up to the rounding of the two means.
    let whole = ranks(1, 4, 3, &f32_plan()).pop().unwrap();
    let halves = ranks(2, 4, 3, &f32_plan());
    assert_eq!(bits(&halves[0]), bits(&halves[1]), "replicas differ");
    let a: Vec<f32> = bits(&whole).into_iter().map(f32::from_bits).collect();
    let b: Vec<f32> = bits(&halves[0]).into_iter().map(f32::from_bits).collect();
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    // One AdamW step moves a weight by about the learning rate (3e-3): a wrong mask or share
    // moves many by that much.
    assert!(worst < 2e-4, "largest difference {worst}");
}

#[test]
fn two_ranks_with_top_k_and_error_feedback_stay_identical_and_learn() {
    let plan = PartitionPlan {
        partition_bytes: 4_000,
        min_compress_bytes: 0,
        push: "topk:0.1".into(),
        pull: "topk:0.1".into(),
        server_memory: "ef".into(),
        seed: 2,
    };
    let text = text();
    let before = LanguageModel::new(&Device::Cpu, &config(8)).unwrap();
    let trained = ranks(2, 8, 12, &plan);
    assert_eq!(bits(&trained[0]), bits(&trained[1]), "replicas differ");
    let loss = |lm: &LanguageModel| lm.evaluate(&text, 16, 8).unwrap();
    let (start, end) = (loss(&before), loss(&trained[0]));
    assert!(end < start - 0.1, "validation loss {start} -> {end}");
}
