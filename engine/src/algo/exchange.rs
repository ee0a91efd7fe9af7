//! One worker's side of the algorithms' rounds: a flat vector cut into blocks, each block
//! encoded with its key's codec and pushed, the servers' reply decoded back into a flat vector.
//! Every round is one round of the [`Collective`], so an algorithm runs in-process and over
//! QUIC unchanged; the bytes it moves are counted here.

use rayon::prelude::*;

use super::blocks::Block;
use super::norm2;
use crate::comm::owner::StepHeader;
use crate::comm::{codec_context, is_param_round, is_sync_round, Collective, KeySpec, PLAIN};
use crate::compress::{parse, Codec, DecodeMode};
use crate::error::{Error, Result};
use crate::feedback::Feedback;

/// The samples each push stands for: an algorithm's workers all take equal shares of every
/// step's batch, so every push weighs the same and the servers take the plain mean.
const EQUAL_SHARES: u32 = 1;

/// What the servers do with every block of an algorithm: the codec of worker pushes, the codec
/// of their reply, their error-feedback memory, the period of sync rounds (0: none), and the
/// optimizer with which they own the parameters (empty: the workers own them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire {
    /// Codec spec of worker pushes, e.g. `topk:0.01`.
    pub push: String,
    /// Codec spec of the servers' reply.
    pub pull: String,
    /// The servers' error-feedback memory spec (`none`, `ef`, ...).
    pub server_memory: String,
    /// Every `sync_every`-th round is a sync round, sent uncompressed (0: never).
    pub sync_every: u64,
    /// Optimizer spec with which the servers own the parameters, or empty when the workers own
    /// them.
    pub owner: String,
}

impl Wire {
    /// What every peer registers for `block`: these rules, or f32 both ways for a block that
    /// travels uncompressed ([`Block::plain`]).
    pub fn key_spec(&self, block: &Block, seed: u64) -> KeySpec {
        let spec = KeySpec {
            key: block.key,
            numel: block.len as u32,
            push: self.push.clone(),
            pull: self.pull.clone(),
            server_memory: self.server_memory.clone(),
            seed,
            sync_every: self.sync_every,
            owner: self.owner.clone(),
        };
        if block.plain {
            spec.uncompressed()
        } else {
            spec
        }
    }
}

