//! Clapping's testable invariants (shared/specs/clapping.md §8) on the in-process pipeline, on
//! the CPU device with a small synthetic image set.

use std::sync::Arc;

use murmur_engine::algo::{Hyper, OptimizerSpec};
use murmur_engine::data::ImageSet;
use murmur_engine::nn::{Activation, Mlp, Module};
use murmur_engine::pipeline::message::RowCodec;
use murmur_engine::pipeline::{
    LazySampler, ModelSpec, PSchedule, Pipeline, PipelineConfig, PipelineData, Rule, Variant,
};
use murmur_engine::{Device, Graph, Tensor};

/// 6x6 images of 4 bands; the label's band is brighter on average, so a model can learn it.
fn images(n: usize) -> ImageSet {
    let mut rng = murmur_engine::rng::Rng::new(42, 0);
    let mut images = Vec::with_capacity(n * 36);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        let label = rng.below(4);
        for px in 0..36 {
            let bright = px / 9 == label;
            images.push((rng.below(160) + if bright { 96 } else { 0 }) as u8);
        }
        labels.push(label as u8);
    }
    ImageSet {
        images,
        labels,
        rows: 6,
        cols: 6,
        classes: 4,
    }
}

fn data(n: usize) -> Arc<PipelineData> {
    Arc::new(images(n).into())
}

const SIZES: [usize; 5] = [36, 20, 16, 12, 4];

fn config(variant: Variant, codec: &str, stages: usize, p: f32) -> PipelineConfig {
    PipelineConfig {
        model: ModelSpec::Mlp(SIZES.to_vec()),
        stages,
        batch: 6,
        variant,
        forward_codec: codec.into(),
        backward_codec: codec.into(),
        p: PSchedule::Constant(p),
        rule: Rule::Batch,
        warmup: 0,
        optimizer: OptimizerSpec::Ema { m: 0.1 },
        lr: 0.5,
        weight_decay: 1e-4,
        lr_drop_at: None,
        seed: 3,
    }
}

fn run(config: PipelineConfig, steps: usize) -> Pipeline {
    let mut p = Pipeline::new(config, &Device::Cpu, data(300)).unwrap();
    for _ in 0..steps {
        p.step().unwrap();
    }
    p
}

#[test]
fn the_identity_codec_gives_the_uncompressed_trajectory_under_every_variant() {
    // Invariant 1, bit for bit thanks to the raw short-circuit of the f32 codec.
    let reference = run(config(Variant::Uncompressed, "f32", 3, 0.5), 25).weight_bits();
    for v in [Variant::Direct, Variant::Fc, Variant::FcReset, Variant::Fu] {
        assert_eq!(
            run(config(v, "f32", 3, 0.5), 25).weight_bits(),
            reference,
            "{v}"
        );
    }
    let compressed = run(config(Variant::Fc, "topk:0.3", 3, 0.5), 25).weight_bits();
    assert_ne!(compressed, reference, "the test can tell");
}

#[test]
fn uncompressed_at_p_one_and_m_one_is_plain_sgd_on_the_unsplit_model() {
    // Invariant 2 (and 3's E = 1): backward at the pre-update weights, the stages' pieces of
    // the gradient equal the whole graph's, bit for bit.
    let mut c = config(Variant::Uncompressed, "f32", 4, 1.0);
    c.optimizer = OptimizerSpec::Ema { m: 1.0 };
    let steps = 12;
    let split = run(c.clone(), steps).weight_bits();
    c.stages = 1;
    assert_eq!(run(c.clone(), steps).weight_bits(), split, "E = 1");

    let set = images(300);
    let mut mlp = Mlp::new(&Device::Cpu, &SIZES, Activation::Relu, c.seed).unwrap();
    let mut sampler = LazySampler::new(set.len(), c.batch, Rule::Batch, c.p, c.seed);
    let mut sgd = OptimizerSpec::Sgd.build(
        &mlp.parameters()
            .iter()
            .map(|p| p.numel())
            .collect::<Vec<_>>(),
    );
    let mut w: Vec<f32> = Tensor::read_many(&mlp.parameters()).unwrap().concat();
    for step in 0..steps as u64 {
        let draw = sampler.next_draw();
        let (x, y) = set.batch(&draw.ids);
        let g = Graph::new(&Device::Cpu);
        let input = g.input(&Tensor::from_vec(&Device::Cpu, &[c.batch, 36], x).unwrap());
        let logits = mlp.forward(&g, input).unwrap();
        let labels = Tensor::from_u32(&Device::Cpu, &[c.batch], y).unwrap();
        let loss = g.cross_entropy_mean(logits, &labels).unwrap();
        let grads = g
            .backward(loss)
            .unwrap()
            .for_params(&mlp.parameters())
            .unwrap();
        let grad = Tensor::read_many(&grads.iter().collect::<Vec<_>>())
            .unwrap()
            .concat();
        let hyper = Hyper {
            step,
            lr: c.lr,
            weight_decay: c.weight_decay,
        };
        sgd.step(&mut w, &grad, hyper).unwrap();
        let mut offset = 0;
        for p in mlp.parameters_mut() {
            let n = p.numel();
            *p = Tensor::from_vec(&Device::Cpu, p.shape(), w[offset..offset + n].to_vec()).unwrap();
            offset += n;
        }
    }
    let bits: Vec<u32> = w.iter().map(|v| v.to_bits()).collect();
    assert_eq!(split, bits, "pipeline against the whole graph");
}

