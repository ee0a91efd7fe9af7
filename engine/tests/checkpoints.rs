//! Checkpoints through the safetensors crate: parameters under their module names, optimizer
//! state named after its parameter, the run described in JSON metadata, weights alone in
//! f16 or bf16, models rebuilt from a file, and refusals (old format, another run, sizes
//! that disagree with the tensors, damaged bytes). Everything here runs on the CPU device with
//! tiny models; resuming bit for bit on the GPU is in models_training.rs.

use std::collections::{BTreeMap, BTreeSet};

use murmur_engine::checkpoint::{self, Precision};
use murmur_engine::compress::support::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use murmur_engine::nn::{Activation, Cnn, CnnConfig, Gpt, GptConfig, Mlp, Module};
use murmur_engine::train::{
    Classifier, ClassifierConfig, LanguageModel, LmConfig, Saved, WarmupCosine, FORMAT,
};
use murmur_engine::{Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

const CPU: Device = Device::Cpu;

fn mlp_config() -> ClassifierConfig {
    ClassifierConfig {
        hidden: vec![6, 5],
        seed: 2,
        ..ClassifierConfig::default()
    }
}

fn cnn_config() -> ClassifierConfig {
    ClassifierConfig {
        cnn: Some(CnnConfig {
            conv1: 2,
            conv2: 4,
            hidden: 8,
            ..CnnConfig::default()
        }),
        optimizer: "sgd".parse().unwrap(),
        seed: 3,
        ..ClassifierConfig::default()
    }
}

fn gpt_config() -> LmConfig {
    LmConfig {
        model: GptConfig {
            context: 8,
            layers: 2,
            dim: 8,
            heads: 2,
            ..GptConfig::default()
        },
        batch: 2,
        schedule: WarmupCosine {
            peak: 3e-3,
            warmup: 1,
            total: 10,
            min_ratio: 0.1,
        },
        ..LmConfig::new(10)
    }
}

/// A classifier of `inputs` features and 3 classes after `steps` steps on fixed data.
fn trained(config: &ClassifierConfig, inputs: usize, steps: usize) -> Classifier {
    let mut clf = Classifier::new(&CPU, inputs, 3, config).unwrap();
    clf.data = serde_json::json!({"dataset": "test", "batch": 4});
    let x: Vec<f32> = (0..4 * inputs).map(|i| (i % 7) as f32 / 7.0).collect();
    for _ in 0..steps {
        clf.step(&x, &[0, 1, 2, 1]).unwrap();
    }
    clf
}

fn trained_gpt(steps: usize) -> LanguageModel {
    let mut lm = LanguageModel::new(&CPU, &gpt_config()).unwrap();
    let text = b"to be or not to be, that is the question".repeat(3);
    for _ in 0..steps {
        lm.step(&text).unwrap();
    }
    lm
}

/// The raw pointers of a module's parameters, by both listings.
fn addresses(m: &mut dyn Module) -> (Vec<*const Tensor>, Vec<*const Tensor>) {
    let named = m
        .named_parameters()
        .into_iter()
        .map(|(_, t)| t as *const Tensor)
        .collect();
    let mutable = m
        .parameters_mut()
        .into_iter()
        .map(|t| &*t as *const Tensor)
        .collect();
    (named, mutable)
}

#[test]
fn parameter_names_follow_the_module_tree_in_parameter_order() {
    let cnn_sizes = CnnConfig {
        conv1: 2,
        conv2: 4,
        hidden: 8,
        ..CnnConfig::default()
    };
    let mut models: Vec<(Box<dyn Module>, Option<usize>)> = vec![
        (
            Box::new(Mlp::new(&CPU, &[5, 4, 3], Activation::Relu, 0).unwrap()),
            Mlp::parameter_count_for(&[5, 4, 3]),
        ),
        (
            Box::new(Cnn::new(&CPU, &cnn_sizes, 0).unwrap()),
            cnn_sizes.parameter_count(),
        ),
        (
            Box::new(Gpt::new(&CPU, &gpt_config().model, 0).unwrap()),
            gpt_config().model.parameter_count(),
        ),
    ];
    for (m, counted) in &mut models {
        let names = m.parameter_names();
        let unique: BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(names.len(), m.parameters().len());
        // parameters_mut is written apart from named_parameters: it must list the same
        // tensors in the same order, or a checkpoint would load weights into the wrong place.
        let (named, mutable) = addresses(m.as_mut());
        assert_eq!(named, mutable, "{names:?}");
        // The counts that guard building a model from a file's metadata.
        assert_eq!(*counted, Some(m.parameter_count()), "{names:?}");
    }
    assert_eq!(
        models[0].0.parameter_names(),
        [
            "layers.0.weight",
            "layers.0.bias",
            "layers.1.weight",
            "layers.1.bias"
        ]
    );
    assert_eq!(
        models[1].0.parameter_names(),
        [
            "conv1.weight",
            "conv1.bias",
            "conv2.weight",
            "conv2.bias",
            "norm.gamma",
            "norm.beta",
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias"
        ]
    );
    let gpt = models[2].0.parameter_names();
    assert_eq!(gpt.len(), 2 + 2 * 16 + 2);
    assert_eq!(
        gpt[..6],
        [
            "token_embedding",
            "position_embedding",
            "blocks.0.ln1.gamma",
            "blocks.0.ln1.beta",
            "blocks.0.attn.query.weight",
            "blocks.0.attn.query.bias"
        ]
    );
    assert_eq!(gpt[2 + 16 + 15], "blocks.1.fc_proj.bias");
    assert_eq!(gpt[gpt.len() - 2..], ["ln_f.gamma", "ln_f.beta"]);
    // The counts refuse sizes whose product overflows instead of wrapping.
    let huge = GptConfig {
        dim: 1 << 40,
        ..GptConfig::default()
    };
    assert_eq!(huge.parameter_count(), None);
}

/// Tensors as the crate lists them: name, then dtype and shape.
type RawTensors = BTreeMap<String, (Dtype, Vec<usize>)>;

/// What the crate itself reads from `bytes`: the tensors and the metadata.
fn read_raw(bytes: &[u8]) -> (RawTensors, BTreeMap<String, String>) {
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let st = SafeTensors::deserialize(bytes).unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec())))
        .collect();
    (
        tensors,
        meta.metadata().clone().unwrap().into_iter().collect(),
    )
}