/// What a worker keeps of its own push, besides sending it.
pub enum Own<'a> {
    /// The worker keeps nothing of its push.
    Nothing,
    /// `clean(q) − D(C(q))`, what the codec dropped (error feedback's residual).
    Residual(&'a mut [f32]),
    /// `D(C(q))`, exactly what the servers decode from this push.
    Decoded(&'a mut [f32]),
    /// One error-feedback memory per block, which adds its compensation to `q` before
    /// compressing and updates itself (LoCo's int8 moving average, [`Feedback`]).
    Feedback(&'a mut [Feedback]),
}

/// Bytes one worker pushed and pulled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Payload bytes this worker has pushed to the servers.
    pub pushed: u64,
    /// Payload bytes this worker has pulled from the servers.
    pub pulled: u64,
}

/// One worker's end of the algorithms' rounds: its blocks registered as keys of a [`Collective`],
/// their codecs, and the traffic and contraction it measured.
pub struct Exchange {
    collective: Box<dyn Collective>,
    /// What was registered for each block.
    specs: Vec<KeySpec>,
    blocks: Vec<Block>,
    wire: Wire,
    push: Box<dyn Codec>,
    pull: Box<dyn Codec>,
    plain: Box<dyn Codec>,
    seed: u64,
    round: u64,
    /// Everything this worker has sent and received so far.
    pub traffic: Traffic,
    /// `1 - |r|² / |q|²` of the last push that kept its residual: the contraction δ the
    /// codec achieved on it (liec-sgd.md Table II).
    pub last_contraction: Option<f64>,
    /// Whether to measure the servers' contraction after each compressed round (needs
    /// [`Collective::server_error`]: in-process servers).
    pub measure_server: bool,
    /// `1 - |e|² / |v|²` of the servers' last compressed reply, `v = D(p) + e` with the error
    /// `e` the servers kept, when measured.
    pub last_server_contraction: Option<f64>,
}

impl Exchange {
    /// Registers one key per block with `wire`'s rules.
    pub fn new(
        mut collective: Box<dyn Collective>,
        blocks: Vec<Block>,
        wire: &Wire,
        seed: u64,
    ) -> Result<Self> {
        let specs: Vec<KeySpec> = blocks.iter().map(|b| wire.key_spec(b, seed)).collect();
        if blocks.iter().any(|b| b.len > u32::MAX as usize) {
            return Err(Error::Config(
                "a block holds more than 2^32 elements".into(),
            ));
        }
        collective.register(&specs)?;
        Ok(Exchange {
            collective,
            specs,
            push: parse(&wire.push)?,
            pull: parse(&wire.pull)?,
            plain: parse(PLAIN)?,
            blocks,
            wire: wire.clone(),
            seed,
            round: 0,
            traffic: Traffic::default(),
            last_contraction: None,
            measure_server: false,
            last_server_contraction: None,
        })
    }

    /// This worker's rank in the collective, below [`Exchange::world`].
    pub fn rank(&self) -> usize {
        self.collective.rank()
    }

    /// Number of workers in the collective.
    pub fn world(&self) -> usize {
        self.collective.world()
    }

    /// The blocks of the flat vector, one per registered key, in registration order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// What every peer registered for each block, in block order.
    pub fn key_specs(&self) -> &[KeySpec] {
        &self.specs
    }

    /// Elements of the flat vector.
    pub fn len(&self) -> usize {
        self.blocks.iter().map(|b| b.len).sum()
    }

    /// Whether the blocks hold no elements at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rounds completed.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Whether the next round is a sync round (plain f32 both ways, server memory flushed).
    pub fn is_sync(&self) -> bool {
        is_sync_round(self.wire.sync_every, self.round)
    }

    /// Whether the next round is the parameter round of servers that own the parameters:
    /// the workers push their parameters in f32 and get the owners' back.
    pub fn is_param_round(&self) -> bool {
        is_param_round(&self.wire.owner, self.round)
    }

    /// One round: pushes `q` block by block (compressed, or plain in a sync or parameter
    /// round), keeping what `own` asks for, and returns the decoded reply.
    pub fn exchange(&mut self, q: &[f32], own: Own) -> Result<Vec<f32>> {
        self.round_with(q, own, None)
    }

    /// A round with servers that own the parameters (after the parameter round): every push
    /// starts with the step's hyperparameters, and the reply is the updated parameters.
    pub fn exchange_with_owners(
        &mut self,
        q: &[f32],
        own: Own,
        header: StepHeader,
    ) -> Result<Vec<f32>> {
        self.round_with(q, own, Some(header))
    }

    fn round_with(
        &mut self,
        q: &[f32],
        mut own: Own,
        header: Option<StepHeader>,
    ) -> Result<Vec<f32>> {
        let headed = !self.wire.owner.is_empty() && !self.is_param_round();
        if headed != header.is_some() {
            let why = if self.wire.owner.is_empty() {
                "servers that do not own the parameters take no step header"
            } else if self.is_param_round() {
                "the parameter round takes no step header"
            } else {
                "pushes to servers that own the parameters need a step header"
            };
            return Err(Error::Config(why.into()));
        }
        let n = self.len();
        let own_fits = match &own {
            Own::Nothing => true,
            Own::Residual(r) | Own::Decoded(r) => r.len() == n,
            Own::Feedback(f) => f.len() == self.blocks.len(),
        };
        if q.len() != n || !own_fits {
            return Err(Error::Shape {
                op: "exchange",
                detail: format!("{n} elements in the blocks, {} pushed", q.len()),
            });
        }
        let (sync, round, seed, rank) = (self.is_sync(), self.round, self.seed, self.rank());
        let plain_push = sync || self.is_param_round();
        let (compressed, plain): (&dyn Codec, &dyn Codec) = (&*self.push, &*self.plain);
        let push_of = |b: &Block| {
            if plain_push || b.plain {
                plain
            } else {
                compressed
            }
        };
        let (residual, decoded) = (
            matches!(own, Own::Residual(_)),
            matches!(own, Own::Decoded(_)),
        );
        // Pushes to owners start with the step header; framed where each push is encoded.
        let frame = |payload: Vec<u8>| match header {
            Some(h) => [&h.to_bytes()[..], &payload].concat(),
            None => payload,
        };
        let encoded: Vec<(Vec<u8>, Vec<f32>)> = if let Own::Feedback(memories) = &mut own {
            if plain_push {
                return Err(Error::Config(
                    "an error-feedback memory cannot take part in sync or parameter rounds".into(),
                ));
            }
            self.blocks
                .par_iter()
                .zip(memories.par_iter_mut())
                .map(|(b, m)| {
                    let ctx = codec_context(seed, round, b.key).sent_by(rank);
                    let payload = m.encode(&q[b.offset..b.offset + b.len], &ctx)?;
                    Ok((frame(payload), Vec::new()))
                })
                .collect::<Result<_>>()?
        } else {
            self.blocks
                .par_iter()
                .map(|b| {
                    let ctx = codec_context(seed, round, b.key).sent_by(rank);
                    let x = &q[b.offset..b.offset + b.len];
                    let mut kept = vec![0.0; if residual || decoded { b.len } else { 0 }];
                    let push = push_of(b);
                    let payload = if residual {
                        push.encode_residual(x, &ctx, &mut kept)?
                    } else {
                        push.encode(x, &ctx)
                    };
                    if decoded {
                        push.decode_into(&payload, &mut kept, &ctx, DecodeMode::Set)?;
                    }
                    Ok((frame(payload), kept))
                })
                .collect::<Result<_>>()?
        };
        let mut keys = Vec::with_capacity(self.blocks.len());
        for (b, (payload, _)) in self.blocks.iter().zip(&encoded) {
            self.traffic.pushed += payload.len() as u64;
            keys.push(b.key);
        }
        if let Own::Residual(out) | Own::Decoded(out) = own {
            for (b, (_, r)) in self.blocks.iter().zip(&encoded) {
                out[b.offset..b.offset + b.len].copy_from_slice(r);
            }
            if residual {
                let (sent, left) = (norm2(q), norm2(out));
                self.last_contraction = (sent > 0.0).then(|| 1.0 - left / sent);
            }
        }
        for (b, (payload, _)) in self.blocks.iter().zip(encoded) {
            self.collective.push(round, b.key, EQUAL_SHARES, payload)?;
        }
        let replies = self.collective.pull(round, &keys)?;
        let pull_of = |b: &Block| -> &dyn Codec {
            if sync || b.plain {
                &*self.plain
            } else {
                &*self.pull
            }
        };
        let mut out = vec![0.0f32; n];
        for (b, (key, reply)) in self.blocks.iter().zip(&replies) {
            if *key != b.key {
                return Err(Error::Data(format!(
                    "reply for key {key:#x} where {:#x} was expected",
                    b.key
                )));
            }
            self.traffic.pulled += reply.len() as u64;
            let ctx = codec_context(seed, round, b.key);
            pull_of(b).decode_into(
                reply,
                &mut out[b.offset..b.offset + b.len],
                &ctx,
                DecodeMode::Set,
            )?;
        }
        self.round += 1;
        let server_compresses = self.wire.server_memory != "none" && self.wire.pull != "f32";
        if self.measure_server && server_compresses && !sync {
            if let Some(e) = self.server_error() {
                let kept = norm2(&e);
                let whole: f64 = out
                    .iter()
                    .zip(&e)
                    .map(|(p, e)| ((p + e) as f64).powi(2))
                    .sum();
                self.last_server_contraction = (whole > 0.0).then(|| 1.0 - kept / whole);
            }
        }
        Ok(out)
    }

    /// The servers' error-feedback memory over the whole vector, where the servers live in
    /// this process (see [`Collective::server_error`]).
    pub fn server_error(&self) -> Option<Vec<f32>> {
        let mut out = vec![0.0f32; self.len()];
        for b in &self.blocks {
            let e = self.collective.server_error(b.key)?;
            out[b.offset..b.offset + b.len].copy_from_slice(&e);
        }
        Some(out)
    }
}
