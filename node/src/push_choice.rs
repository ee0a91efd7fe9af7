//! `--push-codec auto`: a worker picks its own push codec from those its job allows, by what
//! its link to the shards moves in the job's push budget. A worker on a slow link compresses
//! harder; the replies stay the job's for everyone, so the replicas stay identical.

use murmur_engine::comm::partition::{shard_of, PartitionPlan};
use murmur_net::ps::client::PathSample;
use murmur_net::wire::{HEADER, PROBE_MAX, PUSH_PREFIX};

use crate::error::{NodeError, Result};
use crate::job::Job;

/// The bytes a round's pushes put on each shard's path with `codec`.
fn bytes_per_shard(
    plan: &PartitionPlan,
    sizes: &[usize],
    shards: usize,
    codec: &str,
) -> Result<Vec<usize>> {
    let codec = murmur_engine::compress::parse(codec)
        .map_err(|e| NodeError::Job(format!("push codec: {e}")))?;
    let mut bytes = vec![0usize; shards];
    for part in plan.partitions(sizes) {
        let payload = if part.compressed {
            codec.payload_len(part.len)
        } else {
            4 * part.len
        };
        bytes[shard_of(part.key, shards)] += HEADER + PUSH_PREFIX + payload;
    }
    Ok(bytes)
}

/// How many bytes to probe each shard's path with: about what the job's own codec pushes
/// there in a round (the probe then costs about a round), within 256 KiB and
/// [`PROBE_MAX`].
pub(crate) fn probe_size(job: &Job, sizes: &[usize], shards: usize) -> Result<usize> {
    let plan = job.partition_plan();
    let most = bytes_per_shard(&plan, sizes, shards, &job.codec)?
        .into_iter()
        .max()
        .unwrap_or(0);
    Ok(most.clamp(256 << 10, PROBE_MAX))
}

/// The push codec for a path measured as `samples` (one per shard): the least compressed of
/// the job's allowed codecs whose round of pushes the path moves within the job's push
/// budget, else the most compressed. Returns it with the estimated seconds per round.
pub(crate) fn choose(job: &Job, sizes: &[usize], samples: &[PathSample]) -> Result<(String, f64)> {
    let budget = job.push_budget_ms.ok_or_else(|| {
        NodeError::Job(
            "--push-codec auto needs the job's push_budget_ms (the time a worker's pushes may \
             take per round)"
                .into(),
        )
    })? / 1e3;
    let plan = job.partition_plan();
    let shards = samples.len();
    let mut timed = Vec::new();
    for codec in job.allowed_push_codecs() {
        let per_shard = bytes_per_shard(&plan, sizes, shards, codec)?;
        let seconds = per_shard
            .iter()
            .zip(samples)
            .map(|(&bytes, sample)| sample.seconds_for(bytes))
            .fold(0.0, f64::max);
        timed.push((per_shard.iter().sum::<usize>(), seconds, codec));
    }
    // Least compressed first.
    timed.sort_by_key(|t| std::cmp::Reverse(t.0));
    let within = timed.iter().find(|(_, seconds, _)| *seconds <= budget);
    let (_, seconds, codec) = within.or(timed.last()).expect("the job's codec at least");
    Ok((codec.to_string(), *seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job::from_toml(
            "workers = 2\ncodec = \"topk:0.1\"\npull_codec = \"topk:0.01\"\npush_codecs = [\"topk:0.01\", \"topk:0.001\"]\npush_budget_ms = 100.0\nhidden = [512, 256]\nmin_compress_bytes = 4096\n",
        )
        .unwrap()
    }

    /// A path of `mbit` Mbit/s and `rtt_ms`, as a probe of 1 MB would measure it.
    fn path(mbit: f64, rtt_ms: f64) -> PathSample {
        let bytes = 1 << 20;
        let rtt = rtt_ms / 1e3;
        PathSample {
            bytes,
            seconds: rtt + bytes as f64 * 8.0 / (mbit * 1e6),
            rtt,
        }
    }

    #[test]
    fn a_slow_link_pushes_the_harder_code_and_a_fast_one_the_jobs() {
        let job = job();
        let sizes = [784 * 512, 512, 512 * 256, 256, 256 * 10, 10];
        // topk:0.1 of 535k parameters is about 430 kB a round: 35 ms at 100 Mbit/s, 350 ms
        // at 10; topk:0.01, about 45 kB, 36 ms at 10 Mbit/s.
        let (fast, seconds) = choose(&job, &sizes, &[path(100.0, 40.0)]).unwrap();
        assert_eq!(fast, "topk:0.1");
        assert!(seconds < 0.1, "{seconds}");
        let (slow, seconds) = choose(&job, &sizes, &[path(10.0, 40.0)]).unwrap();
        assert_eq!(slow, "topk:0.01");
        assert!(seconds < 0.1, "{seconds}");
        // Nothing fits a 0.1 Mbit/s link: the hardest code.
        let (crawl, _) = choose(&job, &sizes, &[path(0.1, 40.0)]).unwrap();
        assert_eq!(crawl, "topk:0.001");
        // The slowest shard's path decides.
        let (two, _) = choose(&job, &sizes, &[path(100.0, 40.0), path(10.0, 40.0)]).unwrap();
        assert_eq!(two, "topk:0.01");
        let no_budget = Job {
            push_budget_ms: None,
            ..job
        };
        assert!(choose(&no_budget, &sizes, &[path(10.0, 40.0)]).is_err());
    }

    #[test]
    fn a_path_sample_predicts_its_own_transfer() {
        let p = path(10.0, 40.0);
        assert!((p.seconds_for(p.bytes) - p.seconds).abs() < 1e-9);
        assert!((p.seconds_for(0) - 0.04).abs() < 1e-9);
    }
}
