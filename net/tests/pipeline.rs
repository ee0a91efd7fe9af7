//! Pipeline stages as peers: each stage in its own thread, linked to its neighbours over
//! loopback QUIC, gives the bits of the in-process pipeline after every step (Clapping-FC and
//! -FU with stochastic and sparse codecs, and AQ-SGD); a stray frame costs the link, not a
//! panic.

use std::sync::Arc;
use std::thread;

use murmur_engine::algo::OptimizerSpec;
use murmur_engine::comm::stage::{Direction, StageLink, StageMessage};
use murmur_engine::data::ImageSet;
use murmur_engine::nn::GptConfig;
use murmur_engine::pipeline::{
    ModelSpec, PSchedule, Pipeline, PipelineConfig, PipelineData, Rule, Stage, TextWindows, Variant,
};
use murmur_engine::Device;
use murmur_net::identity::{Role, Swarm};
use murmur_net::stage::{connect_stage, QuicStageLink, StageListener, StageOptions};

const STEPS: usize = 8;

/// Builds a case's training data (each side of a comparison gets its own copy).
type DataFn = fn() -> Arc<PipelineData>;

/// 4x4 images of 3 classes: pixels whose index is the label mod 4 are bright.
fn data() -> Arc<PipelineData> {
    let mut rng = murmur_engine::rng::Rng::new(11, 0);
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    for _ in 0..120 {
        let label = rng.below(3);
        for px in 0..16 {
            let bright = if px % 4 == label { 200 } else { 0 };
            images.push((bright + rng.below(50)) as u8);
        }
        labels.push(label as u8);
    }
    Arc::new(
        ImageSet {
            images,
            labels,
            rows: 4,
            cols: 4,
            classes: 3,
        }
        .into(),
    )
}

/// A phrase repeated with seeded letter changes, as windows of 8 bytes.
fn text() -> Arc<PipelineData> {
    let mut rng = murmur_engine::rng::Rng::new(12, 0);
    let bytes: Vec<u8> = b"pipelines pass activations along. "
        .iter()
        .cycle()
        .take(700)
        .map(|&b| {
            if rng.below(10) == 0 {
                b'a' + rng.below(26) as u8
            } else {
                b
            }
        })
        .collect();
    Arc::new(TextWindows::new(bytes, 8).unwrap().into())
}

/// A GPT of three blocks, one per stage.
fn gpt_config(variant: Variant, codec: &str) -> PipelineConfig {
    PipelineConfig {
        model: ModelSpec::Gpt(GptConfig {
            vocab: 256,
            context: 8,
            layers: 3,
            dim: 16,
            heads: 2,
            dropout: 0.0,
        }),
        batch: 4,
        lr: 0.003,
        ..config(variant, codec)
    }
}

fn config(variant: Variant, codec: &str) -> PipelineConfig {
    PipelineConfig {
        model: ModelSpec::Mlp(vec![16, 12, 10, 8, 3]),
        stages: 3,
        batch: 5,
        variant,
        forward_codec: codec.into(),
        backward_codec: codec.into(),
        p: PSchedule::Constant(0.5),
        rule: Rule::Sample,
        warmup: 0,
        optimizer: OptimizerSpec::ADAMW,
        lr: 0.01,
        weight_decay: 0.01,
        lr_drop_at: None,
        seed: 8,
    }
}

/// Every stage's weights after each step, stages in order.
fn over_quic(config: PipelineConfig, data: DataFn) -> Vec<Vec<Vec<u32>>> {
    let swarm = Swarm::generate("pipeline").unwrap();
    let config = Arc::new(config);
    let stages = config.stages;
    // Stage e listens for e+1 on a port of its own; e+1 connects.
    let listeners: Vec<StageListener> = (0..stages - 1)
        .map(|e| {
            let creds = swarm
                .credentials(&format!("stage-{e}"), Role::Stage)
                .unwrap();
            StageListener::bind(
                "127.0.0.1:0".parse().unwrap(),
                &creds,
                e,
                StageOptions::default(),
            )
            .unwrap()
        })
        .collect();
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut listeners: Vec<Option<StageListener>> = listeners.into_iter().map(Some).collect();
    let handles: Vec<_> = (0..stages)
        .map(|e| {
            let listener = if e + 1 < stages {
                listeners[e].take()
            } else {
                None
            };
            let prev_addr = (e > 0).then(|| addrs[e - 1]);
            let creds = swarm
                .credentials(&format!("stage-{e}"), Role::Stage)
                .unwrap();
            let config = config.clone();
            thread::spawn(move || {
                let prev = prev_addr.map(|a| {
                    Box::new(connect_stage(a, &creds, e, StageOptions::default()).unwrap())
                        as Box<dyn StageLink>
                });
                let next = listener.map(|l| Box::new(l.accept().unwrap()) as Box<dyn StageLink>);
                let mut stage = Stage::new(e, config, &Device::Cpu, data(), prev, next).unwrap();
                (0..STEPS)
                    .map(|_| {
                        stage.step().unwrap();
                        stage.weight_bits()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let per_stage: Vec<Vec<Vec<u32>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (0..STEPS)
        .map(|t| per_stage.iter().map(|s| s[t].clone()).collect())
        .collect()
}

fn in_process(config: PipelineConfig, data: DataFn) -> Vec<Vec<Vec<u32>>> {
    let mut p = Pipeline::new(config, &Device::Cpu, data()).unwrap();
    (0..STEPS)
        .map(|_| {
            p.step().unwrap();
            p.stages().iter().map(|s| s.weight_bits()).collect()
        })
        .collect()
}

#[test]
fn stages_over_quic_give_the_bits_of_the_in_process_pipeline() {
    let cases: [(PipelineConfig, DataFn); 4] = [
        (config(Variant::Fc, "natural"), data),
        (config(Variant::Fu, "topk:0.3"), data),
        (config(Variant::AqSgd, "qsgd:bits=4"), data),
        (gpt_config(Variant::Fc, "topk:0.4"), text),
    ];
    for (config, data) in cases {
        let name = format!(
            "{} {} on {}",
            config.variant, config.forward_codec, config.model
        );
        let quic = over_quic(config.clone(), data);
        let local = in_process(config, data);
        assert_eq!(quic.len(), STEPS);
        for t in 0..STEPS {
            assert_eq!(quic[t], local[t], "{name}: step {t}");
        }
        assert_ne!(local[0], local[STEPS - 1], "{name}: the weights moved");
    }
}

#[test]
fn a_frame_from_the_wrong_stage_is_refused_without_a_panic() {
    let swarm = Swarm::generate("pipeline-bad").unwrap();
    let creds = swarm.credentials("stage-0", Role::Stage).unwrap();
    let listener = StageListener::bind(
        "127.0.0.1:0".parse().unwrap(),
        &creds,
        0,
        StageOptions::default(),
    )
    .unwrap();
    let addr = listener.local_addr().unwrap();
    let intruder = thread::spawn(move || {
        // Claims to be stage 2 while connecting where stage 1 belongs.
        let creds = swarm.credentials("stage-2", Role::Stage).unwrap();
        let mut link: QuicStageLink =
            connect_stage(addr, &creds, 2, StageOptions::default()).unwrap();
        link.send(StageMessage {
            step: 0,
            direction: Direction::Backward,
            payload: vec![1, 2, 3],
        })
        .unwrap();
        // Waits for the listener's verdict: the link closes.
        assert!(link.recv().is_err());
    });
    let mut link = listener.accept().unwrap();
    let got = link.recv();
    assert!(got.is_err(), "{got:?}");
    intruder.join().unwrap();
}