/// Checks a training checkpoint of `m` as the crate reads it: every parameter under its
/// name with its shape, the optimizer's state `kinds` under each name, f32 throughout.
fn check_training_file(bytes: &[u8], m: &dyn Module, model: &str, kinds: &[&str]) -> Value {
    let (tensors, meta) = read_raw(bytes);
    let mut want = BTreeMap::new();
    for (name, t) in m.named_parameters() {
        for prefix in
            std::iter::once(String::new()).chain(kinds.iter().map(|k| format!("optim.{k}.")))
        {
            want.insert(format!("{prefix}{name}"), (Dtype::F32, t.shape().to_vec()));
        }
    }
    assert_eq!(tensors, want);
    assert_eq!(meta["format"], FORMAT);
    assert_eq!(meta["model"], model);
    assert_eq!(meta["contents"], "training");
    serde_json::from_str(&meta["run"]).unwrap()
}

#[test]
fn classifier_checkpoints_round_trip_with_named_tensors() {
    for (config, inputs, model, kinds) in [
        (mlp_config(), 7, "mlp", &["m", "v"][..]),
        (cnn_config(), 64, "cnn", &["momentum"][..]),
    ] {
        let clf = trained(&config, inputs, 2);
        let bytes = clf.save_state().unwrap();
        let run = check_training_file(&bytes, &clf.model, model, kinds);
        assert_eq!(run["inputs"], inputs);
        assert_eq!(run["classes"], 3);
        assert_eq!(run["config"]["seed"], config.seed);
        assert_eq!(run["data"]["dataset"], "test");
        let (_, meta) = read_raw(&bytes);
        assert_eq!(
            (meta["steps"].as_str(), meta["optimizer_steps"].as_str()),
            ("2", "2")
        );
        // Rebuilt from the file alone: the same model, optimizer and data description,
        // written back to the same bytes.
        let back = Classifier::from_saved(Saved::from_bytes(&bytes, &CPU).unwrap()).unwrap();
        assert_eq!(
            back.parameter_bits().unwrap(),
            clf.parameter_bits().unwrap()
        );
        assert_eq!(
            (back.steps, &back.data, &back.config),
            (2, &clf.data, &clf.config)
        );
        assert!(
            back.save_state().unwrap() == bytes,
            "{model}: rewritten bytes differ"
        );
    }
}