/// The gradient of the unsplit model at the pipeline's current weights on `ids`, every
/// layer's parameters in order (what the stages' `last_gradient`s concatenate to).
fn exact_gradient(p: &Pipeline, set: &ImageSet, ids: &[usize]) -> Vec<f32> {
    let (x, y) = set.batch(ids);
    let g = Graph::new(&Device::Cpu);
    let x = Tensor::from_vec(&Device::Cpu, &[ids.len(), 36], x).unwrap();
    let h = p.logits(&g, &x).unwrap();
    let labels = Tensor::from_u32(&Device::Cpu, &[ids.len()], y).unwrap();
    let loss = g.cross_entropy_mean(h, &labels).unwrap();
    let params: Vec<&Tensor> = p
        .stages()
        .iter()
        .flat_map(|s| s.model().parameters())
        .collect();
    let grads = g.backward(loss).unwrap().for_params(&params).unwrap();
    Tensor::read_many(&grads.iter().collect::<Vec<_>>())
        .unwrap()
        .concat()
}

#[test]
fn fu_steps_on_fresh_samples_take_the_exact_gradient() {
    // Invariant 6: on a fresh step FU's gradient is the unsplit model's at the same weights,
    // bit for bit; on kept steps (the weights having moved) it is not.
    let set = images(300);
    let c = config(Variant::Fu, "topk:0.25", 3, 0.4);
    let mut fu = Pipeline::new(c.clone(), &Device::Cpu, Arc::new(set.clone().into())).unwrap();
    let mut sampler = LazySampler::new(set.len(), c.batch, c.rule, c.p, c.seed);
    let (mut fresh_steps, mut kept_differ) = (0, 0);
    for _ in 0..30 {
        let draw = sampler.next_draw();
        let exact = exact_gradient(&fu, &set, &draw.ids);
        fu.step().unwrap();
        let got: Vec<f32> = fu
            .stages()
            .iter()
            .flat_map(|s| s.last_gradient.clone())
            .collect();
        if draw.fresh[0] {
            assert_eq!(got, exact, "a fresh FU step is exact (step {})", draw.step);
            fresh_steps += 1;
        } else if got != exact {
            kept_differ += 1;
        }
    }
    assert!(
        fresh_steps >= 5 && kept_differ >= 5,
        "{fresh_steps} {kept_differ}"
    );
}

#[test]
fn top_k_feedback_on_frozen_weights_reaches_the_exact_gradient() {
    // Invariant 7 with E = 2: the forward buffer is exact after ceil(d/K) steps, the backward
    // one ceil(d/K) steps after that, and from then on the gradient is the exact one.
    let mut c = config(Variant::Fc, "topk:k=3", 2, 0.0);
    c.lr = 0.0;
    let rounds = c.cut_width(0).div_ceil(3);
    let mut exact_c = c.clone();
    exact_c.variant = Variant::Uncompressed;
    let mut fc = Pipeline::new(c, &Device::Cpu, data(300)).unwrap();
    let mut exact = Pipeline::new(exact_c, &Device::Cpu, data(300)).unwrap();
    let mut first_exact = None;
    for step in 0..3 * rounds {
        fc.step().unwrap();
        exact.step().unwrap();
        let same = fc.stages()[0].last_gradient == exact.stages()[0].last_gradient;
        if same && first_exact.is_none() {
            first_exact = Some(step);
        }
        if first_exact.is_some() {
            assert!(same, "stays exact once exact (step {step})");
        }
    }
    let first = first_exact.expect("reaches the exact gradient");
    assert!(
        first > 0 && first < 2 * rounds,
        "exact from step {first}, bound {}",
        2 * rounds
    );
}

