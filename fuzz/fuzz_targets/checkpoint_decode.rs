//! Checkpoint files, and the data-parallel snapshots that peers send, are untrusted: parsing
//! any bytes as a murmur checkpoint and building the model its metadata describes must give an
//! error or a model, never a panic, and never allocate a model larger than the tensors the
//! bytes hold. A snapshot of outer rounds (local steps) is split into the replica's
//! checkpoint and the outer loop's state the same way: an error or both parts, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_engine::nn::Module;
use murmur_engine::train::{Classifier, LanguageModel, OuterRounds, Saved};
use murmur_engine::Device;

fuzz_target!(|data: &[u8]| {
    if let Ok((replica, _)) = OuterRounds::split(data) {
        // Half-precision tensors come back as f32: at most twice the bytes, plus the header.
        assert!(replica.len() <= 2 * data.len() + 4096, "a replica part past its snapshot");
    }
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