#[test]
fn gpt_checkpoints_round_trip_with_named_tensors() {
    let lm = trained_gpt(2);
    let bytes = lm.save_state().unwrap();
    let run = check_training_file(&bytes, &lm.model, "gpt", &["m", "v"]);
    assert_eq!(run["config"]["model"]["layers"], 2);
    assert_eq!(run["config"]["batch"], 2);
    let back = LanguageModel::from_saved(Saved::from_bytes(&bytes, &CPU).unwrap()).unwrap();
    assert_eq!(back.config, lm.config);
    assert_eq!(back.steps, 2);
    assert_eq!(
        back.model.parameter_bits().unwrap(),
        lm.model.parameter_bits().unwrap()
    );
    assert!(back.save_state().unwrap() == bytes);
    // A classifier is not built from it.
    let err = Classifier::from_saved(Saved::from_bytes(&bytes, &CPU).unwrap())
        .err()
        .unwrap();
    assert!(err.to_string().contains("gpt"), "{err}");
}

#[test]
fn weights_alone_in_half_precision_round_as_the_engine_converts() {
    let clf = trained(&mlp_config(), 7, 3);
    let lm = trained_gpt(1);
    type Conversion = Option<(fn(f32) -> u16, fn(u16) -> f32)>;
    let cases: [(Precision, Dtype, Conversion); 3] = [
        (Precision::F32, Dtype::F32, None),
        (Precision::F16, Dtype::F16, Some((f32_to_f16, f16_to_f32))),
        (
            Precision::Bf16,
            Dtype::BF16,
            Some((f32_to_bf16, bf16_to_f32)),
        ),
    ];
    for (precision, dtype, conversion) in cases {
        // What the engine's own conversion makes of each f32 weight.
        let round = |bits: Vec<u32>| -> Vec<u32> {
            match conversion {
                None => bits,
                Some((to, from)) => bits
                    .into_iter()
                    .map(|b| from(to(f32::from_bits(b))).to_bits())
                    .collect(),
            }
        };
        // Classifier: no optimizer state in the file, each weight as the engine rounds it.
        let bytes = clf.save_weights(precision).unwrap();
        let (tensors, meta) = read_raw(&bytes);
        assert_eq!(meta["contents"], "weights");
        assert!(!meta.contains_key("optimizer_steps"));
        assert_eq!(tensors.len(), clf.model.parameters().len());
        assert!(tensors.values().all(|(d, _)| *d == dtype), "{precision}");
        let back = Classifier::from_saved(Saved::from_bytes(&bytes, &CPU).unwrap()).unwrap();
        assert_eq!(
            back.parameter_bits().unwrap(),
            round(clf.parameter_bits().unwrap()),
            "{precision}"
        );
        assert_eq!(back.steps, 3);
        // Weights alone cannot be resumed from: the optimizer's state is missing.
        let mut fresh = Classifier::new(&CPU, 7, 3, &mlp_config()).unwrap();
        fresh.data = clf.data.clone();
        let err = fresh.load_state(&bytes).unwrap_err().to_string();
        assert!(err.contains("weights alone"), "{err}");
        // The GPT likewise.
        let bytes = lm.save_weights(precision).unwrap();
        let back = LanguageModel::from_saved(Saved::from_bytes(&bytes, &CPU).unwrap()).unwrap();
        assert_eq!(
            back.model.parameter_bits().unwrap(),
            round(lm.model.parameter_bits().unwrap()),
            "{precision}"
        );
    }
    // The f16 file is half the f32 one's data.
    let (full, half) = (
        clf.save_weights(Precision::F32).unwrap().len(),
        clf.save_weights(Precision::F16).unwrap().len(),
    );
    let data = 2 * clf.model.parameter_count();
    assert!(
        full - half >= data - 8 && full - half <= data + 8,
        "{full} {half}"
    );
}

#[test]
fn resuming_refuses_another_run_and_names_the_difference() {
    let clf = trained(&mlp_config(), 7, 1);
    let bytes = clf.save_state().unwrap();
    let refusals = [
        (
            ClassifierConfig {
                lr: 2e-3,
                ..mlp_config()
            },
            None,
            "config.lr is 0.001 in the checkpoint, 0.002 in this run",
        ),
        (
            ClassifierConfig {
                seed: 9,
                ..mlp_config()
            },
            None,
            "config.seed",
        ),
        (
            mlp_config(),
            Some(serde_json::json!({"dataset": "test", "batch": 8})),
            "data.batch is 4",
        ),
        (cnn_config(), None, "model is mlp, not cnn"),
    ];
    for (config, data, want) in refusals {
        let inputs = if config.cnn.is_some() { 64 } else { 7 };
        let mut other = Classifier::new(&CPU, inputs, 3, &config).unwrap();
        other.data = data.unwrap_or_else(|| clf.data.clone());
        let before = other.parameter_bits().unwrap();
        let err = other.load_state(&bytes).unwrap_err().to_string();
        assert!(err.contains(want), "wanted {want:?} in: {err}");
        assert_eq!(
            other.parameter_bits().unwrap(),
            before,
            "changed on refusal"
        );
        assert_eq!(other.steps, 0);
    }
}

