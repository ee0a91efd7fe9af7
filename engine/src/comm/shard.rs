//! The arithmetic of a parameter-server shard for one key, shared by the in-process collective
//! and the QUIC servers so that both give the same bits.
//!
//! A round: every push is decoded (and thereby validated) when it arrives; when the round
//! closes, the decoded pushes are averaged in rank order, each weighted by the samples it
//! stands for ([`Push::samples`]; equal weights take the plain mean), compensated with the
//! server's memory, and encoded once with the pull codec: `Δ = mean + ẽ`, `p = C(Δ)`,
//! `ẽ = Δ − D(p)` (Algorithms 3 and 4 of byteps-clan.md). A server that owns the key's
//! parameters ([`owner`](super::owner)) instead steps its optimizer with the mean and replies
//! with the parameters.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::aggregate::{Aggregate, Aggregated};
use super::history::{Alignment, PushHistory};
use super::owner::{Owner, SavedOwner, StepHeader};
use super::push::Push;
use super::{codec_context, KeySpec, PLAIN};
use crate::compress::{build, parse, payload_log2s, rescaled, Codec, CodecContext, CodecSpec};
use crate::error::{Error, Result};
use crate::feedback::{Feedback, Memory, SavedMemory};
use crate::tensor::Device;

/// Decodes one push of a checked round (from [`KeyState::push_decoder`]).
#[derive(Clone)]
pub struct PushDecoder {
    codec: Arc<dyn Codec>,
    numel: usize,
    ctx: CodecContext,
    /// Whether the push starts with a [`StepHeader`].
    headed: bool,
}

/// The largest magnitude a pushed value may have. A round sums at most 65,536 pushes (ranks
/// are u16), each weighted by at most 1, so with every value below `f32::MAX / 2^17` no sum
/// of a round can reach infinity, even after rounding; finite pushes beyond it could, and an
/// infinite sum would be encoded as 0 (the codecs' non-finite rule), silently erasing the
/// key's update for everyone. No gradient or parameter comes near 2.6e33.
pub const MAX_PUSH_MAGNITUDE: f32 = f32::MAX / 131_072.0;

impl PushDecoder {
    /// Splits off the step header if the key expects one and decodes the rest with the push codec,
    /// as a push standing for `samples` training samples; fails on a malformed payload, and on a
    /// value beyond [`MAX_PUSH_MAGNITUDE`] (the push is refused, never summed).
    pub fn decode(&self, samples: u32, payload: &[u8]) -> Result<Push> {
        let (header, payload) = if self.headed {
            let (h, rest) = StepHeader::split(payload)?;
            (Some(h), rest)
        } else {
            (None, payload)
        };
        let values = self.codec.decode(payload, self.numel, &self.ctx)?;
        if let Some(i) = values.iter().position(|v| v.abs() > MAX_PUSH_MAGNITUDE) {
            return Err(Error::Data(format!(
                "value {i} of the push is {:e}: beyond ±{MAX_PUSH_MAGNITUDE:e}, where the \
                 round's sum could overflow",
                values[i]
            )));
        }
        Ok(Push {
            values,
            header,
            log2s: payload_log2s(self.codec.spec(), payload),
            samples,
        })
    }
}

/// One key's state on a parameter-server shard: its codecs, error-feedback memory, owned parameters
/// if any, and the decoded pushes of the open round.
pub struct KeyState {
    /// What the first peer registered for the key; every other registers the same, but for
    /// its push codec ([`KeyState::push_codec_of`]).
    pub spec: KeySpec,
    push: Arc<dyn Codec>,
    /// The push codecs of the ranks that push with another than the spec's (a worker on a
    /// slow link compresses harder): each push decodes with its sender's codec, and the
    /// replies stay one for all, so that the replicas stay identical.
    push_of: BTreeMap<usize, Arc<dyn Codec>>,
    /// The codec of both directions in sync rounds and of pushes in a parameter round.
    plain: Arc<dyn Codec>,
    pull: Feedback,
    /// Where the server owns the key's parameters.
    owner: Option<Owner>,
    /// The scale (`log2 s`) of the key's rescalable LoCo pushes so far: the spec's until a
    /// round's pushes come at another, which the key then moves to ([`KeyState::close`]).
    scale: Option<i32>,
    /// The step of the round now open.
    pub step: u64,
    /// Decoded pushes of this round by rank.
    pending: BTreeMap<usize, Push>,
    /// How the round's pushes are combined.
    rule: Aggregate,
    /// The pushes of the last closed round that stood far out ([`Aggregated::outliers`]).
    outliers: Vec<(usize, f32)>,
    /// Under a robust rule: each rank's pushes, decayed, and how the history of each rank of
    /// the last closed round points against the others' ([`super::history`]).
    history: PushHistory,
    alignment: Vec<(usize, Alignment)>,
}

