//! Communication overlapped with the backward pass: gradients handed over layer by layer as
//! the pass finishes them, and data-parallel rounds that push them as they come, with the
//! bits of rounds that push everything at the end.

mod common;

use murmur_engine::comm::local::local_collectives;
use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::data::lm_batch;
use murmur_engine::train::{
    Classifier, ClassifierConfig, DataParallel, LanguageModel, Learner, LmConfig,
};
use murmur_engine::{Device, Tensor};

fn mlp(hidden: Vec<usize>) -> Classifier {
    let config = ClassifierConfig {
        hidden,
        seed: 3,
        ..ClassifierConfig::default()
    };
    Classifier::new(&Device::Cpu, 784, 10, &config).unwrap()
}

fn images(n: usize) -> (Vec<f32>, Vec<u32>) {
    let x = (0..n * 784)
        .map(|i| ((i * 37) % 101) as f32 / 101.0)
        .collect();
    let y = (0..n as u32).map(|i| (i * 7) % 10).collect();
    (x, y)
}

/// Every gradient as `grads_as_ready` hands it over: the positions in the order they came,
/// and the values by position.
fn handed<M: Learner>(learner: &M, batch: M::Batch<'_>) -> (Vec<usize>, Vec<Vec<f32>>) {
    let n = learner.parameters().len();
    let (mut order, mut grads) = (Vec::new(), vec![Vec::new(); n]);
    learner
        .grads_as_ready(batch, 0, &mut |i, g: Tensor| {
            order.push(i);
            grads[i] = g.to_vec()?;
            Ok(())
        })
        .unwrap();
    (order, grads)
}

fn read(tensors: &[Tensor]) -> Vec<Vec<f32>> {
    tensors.iter().map(|t| t.to_vec().unwrap()).collect()
}

fn to_bits(values: &[Vec<f32>]) -> Vec<Vec<u32>> {
    values
        .iter()
        .map(|v| v.iter().map(|f| f.to_bits()).collect())
        .collect()
}

#[test]
fn gradients_come_last_layer_first_with_the_bits_of_the_whole_pass() {
    let clf = mlp(vec![32, 16]);
    let (x, y) = images(6);
    let (order, grads) = handed(&clf, (&x, &y));
    let (_, whole) = clf.loss_and_grads(&x, &y, 0).unwrap();
    assert_eq!(to_bits(&grads), to_bits(&read(&whole)));
    // Parameters are [w1, b1, w2, b2, w3, b3]: each once, the last layer's before the
    // middle one's, the middle one's before the first's.
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..6).collect::<Vec<_>>(), "each once: {order:?}");
    let at = |i: usize| order.iter().position(|&o| o == i).unwrap();
    let layer_done = |l: usize| at(2 * l).max(at(2 * l + 1));
    let layer_began = |l: usize| at(2 * l).min(at(2 * l + 1));
    assert!(
        layer_done(2) < layer_began(1) && layer_done(1) < layer_began(0),
        "last layer first: {order:?}"
    );
}

#[test]
fn the_gpt_hands_every_gradient_once_with_the_bits_of_the_whole_pass() {
    let config = LmConfig {
        batch: 2,
        seed: 4,
        ..common::tiny_gpt(12)
    };
    let lm = LanguageModel::new(&Device::Cpu, &config).unwrap();
    let text = b"the quick brown fox jumps over the lazy dog, again and again.".repeat(2);
    let (ids, targets) = lm_batch(&text, 2, config.model.context, 1, 0).unwrap();
    let (order, grads) = handed(&lm, (&ids, &targets));
    let (_, whole) = lm.loss_and_grads(&ids, &targets, 0).unwrap();
    assert_eq!(to_bits(&grads), to_bits(&read(&whole)));
    let mut sorted = order;
    sorted.sort_unstable();
    assert_eq!(sorted, (0..grads.len()).collect::<Vec<_>>());
}

/// A classifier whose backward pass takes 20 ms more after each tensor it hands over, as a
/// large model's would: time enough for the pushes of the tensors handed before to leave
/// while it goes on, whatever else the machine runs.
struct SlowBackward(Classifier);

const PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

