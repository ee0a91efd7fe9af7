//! LoCo's scale, calibrated where the job leaves it open: the codec's own default (2^19) suits
//! no real gradient (loco.md §7.5), so a `loco` codec without `log2s` is calibrated the way
//! `murmur repro loco` does it, from the gradient of the initial model on the job's first
//! global batch.
//!
//! Every worker computes the same scale without talking to the others: the initial model and
//! the first global batch follow from the job's seed, and the gradient is taken on the CPU,
//! whose bits are the same on every machine. The scale then sits in the codec spec of every key
//! a worker registers, and the servers refuse a worker whose keys differ, so no two workers can
//! ever quantize at different scales (the integer sum of their codes stays exact).
//!
//! A job may ask for recalibration every few epochs (`loco_recalibrate_every`): gradients
//! shrink as training goes on, and a scale fitted to the first batch then leaves most codes
//! near zero. At the epoch's first round every worker applies the same rule to the gradient of
//! the epoch's first global batch at the current model and moves to the new scale before
//! pushing; the codecs carry their scale in every payload, so the servers follow the pushes
//! and a worker that missed the move (catching up) learns it from the replies.

use murmur_engine::algo::calibrate::{
    loco_log2s, scale_left_to_calibration, with_calibrated_scale,
};
use murmur_engine::compress::CodecSpec;
use murmur_engine::data::epoch_batches;
use murmur_engine::train::Classifier;
use murmur_engine::Device;

use crate::data::Sets;
use crate::error::Result;
use crate::job::Job;

/// `job` with LoCo's scale filled in wherever it leaves it to calibration (the push codec, the
/// reply codec, and the LoCo memories that go with them), and its LoCo codecs made rescalable
/// where it asks for recalibration; unchanged otherwise.
pub(crate) fn calibrate_loco(job: Job, sets: &Sets, world: usize, total_steps: u64) -> Result<Job> {
    let log2s = match loco_bits_left_to_calibration(&job) {
        None => None,
        Some(bits) => {
            let log2s = first_batch_log2s(&job, sets, world, total_steps, bits)?;
            tracing::info!("LoCo's scale calibrated from the first global batch: s = 2^{log2s}");
            Some(log2s)
        }
    };
    Ok(with_loco_scale(job, log2s))
}

/// The bits of the LoCo codec whose scale the job leaves to calibration (its push codec's,
/// else its reply codec's), if it leaves one.
pub(crate) fn loco_bits_left_to_calibration(job: &Job) -> Option<u32> {
    let pull = job.pull_codec.as_deref().unwrap_or(&job.codec);
    scale_left_to_calibration(&job.codec).or_else(|| scale_left_to_calibration(pull))
}

/// `job` as its workers run it once LoCo's scale is `log2s` (`None`: the job leaves no scale
/// to calibration): the scale named in the push codec, the reply codec and the LoCo memories
/// that go with them, and its LoCo codecs made rescalable where it asks for recalibration.
/// What the servers hold registrations to ([`crate::layout`]), and what workers train with.
pub(crate) fn with_loco_scale(job: Job, log2s: Option<i32>) -> Job {
    let pull = job.pull_codec.clone().unwrap_or_else(|| job.codec.clone());
    let job = match log2s {
        None => job,
        Some(log2s) => {
            let (codec, memory) = with_calibrated_scale(&job.codec, &job.memory, log2s);
            let (pull_codec, server_memory) =
                with_calibrated_scale(&pull, &job.server_memory, log2s);
            Job {
                pull_codec: job.pull_codec.is_some().then_some(pull_codec),
                codec,
                memory,
                server_memory,
                ..job
            }
        }
    };
    if job.loco_recalibrate_every.is_some() {
        // Payloads that carry their scale, so that the scale can move mid-job.
        let rescalable = |spec: &str| match spec.parse() {
            Ok(CodecSpec::Loco { bits, log2s, .. }) => CodecSpec::Loco {
                bits,
                log2s,
                rescalable: true,
            }
            .to_string(),
            _ => spec.to_string(),
        };
        Job {
            codec: rescalable(&job.codec),
            pull_codec: job.pull_codec.as_deref().map(rescalable),
            ..job
        }
    } else {
        job
    }
}

/// The bits of the job's LoCo push codes, where it recalibrates LoCo's scale.
pub(crate) fn recalibrated_bits(job: &Job) -> Option<u32> {
    job.loco_recalibrate_every?;
    match job.codec.parse().ok()? {
        CodecSpec::Loco { bits, .. } => Some(bits),
        _ => None,
    }
}

/// `log2 s` that puts the 99.9th percentile of the initial gradient's magnitudes at the top
/// code of `bits`-bit LoCo, on the job's first global batch.
fn first_batch_log2s(
    job: &Job,
    sets: &Sets,
    world: usize,
    total_steps: u64,
    bits: u32,
) -> Result<i32> {
    let train = &sets.train;
    let clf = Classifier::new(
        &Device::Cpu,
        train.features(),
        train.classes,
        &job.classifier_config(total_steps)?,
    )?;
    let batches = epoch_batches(train.len(), job.batch * world, job.seed, 0);
    let first = batches.first().ok_or_else(|| {
        murmur_engine::Error::Config("calibrating LoCo's scale: no training batch".into())
    })?;
    batch_log2s(&clf, sets, first, bits)
}

/// `log2 s` by the calibration's rule (the 99.9th percentile of the gradient's magnitudes at
/// the top code of `bits`-bit LoCo), from the gradient of `clf` as it stands on the global
/// batch `batch`. Every worker computes the same: the replicas and the batch are the same, and
/// the gradient's bits are the same on every device.
pub(crate) fn batch_log2s(
    clf: &Classifier,
    sets: &Sets,
    batch: &[usize],
    bits: u32,
) -> Result<i32> {
    let (x, labels) = sets.train.batch(batch);
    let (_, grads) = clf.loss_and_grads(&x, &labels, 0)?;
    let flat: Vec<f32> =
        murmur_engine::Tensor::read_many(&grads.iter().collect::<Vec<_>>())?.concat();
    Ok(loco_log2s(&flat, bits)?)
}