impl KeyState {
    /// The state of a new key at step 0 whose rounds combine pushes by `rule`, failing if a
    /// codec or memory spec of `spec` does not parse.
    pub fn new(spec: KeySpec, rule: Aggregate) -> Result<Self> {
        let push: Arc<dyn Codec> = Arc::from(parse(&spec.push)?);
        let memory: Memory = spec.server_memory.parse()?;
        let pull = Feedback::new(
            parse(&spec.pull)?,
            memory,
            spec.numel as usize,
            &Device::Cpu,
        )?;
        let owner = if spec.owner.is_empty() {
            None
        } else if spec.server_memory != "none" || spec.sync_every != 0 {
            return Err(Error::Config(format!(
                "key {:#x}: a server that owns the parameters keeps no error memory and has no \
                 sync rounds",
                spec.key
            )));
        } else {
            Some(Owner::new(&spec.owner, spec.numel as usize)?)
        };
        let scale = push.spec().rescalable_log2s();
        let pull_fixed = matches!(
            pull.codec().spec(),
            CodecSpec::Loco {
                rescalable: false,
                ..
            }
        );
        if scale.is_some() && pull_fixed {
            return Err(Error::Config(format!(
                "key {:#x}: rescalable pushes need a reply codec that follows their scale (a \
                 rescalable LoCo, or one without a fixed scale), not {}",
                spec.key, spec.pull
            )));
        }
        Ok(KeyState {
            spec,
            scale,
            push,
            push_of: BTreeMap::new(),
            plain: Arc::from(parse(PLAIN)?),
            pull,
            owner,
            step: 0,
            pending: BTreeMap::new(),
            rule,
            outliers: Vec::new(),
            history: PushHistory::default(),
            alignment: Vec::new(),
        })
    }

    /// Checks that `rank` may push for `step` and returns what decodes that push; it needs no
    /// access to the state, so servers decode concurrent pushes in parallel, outside their
    /// locks, and [`KeyState::insert`] them afterwards.
    pub fn push_decoder(&self, rank: usize, step: u64) -> Result<PushDecoder> {
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
        let plain = self.spec.is_sync_round(step) || self.spec.is_param_round(step);
        let codec = if plain {
            &self.plain
        } else {
            self.push_of.get(&rank).unwrap_or(&self.push)
        };
        Ok(PushDecoder {
            codec: codec.clone(),
            numel: self.spec.numel as usize,
            ctx: codec_context(self.spec.seed, step, self.spec.key),
            headed: self.owner.is_some() && !plain,
        })
    }

    /// Lets `rank` push with `push` (a codec spec) instead of the key's codec, from its next
    /// push on. Any codec that decodes to the key's elements combines with the others' in the
    /// round, except where scales must agree: LoCo's codes, and pushes to an owner, keep the
    /// key's codec.
    pub fn push_codec_of(&mut self, rank: usize, push: &str) -> Result<()> {
        if push == self.spec.push {
            self.push_of.remove(&rank);
            return Ok(());
        }
        let codec: Arc<dyn Codec> = Arc::from(parse(push)?);
        let scaled = |spec: CodecSpec| matches!(spec, CodecSpec::Loco { .. });
        if scaled(codec.spec()) || scaled(self.push.spec()) || self.owner.is_some() {
            return Err(Error::Config(format!(
                "key {:#x}: rank {rank} pushes {push}, the key {}: a LoCo code's scale, or a \
                 push to an owner, must be the key's own",
                self.spec.key, self.spec.push
            )));
        }
        self.push_of.insert(rank, codec);
        Ok(())
    }