#[test]
fn an_old_format_checkpoint_gets_a_clear_error() {
    // Written by murmur's hand-made writer before tensors had names (param.0, ...).
    let old = include_bytes!("fixtures/murmur-0.1-mlp.safetensors");
    let err = Saved::from_bytes(old, &CPU).err().unwrap().to_string();
    assert!(
        err.contains("older murmur")
            && err.contains("murmur-classifier-1")
            && err.contains("murmur train --save"),
        "{err}"
    );
    // The same on the resume path (the fixture's run would otherwise match this one).
    let mut clf = Classifier::new(
        &CPU,
        4,
        2,
        &ClassifierConfig {
            hidden: vec![3],
            seed: 7,
            ..ClassifierConfig::default()
        },
    )
    .unwrap();
    let err = clf.load_state(old).unwrap_err().to_string();
    assert!(err.contains("older murmur"), "{err}");
    // A safetensors file of another tool (no format tag) is named as such.
    let foreign = checkpoint::to_bytes(
        &[("w".into(), Tensor::scalar(&CPU, 1.0).unwrap())],
        &BTreeMap::new(),
        Precision::F32,
    )
    .unwrap();
    let err = Saved::from_bytes(&foreign, &CPU).err().unwrap().to_string();
    assert!(err.contains("not a murmur checkpoint"), "{err}");
}

/// `bytes` with the metadata entry `run` edited by `edit`.
fn with_run(bytes: &[u8], edit: impl Fn(&mut Value)) -> Vec<u8> {
    let (tensors, mut meta) = checkpoint::from_bytes(bytes, &CPU).unwrap();
    let mut run: Value = serde_json::from_str(&meta["run"]).unwrap();
    edit(&mut run);
    meta.insert("run".into(), run.to_string());
    checkpoint::to_bytes(&tensors, &meta, Precision::F32).unwrap()
}

#[test]
fn sizes_in_the_metadata_must_match_the_tensors_before_a_model_is_built() {
    // Sizes that would allocate terabytes if believed: refused from the tensors' count
    // (an attempt to allocate would abort the test).
    let clf = trained(&mlp_config(), 7, 1)
        .save_weights(Precision::F32)
        .unwrap();
    let lm = trained_gpt(0).save_weights(Precision::F32).unwrap();
    type Edit = fn(&mut Value);
    let edits: [(&[u8], Edit); 4] = [
        (&clf, |r| {
            r["config"]["hidden"] = serde_json::json!([1u64 << 40])
        }),
        (&clf, |r| r["inputs"] = serde_json::json!(1u64 << 62)),
        (&lm, |r| {
            r["config"]["model"]["context"] = serde_json::json!(1u64 << 40)
        }),
        (&lm, |r| {
            r["config"]["model"]["layers"] = serde_json::json!(3)
        }),
    ];
    for (bytes, edit) in edits {
        let edited = with_run(bytes, edit);
        let saved = Saved::from_bytes(&edited, &CPU).unwrap();
        let err = if saved.model == "gpt" {
            LanguageModel::from_saved(saved).err().unwrap()
        } else {
            Classifier::from_saved(saved).err().unwrap()
        };
        assert!(err.to_string().contains("parameters"), "{err}");
    }
    // A run description that is not the model's.
    let edited = with_run(&lm, |r| r["config"] = serde_json::json!("nonsense"));
    let err = LanguageModel::from_saved(Saved::from_bytes(&edited, &CPU).unwrap())
        .err()
        .unwrap();
    assert!(err.to_string().contains("run description"), "{err}");
}

#[test]
fn damaged_training_checkpoints_are_errors_not_panics() {
    let clf = trained(&mlp_config(), 7, 1);
    let bytes = clf.save_state().unwrap();
    let mut fresh = Classifier::new(&CPU, 7, 3, &mlp_config()).unwrap();
    fresh.data = clf.data.clone();
    for cut in (0..bytes.len()).step_by(7) {
        assert!(fresh.load_state(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    // Flipped bytes anywhere: refused or loaded, never a panic.
    for i in (0..bytes.len()).step_by(3) {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0xA5;
        let _ = fresh.load_state(&flipped);
        let _ = Saved::from_bytes(&flipped, &CPU).and_then(Classifier::from_saved);
    }
    fresh.load_state(&bytes).unwrap();
    assert_eq!(
        fresh.parameter_bits().unwrap(),
        clf.parameter_bits().unwrap()
    );
}
