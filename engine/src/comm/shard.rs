//! The arithmetic of a parameter-server shard for one key, shared by the in-process collective
//! and the QUIC servers so that both give the same bits.
//!
//! A round: every push is decoded (and thereby validated) when it arrives; when the round
//! closes, the decoded pushes are summed in rank order, scaled by 1/count, compensated with the
//! server's memory, and encoded once with the pull codec: `Δ = mean + ẽ`, `p = C(Δ)`,
//! `ẽ = Δ − D(p)` (Algorithms 3 and 4 of byteps-clan.md).

use std::collections::BTreeMap;

use super::{codec_context, KeySpec};
use crate::compress::{parse, Codec};
use crate::error::{Error, Result};
use crate::feedback::{Feedback, Memory};
use crate::tensor::Device;

pub struct KeyState {
    pub spec: KeySpec,
    push: Box<dyn Codec>,
    pull: Feedback,
    /// The step of the round now open.
    pub step: u64,
    /// Decoded pushes of this round by rank.
    pending: BTreeMap<usize, Vec<f32>>,
}

impl KeyState {
    pub fn new(spec: KeySpec) -> Result<Self> {
        let push = parse(&spec.push)?;
        let memory: Memory = spec.server_memory.parse()?;
        let pull = Feedback::new(
            parse(&spec.pull)?,
            memory,
            spec.numel as usize,
            &Device::Cpu,
        )?;
        Ok(KeyState {
            spec,
            push,
            pull,
            step: 0,
            pending: BTreeMap::new(),
        })
    }

    /// Decodes and keeps one rank's push for the open round. Bad payloads, wrong steps and
    /// second pushes are errors that change nothing.
    pub fn accept(&mut self, rank: usize, step: u64, payload: &[u8]) -> Result<()> {
        let values = self.decode_push(rank, step, payload)?;
        self.insert(rank, values);
        Ok(())
    }

    /// The checking and decoding half of [`KeyState::accept`]; it needs no exclusive access, so
    /// servers decode concurrent pushes in parallel and insert them afterwards.
    pub fn decode_push(&self, rank: usize, step: u64, payload: &[u8]) -> Result<Vec<f32>> {
        if step != self.step {
            return Err(Error::Data(format!(
                "key {:#x}: push for step {step}, but the open round is step {}",
                self.spec.key, self.step
            )));
        }
        if self.pending.contains_key(&rank) {
            return Err(Error::Data(format!(
                "key {:#x}: rank {rank} pushed twice in step {step}",
                self.spec.key
            )));
        }
        let ctx = codec_context(self.spec.seed, step, self.spec.key);
        self.push.decode(payload, self.spec.numel as usize, &ctx)
    }

    /// Keeps a decoded push of the open round (from [`KeyState::decode_push`]).
    pub fn insert(&mut self, rank: usize, values: Vec<f32>) {
        self.pending.insert(rank, values);
    }

    /// Forgets a rank's push of the open round (the rank left or missed the deadline).
    pub fn discard(&mut self, rank: usize) {
        self.pending.remove(&rank);
    }

    /// Ranks that have pushed in the open round.
    pub fn pushed(&self) -> impl Iterator<Item = usize> + '_ {
        self.pending.keys().copied()
    }

    pub fn count(&self) -> usize {
        self.pending.len()
    }

    /// Closes the round: the reply every rank receives. Opens the next round.
    pub fn close(&mut self) -> Result<Vec<u8>> {
        let n = self.spec.numel as usize;
        // Rank order, whatever the arrival order, starting from the first push itself (so that
        // one rank's push comes back bit for bit, signed zeros included).
        let mut ranks = self.pending.values();
        let mut mean = ranks.next().cloned().unwrap_or_else(|| vec![0.0f32; n]);
        for values in ranks {
            mean.iter_mut().zip(values).for_each(|(m, v)| *m += v);
        }
        if self.pending.len() > 1 {
            let scale = 1.0 / self.pending.len() as f32;
            mean.iter_mut().for_each(|m| *m *= scale);
        }
        let ctx = codec_context(self.spec.seed, self.step, self.spec.key);
        let reply = self.pull.encode(&mean, &ctx)?;
        self.pending.clear();
        self.step += 1;
        Ok(reply)
    }
}
