//! A shard's state on disk, so that a shard killed at any moment and started again with the
//! same flags goes on from the last round it closed.
//!
//! The folder holds three kinds of file, each written whole through a temporary file, synced
//! and renamed over the old one (a kill leaves the old file or the new, never half of one):
//! - `state`: the shard's keys (their server memories, owned parameters and optimizer state),
//!   the open round, the job's world and digest, who took part in the last round and which
//!   certificates hold which rank. Written after every round closes, before any worker sees
//!   the reply, so no worker is ever ahead of what a restarted shard knows.
//! - `round-<step>`: one closed round's replies and summary (who took part), written once before `state` names it; a
//!   rejoining worker replays them. Removed once a snapshot covers them.
//! - `snapshot`: shard 0's newest model snapshot (the ranks send one in turn every few rounds).
//!
//! Every file is framed by [`crate::state_file`] with [`MAGIC`]; reading also checks every
//! length against the shard's limits: a damaged or foreign file is an error that names it,
//! never a panic or a wild allocation.

use std::fs;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use murmur_engine::comm::shard::SavedKey;
use murmur_engine::comm::{Key, KeySpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{NetError, Result};
use crate::state_file;
use crate::wire::Closed;

/// The first bytes of every file in a shard's state folder, with the format's version.
pub const MAGIC: &[u8; 8] = b"MMSHARD6";

/// What `state` holds: a shard between rounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedShard {
    /// The shard's index.
    pub shard: u16,
    /// SHA-256 of the job description the shard serves (empty without a job).
    pub job: Vec<u8>,
    /// The world size, once fixed.
    pub world: Option<u16>,
    /// Whether the first round had started.
    pub started: bool,
    /// The open round.
    pub open_step: u64,
    /// Every key, as registered, and what it keeps.
    pub keys: Vec<(KeySpec, SavedKey)>,
    /// The ranks that took part in the last closed round: a restarted shard's first round
    /// waits for them (up to its deadline).
    pub members: Vec<u16>,
    /// Ranks handed out, by certificate fingerprint.
    pub assigned: Vec<(String, u16)>,
    /// The first logged round; rounds `first_logged..open_step` each have a `round-` file.
    pub first_logged: u64,
    /// The step of the snapshot in `snapshot`, if the shard keeps one.
    pub snapshot_step: Option<u64>,
    /// The job's sample queue (shard 0 of a job with one), the open round's assignment in it.
    pub queue: Option<super::queue::SampleQueue>,
}

/// A closed round as its file holds it.
#[derive(Serialize, Deserialize)]
struct SavedRound {
    step: u64,
    replies: Vec<SavedReply>,
    summary: Closed,
}

/// One key's reply in a round file.
#[derive(Serialize, Deserialize)]
struct SavedReply {
    key: Key,
    numel: u32,
    #[serde(with = "murmur_engine::saved_bytes::u8s")]
    payload: Vec<u8>,
}

/// A snapshot as its file holds it.
#[derive(Serialize, Deserialize)]
struct SavedSnapshot {
    step: u64,
    #[serde(with = "murmur_engine::saved_bytes::u8s")]
    bytes: Vec<u8>,
}

/// A shard's state folder.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

/// One key's reply in a logged round: the key, its element count and the encoded payload.
pub type Reply = (Key, u32, Bytes);

/// What a state folder gave back.
pub struct Loaded {
    /// The shard.
    pub shard: SavedShard,
    /// Its logged rounds as (step, replies, summary), oldest first.
    pub rounds: Vec<(u64, Vec<Reply>, Closed)>,
    /// Its snapshot, if it keeps one.
    pub snapshot: Option<(u64, Bytes)>,
}

