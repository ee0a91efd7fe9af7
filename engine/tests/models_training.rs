//! The CNN and the GPT as whole models: the GPU path against the CPU reference path,
//! checkpoints that resume bit-identically (dropout, schedule and batches included), and quick
//! checks that both learn from real data.

mod common;

use murmur_engine::data::{epoch_batches, ImageDataset, TextCorpus};
use murmur_engine::nn::{CnnConfig, GptConfig, Module};
use murmur_engine::train::{Classifier, ClassifierConfig, LanguageModel, LmConfig};
use murmur_engine::Device;

fn cnn_config() -> ClassifierConfig {
    ClassifierConfig {
        cnn: Some(CnnConfig {
            conv1: 4,
            conv2: 8,
            hidden: 16,
            ..CnnConfig::default()
        }),
        seed: 3,
        ..ClassifierConfig::default()
    }
}

/// Some bytes of English, for the tests that only need text-like input.
fn text() -> Vec<u8> {
    b"Shall I compare thee to a summer's day? Thou art more lovely and more temperate: \
      Rough winds do shake the darling buds of May, And summer's lease hath all too short a date."
        .repeat(4)
}

fn gpt_bits(lm: &LanguageModel) -> Vec<u32> {
    lm.model.parameter_bits().unwrap()
}

#[test]
fn gpt_gpu_steps_match_cpu_steps() {
    let config = common::tiny_gpt(4);
    let text = text();
    let mut on_gpu = LanguageModel::new(&common::gpu(), &config).unwrap();
    let mut on_cpu = LanguageModel::new(&Device::Cpu, &config).unwrap();
    for step in 0..4 {
        let g = on_gpu.step(&text).unwrap();
        let c = on_cpu.step(&text).unwrap();
        common::assert_close(
            &format!("step {step} loss and gradient norm"),
            &[g.loss.item().unwrap(), g.grad_norm.item().unwrap()],
            &[c.loss.item().unwrap(), c.grad_norm.item().unwrap()],
            1e-5,
            1e-4,
        );
    }
    if common::exact_adapter() {
        assert_eq!(
            gpt_bits(&on_gpu),
            gpt_bits(&on_cpu),
            "lavapipe must match the CPU bit for bit"
        );
    }
}

#[test]
fn gpt_resumed_from_a_checkpoint_matches_an_uninterrupted_run() {
    let gpu = common::gpu();
    let config = common::tiny_gpt(6);
    let text = text();
    let mut straight = LanguageModel::new(&gpu, &config).unwrap();
    for _ in 0..6 {
        straight.step(&text).unwrap();
    }
    let mut first = LanguageModel::new(&gpu, &config).unwrap();
    for _ in 0..3 {
        first.step(&text).unwrap();
    }
    let checkpoint = first.save_state().unwrap();
    drop(first);
    let mut resumed = LanguageModel::new(&gpu, &config).unwrap();
    resumed.load_state(&checkpoint).unwrap();
    assert_eq!(resumed.steps, 3);
    for _ in 0..3 {
        resumed.step(&text).unwrap();
    }
    assert_eq!(gpt_bits(&resumed), gpt_bits(&straight));
    // A checkpoint of another model kind, shape or run is refused, and leaves the model
    // as it was.
    let mut clf = Classifier::new(&gpu, 784, 10, &cnn_config()).unwrap();
    assert!(clf.load_state(&checkpoint).is_err());
    let model = |m: GptConfig| LmConfig {
        model: m,
        ..config.clone()
    };
    let others = [
        model(GptConfig {
            dim: 32,
            ..config.model.clone()
        }),
        model(GptConfig {
            layers: 3,
            ..config.model.clone()
        }),
        model(GptConfig {
            layers: 1,
            ..config.model.clone()
        }),
        model(GptConfig {
            heads: 4,
            ..config.model.clone()
        }),
        LmConfig {
            seed: 1,
            ..config.clone()
        },
        LmConfig {
            batch: 5,
            ..config.clone()
        },
    ];
    for other in others {
        let mut lm = LanguageModel::new(&gpu, &other).unwrap();
        let before = gpt_bits(&lm);
        let refused = lm.load_state(&checkpoint);
        assert!(refused.is_err(), "{other:?} accepted the checkpoint");
        assert_eq!(gpt_bits(&lm), before);
        assert_eq!(lm.steps, 0);
    }
}