    /// The push codec `rank` pushes with.
    pub fn push_codec(&self, rank: usize) -> CodecSpec {
        self.push_of.get(&rank).unwrap_or(&self.push).spec()
    }

    /// Whether `rank` has pushed in the open round.
    pub fn has_pushed(&self, rank: usize) -> bool {
        self.pending.contains_key(&rank)
    }

    /// Keeps a decoded push of the open round (decoded with [`KeyState::push_decoder`]).
    /// Pushes to an owner must agree with the round's earlier ones: a push that does not is
    /// refused here, so it costs its sender and never the round.
    pub fn insert(&mut self, rank: usize, push: Push) -> Result<()> {
        if self.pending.contains_key(&rank) {
            return Err(Error::Data(format!(
                "key {:#x}: rank {rank} pushed twice in step {}",
                self.spec.key, self.step
            )));
        }
        if let Some(first) = self.pending.values().next() {
            if first.log2s != push.log2s {
                return Err(Error::Data(format!(
                    "key {:#x}: rank {rank} pushed at scale 2^{:?}, the ranks before it at \
                     2^{:?}: the workers' LoCo scales disagree",
                    self.spec.key, push.log2s, first.log2s
                )));
            }
        }
        if self.owner.is_some() {
            let param_round = self.spec.is_param_round(self.step);
            let agrees = match self.pending.values().next() {
                Some(first) => check_agreement(param_round, first, rank, &push),
                None if !param_round && push.header.is_none() => Err(unheaded(rank)),
                None => Ok(()),
            };
            agrees.map_err(|e| Error::Data(format!("key {:#x}: {e}", self.spec.key)))?;
        }
        self.pending.insert(rank, push);
        Ok(())
    }

    /// Weighs `rank`'s push of the open round as standing for `samples` samples, whatever
    /// it claimed (a shard that knows the rank's share better than the push does).
    pub fn reweigh(&mut self, rank: usize, samples: u32) {
        if let Some(push) = self.pending.get_mut(&rank) {
            push.samples = samples;
        }
    }

    /// Forgets a rank's push of the open round (the rank left or missed the deadline).
    pub fn discard(&mut self, rank: usize) {
        self.pending.remove(&rank);
    }

    /// Pushes received so far in the open round.
    pub fn count(&self) -> usize {
        self.pending.len()
    }

    /// Combines the pushes of the next rounds by `rule`.
    pub fn set_aggregate(&mut self, rule: Aggregate) {
        self.rule = rule;
    }

    /// The ranks whose pushes stood far out in the last round closed, with how far (see
    /// [`Aggregated::outliers`]); empty under the mean.
    pub fn outliers(&self) -> &[(usize, f32)] {
        &self.outliers
    }

    /// How the push history of each rank of the last closed round points against the other
    /// ranks' ([`super::history`]); empty under the mean.
    pub fn alignment(&self) -> &[(usize, Alignment)] {
        &self.alignment
    }

    /// The round's pushes combined by the key's rule; keeps the rule's outliers and, under a
    /// robust rule, the pushes' history.
    fn combine(&mut self, pending: BTreeMap<usize, Push>, numel: usize) -> Vec<f32> {
        if self.rule != Aggregate::Mean {
            self.alignment = self.history.record(&pending);
        }
        let Aggregated { values, outliers } = self.rule.combine(pending, numel);
        self.outliers = outliers;
        values
    }

    /// Closes the round: the reply every rank receives, and opens the next round, whatever
    /// happens. Should the round's arithmetic fail (an internal fault: the shard checked every
    /// push as it arrived), the key still closes, with an update that changes nothing (zeros, or
    /// an owner's parameters as they were), and the error comes back beside that reply: every
    /// rank then receives the same bytes and the key stays in step with the shard's other keys.
    pub fn close_or_skip(&mut self) -> (Vec<u8>, Option<Error>) {
        let step = self.step;
        match self.close() {
            Ok(reply) => (reply, None),
            Err(e) => {
                let ctx = codec_context(self.spec.seed, step, self.spec.key);
                let numel = self.spec.numel as usize;
                let codec = if self.spec.is_sync_round(step) {
                    &*self.plain
                } else {
                    self.pull.codec()
                };
                let unchanged = match self.owner.as_ref().and_then(|o| o.master()) {
                    Some(params) => codec.encode(params, &ctx),
                    None => codec.encode(&vec![0.0; numel], &ctx),
                };
                self.step = step + 1;
                (unchanged, Some(e))
            }
        }
    }