impl StateDir {
    /// The folder `dir`, created if missing.
    pub fn create(dir: &Path) -> Result<StateDir> {
        fs::create_dir_all(dir)
            .map_err(|e| NetError::State(format!("creating {}: {e}", dir.display())))?;
        Ok(StateDir {
            dir: dir.to_path_buf(),
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn round_path(&self, step: u64) -> PathBuf {
        self.dir.join(format!("round-{step:020}"))
    }

    fn snapshot_path(&self) -> PathBuf {
        self.dir.join("snapshot")
    }

    /// Writes the shard's state (after its rounds' files).
    pub fn write_state(&self, shard: &SavedShard) -> Result<()> {
        state_file::write(&self.state_path(), MAGIC, shard)
    }

    /// Writes one closed round's replies and summary.
    pub fn write_round(&self, step: u64, replies: &[Reply], summary: &Closed) -> Result<()> {
        let saved = SavedRound {
            step,
            summary: summary.clone(),
            replies: replies
                .iter()
                .map(|(key, numel, payload)| SavedReply {
                    key: *key,
                    numel: *numel,
                    payload: payload.to_vec(),
                })
                .collect(),
        };
        state_file::write(&self.round_path(step), MAGIC, &saved)
    }

    /// Writes the snapshot the shard keeps.
    pub fn write_snapshot(&self, step: u64, bytes: &[u8]) -> Result<()> {
        let saved = SavedSnapshot {
            step,
            bytes: bytes.to_vec(),
        };
        state_file::write(&self.snapshot_path(), MAGIC, &saved)
    }

    /// Removes the files of rounds before `step` (a snapshot covers them). Files that will not
    /// go are left (a later prune tries again): they cost disk, not correctness.
    pub fn prune_rounds_before(&self, step: u64) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let old = name
                .to_str()
                .and_then(|n| n.strip_prefix("round-"))
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|s| s < step);
            if old {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Reads what the folder holds: `None` if it holds no state yet. `max_payload` bounds every
    /// reply and the snapshot, as it bounds them on the wire.
    pub fn load(&self, max_payload: usize) -> Result<Option<Loaded>> {
        let path = self.state_path();
        if !path.exists() {
            return Ok(None);
        }
        let shard: SavedShard = state_file::read(&path, MAGIC)?;
        let damaged = |what: String| NetError::State(format!("{}: {what}", self.dir.display()));
        if shard.first_logged > shard.open_step {
            return Err(damaged(format!(
                "it logs rounds from {} but its open round is {}",
                shard.first_logged, shard.open_step
            )));
        }
        let keys: Vec<(Key, u32)> = shard.keys.iter().map(|(s, _)| (s.key, s.numel)).collect();
        let mut rounds = Vec::new();
        for step in shard.first_logged..shard.open_step {
            let path = self.round_path(step);
            let saved: SavedRound = state_file::read(&path, MAGIC)?;
            let same_keys = saved.replies.len() == keys.len()
                && saved.replies.iter().zip(&keys).all(|(r, (key, numel))| {
                    r.key == *key && r.numel == *numel && r.payload.len() <= max_payload
                });
            if saved.step != step || !same_keys {
                return Err(damaged(format!(
                    "{} does not hold round {step} of this shard's keys",
                    path.display()
                )));
            }
            rounds.push((
                step,
                saved
                    .replies
                    .into_iter()
                    .map(|r| (r.key, r.numel, Bytes::from(r.payload)))
                    .collect(),
                saved.summary,
            ));
        }
        let snapshot = match shard.snapshot_step {
            None => None,
            Some(step) => {
                let path = self.snapshot_path();
                let saved: SavedSnapshot = state_file::read(&path, MAGIC)?;
                // A snapshot newer than the state names arrived just before the kill: it is
                // as good (rank 0 sent it), and the rounds it covers are still logged.
                if saved.step < step || saved.step > shard.open_step {
                    return Err(damaged(format!(
                        "{} holds round {}, the state names {step}",
                        path.display(),
                        saved.step
                    )));
                }
                if saved.bytes.len() > max_payload {
                    return Err(damaged(format!(
                        "{} is over the frame limit",
                        path.display()
                    )));
                }
                Some((saved.step, Bytes::from(saved.bytes)))
            }
        };
        Ok(Some(Loaded {
            shard,
            rounds,
            snapshot,
        }))
    }
}

/// The SHA-256 of a job description, which a state folder is tied to.
pub fn job_digest(description: &str) -> Vec<u8> {
    Sha256::digest(description.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("murmur-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn bad_files_are_errors_that_name_them() {
        let dir = temp_dir("durable-bad");
        let state = StateDir::create(&dir).unwrap();
        assert!(state.load(1 << 20).unwrap().is_none(), "an empty folder");
        state
            .write_round(
                0,
                &[(1, 2, Bytes::from_static(&[1, 2, 3]))],
                &Closed {
                    participants: vec![0],
                    replicas: None,
                    next: None,
                    relay: None,
                },
            )
            .unwrap();
        let good = fs::read(state.round_path(0)).unwrap();
        assert!(state_file::decode::<SavedRound>(MAGIC, &good).is_ok());
        // Every truncation, and every flipped byte, is refused without a panic.
        for end in 0..good.len() {
            assert!(
                state_file::decode::<SavedRound>(MAGIC, &good[..end]).is_err(),
                "cut at {end}"
            );
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(
                state_file::decode::<SavedRound>(MAGIC, &bad).is_err(),
                "byte {i} flipped"
            );
        }
        // A body that claims a huge reply, with a correct length and CRC, fails on its length.
        let mut forged = Vec::from(&MAGIC[..]);
        let body = [0u8, 1, 1, 2, 0xff, 0xff, 0xff, 0xff, 0x0f];
        forged.extend((body.len() as u64).to_le_bytes());
        forged.extend(crc32fast::hash(&body).to_le_bytes());
        forged.extend(body);
        assert!(state_file::decode::<SavedRound>(MAGIC, &forged).is_err());
        // A state naming a round whose file is missing names the file.
        let shard = SavedShard {
            shard: 0,
            job: Vec::new(),
            world: Some(1),
            started: true,
            open_step: 2,
            keys: Vec::new(),
            members: vec![0],
            assigned: Vec::new(),
            first_logged: 1,
            snapshot_step: None,
            queue: None,
        };
        state.write_state(&shard).unwrap();
        let missing = state.load(1 << 20).err().unwrap().to_string();
        assert!(missing.contains("round-00000000000000000001"), "{missing}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
