//! A GPT cut between its blocks (clapping.md §7 R4): the split changes nothing without
//! compression, the untied head starts as the tied model, and compressed cuts keep both ends
//! of every buffer equal while the model learns.

mod common;

use std::sync::Arc;

use murmur_engine::algo::OptimizerSpec;
use murmur_engine::data::ImageSet;
use murmur_engine::nn::{Gpt, GptConfig};
use murmur_engine::pipeline::{
    ModelSpec, PSchedule, Pipeline, PipelineConfig, PipelineData, Rule, TextWindows, Variant,
};
use murmur_engine::{Device, Graph, Tensor};

const CONTEXT: usize = 8;

fn gpt() -> GptConfig {
    GptConfig {
        vocab: 256,
        context: CONTEXT,
        layers: 3,
        dim: 16,
        heads: 2,
        dropout: 0.0,
    }
}

/// A sentence repeated with a seeded letter changed now and then: learnable, not trivial.
fn text_bytes() -> Vec<u8> {
    let mut rng = murmur_engine::rng::Rng::new(5, 0);
    b"a stage sends what it computed to the next stage. "
        .iter()
        .cycle()
        .take(2000)
        .map(|&b| {
            if rng.below(20) == 0 {
                b'a' + rng.below(26) as u8
            } else {
                b
            }
        })
        .collect()
}

fn windows() -> TextWindows {
    TextWindows::new(text_bytes(), CONTEXT).unwrap()
}

fn config(variant: Variant, codec: &str, stages: usize) -> PipelineConfig {
    PipelineConfig {
        model: ModelSpec::Gpt(gpt()),
        stages,
        batch: 4,
        variant,
        forward_codec: codec.into(),
        backward_codec: codec.into(),
        p: PSchedule::Constant(0.5),
        rule: Rule::Batch,
        warmup: 0,
        optimizer: OptimizerSpec::ADAMW,
        lr: 0.01,
        weight_decay: 0.01,
        lr_drop_at: None,
        seed: 4,
    }
}

fn pipeline(c: PipelineConfig) -> Pipeline {
    Pipeline::new(c, &Device::Cpu, Arc::new(windows().into())).unwrap()
}

#[test]
fn a_compressed_gpt_pipeline_on_the_gpu_follows_the_cpu_reference() {
    // The GPT's stages on a GPU train what the CPU reference trains. On lavapipe, which
    // evaluates every kernel with the reference's arithmetic, the runs agree bit for bit (so
    // peers on either device would send the same payloads); elsewhere they stay close.
    let run = |device: &Device| {
        let mut p = Pipeline::new(
            config(Variant::Fc, "topk:0.4", 3),
            device,
            Arc::new(windows().into()),
        )
        .unwrap();
        let losses: Vec<f32> = (0..5).map(|_| p.step().unwrap().loss).collect();
        let valid = p.text_loss(&windows(), 16, 8).unwrap();
        (losses, valid, p.weight_bits())
    };
    let (cpu, gpu) = (run(&Device::Cpu), run(&common::gpu()));
    if common::exact_adapter() {
        assert_eq!(cpu, gpu, "lavapipe computes the CPU reference's bits");
    } else {
        for (c, g) in cpu.0.iter().zip(&gpu.0) {
            assert!(
                (c - g).abs() < 1e-3 * c.abs().max(1.0),
                "losses {:?} {:?}",
                cpu.0,
                gpu.0
            );
        }
        assert!(
            (cpu.1 - gpu.1).abs() < 1e-2,
            "validation {} {}",
            cpu.1,
            gpu.1
        );
    }
}

#[test]
fn windows_are_consecutive_and_shifted_by_one() {
    let w = windows();
    let bytes = text_bytes();
    assert_eq!(w.len(), (bytes.len() - 1) / CONTEXT);
    let (inputs, targets) = w.batch(&[2, 0]);
    let expect = |at: usize| bytes[at..at + CONTEXT].iter().map(|&b| b as u32);
    assert!(inputs[..CONTEXT].iter().copied().eq(expect(16)));
    assert!(inputs[CONTEXT..].iter().copied().eq(expect(0)));
    assert!(targets[..CONTEXT].iter().copied().eq(expect(17)));
    assert!(TextWindows::new(vec![1; CONTEXT], CONTEXT).is_err());
    assert!(TextWindows::new(vec![1; 20], 0).is_err());
}