    /// Closes the round: the reply every rank receives. Opens the next round (the step advances
    /// only once the reply exists; the round's pushes are consumed either way).
    pub fn close(&mut self) -> Result<Vec<u8>> {
        #[cfg(any(test, feature = "test-faults"))]
        if self.spec.key == FAILING_KEY_FOR_TESTS {
            self.pending.clear();
            return Err(Error::Data("the test's key fails to close".into()));
        }
        let pending = std::mem::take(&mut self.pending);
        let round_scale = pending.values().next().and_then(|p| p.log2s);
        if let (Some(now), Some(new)) = (self.scale, round_scale) {
            if new != now {
                self.rescale(new - now)?;
                self.scale = Some(new);
            }
        }
        let (step, numel) = (self.step, self.spec.numel as usize);
        let ctx = codec_context(self.spec.seed, step, self.spec.key);
        let reply = if let Some(owner) = &mut self.owner {
            // The pushes agree (checked as they arrived): the first speaks for all.
            let header = pending.values().next().and_then(|p| p.header);
            let params = if step == 0 {
                let first = pending.into_values().next().ok_or_else(|| {
                    Error::Data("the parameter round closed without parameters".into())
                })?;
                owner.adopt(first.values)
            } else {
                let header = header.ok_or_else(|| {
                    Error::Data(format!(
                        "key {:#x}: round {step} closed without pushes",
                        self.spec.key
                    ))
                })?;
                let update = self.combine(pending, numel);
                self.owner
                    .as_mut()
                    .expect("an owner")
                    .step(&update, header)?
            };
            self.pull.encode(params, &ctx)?
        } else if self.spec.is_sync_round(step) {
            let mut mean = self.combine(pending, numel);
            self.pull.flush_into(&mut mean)?;
            self.plain.encode(&mean, &ctx)
        } else {
            let update = self.combine(pending, numel);
            self.pull.encode(&update, &ctx)?
        };
        self.step += 1;
        Ok(reply)
    }

    /// Moves the reply codec's scale, and its memory's, by `2^shift`: the pushes of the
    /// round came at a scale that far from the last (a recalibration on the workers).
    fn rescale(&mut self, shift: i32) -> Result<()> {
        let pull = match self.pull.codec().spec() {
            CodecSpec::Loco { log2s, .. } => {
                let log2s = log2s + shift;
                if !(-100..=100).contains(&log2s) {
                    return Err(Error::Data(format!(
                        "key {:#x}: the reply scale would move to 2^{log2s}, past LoCo's range",
                        self.spec.key
                    )));
                }
                rescaled(self.pull.codec().spec(), log2s)
            }
            other => other,
        };
        self.pull.rescale(build(pull), shift)
    }

    /// What the key keeps between rounds (not the open round's pushes): a durable server
    /// writes it before it replies to a round.
    pub fn saved(&self) -> Result<SavedKey> {
        Ok(SavedKey {
            step: self.step,
            scale: self.scale,
            memory: self.pull.saved()?,
            owner: self.owner.as_ref().map(Owner::saved),
        })
    }

    /// The key `spec` as [`KeyState::saved`] left it, with no push of its open round: what a
    /// restarted server resumes from, combining by `rule`. A state that does not fit the spec
    /// is an error.
    pub fn restore(spec: KeySpec, rule: Aggregate, saved: SavedKey) -> Result<Self> {
        let key = spec.key;
        let mut state = KeyState::new(spec, rule)?;
        let mismatch = |what: &str| Error::Data(format!("key {key:#x}: the saved {what}"));
        if let (Some(now), Some(then)) = (state.scale, saved.scale) {
            if !(-100..=100).contains(&then) {
                return Err(mismatch("scale is past LoCo's range"));
            }
            if then != now {
                state.rescale(then - now)?;
            }
        } else if state.scale.is_some() != saved.scale.is_some() {
            return Err(mismatch("scale belongs to another codec"));
        }
        state.scale = saved.scale;
        state.pull.restore(saved.memory)?;
        match (&mut state.owner, saved.owner) {
            (Some(owner), Some(o)) => owner.restore(o)?,
            (None, None) => {}
            _ => return Err(mismatch("parameters belong to another kind of key")),
        }
        state.step = saved.step;
        Ok(state)
    }