#[test]
fn cnn_gpu_matches_cpu_and_resumes_bit_identically() {
    let gpu = common::gpu();
    let mut rng = murmur_engine::rng::Rng::new(5, 0);
    let batches: Vec<(Vec<f32>, Vec<u32>)> = (0..4)
        .map(|_| {
            (
                (0..8 * 784).map(|_| rng.uniform()).collect(),
                (0..8).map(|_| rng.below(10) as u32).collect(),
            )
        })
        .collect();
    let mut on_gpu = Classifier::new(&gpu, 784, 10, &cnn_config()).unwrap();
    let mut on_cpu = Classifier::new(&Device::Cpu, 784, 10, &cnn_config()).unwrap();
    for (step, (x, y)) in batches.iter().enumerate() {
        let g = on_gpu.step(x, y).unwrap().item().unwrap();
        let c = on_cpu.step(x, y).unwrap().item().unwrap();
        common::assert_close(&format!("step {step} loss"), &[g], &[c], 1e-5, 1e-4);
    }
    if common::exact_adapter() {
        assert_eq!(
            on_gpu.parameter_bits().unwrap(),
            on_cpu.parameter_bits().unwrap()
        );
    }
    // Two steps, checkpoint, two more == four straight (dropout masks follow the step).
    let mut first = Classifier::new(&gpu, 784, 10, &cnn_config()).unwrap();
    for (x, y) in &batches[..2] {
        first.step(x, y).unwrap();
    }
    let mut resumed = Classifier::new(&gpu, 784, 10, &cnn_config()).unwrap();
    resumed.load_state(&first.save_state().unwrap()).unwrap();
    for (x, y) in &batches[2..] {
        resumed.step(x, y).unwrap();
    }
    assert_eq!(
        resumed.parameter_bits().unwrap(),
        on_gpu.parameter_bits().unwrap()
    );
}

#[test]
fn cnn_learns_fashion_mnist_quickly() {
    let Some((mut train, mut test)) = common::dataset_or_skip(
        ImageDataset::FashionMnist,
        "cnn_learns_fashion_mnist_quickly",
    ) else {
        return;
    };
    train.truncate(6400);
    test.truncate(1000);
    let config = ClassifierConfig {
        cnn: Some(CnnConfig::default()),
        seed: 1,
        ..ClassifierConfig::default()
    };
    let mut clf = Classifier::new(&common::gpu(), 784, 10, &config).unwrap();
    for batch in epoch_batches(train.len(), 64, 1, 0) {
        let (x, y) = train.batch(&batch);
        clf.step(&x, &y).unwrap();
    }
    let accuracy = clf.accuracy(&test, 500).unwrap();
    eprintln!(
        "CNN after 100 steps on 6400 Fashion-MNIST images: {:.1}% on 1000 test images",
        100.0 * accuracy
    );
    // Chance is 10%; a broken convolution, pooling or norm backward stays far below this.
    assert!(accuracy > 0.70, "accuracy {accuracy}");
}

#[test]
fn gpt_learns_shakespeare_quickly() {
    let root = murmur_engine::data::default_root();
    let Some(corpus) = common::data_or_skip(
        "gpt_learns_shakespeare_quickly",
        "the Shakespeare texts",
        || TextCorpus::load_shakespeare(&root),
    ) else {
        return;
    };
    let mut config = common::tiny_gpt(150);
    config.model = GptConfig {
        context: 32,
        layers: 2,
        dim: 32,
        heads: 2,
        ..GptConfig::default()
    };
    config.batch = 16;
    let mut lm = LanguageModel::new(&common::gpu(), &config).unwrap();
    let before = lm.evaluate(&corpus.valid, 64, 64).unwrap();
    for _ in 0..150 {
        lm.step(&corpus.train).unwrap();
    }
    let after = lm.evaluate(&corpus.valid, 64, 64).unwrap();
    eprintln!("tiny GPT, 150 steps: validation {before:.3} -> {after:.3} nats/byte");
    // ln 256 = 5.55 at the start; the unigram entropy of the plays is about 3.3 nats, so
    // getting below 3.0 needs context.
    assert!(before > 5.0 && after < 3.0, "{before} -> {after}");
}
