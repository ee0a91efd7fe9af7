//! What the servers know of a job's model without a worker telling them: the keys every
//! worker registers (sizes, codecs, memories) and how a snapshot's parameters hash. The
//! servers hold every registration and snapshot to these ([`murmur_net::ps::job_checks`]),
//! so the first peer to reach a fresh shard fixes nothing, and a snapshot that is not the
//! replicas' model never reaches a rejoining worker.
//!
//! The model is built on the CPU from the job alone: its sizes follow from the job's fields
//! and the dataset's shape (known without loading the files).

use std::collections::BTreeMap;

use murmur_engine::comm::partition::shard_of;
use murmur_engine::comm::KeySpec;
use murmur_engine::compress::CodecSpec;
use murmur_engine::data::ImageDataset;
use murmur_engine::train::{Classifier, LanguageModel, Learner};
use murmur_engine::Device;
use murmur_net::ps::job_checks::{LayoutCheck, SnapshotDigest};

use crate::calibration::{loco_bits_left_to_calibration, with_loco_scale};
use crate::error::{NodeError, Result};
use crate::job::Job;

/// The job's model, as every worker builds it before training (only its shapes and its
/// parameter order matter here).
enum Model {
    Classifier(Box<Classifier>),
    Language(Box<LanguageModel>),
}

impl Model {
    fn of(job: &Job) -> Result<Model> {
        Ok(if job.is_gpt() {
            Model::Language(Box::new(LanguageModel::new(
                &Device::Cpu,
                &job.lm_config(),
            )?))
        } else {
            let dataset: ImageDataset = job
                .dataset
                .parse()
                .map_err(|e| NodeError::Job(format!("dataset: {e}")))?;
            Model::Classifier(Box::new(Classifier::new(
                &Device::Cpu,
                dataset.features(),
                dataset.classes(),
                &job.classifier_config(1)?,
            )?))
        })
    }

    fn sizes(&self) -> Vec<usize> {
        let parameters = match self {
            Model::Classifier(m) => m.parameters(),
            Model::Language(m) => m.parameters(),
        };
        parameters.iter().map(|p| p.numel()).collect()
    }

    fn snapshot_digest(&self, snapshot: &[u8]) -> Result<u64> {
        Ok(match self {
            Model::Classifier(m) => m.snapshot_digest(snapshot)?,
            Model::Language(m) => m.snapshot_digest(snapshot)?,
        })
    }
}

/// The keys a worker of `job` registers with shard `shard` of `shards`, in its order, as a
/// worker whose LoCo scale came out at `log2s` registers them (`None`: the job leaves no scale
/// to calibration).
fn expected_keys(
    job: &Job,
    sizes: &[usize],
    shard: u16,
    shards: u16,
    log2s: Option<i32>,
) -> Vec<KeySpec> {
    let plan = with_loco_scale(job.clone(), log2s).partition_plan();
    plan.key_specs(&plan.partitions(sizes))
        .into_iter()
        .filter(|spec| shard_of(spec.key, shards.into()) == usize::from(shard))
        .collect()
}

/// The LoCo scale a registration's codecs name, where the job leaves it to calibration: each
/// worker calibrates it from the job's first batch, so the servers cannot know it without the
/// data, but every worker comes to the same one (and a shard holds all to the first).
fn registered_scale(keys: &[KeySpec]) -> Option<i32> {
    keys.iter()
        .flat_map(|k| [&k.push, &k.pull])
        .find_map(|codec| match codec.parse() {
            Ok(CodecSpec::Loco { log2s, .. }) => Some(log2s),
            _ => None,
        })
}

/// What differs between a registration and the job's keys, if anything (the first few
/// differences). A key the job compresses with `codec` may be pushed with any of
/// `alternatives` (the job's `push_codecs`).
fn differences(
    registered: &[KeySpec],
    expected: &[KeySpec],
    (codec, alternatives): (&str, &[String]),
) -> Option<String> {
    let theirs: BTreeMap<u64, &KeySpec> = registered.iter().map(|k| (k.key, k)).collect();
    let ours: BTreeMap<u64, &KeySpec> = expected.iter().map(|k| (k.key, k)).collect();
    let mut found = Vec::new();
    if theirs.len() != registered.len() {
        found.push("a key registered twice".to_string());
    }
    for (key, spec) in &ours {
        match theirs.get(key) {
            None => found.push(format!("key {key:#x} missing")),
            Some(got) if got.numel != spec.numel => found.push(format!(
                "key {key:#x} has {} elements, the job's {}",
                got.numel, spec.numel
            )),
            Some(got)
                if spec.push == codec
                    && alternatives.contains(&got.push)
                    && spec.same_but_push(got) => {}
            Some(got) if got != spec => found.push(format!(
                "key {key:#x} travels as push {} / reply {} / server memory {}, the job's as {} / {} / {}",
                got.push, got.pull, got.server_memory, spec.push, spec.pull, spec.server_memory
            )),
            Some(_) => {}
        }
    }
    let extra = theirs.keys().filter(|k| !ours.contains_key(k)).count();
    if extra > 0 {
        found.push(format!("{extra} keys the job does not have"));
    }
    let more = found.len().saturating_sub(3);
    found.truncate(3);
    (!found.is_empty()).then(|| {
        let mut said = found.join("; ");
        if more > 0 {
            said.push_str(&format!(" (and {more} more)"));
        }
        said
    })
}