    /// The parameters the server owns (an owned key after its parameter round).
    pub fn owned_params(&self) -> Option<&[f32]> {
        self.owner.as_ref()?.master()
    }

    /// The server's error-feedback memory (zeros where it keeps none).
    pub fn server_error(&self) -> Result<Vec<f32>> {
        self.pull.error()
    }
}

/// What a key keeps between rounds ([`KeyState::saved`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedKey {
    /// The open round.
    pub step: u64,
    /// The scale of its rescalable LoCo pushes so far.
    pub scale: Option<i32>,
    /// The server's error-feedback memory.
    pub memory: SavedMemory,
    /// What the server keeps of parameters it owns.
    pub owner: Option<SavedOwner>,
}

/// A key whose close always fails, for the tests of what the shard does then.
#[cfg(any(test, feature = "test-faults"))]
pub const FAILING_KEY_FOR_TESTS: super::Key = 0xdead_0000;

/// Whether `push` (from `rank`) agrees with `first`, a push of the same round to an owner: the
/// same parameter bits in the parameter round, the same step header after it.
pub fn check_agreement(param_round: bool, first: &Push, rank: usize, push: &Push) -> Result<()> {
    if param_round {
        let same_bits = push
            .values
            .iter()
            .zip(&first.values)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same_bits {
            return Err(Error::Data(format!(
                "rank {rank} starts from other parameters than the ranks before it; every \
                 worker must start from the same model (same seed)"
            )));
        }
        return Ok(());
    }
    match (push.header, first.header) {
        (Some(h), Some(f)) if h == f => Ok(()),
        (Some(h), Some(f)) => Err(Error::Data(format!(
            "rank {rank} steps with learning rate {} and weight decay {}, the ranks before it \
             with {} and {}: the workers' schedules disagree",
            h.lr, h.weight_decay, f.lr, f.weight_decay
        ))),
        _ => Err(unheaded(rank)),
    }
}

