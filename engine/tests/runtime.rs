//! The GPU runtime's promises: a training step is a few submits, and buffers are reused
//! across steps instead of allocated anew.

use murmur_engine::rng::Rng;
use murmur_engine::train::{Classifier, ClassifierConfig};
use murmur_engine::{Device, Tensor};

#[test]
fn a_training_step_is_a_few_submits_and_reuses_its_buffers() {
    // A device of its own, so that no other test's work shows in the counters.
    let device =
        Device::gpu().expect("GPU tests need an adapter (scripts/test.sh installs lavapipe)");
    let gpu = device.as_gpu().unwrap().clone();
    let config = ClassifierConfig {
        hidden: vec![32, 16],
        seed: 4,
        ..ClassifierConfig::default()
    };
    let mut clf = Classifier::new(&device, 20, 5, &config).unwrap();
    let mut rng = Rng::new(4, 0);
    let x: Vec<f32> = (0..64 * 20).map(|_| rng.uniform()).collect();
    let y: Vec<u32> = (0..64).map(|_| rng.below(5) as u32).collect();

    // The loop a training run has: keep the newest loss, read it now and then.
    let mut run = |steps: u64| {
        let mut loss = None;
        for _ in 0..steps {
            loss = Some(clf.step(&x, &y).unwrap());
        }
        loss.unwrap().item().unwrap();
    };
    // Warm-up steps create optimizer state and fill the pool.
    run(3);
    let pool_before = gpu.pool_stats();
    let (submits_before, dispatches_before) = gpu.command_stats();
    let steps = 5;
    run(steps);
    let (submits, dispatches) = gpu.command_stats();
    let (submits, dispatches) = (submits - submits_before, dispatches - dispatches_before);
    assert!(submits <= 3 * steps, "{submits} submits for {steps} steps");
    assert!(
        dispatches >= 20 * steps,
        "only {dispatches} dispatches for {steps} steps?"
    );

    let pool_after = gpu.pool_stats();
    assert_eq!(
        pool_before.live_bytes + pool_before.cached_bytes,
        pool_after.live_bytes + pool_after.cached_bytes,
        "steady-state steps allocate nothing new: {pool_before:?} -> {pool_after:?}"
    );
}

#[test]
fn oversized_tensors_fail_cleanly_and_the_device_keeps_working() {
    let device = Device::gpu().unwrap();
    let gpu = device.as_gpu().unwrap().clone();
    let limit = gpu.info().limits.max_storage_buffer_binding_size as usize;
    let n = limit / 4 + 1024;
    let err = Tensor::zeros(&device, &[n]).unwrap_err().to_string();
    assert!(err.contains("largest storage binding"), "{err}");
    let err = Tensor::from_vec(&device, &[n], vec![0.0; n])
        .unwrap_err()
        .to_string();
    assert!(err.contains("largest storage binding"), "{err}");
    // The failure cost one request, not the device.
    let t = Tensor::from_vec(&device, &[3], vec![1.0, -2.0, 3.0]).unwrap();
    assert_eq!(t.relu().unwrap().to_vec().unwrap(), [1.0, 0.0, 3.0]);
}