/// The checks shard `shard` of `shards` holds its peers to for `job`: the keys a worker
/// registers, and (shard 0, which keeps the snapshots) the digest of a snapshot's parameters.
pub fn shard_checks(
    job: &Job,
    shard: u16,
    shards: u16,
) -> Result<(LayoutCheck, Option<SnapshotDigest>)> {
    let model = Model::of(job)?;
    let sizes = model.sizes();
    let calibrated = loco_bits_left_to_calibration(job).is_some();
    let job = job.clone();
    let for_snapshots = job.clone();
    let layout = LayoutCheck::new(move |keys| {
        let log2s = if calibrated {
            Some(registered_scale(keys).ok_or("the job's LoCo scale is missing from the codecs")?)
        } else {
            None
        };
        let expected = expected_keys(&job, &sizes, shard, shards, log2s);
        match differences(keys, &expected, (&job.codec, &job.push_codecs)) {
            None => Ok(()),
            Some(said) => Err(said),
        }
    });
    // A model is not shared between threads: each snapshot (one every few rounds) builds
    // its own, which costs milliseconds.
    let snapshot = (shard == 0).then(|| {
        SnapshotDigest::new(move |bytes| {
            Model::of(&for_snapshots)
                .and_then(|model| model.snapshot_digest(bytes))
                .map_err(|e| e.to_string())
        })
    });
    Ok((layout, snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> Job {
        Job::from_toml(text).unwrap()
    }

    #[test]
    fn a_registration_is_held_to_the_jobs_keys() {
        let job = job("workers = 2\ncodec = \"topk:0.01\"\nhidden = [64, 32]\nmin_compress_bytes = 4096\npartition_bytes = 65536\n");
        let sizes = Model::of(&job).unwrap().sizes();
        assert_eq!(sizes, vec![784 * 64, 64, 64 * 32, 32, 32 * 10, 10]);
        for shards in [1, 2] {
            let all: Vec<KeySpec> = (0..shards)
                .flat_map(|s| expected_keys(&job, &sizes, s, shards, None))
                .collect();
            // Every key of the model lands on one shard.
            let plan = job.partition_plan();
            assert_eq!(all.len(), plan.partitions(&sizes).len());
            for shard in 0..shards {
                let (layout, snapshot) = shard_checks(&job, shard, shards).unwrap();
                assert_eq!(snapshot.is_some(), shard == 0);
                let honest = expected_keys(&job, &sizes, shard, shards, None);
                assert_eq!(layout.check(&honest), Ok(()));
                // A key that claims 2^28 elements, another codec, a key left out, one added.
                let mut huge = honest.clone();
                huge[0].numel = 1 << 28;
                assert!(layout.check(&huge).unwrap_err().contains("elements"));
                let mut loose = honest.clone();
                let compressed = loose.iter().position(|k| k.push != "f32").unwrap();
                loose[compressed].push = "topk:0.5".into();
                assert!(layout.check(&loose).unwrap_err().contains("topk:0.5"));
                assert!(layout.check(&honest[1..]).unwrap_err().contains("missing"));
                let mut more = honest.clone();
                more.push(KeySpec {
                    key: 0xdead_0000,
                    ..honest[0].clone()
                });
                assert!(layout.check(&more).unwrap_err().contains("does not have"));
            }
        }
    }

    #[test]
    fn a_worker_may_push_the_codecs_the_job_allows_and_no_other() {
        let job = job("workers = 2\ncodec = \"topk:0.01\"\npush_codecs = [\"topk:0.001\"]\nhidden = [64, 32]\nmin_compress_bytes = 4096\n");
        let sizes = Model::of(&job).unwrap().sizes();
        let (layout, _) = shard_checks(&job, 0, 1).unwrap();
        let honest = expected_keys(&job, &sizes, 0, 1, None);
        let compressed = honest.iter().position(|k| k.push == "topk:0.01").unwrap();
        let plain = honest.iter().position(|k| k.push == "f32").unwrap();
        let mut harder = honest.clone();
        for key in harder.iter_mut().filter(|k| k.push == "topk:0.01") {
            key.push = "topk:0.001".into();
        }
        assert_eq!(layout.check(&harder), Ok(()));
        let mut other = honest.clone();
        other[compressed].push = "topk:0.1".into();
        assert!(layout.check(&other).unwrap_err().contains("topk:0.1"));
        // A key the job sends uncompressed stays so.
        let mut squeezed = honest.clone();
        squeezed[plain].push = "topk:0.001".into();
        assert!(layout.check(&squeezed).is_err());
        // And the replies are the job's whatever a worker pushes.
        harder[compressed].pull = "f16".into();
        assert!(layout.check(&harder).is_err());
    }

    #[test]
    fn a_calibrated_loco_scale_passes_and_must_be_the_same_on_every_key() {
        let job = job("workers = 2\ncodec = \"loco:bits=4\"\nmemory = \"loco-ema\"\nserver_memory = \"loco-ema\"\nhidden = [64, 32]\nmin_compress_bytes = 4096\n");
        let sizes = Model::of(&job).unwrap().sizes();
        let (layout, _) = shard_checks(&job, 0, 1).unwrap();
        let calibrated = expected_keys(&job, &sizes, 0, 1, Some(9));
        assert!(calibrated.iter().any(|k| k.push.contains("log2s=9")));
        assert_eq!(layout.check(&calibrated), Ok(()));
        // Two scales in one registration: the keys at the other scale differ.
        let mut mixed = calibrated.clone();
        let last = mixed.iter().rposition(|k| k.push != "f32").unwrap();
        mixed[last] = expected_keys(&job, &sizes, 0, 1, Some(3))[last].clone();
        assert!(layout.check(&mixed).is_err());
    }
}
