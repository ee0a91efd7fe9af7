//! The seams between algorithms and transports: [`Collective`] for data-parallel rounds and
//! [`stage::StageLink`] between pipeline stages. The engine ships in-process implementations
//! ([`local`], [`stage::local_links`]); `murmur-net` implements the same traits over QUIC.
//! Both run the servers' arithmetic through [`shard::KeyState`], which is why a run over QUIC
//! gives the bits of the same run in-process.

pub mod aggregate;
pub mod history;
pub mod local;
pub mod owner;
pub mod partition;
pub mod push;
pub mod shard;
pub mod stage;

use serde::{Deserialize, Serialize};

use crate::compress::CodecContext;
use crate::error::Result;

/// Identifies one tensor partition across all peers: `(tensor << 16) | partition`.
pub type Key = u64;

/// What every peer agrees about one key: its size, how workers compress their pushes, and how
/// the server re-compresses the mean (with its own error-feedback memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySpec {
    /// The key every peer knows this tensor partition by.
    pub key: Key,
    /// Number of f32 elements under the key.
    pub numel: u32,
    /// Codec spec of worker pushes (e.g. `topk:0.01`).
    pub push: String,
    /// Codec spec of the server's reply.
    pub pull: String,
    /// Server memory spec (`none`, `ef`, `loco-ema...`).
    pub server_memory: String,
    /// Seed of the stochastic codecs and of random-k's shared index sets.
    pub seed: u64,
    /// Makes every `sync_every`-th round of this key a sync round (0: none), see
    /// [`KeySpec::is_sync_round`].
    pub sync_every: u64,
    /// The optimizer (`sgd`, `nag[:m]`, `adamw`) with which the key's server owns the key's
    /// parameters, or empty where workers own them: see [`owner`] (loco.md's sharded path).
    pub owner: String,
}

impl KeySpec {
    /// Whether `other` is this key with, at most, another push codec: what a worker may
    /// register beside the others (its own link's compression), since the replies, memories
    /// and seed must be the swarm's.
    pub fn same_but_push(&self, other: &KeySpec) -> bool {
        *self
            == KeySpec {
                push: self.push.clone(),
                ..other.clone()
            }
    }

    /// Whether round `round` is a sync round: rounds `r` with `(r + 1) % sync_every == 0`,
    /// LIEC-SGD's averaging steps `t = H - 1, 2H - 1, ...` (liec-sgd.md §6.12). In a sync round
    /// pushes and the reply are plain f32 and the server adds its whole error-feedback memory
    /// to the mean and resets it, so nothing is held back.
    pub fn is_sync_round(&self, round: u64) -> bool {
        is_sync_round(self.sync_every, round)
    }

    /// Whether round `round` is an owned key's parameter round (its first): pushes are the
    /// workers' initial parameters in f32, see [`owner`].
    pub fn is_param_round(&self, round: u64) -> bool {
        is_param_round(&self.owner, round)
    }

    /// This key travelling uncompressed: f32 both ways, no server memory (BytePS's small
    /// tensors, byteps-clan.md §5.3).
    pub fn uncompressed(self) -> KeySpec {
        KeySpec {
            push: PLAIN.into(),
            pull: PLAIN.into(),
            server_memory: "none".into(),
            ..self
        }
    }
}

/// The codec of uncompressed keys, of sync rounds and of parameter rounds.
pub const PLAIN: &str = "f32";

/// The parameter-round rule of [`KeySpec::is_param_round`], for workers that know the owner.
pub fn is_param_round(owner: &str, round: u64) -> bool {
    !owner.is_empty() && round == 0
}

/// The sync-round rule of [`KeySpec::is_sync_round`], for workers that know the period.
pub fn is_sync_round(sync_every: u64, round: u64) -> bool {
    sync_every > 0 && (round + 1).is_multiple_of(sync_every)
}

/// The codec context of a key in a round, the same on every peer (a worker's push adds its
/// rank, [`CodecContext::sent_by`]). The key folds to 32 bits.
pub fn codec_context(seed: u64, step: u64, key: Key) -> CodecContext {
    CodecContext {
        seed,
        step: step as u32,
        key: (key as u32) ^ ((key >> 32) as u32),
        stream: 0,
    }
}

/// Synchronous data-parallel rounds through parameter servers (BytePS-Compress style): each
/// rank pushes one payload per key; the servers decode the pushes, average them in rank order,
/// add their error feedback, re-compress once and send every rank the same bytes.
pub trait Collective: Send {
    /// This peer's rank, below [`Collective::world`].
    fn rank(&self) -> usize;
    /// Number of ranks taking part in every round.
    fn world(&self) -> usize;

    /// Declares the keys (same list, same order, on every rank) before the first round.
    fn register(&mut self, keys: &[KeySpec]) -> Result<()>;

    /// Sends this rank's payload for one key of round `step`, standing for `samples` training
    /// samples (its weight in the round's mean, [`push::Push::samples`]; every key of a
    /// round carries the same count). Implementations may send at once, so a caller pushes
    /// each partition as soon as it is encoded.
    fn push(&mut self, step: u64, key: Key, samples: u32, payload: Vec<u8>) -> Result<()>;

    /// Completes round `step`: the servers' reply for each of `keys` (in that order; identical
    /// bytes on every rank). Every key must have been pushed in this round.
    fn pull(&mut self, step: u64, keys: &[Key]) -> Result<Vec<(Key, Vec<u8>)>>;

    /// The error-feedback memory of a key's server as it stands between rounds, where the
    /// servers live in this process (a diagnostic for simulations; `None` elsewhere).
    fn server_error(&self, _key: Key) -> Option<Vec<f32>> {
        None
    }

    /// One whole round: [`Collective::push`] every payload, each standing for `samples`, then
    /// [`Collective::pull`].
    fn push_pull(
        &mut self,
        step: u64,
        samples: u32,
        pushes: Vec<(Key, Vec<u8>)>,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let keys: Vec<Key> = pushes.iter().map(|(k, _)| *k).collect();
        for (key, payload) in pushes {
            self.push(step, key, samples, payload)?;
        }
        self.pull(step, &keys)
    }
}