#[test]
fn the_split_gpt_starts_as_the_tied_model_and_trains_like_the_unsplit_one() {
    // At initialisation the untied head is a copy of the token embedding, so the stages
    // compute the logits of the tied GPT, bit for bit.
    let p = pipeline(config(Variant::Uncompressed, "f32", 3));
    let (inputs, _) = windows().batch(&[0, 5, 9]);
    let ids = Tensor::from_u32(&Device::Cpu, &[3, CONTEXT], inputs).unwrap();
    let g = Graph::new(&Device::Cpu);
    let split = g.value(p.logits(&g, &ids).unwrap()).to_vec().unwrap();
    let whole = Gpt::new(&Device::Cpu, &gpt(), 4).unwrap();
    let g = Graph::new(&Device::Cpu);
    let tied = g.value(whole.forward(&g, &ids, None).unwrap());
    assert_eq!(tied.shape(), [3, CONTEXT, 256]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&split), bits(&tied.to_vec().unwrap()));

    // Without compression the cuts change nothing: three stages give the bits of one.
    let run = |stages| {
        let mut p = pipeline(config(Variant::Uncompressed, "f32", stages));
        let losses: Vec<f32> = (0..6).map(|_| p.step().unwrap().loss).collect();
        (losses, p.weight_bits())
    };
    let (one, three) = (run(1), run(3));
    assert_eq!(one, three);
    assert!(one.0[5] < one.0[0], "the loss falls: {:?}", one.0);
}

#[test]
fn compressed_gpt_cuts_keep_both_ends_equal_and_the_model_learns() {
    let mut p = pipeline(config(Variant::Fc, "topk:0.4", 3));
    let before = p.text_loss(&windows(), 64, 16).unwrap();
    let width = CONTEXT * 16;
    let f32_bytes = 2 * 2 * 4 * 4 * width;
    for step in 0..120 {
        let r = p.step().unwrap();
        assert!(
            r.bytes > 0 && r.bytes < f32_bytes,
            "step {step}: {} bytes",
            r.bytes
        );
        for e in 0..2 {
            assert_eq!(
                p.stages()[e].buffers_after(),
                p.stages()[e + 1].buffers_before(),
                "cut {e} after step {step}"
            );
        }
    }
    let after = p.text_loss(&windows(), 64, 16).unwrap();
    // Uniform bytes cost ln 256 = 5.55 nats; the repeated sentence is far more predictable.
    assert!(before > 5.0 && after < before - 2.0, "{before} -> {after}");
}

#[test]
fn models_and_data_that_do_not_fit_are_refused_with_a_reason() {
    let images = ImageSet {
        images: vec![0; 4 * 8],
        labels: vec![0; 4],
        rows: 2,
        cols: 4,
        classes: 2,
    };
    let data: Arc<PipelineData> = Arc::new(images.into());
    let err = Pipeline::new(config(Variant::Fc, "topk:0.4", 3), &Device::Cpu, data)
        .err()
        .unwrap();
    assert!(err.to_string().contains("do not fit"), "{err}");
    let short = TextWindows::new(text_bytes(), CONTEXT + 1).unwrap();
    let p = pipeline(config(Variant::Fc, "topk:0.4", 3));
    assert!(p.text_loss(&short, 4, 4).is_err());
    let wrong: Arc<PipelineData> = Arc::new(short.into());
    assert!(Pipeline::new(config(Variant::Fc, "topk:0.4", 3), &Device::Cpu, wrong).is_err());
    let mut too_deep = config(Variant::Fc, "topk:0.4", 4);
    assert!(too_deep.check().is_err(), "four stages for three blocks");
    too_deep.stages = 3;
    if let ModelSpec::Gpt(c) = &mut too_deep.model {
        c.dropout = 0.1;
    }
    assert!(too_deep.check().is_err(), "dropout");
}
