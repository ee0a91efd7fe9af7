//! A trained model read from a checkpoint file (`murmur train --save`, `murmur export`): what
//! `export`, `eval` and `sample` start from. The file's metadata names the model and its
//! sizes, so these commands take no model flags.

use std::path::Path;

use anyhow::Context;
use murmur_engine::checkpoint::Precision;
use murmur_engine::nn::Module;
use murmur_engine::train::{Classifier, LanguageModel, Saved};
use murmur_engine::Device;

/// The model a checkpoint holds (boxed: the two differ in size by hundreds of bytes).
pub enum Model {
    /// An image classifier (mlp or cnn).
    Classifier(Box<Classifier>),
    /// A byte-level GPT.
    Gpt(Box<LanguageModel>),
}

/// A model read from a file, and whether the file could resume its training.
pub struct ModelFile {
    pub model: Model,
    /// Whether the file held the optimizer's state too (a `--save` checkpoint), not weights
    /// alone.
    pub training_state: bool,
}

/// Reads the model in `path` onto `device`.
pub fn read(path: &Path, device: &Device) -> anyhow::Result<ModelFile> {
    let what = || format!("reading {}", path.display());
    let bytes = std::fs::read(path).with_context(what)?;
    let saved = Saved::from_bytes(&bytes, device).with_context(what)?;
    let training_state = saved.is_training_state();
    let model = if saved.model == "gpt" {
        Model::Gpt(Box::new(
            LanguageModel::from_saved(saved).with_context(what)?,
        ))
    } else {
        Model::Classifier(Box::new(Classifier::from_saved(saved).with_context(what)?))
    };
    Ok(ModelFile {
        model,
        training_state,
    })
}

impl Model {
    /// `mlp`, `cnn` or `gpt`.
    pub fn kind(&self) -> &'static str {
        match self {
            Model::Classifier(c) => c.model.name(),
            Model::Gpt(_) => "gpt",
        }
    }

    /// Trainable scalars.
    pub fn parameter_count(&self) -> usize {
        match self {
            Model::Classifier(c) => c.model.parameter_count(),
            Model::Gpt(lm) => lm.model.parameter_count(),
        }
    }

    /// Training steps the model has taken.
    pub fn steps(&self) -> u64 {
        match self {
            Model::Classifier(c) => c.steps,
            Model::Gpt(lm) => lm.steps,
        }
    }

    /// The weights alone in `precision`, with what rebuilds the model.
    pub fn save_weights(&self, precision: Precision) -> murmur_engine::Result<Vec<u8>> {
        match self {
            Model::Classifier(c) => c.save_weights(precision),
            Model::Gpt(lm) => lm.save_weights(precision),
        }
    }

    /// Weights and optimizer state (f32), to resume from.
    pub fn save_state(&self) -> murmur_engine::Result<Vec<u8>> {
        match self {
            Model::Classifier(c) => c.save_state(),
            Model::Gpt(lm) => lm.save_state(),
        }
    }
}
