//! Checkpoint files, and the data-parallel snapshots that peers send, are untrusted: parsing
//! any bytes as a murmur checkpoint and building the model its metadata describes must give an
//! error or a model, never a panic, and never allocate a model larger than the tensors the
//! bytes hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_engine::nn::Module;
use murmur_engine::train::{Classifier, LanguageModel, Saved};
use murmur_engine::Device;

fuzz_target!(|data: &[u8]| {
    let Ok(saved) = Saved::from_bytes(data, &Device::Cpu) else {
        return;
    };
    let count = if saved.model == "gpt" {
        LanguageModel::from_saved(saved).map(|lm| lm.model.parameter_count())
    } else {
        Classifier::from_saved(saved).map(|c| c.model.parameter_count())
    };
    if let Ok(count) = count {
        assert!(count * 2 <= data.len(), "a model larger than its file");
    }
});
