//! A worker's own state on disk: after every round, its replica (parameters and optimizer
//! state, as the checkpoint format holds them) and its error-feedback memories. A worker
//! that died (a crash, a kill, a reboot) and is started again with the same file and
//! certificate takes them back, then catches up from its own round (or from the newest
//! snapshot, when the servers no longer log that far back): its memories, which no snapshot
//! holds, are not lost.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use murmur_engine::comm::Collective;
use murmur_engine::feedback::SavedMemory;
use murmur_engine::train::{DataParallel, Learner};
use murmur_net::ps::durable::job_digest;
use murmur_net::state_file;
use serde::{Deserialize, Serialize};

use crate::error::{NodeError, Result};

/// The first bytes of a worker's state file, with the format's version.
const MAGIC: &[u8; 8] = b"MMWORKR1";

/// What the file holds.
#[derive(Serialize, Deserialize)]
struct Saved {
    /// SHA-256 of the job's description: a state of another job is refused.
    job: Vec<u8>,
    /// The rank the servers gave this worker.
    rank: u16,
    /// The checkpoint of the replica (model, optimizer state, rounds done, and the outer
    /// loop's state where rounds are outer rounds).
    #[serde(with = "murmur_engine::saved_bytes::u8s")]
    checkpoint: Vec<u8>,
    /// The error-feedback memory of every partition.
    memories: Vec<SavedMemory>,
}

/// The worker's state after a round.
fn capture<C: Collective, M: Learner>(
    job: &str,
    rank: u16,
    dp: &DataParallel<C, M>,
) -> Result<Saved> {
    Ok(Saved {
        job: job_digest(job),
        rank,
        checkpoint: dp.save_state()?,
        memories: dp.saved_memories()?,
    })
}

/// Writes a worker's state off its training thread: the round's state is copied at once,
/// then encoded, synced and renamed by a thread of its own. While a write is still going, a
/// newer round's state is not even copied: the file lags the rounds by a round or two when
/// the disk is slow, and the rounds never wait for it.
pub(crate) struct StateWriter {
    job: String,
    rank: u16,
    queue: Option<mpsc::SyncSender<Saved>>,
    thread: Option<std::thread::JoinHandle<()>>,
    failed: Arc<Mutex<Option<String>>>,
    /// Set while a state is being written: the next round's state is not even copied.
    busy: Arc<AtomicBool>,
}

impl StateWriter {
    /// A writer to `path` for this job and rank.
    pub(crate) fn start(path: &Path, job: &str, rank: u16) -> Result<StateWriter> {
        let (queue, states) = mpsc::sync_channel::<Saved>(1);
        let failed = Arc::new(Mutex::new(None));
        let busy = Arc::new(AtomicBool::new(false));
        let (path, failure, writing) = (path.to_path_buf(), failed.clone(), busy.clone());
        let thread = std::thread::Builder::new()
            .name("murmur-worker-state".into())
            .spawn(move || {
                for saved in states {
                    if let Err(e) = state_file::write(&path, MAGIC, &saved) {
                        *failure.lock().expect("failure lock") = Some(e.to_string());
                    }
                    writing.store(false, Ordering::Release);
                }
            })
            .map_err(|e| NodeError::io("starting the state writer", e))?;
        Ok(StateWriter {
            job: job.to_string(),
            rank,
            queue: Some(queue),
            thread: Some(thread),
            failed,
            busy,
        })
    }

    /// Hands this round's state to the writer, unless it is still busy; fails if an earlier
    /// write failed.
    pub(crate) fn save<C: Collective, M: Learner>(&self, dp: &DataParallel<C, M>) -> Result<()> {
        if let Some(e) = self.failed.lock().expect("failure lock").take() {
            return Err(NodeError::Config(format!(
                "the worker's state was not saved: {e}"
            )));
        }
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        if self.busy.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let saved = capture(&self.job, self.rank, dp).inspect_err(|_| {
            self.busy.store(false, Ordering::Release);
        })?;
        if let Err(mpsc::TrySendError::Disconnected(_)) = queue.try_send(saved) {
            return Err(NodeError::Thread("the state writer ended".into()));
        }
        Ok(())
    }
}