fn unheaded(rank: usize) -> Error {
    Error::Data(format!("rank {rank}'s push to an owner has no step header"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Key;

    /// A key of 2 elements in f32 both ways, owned with `owner` (empty: not owned).
    fn plain_key(key: Key, owner: &str) -> KeyState {
        KeyState::new(
            KeySpec {
                key,
                numel: 2,
                push: "f32".into(),
                pull: "f32".into(),
                server_memory: "none".into(),
                seed: 0,
                sync_every: 0,
                owner: owner.into(),
            },
            Aggregate::Mean,
        )
        .unwrap()
    }

    fn push(values: &[f32], header: Option<StepHeader>) -> Push {
        weighed(values, 1, header)
    }

    fn weighed(values: &[f32], samples: u32, header: Option<StepHeader>) -> Push {
        Push {
            values: values.to_vec(),
            header,
            log2s: None,
            samples,
        }
    }

    /// A round of an unowned f32 key with one push per `(values, samples)`, rank by rank: the
    /// mean it replies with.
    fn mean_of(pushes: &[(&[f32], u32)]) -> Vec<f32> {
        let mut key = plain_key(1, "");
        for (rank, (values, samples)) in pushes.iter().enumerate() {
            key.insert(rank, weighed(values, *samples, None)).unwrap();
        }
        f32s(&key.close().unwrap())
    }

    /// Pushes weigh by the samples they stand for: a rank whose share was three times
    /// another's counts three times as much, a push of no samples adds nothing, and pushes of equal samples keep the plain mean, bit for bit.
    #[test]
    fn pushes_weigh_by_the_samples_they_stand_for() {
        assert_eq!(mean_of(&[(&[4.0, -8.0], 3), (&[8.0, 4.0], 1)]), [5.0, -5.0]);
        assert_eq!(
            mean_of(&[(&[4.0, 1.0], 2), (&[1e30, -1e30], 0), (&[2.0, 3.0], 2)]),
            [3.0, 2.0],
            "equal weights but one: the zero-sample push is left out"
        );
        assert_eq!(mean_of(&[(&[1.0, 2.0], 5), (&[1e30, 7.0], 0)]), [1.0, 2.0]);
        // Equal weights, whatever they are, give the plain mean's bits: the sum in rank order
        // times 1/count, not a sum of products.
        let values: [&[f32]; 3] = [&[0.1, 1e-8], &[0.7, 3.3], &[0.2, -2.9]];
        let plain: Vec<f32> = {
            let scale = 1.0f32 / 3.0;
            (0..2)
                .map(|i| (values[0][i] + values[1][i] + values[2][i]) * scale)
                .collect()
        };
        for n in [0, 1, 64] {
            let pushes: Vec<(&[f32], u32)> = values.iter().map(|v| (*v, n)).collect();
            assert_eq!(mean_of(&pushes), plain, "{n} samples each");
        }
    }

    /// Two colluding ranks push finite values whose sum overflows f32: summed, the infinity
    /// would be encoded as 0 and the key's update silently lost. Their pushes are refused as
    /// they are decoded, saying why; pushes at the limit, from many ranks, sum to finite values.
    #[test]
    fn pushes_that_could_overflow_the_sum_are_refused_not_zeroed() {
        let huge = [3e38f32, 1.0];
        let mut summed = plain_key(1, "");
        summed.insert(0, push(&huge, None)).unwrap();
        summed.insert(1, push(&huge, None)).unwrap();
        assert_eq!(
            f32s(&summed.close().unwrap()),
            [0.0, 1.0],
            "the hazard: an overflowing sum encodes as 0"
        );
        let key = plain_key(1, "");
        let encoded = |values: &[f32]| {
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        let err = key
            .push_decoder(0, 0)
            .unwrap()
            .decode(1, &encoded(&huge))
            .unwrap_err()
            .to_string();
        assert!(err.contains("value 0 of the push is 3e38"), "{err}");
        assert!(err.contains("overflow"), "{err}");
        let mut at_limit = plain_key(1, "");
        let edge = [MAX_PUSH_MAGNITUDE, -MAX_PUSH_MAGNITUDE];
        for rank in 0..1000 {
            let decoded = at_limit
                .push_decoder(rank, 0)
                .unwrap()
                .decode(1, &encoded(&edge))
                .unwrap();
            at_limit.insert(rank, decoded).unwrap();
        }
        let mean = f32s(&at_limit.close().unwrap());
        assert!(
            mean.iter().all(|m| m.is_finite() && m.abs() > 1e33),
            "{mean:?}"
        );
    }

    /// An f32 reply's values.
    fn f32s(reply: &[u8]) -> Vec<f32> {
        reply
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_rank_may_push_another_codec_but_not_another_loco_scale() {
        let spec = |push: &str| KeySpec {
            key: 3,
            numel: 8,
            push: push.into(),
            pull: "f32".into(),
            server_memory: "none".into(),
            seed: 1,
            sync_every: 0,
            owner: String::new(),
        };
        let mut key = KeyState::new(spec("topk:0.5"), Aggregate::Mean).unwrap();
        key.push_codec_of(1, "topk:0.25").unwrap();
        assert_eq!(key.push_codec(1).to_string(), "topk:0.25");
        assert_eq!(key.push_codec(0).to_string(), "topk:0.5");
        // Back to the key's own.
        key.push_codec_of(1, "topk:0.5").unwrap();
        assert_eq!(key.push_codec(1).to_string(), "topk:0.5");
        assert!(key.push_codec_of(1, "no such codec").is_err());
        assert!(key.push_codec_of(1, "loco:bits=4:log2s=3").is_err());
        let mut loco = KeyState::new(spec("loco:bits=4:log2s=3"), Aggregate::Mean).unwrap();
        assert!(loco.push_codec_of(1, "loco:bits=4:log2s=5").is_err());
        assert!(loco.push_codec_of(1, "loco:bits=4:log2s=3").is_ok());
    }

    #[test]
    fn a_restored_key_closes_its_next_rounds_as_the_original_does() {
        use crate::compress::build;
        let spec = |push: &str, pull: &str, memory: &str, owner: &str| KeySpec {
            key: 3,
            numel: 5,
            push: push.into(),
            pull: pull.into(),
            server_memory: memory.into(),
            seed: 7,
            sync_every: 0,
            owner: owner.into(),
        };
        let rescalable: CodecSpec = "loco:bits=4:log2s=4:rescalable".parse().unwrap();
        let specs = [
            spec("topk:0.4", "sign", "ef", ""),
            spec(
                &rescalable.to_string(),
                "loco:bits=8:log2s=5:rescalable",
                "loco-ema:beta=0.5:se=64",
                "",
            ),
            spec("f32", "f32", "none", "adamw"),
        ];
        let header = StepHeader {
            lr: 0.1,
            weight_decay: 0.01,
        };
        for spec in specs {
            let owned = !spec.owner.is_empty();
            // Round `step`'s pushes: the rescalable codec moves to 2^6 from round 1 on.
            let payload = |step: u64, rank: usize| {
                let g: Vec<f32> = (0..5)
                    .map(|i| ((i + 3 * rank + 5 * step as usize) as f32).sin())
                    .collect();
                let codec = if spec.push.contains("rescalable") {
                    build(rescaled(rescalable, if step == 0 { 4 } else { 6 }))
                } else {
                    parse(&spec.push).unwrap()
                };
                let mut bytes = if owned && step > 0 {
                    header.to_bytes().to_vec()
                } else {
                    Vec::new()
                };
                bytes.extend(codec.encode(&g, &codec_context(7, step, 3)));
                bytes
            };
            let round = |key: &mut KeyState, step: u64| {
                for rank in 0..2 {
                    let decoder = key.push_decoder(rank, step).unwrap();
                    let p = if owned && step == 0 {
                        payload(0, 0)
                    } else {
                        payload(step, rank)
                    };
                    key.insert(rank, decoder.decode(1, &p).unwrap()).unwrap();
                }
                key.close().unwrap()
            };
            let mut original = KeyState::new(spec.clone(), Aggregate::Mean).unwrap();
            for step in 0..2 {
                round(&mut original, step);
            }
            let mut restored =
                KeyState::restore(spec.clone(), Aggregate::Mean, original.saved().unwrap())
                    .unwrap();
            for step in 2..4 {
                assert_eq!(
                    round(&mut original, step),
                    round(&mut restored, step),
                    "{} round {step}",
                    spec.push
                );
            }
            assert_eq!(original.saved().unwrap(), restored.saved().unwrap());
            // A state saved for another key is refused.
            let other = KeyState::new(spec.clone(), Aggregate::Mean)
                .unwrap()
                .saved()
                .unwrap();
            let mut wrong = other.clone();
            wrong.memory.residual = vec![0.0; 4];
            wrong.memory.codes = vec![0; 4];
            assert!(KeyState::restore(spec.clone(), Aggregate::Mean, wrong).is_err());
        }
    }

    #[test]
    fn rescalable_loco_keys_follow_the_scale_of_their_pushes() {
        use crate::compress::build;
        let spec: CodecSpec = "loco:bits=4:log2s=4:rescalable".parse().unwrap();
        let mut key = KeyState::new(
            KeySpec {
                key: 1,
                numel: 4,
                push: spec.to_string(),
                pull: "loco:bits=8:log2s=5:rescalable".into(),
                server_memory: "loco-ema:beta=1:se=64".into(),
                seed: 0,
                sync_every: 0,
                owner: String::new(),
            },
            Aggregate::Mean,
        )
        .unwrap();
        let g = [0.3f32, -0.2, 0.05, 0.0];
        let ctx = |step| codec_context(0, step, 1);
        let round = |key: &mut KeyState, log2s: i32, step: u64| {
            let payload = build(rescaled(spec, log2s)).encode(&g, &ctx(step));
            for rank in 0..2 {
                let push = key
                    .push_decoder(rank, step)
                    .unwrap()
                    .decode(1, &payload)
                    .unwrap();
                key.insert(rank, push).unwrap();
            }
            key.close().unwrap()
        };
        // At the registered scale, the reply comes at 2^5 and the memory at s_e = 64.
        let reply = round(&mut key, 4, 0);
        assert_eq!(payload_log2s(key.pull.codec().spec(), &reply), Some(5));
        // Pushes at 2^7 (a recalibration): the reply follows to 2^8, the memory to s_e = 512.
        let spec_now = key.pull.codec().spec();
        let reply = round(&mut key, 7, 1);
        assert_eq!(payload_log2s(spec_now, &reply), Some(8));
        assert!(matches!(key.pull.memory(), Memory::LocoEma { se, .. } if se == 512.0));
        // A rank at another scale than the round's first is refused, and costs only itself.
        let at = |log2s| build(rescaled(spec, log2s)).encode(&g, &ctx(2));
        let first = key.push_decoder(0, 2).unwrap().decode(1, &at(7)).unwrap();
        key.insert(0, first).unwrap();
        let odd = key.push_decoder(1, 2).unwrap().decode(1, &at(6)).unwrap();
        let refused = key.insert(1, odd).unwrap_err().to_string();
        assert!(refused.contains("scales disagree"), "{refused}");
        assert_eq!(key.count(), 1);
    }

    #[test]
    fn a_second_push_of_a_rank_in_one_round_is_refused_not_overwritten() {
        let mut state = plain_key(7, "");
        state.insert(0, push(&[1.0, 2.0], None)).unwrap();
        assert!(state.push_decoder(0, 0).is_err());
        assert!(state.insert(0, push(&[9.0, 9.0], None)).is_err());
        state.insert(1, push(&[3.0, 4.0], None)).unwrap();
        let reply = state.close().unwrap();
        assert_eq!(
            f32s(&reply),
            [2.0, 3.0],
            "the first push counts, the second is dropped"
        );
    }

    #[test]
    fn a_push_that_disagrees_with_an_owner_costs_its_sender_not_the_round() {
        let mut state = plain_key(9, "sgd");
        // The parameter round: rank 2 starts elsewhere and is refused.
        state.insert(0, push(&[1.0, 2.0], None)).unwrap();
        state.insert(1, push(&[1.0, 2.0], None)).unwrap();
        assert!(state.insert(2, push(&[1.0, 3.0], None)).is_err());
        assert_eq!(f32s(&state.close().unwrap()), [1.0, 2.0]);
        // A step: rank 1's schedule disagrees, rank 2 sends no header; rank 0's step stands.
        let header = StepHeader {
            lr: 0.5,
            weight_decay: 0.0,
        };
        assert!(state.insert(2, push(&[4.0, 4.0], None)).is_err());
        state.insert(0, push(&[2.0, -2.0], Some(header))).unwrap();
        let faster = StepHeader { lr: 1.0, ..header };
        assert!(state.insert(1, push(&[0.0, 0.0], Some(faster))).is_err());
        assert_eq!(f32s(&state.close().unwrap()), [0.0, 3.0]);
        assert_eq!(state.step, 2);
        // A round that closes without pushes is an error and does not advance.
        assert!(state.close().is_err());
        assert_eq!(state.step, 2);
    }

    #[test]
    fn pushes_to_an_owner_agree_on_the_parameter_bits_then_on_the_header() {
        let header = StepHeader {
            lr: 0.5,
            weight_decay: 0.0,
        };
        let first = push(&[1.0, 2.0], None);
        assert!(check_agreement(true, &first, 1, &push(&[1.0, 2.0], None)).is_ok());
        let other = check_agreement(true, &first, 1, &push(&[1.0, 2.5], None));
        assert!(other.unwrap_err().to_string().contains("rank 1"));
        let negative_zero = push(&[1.0, -0.0], None);
        assert!(check_agreement(true, &push(&[1.0, 0.0], None), 2, &negative_zero).is_err());
        let stepped = push(&[0.0; 2], Some(header));
        let faster = push(&[0.0; 2], Some(StepHeader { lr: 0.4, ..header }));
        assert!(check_agreement(false, &stepped, 3, &stepped.clone()).is_ok());
        let e = check_agreement(false, &stepped, 3, &faster).unwrap_err();
        assert!(e.to_string().contains("rank 3"), "{e}");
        assert!(check_agreement(false, &stepped, 3, &push(&[0.0; 2], None)).is_err());
    }
}
