//! Training on real MNIST: the GPU path against the CPU reference path, determinism, and a
//! quick check that the MLP learns.

mod common;

use murmur_engine::data::epoch_batches;
use murmur_engine::train::{Classifier, ClassifierConfig};
use murmur_engine::Device;

/// 784-512-256-10 with AdamW, the spine's acceptance configuration.
fn config(seed: u64) -> ClassifierConfig {
    ClassifierConfig {
        seed,
        ..ClassifierConfig::default()
    }
}

#[test]
fn gpu_and_cpu_losses_agree_for_the_first_50_steps() {
    let Some((train, _)) = common::mnist_or_skip("gpu_and_cpu_losses_agree_for_the_first_50_steps")
    else {
        return;
    };
    let gpu = common::gpu();
    let mut on_gpu = Classifier::new(&gpu, train.features(), 10, &config(7)).unwrap();
    let mut on_cpu = Classifier::new(&Device::Cpu, train.features(), 10, &config(7)).unwrap();
    let batches = epoch_batches(train.len(), 128, 7, 0);
    let mut worst = 0.0f32;
    for (step, batch) in batches.iter().take(50).enumerate() {
        let (x, y) = train.batch(batch);
        let g = on_gpu.step(&x, &y).unwrap().item().unwrap();
        let c = on_cpu.step(&x, &y).unwrap().item().unwrap();
        let rel = (g - c).abs() / c.abs();
        worst = worst.max(rel);
        assert!(
            rel <= 1e-4,
            "step {step}: GPU loss {g} vs CPU loss {c} (relative {rel:e})"
        );
    }
    eprintln!("50 steps: largest relative loss difference GPU vs CPU {worst:e}");
    if common::exact_adapter() {
        assert_eq!(
            worst, 0.0,
            "lavapipe evaluates every kernel exactly as the CPU reference does"
        );
        assert_eq!(
            on_gpu.parameter_bits().unwrap(),
            on_cpu.parameter_bits().unwrap(),
            "parameters after 50 steps differ"
        );
    }
}

#[test]
fn same_seed_gives_the_same_bits() {
    let Some((train, _)) = common::mnist_or_skip("same_seed_gives_the_same_bits") else {
        return;
    };
    for device in [common::gpu(), Device::Cpu] {
        let run = || {
            let mut clf = Classifier::new(&device, train.features(), 10, &config(3)).unwrap();
            for batch in epoch_batches(train.len(), 64, 3, 0).iter().take(5) {
                let (x, y) = train.batch(batch);
                clf.step(&x, &y).unwrap();
            }
            clf.parameter_bits().unwrap()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b, "two runs with one seed differ on {device}");
    }
}

#[test]
fn the_mlp_learns_mnist_in_a_few_hundred_steps() {
    let Some((train, mut test)) =
        common::mnist_or_skip("the_mlp_learns_mnist_in_a_few_hundred_steps")
    else {
        return;
    };
    test.truncate(2000);
    let mut clf = Classifier::new(&common::gpu(), train.features(), 10, &config(1)).unwrap();
    let before = clf.accuracy(&test, 500).unwrap();
    for batch in epoch_batches(train.len(), 128, 1, 0).iter().take(150) {
        let (x, y) = train.batch(batch);
        clf.step(&x, &y).unwrap();
    }
    let after = clf.accuracy(&test, 500).unwrap();
    assert!(
        before < 0.3,
        "an untrained model should be near chance, got {before}"
    );
    assert!(
        after > 0.9,
        "150 AdamW steps should pass 90% on MNIST, got {after}"
    );
}