#[test]
fn sender_and_receiver_buffers_stay_equal_bit_for_bit() {
    // Invariant 5, for every variant with memory and stochastic and deterministic codecs.
    for (v, codec) in [
        (Variant::Fc, "natural"),
        (Variant::Fu, "topk:0.2"),
        (Variant::FcReset, "qsgd:bits=4"),
        (Variant::Ef21, "qsgd:bits=8+natural"),
        (Variant::AqSgd, "hybrid:bits=6:topk=0.3"),
    ] {
        let mut c = config(v, codec, 3, 0.5);
        c.rule = Rule::Sample;
        let mut p = Pipeline::new(c, &Device::Cpu, data(300)).unwrap();
        for step in 0..12 {
            p.step().unwrap();
            for e in 0..2 {
                let sender = p.stages()[e].buffers_after().unwrap();
                let receiver = p.stages()[e + 1].buffers_before().unwrap();
                assert_eq!(sender, receiver, "{v} {codec} cut {e} step {step}");
            }
        }
    }
}

#[test]
fn clapping_memory_is_fixed_while_aq_sgd_grows_with_the_samples_seen() {
    // Invariant 9: 2 buffers (forward and backward) of B x d per cut on each side.
    let c = config(Variant::Fc, "topk:0.2", 3, 0.5);
    let expected: usize = (0..2).map(|e| 4 * c.batch * c.cut_width(e)).sum();
    for n in [100, 300] {
        let mut p = Pipeline::new(c.clone(), &Device::Cpu, data(n)).unwrap();
        for _ in 0..60 {
            p.step().unwrap();
        }
        assert_eq!(p.memory_floats(), expected, "N = {n}");
    }
    let aq = |steps| run(config(Variant::AqSgd, "topk:0.2", 3, 1.0), steps).memory_floats();
    let per_sample: usize = (0..2).map(|e| 2 * c.cut_width(e)).sum();
    assert_eq!(aq(10), 60 * per_sample, "10 steps of 6 fresh samples");
    assert_eq!(
        aq(80),
        300 * per_sample,
        "every sample of the set, after an epoch"
    );
}

#[test]
fn baseline_equivalences_hold() {
    // Invariant 8: FC with the reset at p = 1 is direct compression.
    assert_eq!(
        run(config(Variant::FcReset, "topk:0.2", 3, 1.0), 20).weight_bits(),
        run(config(Variant::Direct, "topk:0.2", 3, 1.0), 20).weight_bits()
    );
    // EF21 is FC at p = 1 whatever p it is given.
    assert_eq!(
        run(config(Variant::Ef21, "topk:0.2", 3, 0.3), 20).weight_bits(),
        run(config(Variant::Fc, "topk:0.2", 3, 1.0), 20).weight_bits()
    );
}

#[test]
fn wire_bytes_follow_the_formulas() {
    // Invariant 12: FC sends the compressed size every step; FU sends full rows on fresh
    // steps; with batch-wise sampling each step is one or the other.
    let c = config(Variant::Fc, "topk:0.25", 3, 0.5);
    let codec: RowCodec = "topk:0.25".parse().unwrap();
    let per_cut = |e: usize, coded: bool| {
        let d = c.cut_width(e);
        2 * c.batch * if coded { codec.payload_len(d) } else { 4 * d }
    };
    let compressed: usize = (0..2).map(|e| per_cut(e, true)).sum();
    let full: usize = (0..2).map(|e| per_cut(e, false)).sum();
    let mut fc = Pipeline::new(c.clone(), &Device::Cpu, data(300)).unwrap();
    let mut fu_c = c.clone();
    fu_c.variant = Variant::Fu;
    let mut fu = Pipeline::new(fu_c, &Device::Cpu, data(300)).unwrap();
    let mut sampler = LazySampler::new(300, 6, Rule::Batch, c.p, c.seed);
    let mut total = 0;
    let steps = 200;
    for _ in 0..steps {
        assert_eq!(fc.step().unwrap().bytes, compressed);
        let bytes = fu.step().unwrap().bytes;
        let fresh = sampler.next_draw().fresh[0];
        assert_eq!(bytes, if fresh { full } else { compressed });
        total += bytes;
    }
    let mean = total as f64 / steps as f64;
    let expected = 0.5 * full as f64 + 0.5 * compressed as f64;
    assert!(
        (mean - expected).abs() < 0.15 * expected,
        "{mean} vs {expected}"
    );
}

#[test]
fn clapping_trains_and_the_run_is_reproducible() {
    let c = config(Variant::Fc, "topk:0.3", 3, 0.5);
    let mut p = Pipeline::new(c.clone(), &Device::Cpu, data(300)).unwrap();
    let losses: Vec<f32> = (0..400).map(|_| p.step().unwrap().loss).collect();
    let early: f32 = losses[..50].iter().sum::<f32>() / 50.0;
    let late: f32 = losses[350..].iter().sum::<f32>() / 50.0;
    assert!(late < 0.7 * early, "loss {early} -> {late}");
    assert!(p.accuracy(&images(300), 64).unwrap() > 0.5);
    assert_eq!(run(c, 400).weight_bits(), p.weight_bits());
}