impl Learner for SlowBackward {
    type Batch<'a> = <Classifier as Learner>::Batch<'a>;
    fn device(&self) -> &Device {
        Learner::device(&self.0)
    }
    fn parameters(&self) -> Vec<&Tensor> {
        Learner::parameters(&self.0)
    }
    fn steps(&self) -> u64 {
        Learner::steps(&self.0)
    }
    fn lr(&self) -> f32 {
        Learner::lr(&self.0)
    }
    fn samples(&self, batch: &Self::Batch<'_>) -> usize {
        self.0.samples(batch)
    }
    fn sub_batch<'a>(
        &self,
        batch: &Self::Batch<'a>,
        range: std::ops::Range<usize>,
    ) -> Self::Batch<'a> {
        self.0.sub_batch(batch, range)
    }
    fn loss_and_grads(
        &self,
        batch: Self::Batch<'_>,
        first: usize,
    ) -> murmur_engine::Result<(Tensor, Vec<Tensor>)> {
        let done = Learner::loss_and_grads(&self.0, batch, first)?;
        std::thread::sleep(PAUSE * done.1.len() as u32);
        Ok(done)
    }
    fn grads_as_ready(
        &self,
        batch: Self::Batch<'_>,
        first: usize,
        ready: &mut dyn FnMut(usize, Tensor) -> murmur_engine::Result<()>,
    ) -> murmur_engine::Result<Tensor> {
        Learner::grads_as_ready(&self.0, batch, first, &mut |i, g| {
            ready(i, g)?;
            std::thread::sleep(PAUSE);
            Ok(())
        })
    }
    fn apply(&mut self, grads: &[Tensor]) -> murmur_engine::Result<()> {
        Learner::apply(&mut self.0, grads)
    }
    fn set_parameters(&mut self, values: &[Tensor]) -> murmur_engine::Result<()> {
        Learner::set_parameters(&mut self.0, values)
    }
    fn set_steps(&mut self, steps: u64) {
        self.0.set_steps(steps)
    }
    fn update_on_cpu(&mut self) -> murmur_engine::Result<()> {
        Learner::update_on_cpu(&mut self.0)
    }
    fn save_state(&self) -> murmur_engine::Result<Vec<u8>> {
        Learner::save_state(&self.0)
    }
    fn load_state(&mut self, bytes: &[u8]) -> murmur_engine::Result<()> {
        Learner::load_state(&mut self.0, bytes)
    }
    fn parameter_digest(&self) -> murmur_engine::Result<u64> {
        Learner::parameter_digest(&self.0)
    }
    fn snapshot_digest(&self, snapshot: &[u8]) -> murmur_engine::Result<u64> {
        self.0.snapshot_digest(snapshot)
    }
}

/// Three rounds of one rank with top-k and error feedback over small partitions (several per
/// tensor): the replica's bits, the bytes each round pushed, and each round's timing. With
/// `at_once`, the rank emulates a device (of a nanosecond a sample), which makes it hand
/// every gradient over at the end.
fn rounds(at_once: bool) -> (Vec<u32>, Vec<usize>, Vec<murmur_engine::train::RoundTiming>) {
    let plan = PartitionPlan {
        partition_bytes: 64_000,
        min_compress_bytes: 4_000,
        push: "topk:0.05".into(),
        pull: "topk:0.05".into(),
        server_memory: "ef".into(),
        seed: 2,
    };
    let collective = local_collectives(1).pop().unwrap();
    let slow = SlowBackward(mlp(vec![64, 32]));
    let mut dp = DataParallel::new(slow, collective, &plan, "ef").unwrap();
    if at_once {
        dp.emulate_device(Some(1e-9));
    }
    let (x, y) = images(16);
    let (mut pushed, mut timings) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (_, bytes) = dp.step((&x, &y), 0).unwrap();
        pushed.push(bytes.pushed);
        timings.push(dp.round_timing());
    }
    (dp.replica.0.parameter_bits().unwrap(), pushed, timings)
}

#[test]
fn rounds_that_push_as_the_gradients_come_give_the_bits_of_rounds_that_push_at_the_end() {
    let (overlapped, pushed, timings) = rounds(false);
    let (at_once, pushed_at_once, timings_at_once) = rounds(true);
    assert_eq!(pushed, pushed_at_once);
    assert!(
        overlapped == at_once,
        "the overlap changed the replica's bits"
    );
    // Pushed at the end, nothing is hidden. Pushed as they come, the pushes of the first
    // five tensors leave while the backward pass goes on for at least 20 ms after each.
    assert!(timings_at_once.iter().all(|t| t.hidden().is_zero()));
    for t in &timings {
        assert!(t.hidden() >= PAUSE, "{t:?}");
        assert!(
            t.hidden() <= t.communicating() && t.computing >= 6 * PAUSE,
            "{t:?}"
        );
    }
}