impl Drop for StateWriter {
    /// Writes what is waiting, then ends the thread.
    fn drop(&mut self) {
        self.queue = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Takes the state in `path` back into `dp`, if there is one: returns the round it held.
/// A state of another job or rank, or a damaged one, is an error that says what to do.
pub(crate) fn resume<C: Collective, M: Learner>(
    path: &Path,
    job: &str,
    rank: u16,
    dp: &mut DataParallel<C, M>,
) -> Result<Option<u64>> {
    if !path.exists() {
        return Ok(None);
    }
    let refuse = |why: String| {
        Err(NodeError::Config(format!(
            "{}: {why}; remove it (the worker then catches up from the newest snapshot, \
             without its error-feedback memory) or give another state file",
            path.display()
        )))
    };
    let saved: Saved = match state_file::read(path, MAGIC) {
        Ok(saved) => saved,
        Err(e) => return refuse(e.to_string()),
    };
    if saved.job != job_digest(job) {
        return refuse("the state of another job".into());
    }
    if saved.rank != rank {
        return refuse(format!(
            "the state of rank {}, and the servers gave this worker rank {rank}",
            saved.rank
        ));
    }
    if let Err(e) = dp
        .load_state(&saved.checkpoint)
        .and_then(|()| dp.restore_memories(saved.memories))
    {
        return refuse(format!("a state that does not fit this model ({e})"));
    }
    Ok(Some(dp.round()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_engine::comm::local::local_collectives;
    use murmur_engine::comm::partition::PartitionPlan;
    use murmur_engine::train::{Classifier, ClassifierConfig};
    use murmur_engine::Device;

    fn trainer() -> DataParallel<murmur_engine::comm::local::LocalCollective> {
        let config = ClassifierConfig {
            hidden: vec![8],
            seed: 3,
            ..ClassifierConfig::default()
        };
        let clf = Classifier::new(&Device::Cpu, 6, 3, &config).unwrap();
        let plan = PartitionPlan {
            push: "topk:0.3".into(),
            pull: "topk:0.3".into(),
            min_compress_bytes: 0,
            ..PartitionPlan::default()
        };
        let collective = local_collectives(1).pop().unwrap();
        DataParallel::new(clf, collective, &plan, "ef").unwrap()
    }

    fn train(dp: &mut DataParallel<murmur_engine::comm::local::LocalCollective>, rounds: u64) {
        for round in 0..rounds {
            let x: Vec<f32> = (0..24)
                .map(|i| ((i as u64 * 7 + round) % 11) as f32 / 11.0)
                .collect();
            dp.step((&x, &[0, 1, 2, 1]), 0).unwrap();
        }
    }

    #[test]
    fn a_worker_started_again_takes_back_its_replica_and_memories_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("murmur-worker-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("worker-0");
        let mut dp = trainer();
        assert_eq!(
            resume(&path, "job", 0, &mut dp).unwrap(),
            None,
            "no file yet"
        );
        train(&mut dp, 3);
        let memories = dp.saved_memories().unwrap();
        assert!(
            memories
                .iter()
                .any(|m| m.residual.iter().any(|v| *v != 0.0)),
            "top-30% leaves something in the memories"
        );
        // What the writer holds when it is dropped reaches the file.
        StateWriter::start(&path, "job", 0)
            .unwrap()
            .save(&dp)
            .unwrap();
        let mut back = trainer();
        assert_eq!(resume(&path, "job", 0, &mut back).unwrap(), Some(3));
        assert_eq!(back.saved_memories().unwrap(), dp.saved_memories().unwrap());
        assert_eq!(
            back.replica.save_state().unwrap(),
            dp.replica.save_state().unwrap()
        );
        // Another job, another rank, a damaged file: refused, saying what to do.
        for (job, rank) in [("another job", 0), ("job", 1)] {
            let e = resume(&path, job, rank, &mut trainer())
                .unwrap_err()
                .to_string();
            assert!(e.contains("remove it"), "{e}");
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(resume(&path, "job", 0, &mut trainer()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
