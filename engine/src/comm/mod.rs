//! The seams between algorithms and transports: [`Collective`] for data-parallel rounds
//! (`StageLink` for pipelines comes with the pipeline issue). The engine ships an in-process
//! implementation ([`local`]); `murmur-net` implements the same trait over QUIC. Both run the
//! servers' arithmetic through [`shard::KeyState`], which is why a run over QUIC gives the bits
//! of the same run in-process.

pub mod local;
pub mod partition;
pub mod shard;

use serde::{Deserialize, Serialize};

use crate::compress::CodecContext;
use crate::error::Result;

/// Identifies one tensor partition across all peers: `(tensor << 16) | partition`.
pub type Key = u64;

/// What every peer agrees about one key: its size, how workers compress their pushes, and how
/// the server re-compresses the mean (with its own error-feedback memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySpec {
    pub key: Key,
    pub numel: u32,
    /// Codec spec of worker pushes (e.g. `topk:0.01`).
    pub push: String,
    /// Codec spec of the server's reply.
    pub pull: String,
    /// Server memory spec (`none`, `ef`, `loco-ema...`).
    pub server_memory: String,
    /// Seed of the stochastic codecs and of random-k's shared index sets.
    pub seed: u64,
}

/// The codec context of a key in a round, the same on every peer. The key folds to 32 bits.
pub fn codec_context(seed: u64, step: u64, key: Key) -> CodecContext {
    CodecContext {
        seed,
        step: step as u32,
        key: (key as u32) ^ ((key >> 32) as u32),
    }
}

/// Synchronous data-parallel rounds through parameter servers (BytePS-Compress style): each
/// rank pushes one payload per key; the servers decode the pushes, average them in rank order,
/// add their error feedback, re-compress once and send every rank the same bytes.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;

    /// Declares the keys (same list, same order, on every rank) before the first round.
    fn register(&mut self, keys: &[KeySpec]) -> Result<()>;

    /// Sends this rank's payload for one key of round `step`. Implementations may send at
    /// once, so a caller pushes each partition as soon as it is encoded.
    fn push(&mut self, step: u64, key: Key, payload: Vec<u8>) -> Result<()>;

    /// Completes round `step`: the servers' reply for each of `keys` (in that order; identical
    /// bytes on every rank). Every key must have been pushed in this round.
    fn pull(&mut self, step: u64, keys: &[Key]) -> Result<Vec<(Key, Vec<u8>)>>;

    /// One whole round: [`Collective::push`] every payload, then [`Collective::pull`].
    fn push_pull(&mut self, step: u64, pushes: Vec<(Key, Vec<u8>)>) -> Result<Vec<(Key, Vec<u8>)>> {
        let keys: Vec<Key> = pushes.iter().map(|(k, _)| *k).collect();
        for (key, payload) in pushes {
            self.push(step, key, payload)?;
        }
        self.pull(step, &keys)
    }
}
