//! Data-parallel training through a [`Collective`]: every rank computes gradients on its slice
//! of the global batch, pushes them compressed (with its error-feedback memory) partition by
//! partition, and applies the servers' averaged reply with its optimizer. All ranks apply the
//! same reply bytes, so their replicas stay bit-identical, in-process or over QUIC.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::outer::{OuterConfig, OuterRounds};
use super::push_pipeline::PushPipeline;
use super::{Classifier, Learner};
use crate::comm::partition::{Partition, PartitionPlan};
use crate::comm::{codec_context, Collective, Key, KeySpec};
use crate::compress::{build, parse, payload_log2s, rescaled, Codec, CodecSpec, DecodeMode};
use crate::error::{Error, Result};
use crate::feedback::{Feedback, Memory, SavedMemory};
use crate::tensor::{Device, Tensor};

/// Bytes one rank sent and received in one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundBytes {
    /// Payload bytes pushed to the servers.
    pub pushed: usize,
    /// Payload bytes pulled from the servers.
    pub pulled: usize,
    /// What the same samples cost in f32 each way when ranks exchange gradients every step:
    /// one exchange a round, or one per local step where rounds are outer rounds (the
    /// step-wise f32 data parallelism local steps are measured against).
    pub f32_each_way: usize,
}

/// How the last round's codes sat: LoCo's diagnostics (loco.md §7.2, §7.5), per round.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CodeStats {
    /// Fraction of the pushed fixed-scale (LoCo) codes at either end of their range: a scale s
    /// too large clips most of them. `None` where no partition travels as LoCo codes.
    pub saturated: Option<f64>,
    /// Fraction of the error-feedback memory's entries that are nonzero: an error stuck at
    /// zero means the memory does nothing (s too small for s_e), one nonzero almost everywhere
    /// that it is pinned at its limit. `None` without error feedback.
    pub error_nonzero: Option<f64>,
}

/// One rank of data-parallel training: its replica (a classifier or the language model, with
/// its optimizer) and the collective it exchanges compressed gradients through, partition by
/// partition.
pub struct DataParallel<C: Collective, M: Learner = Classifier> {
    /// This rank's replica, bit-identical on every rank whatever its device (its optimizer
    /// steps on the CPU).
    pub replica: M,
    /// The collective the rank pushes and pulls through.
    pub collective: C,
    parts: Arc<[Partition]>,
    memories: Vec<Feedback>,
    /// The last round's code statistics.
    codes: CodeStats,
    pulls: Vec<Box<dyn Codec>>,
    seed: u64,
    /// The partitions' keys, in push order.
    keys: Vec<Key>,
    /// What was registered with the collective, to register again with a new one.
    specs: Vec<KeySpec>,
    /// Shapes of the model's parameters, for the averaged gradients.
    shapes: Vec<Vec<usize>>,
    /// The round pushed last whose replies have not been applied yet.
    unanswered: Option<Unanswered>,
    /// The round whose replies were applied last, with what this rank pushed in it (for
    /// [`DataParallel::take_back_late_pushes`]).
    answered: Option<Unanswered>,
    /// The emulated device this rank computes on, if any ([`DataParallel::emulate_device`]).
    device: Option<EmulatedDevice>,
    /// What an attacker does to its gradients before it encodes them ([`DataParallel::tamper_with`]).
    tamper: Option<Tamper>,
    /// The outer loop, when rounds are outer rounds of local steps
    /// ([`DataParallel::take_local_steps`]).
    outer: Option<OuterRounds>,
    /// How the last round's time went.
    timing: RoundTiming,
}

/// A function of the round and the rank's gradients (one vector per parameter tensor) that
/// changes them before they are encoded.
pub type Tamper = Box<dyn FnMut(u64, &mut [Vec<f32>]) + Send>;

/// A device of a set speed, emulated on whatever computes ([`DataParallel::emulate_device`]).
#[derive(Debug, Clone, Copy)]
struct EmulatedDevice {
    /// Seconds one sample's gradients take on it.
    seconds_per_sample: f64,
    /// Rounds whose real compute took longer than the emulated device would have.
    overruns: u64,
}

/// How one round's time went on a rank: computing its gradients, and communicating (from
/// its first push to the replies), part of which ran while the gradients were still being
/// computed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundTiming {
    /// From the round's start to the last gradient on the host (local steps included in an
    /// outer round; zero where the round computed nothing).
    pub computing: Duration,
    computed_at: Option<Instant>,
    first_push: Option<Instant>,
    replied_at: Option<Instant>,
}

impl RoundTiming {
    /// From the first push to the last reply: what the round spent communicating (waiting
    /// for the other workers and the servers included).
    pub fn communicating(&self) -> Duration {
        match (self.first_push, self.replied_at) {
            (Some(pushed), Some(replied)) => replied.saturating_duration_since(pushed),
            _ => Duration::ZERO,
        }
    }

    /// The part of [`RoundTiming::communicating`] that ran while gradients were still being
    /// computed: hidden behind the backward pass.
    pub fn hidden(&self) -> Duration {
        match (self.first_push, self.computed_at) {
            (Some(pushed), Some(computed)) => computed
                .saturating_duration_since(pushed)
                .min(self.communicating()),
            _ => Duration::ZERO,
        }
    }
}

/// A round this rank pushed, kept until its replies are applied: should they never come (a
/// shard was lost), the round is pushed again with the same bytes. Encoding again would move
/// the error-feedback memories a second time; the same bytes give the round the bits it would
/// have had had nothing failed.
struct Unanswered {
    step: u64,
    loss: f32,
    samples: u32,
    pushes: Vec<(Key, Vec<u8>)>,
}

/// The slowest device [`DataParallel::emulate_device`] emulates: ten seconds a sample.
pub const MAX_EMULATED_SECONDS_PER_SAMPLE: f64 = 10.0;

/// Refuses a gradient with non-finite values ([`Error::NonFinite`]): the codecs would send them
/// as zeros (their encoders read a non-finite value as zero), hiding the fault. `grads` are
/// the parameter tensors from `first_tensor` on.
fn check_finite(grads: &[Vec<f32>], first_tensor: usize, round: u64) -> Result<()> {
    use rayon::prelude::*;
    let counts: Vec<usize> = grads
        .par_iter()
        .map(|g| g.iter().filter(|v| !v.is_finite()).count())
        .collect();
    match counts.iter().position(|&c| c > 0) {
        None => Ok(()),
        Some(tensor) => Err(Error::NonFinite {
            round,
            count: counts.iter().sum(),
            tensor: first_tensor + tensor,
        }),
    }
}

impl<C: Collective, M: Learner> DataParallel<C, M> {
    /// Registers the model's partitions with the collective. `worker_memory` is the error
    /// feedback of compressed partitions on this rank (`none`, `ef`, `loco-ema...`).
    /// The replica's optimizer steps on the CPU from here on ([`Learner::update_on_cpu`]), so
    /// that ranks on different devices stay bit-identical.
    pub fn new(
        mut replica: M,
        mut collective: C,
        plan: &PartitionPlan,
        worker_memory: &str,
    ) -> Result<Self> {
        replica.update_on_cpu()?;
        let sizes: Vec<usize> = replica.parameters().iter().map(|p| p.numel()).collect();
        let parts = plan.partitions(&sizes);
        let specs = plan.key_specs(&parts);
        collective.register(&specs)?;
        let memory: Memory = worker_memory.parse()?;
        let memories = parts
            .iter()
            .zip(&specs)
            .map(|(p, s)| {
                Feedback::new(
                    parse(&s.push)?,
                    if p.compressed { memory } else { Memory::None },
                    p.len,
                    &Device::Cpu,
                )
            })
            .collect::<Result<_>>()?;
        let pulls = specs
            .iter()
            .map(|s| parse(&s.pull))
            .collect::<Result<_>>()?;
        let keys = parts.iter().map(|p| p.key).collect();
        let shapes = replica
            .parameters()
            .iter()
            .map(|p| p.shape().to_vec())
            .collect();
        Ok(DataParallel {
            replica,
            collective,
            parts: parts.into(),
            memories,
            codes: CodeStats::default(),
            pulls,
            seed: plan.seed,
            keys,
            specs,
            shapes,
            unanswered: None,
            answered: None,
            device: None,
            tamper: None,
            outer: None,
            timing: RoundTiming::default(),
        })
    }

    /// Makes every round an outer round of `config.local_steps` local optimizer steps on the
    /// rank's share, whose pseudo-gradient is pushed and whose aggregate an outer optimizer
    /// applies ([`OuterRounds`]). Called before the first round, on every rank of the job.
    pub fn take_local_steps(&mut self, config: OuterConfig) -> Result<()> {
        if self.round() != 0 || self.unanswered.is_some() {
            return Err(Error::Config(
                "local steps are chosen before the first round".into(),
            ));
        }
        let parameters = Tensor::read_many(&self.replica.parameters())?;
        self.outer = Some(OuterRounds::new(config, parameters, &self.shapes)?);
        Ok(())
    }

    /// The outer loop's settings, when rounds are outer rounds.
    pub fn local_steps(&self) -> Option<OuterConfig> {
        self.outer.as_ref().map(OuterRounds::config)
    }

    /// Rounds completed: with outer rounds, those the outer loop played; else one optimizer
    /// step each, so the replica's step count (which a snapshot carries).
    pub fn round(&self) -> u64 {
        match &self.outer {
            Some(outer) => outer.rounds(),
            None => self.replica.steps(),
        }
    }

    /// The digest of the parameters every replica shares at a round's start, which the
    /// replicas compare: the replica's own, or with outer rounds the round's anchor (which
    /// the replica holds too, unless a failed round left it mid-way through its local steps).
    pub fn parameter_digest(&self) -> Result<u64> {
        match &self.outer {
            Some(outer) => outer.digest(),
            None => self.replica.parameter_digest(),
        }
    }

    /// The state a snapshot carries, taken between rounds: the replica's checkpoint, with the
    /// outer loop's state where rounds are outer rounds ([`OuterRounds::save_into`]).
    pub fn save_state(&self) -> Result<Vec<u8>> {
        let replica = self.replica.save_state()?;
        match &self.outer {
            Some(outer) => outer.save_into(&replica),
            None => Ok(replica),
        }
    }

    /// Replaces parameters and optimizer state with a snapshot taken after `step` rounds (what
    /// a rejoining rank starts from before replaying later rounds): bytes of
    /// [`DataParallel::save_state`].
    pub fn restore(&mut self, snapshot: &[u8], step: u64) -> Result<()> {
        self.load_state(snapshot)?;
        if self.round() != step {
            return Err(Error::Data(format!(
                "the snapshot of round {step} holds a model after {} rounds",
                self.round()
            )));
        }
        Ok(())
    }

    /// Replaces parameters and optimizer state (and the outer loop's) with bytes of
    /// [`DataParallel::save_state`], of whichever round.
    pub fn load_state(&mut self, snapshot: &[u8]) -> Result<()> {
        match &mut self.outer {
            Some(outer) => {
                let (replica, saved) = OuterRounds::split(snapshot)?;
                self.replica.load_state(&replica)?;
                let parameters = Tensor::read_many(&self.replica.parameters())?;
                outer.restore(saved, parameters)?;
            }
            None => self.replica.load_state(snapshot)?,
        }
        Ok(())
    }

    /// Registers the model's partitions with `collective` and trains through it from now on,
    /// keeping parameters, optimizer state and error-feedback memories: how a worker that
    /// left the rounds (paused, or lost its link) comes back. The old collective is dropped.
    pub fn reconnect(&mut self, mut collective: C) -> Result<()> {
        collective.register(&self.specs)?;
        self.collective = collective;
        Ok(())
    }

    /// Pulls and applies the replies of the round this rank is at, without pushing: how a
    /// rejoining rank replays logged rounds.
    pub fn replay_round(&mut self) -> Result<()> {
        let replies = self.collective.pull(self.round(), &self.keys)?;
        self.apply_replies(&replies)
    }

    /// This rank's error-feedback memories, partition by partition: with the classifier's
    /// state, what a worker keeps in its own state file to come back without loss.
    pub fn saved_memories(&self) -> Result<Vec<SavedMemory>> {
        self.memories.iter().map(Feedback::saved).collect()
    }

    /// Takes back memories from [`DataParallel::saved_memories`] of the same job; a list
    /// that does not fit (another model, codec or memory) is an error and changes nothing.
    pub fn restore_memories(&mut self, saved: Vec<SavedMemory>) -> Result<()> {
        if saved.len() != self.memories.len() {
            return Err(Error::Data(format!(
                "{} saved memories for {} partitions",
                saved.len(),
                self.memories.len()
            )));
        }
        let before = self.saved_memories()?;
        for (i, s) in saved.into_iter().enumerate() {
            if let Err(e) = self.memories[i].restore(s) {
                for (m, b) in self.memories.iter_mut().zip(before) {
                    m.restore(b).expect("a memory's own state fits it");
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// The keyed partitions this rank pushes each round.
    pub fn partitions(&self) -> &[Partition] {
        &self.parts
    }

    /// One round on this rank's share of the batch (images and labels for a classifier, input
    /// bytes and targets for the language model), whose first sample is sample `first_sample`
    /// of the round's global batch ([`rank_share`](super::rank_share)): returns its loss and the bytes it moved.
    /// The pushes stand for the share's samples, so that shares of unequal size weigh as
    /// they should in the servers' mean.
    /// The loss comes back with the gradients in the round's one readback, so reporting it
    /// every round costs no extra wait for the GPU.
    ///
    /// A round that failed after its pushes (its replies never came: call again after
    /// [`DataParallel::reconnect`]) is pushed again with the same bytes, without computing
    /// anything: `batch` must be the round's own, as it was.
    pub fn step(&mut self, batch: M::Batch<'_>, first_sample: usize) -> Result<(f32, RoundBytes)> {
        let round = self.round();
        let (loss, pushed) = match self.push_again(round)? {
            Some(again) => again,
            None => self.compute_and_push(batch, first_sample)?,
        };
        Ok((loss, self.pull_and_apply(round, pushed)?))
    }

    /// The first half of a round: the gradients computed and pushed, each tensor's
    /// partitions encoded and pushed the moment the backward pass has finished the tensor
    /// ([`PushPipeline`]), so that the last layers' pushes travel while earlier layers'
    /// gradients are computed. Where the gradients only exist at the end (outer rounds'
    /// pseudo-gradients, an attacker's tampering, an emulated device's wait), or would each
    /// cost a GPU readback, every tensor is handed over at once. Returns the loss and the
    /// bytes pushed.
    fn compute_and_push(
        &mut self,
        batch: M::Batch<'_>,
        first_sample: usize,
    ) -> Result<(f32, usize)> {
        let round = self.round();
        let samples = u32::try_from(self.replica.samples(&batch))
            .map_err(|_| Error::Data("a share of over 2^32 samples cannot be weighed".into()))?;
        let computing = Instant::now();
        let mut pipeline = PushPipeline::new(
            Arc::clone(&self.parts),
            std::mem::take(&mut self.memories),
            self.seed,
            round,
            self.collective.rank(),
            samples,
        );
        // On a GPU each tensor handed over would be a readback of its own (a wait for the
        // queue each), so a GPU replica reads its gradients back once, at the end.
        let overlapped = self.outer.is_none()
            && self.tamper.is_none()
            && self.device.is_none()
            && matches!(self.replica.device(), Device::Cpu);
        let computed = if overlapped {
            let (replica, collective) = (&self.replica, &mut self.collective);
            replica
                .grads_as_ready(batch, first_sample, &mut |tensor, grad| {
                    let host = grad.to_vec()?;
                    check_finite(std::slice::from_ref(&host), tensor, round)?;
                    pipeline.ready(tensor, host, collective);
                    Ok(())
                })
                .and_then(|loss| Ok((loss.to_vec()?[0], Instant::now())))
        } else {
            self.gradients_at_once(batch, first_sample, computing, samples)
                .map(|(loss, host)| {
                    let computed_at = Instant::now();
                    for (tensor, grad) in host.into_iter().enumerate() {
                        pipeline.ready(tensor, grad, &mut self.collective);
                    }
                    (loss, computed_at)
                })
        };
        let (memories, pushed) = pipeline.finish(&mut self.collective);
        self.memories = memories;
        let (loss, computed_at) = computed?;
        let pushed = pushed?;
        self.timing = RoundTiming {
            computing: computed_at - computing,
            first_push: pushed.first_push,
            computed_at: Some(computed_at),
            ..RoundTiming::default()
        };
        let bytes = pushed.kept.iter().map(|(_, b)| b.len()).sum();
        self.unanswered = Some(Unanswered {
            step: round,
            loss,
            samples,
            pushes: pushed.kept,
        });
        if let Some(e) = pushed.push_failed {
            return Err(e);
        }
        self.codes = CodeStats {
            saturated: pushed.clipped.map(|(c, n)| c as f64 / n.max(1) as f64),
            error_nonzero: self.error_nonzero()?,
        };
        Ok((loss, bytes))
    }

    /// The round's loss and every gradient on the host, at once: an outer round's
    /// pseudo-gradient, or the share's gradients (then waited on as an emulated device,
    /// checked, and tampered with where this rank is an attacker).
    fn gradients_at_once(
        &mut self,
        batch: M::Batch<'_>,
        first_sample: usize,
        computing: Instant,
        samples: u32,
    ) -> Result<(f32, Vec<Vec<f32>>)> {
        let round = self.round();
        let (loss, mut host) = if let Some(outer) = &mut self.outer {
            outer.local_work(&mut self.replica, batch, first_sample)?
        } else {
            let (loss, grads) = self.replica.loss_and_grads(batch, first_sample)?;
            let mut host =
                Tensor::read_many(&std::iter::once(&loss).chain(&grads).collect::<Vec<_>>())?;
            (host.remove(0)[0], host)
        };
        self.wait_for_device(computing, samples, round);
        check_finite(&host, 0, round)?;
        if let Some(tamper) = &mut self.tamper {
            tamper(round, &mut host);
        }
        Ok((loss, host))
    }

    /// How the last round's time was spent: computing, communicating, and how much of the
    /// communication ran while the gradients were still being computed.
    pub fn round_timing(&self) -> RoundTiming {
        self.timing
    }

    /// Makes this rank compute as a device of `seconds_per_sample` would: a round's gradients
    /// take `samples × seconds_per_sample` of wall time, the thread asleep for what the real
    /// compute leaves (`None`: as fast as it goes). For benchmarks and tests of swarms of
    /// uneven devices on one machine: give every rank an emulated device slower than the
    /// machine, and the round times follow the devices, not the cores the nodes share (a
    /// rank's sleep gives its core to the others, as a GPU that computes leaves the host
    /// idle). A round whose real compute overruns the emulated time is counted and logged
    /// (the first one), since the emulation then no longer holds. Values outside 0 to
    /// [`MAX_EMULATED_SECONDS_PER_SAMPLE`] are held to those bounds.
    pub fn emulate_device(&mut self, seconds_per_sample: Option<f64>) {
        self.device = seconds_per_sample
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| EmulatedDevice {
                seconds_per_sample: s.min(MAX_EMULATED_SECONDS_PER_SAMPLE),
                overruns: 0,
            });
    }

    /// Makes this rank an attacker: `tamper` changes its gradients every round before they
    /// are encoded and pushed (`murmur repro attack` measures what the servers' aggregation
    /// rules withstand). An honest worker never sets one.
    pub fn tamper_with(&mut self, tamper: Option<Tamper>) {
        self.tamper = tamper;
    }

    /// Rounds whose real compute overran the emulated device ([`DataParallel::emulate_device`]).
    pub fn emulation_overruns(&self) -> u64 {
        self.device.map_or(0, |d| d.overruns)
    }

    /// Sleeps until a round's compute, begun at `computing` on `samples`, has taken what the
    /// emulated device would take, if one is set.
    fn wait_for_device(&mut self, computing: std::time::Instant, samples: u32, round: u64) {
        let Some(device) = &mut self.device else {
            return;
        };
        let due =
            std::time::Duration::from_secs_f64(device.seconds_per_sample * f64::from(samples));
        let took = computing.elapsed();
        match due.checked_sub(took) {
            Some(rest) => std::thread::sleep(rest),
            None => {
                if device.overruns == 0 {
                    tracing::warn!(
                        "round {round}'s gradients took {took:?}, longer than the emulated \
                         device's {due:?}: the emulation does not hold (emulate a slower device)"
                    );
                }
                device.overruns += 1;
            }
        }
    }

    /// One round in which this rank has no share of the global batch (it joined, or came
    /// back, after the round was cut): it pushes zeros standing for no samples, which the
    /// servers' mean leaves out, leaves its error-feedback memories as they are, and applies
    /// the round's replies as every rank does. Returns the bytes it moved. A round that
    /// failed after its pushes is pushed again as [`DataParallel::step`] does.
    pub fn step_without_share(&mut self) -> Result<RoundBytes> {
        let round = self.round();
        if let Some((_, pushed)) = self.push_again(round)? {
            return self.pull_and_apply(round, pushed);
        }
        let rank = self.collective.rank();
        let pushes: Vec<(Key, Vec<u8>)> = self
            .parts
            .iter()
            .zip(&self.memories)
            .map(|(p, m)| {
                let ctx = codec_context(self.seed, round, p.key).sent_by(rank);
                (p.key, m.codec().encode(&vec![0.0; p.len], &ctx))
            })
            .collect();
        // Kept before pushing, as encode_and_push keeps its own: only applied replies end it.
        self.unanswered = Some(Unanswered {
            step: round,
            loss: f32::NAN,
            samples: 0,
            pushes,
        });
        // Nothing was coded from a gradient this round.
        self.codes = CodeStats::default();
        let (_, pushed) = self.push_again(round)?.expect("kept above");
        self.pull_and_apply(round, pushed)
    }

    /// Pushes again, with the same bytes, the pushes of round `round` kept since they were
    /// first sent (kept whatever happens to them: only applied replies end them); drops those
    /// of another round. Returns the kept round's loss and the bytes pushed, or `None` when
    /// this round has none kept.
    fn push_again(&mut self, round: u64) -> Result<Option<(f32, usize)>> {
        if self.unanswered.as_ref().is_some_and(|u| u.step != round) {
            self.unanswered = None;
        }
        let Some(again) = &self.unanswered else {
            return Ok(None);
        };
        let mut pushed = 0;
        self.timing = RoundTiming {
            first_push: Some(Instant::now()),
            ..RoundTiming::default()
        };
        for (key, bytes) in &again.pushes {
            pushed += bytes.len();
            self.collective
                .push(round, *key, again.samples, bytes.clone())?;
        }
        Ok(Some((again.loss, pushed)))
    }

    /// The second half of a round: its replies pulled and applied; the bytes it moved.
    fn pull_and_apply(&mut self, round: u64, pushed: usize) -> Result<RoundBytes> {
        let replies = self.collective.pull(round, &self.keys)?;
        self.timing.replied_at = Some(Instant::now());
        let pulled = replies.iter().map(|(_, b)| b.len()).sum();
        self.apply_replies(&replies)?;
        let exchanges = self
            .outer
            .as_ref()
            .map_or(1, |o| o.config().local_steps as usize);
        let f32_each_way = 4
            * exchanges
            * self
                .shapes
                .iter()
                .map(|s| s.iter().product::<usize>())
                .sum::<usize>();
        Ok(RoundBytes {
            pushed,
            pulled,
            f32_each_way,
        })
    }

    /// The fraction of nonzero entries over every partition's error-feedback memory.
    fn error_nonzero(&self) -> Result<Option<f64>> {
        let (mut nonzero, mut total) = (0usize, 0usize);
        for (m, p) in self.memories.iter().zip(self.parts.iter()) {
            if m.memory() != Memory::None {
                nonzero += m.nonzero_entries()?;
                total += p.len;
            }
        }
        Ok((total > 0).then(|| nonzero as f64 / total as f64))
    }

    /// The scale (`log2 s`) this rank's rescalable LoCo pushes are coded at; `None` where
    /// no partition pushes rescalable LoCo codes.
    pub fn push_log2s(&self) -> Option<i32> {
        self.memories
            .iter()
            .find_map(|m| m.codec().spec().rescalable_log2s())
    }

    /// Codes this rank's rescalable LoCo pushes at scale `2^log2s` from the next round on
    /// (a recalibration, which every rank makes at the same round from the same data): each
    /// such partition's memory moves its error scale with it ([`Feedback::rescale`]). The
    /// servers follow the scale the round's pushes carry.
    pub fn rescale(&mut self, log2s: i32) -> Result<()> {
        for memory in &mut self.memories {
            rescale_memory(memory, log2s)?;
        }
        Ok(())
    }

    /// How the last round's codes sat ([`CodeStats`]).
    pub fn code_stats(&self) -> CodeStats {
        self.codes
    }

    /// Applies one round's replies (in partition order) with the optimizer: the second half of
    /// [`DataParallel::step`], and what a rejoining rank replays to catch up.
    pub fn apply_replies(&mut self, replies: &[(Key, Vec<u8>)]) -> Result<()> {
        if replies.len() != self.parts.len() {
            return Err(Error::Data(format!(
                "{} replies for {} partitions",
                replies.len(),
                self.parts.len()
            )));
        }
        let mut avg: Vec<Vec<f32>> = self
            .shapes
            .iter()
            .map(|s| vec![0.0; s.iter().product()])
            .collect();
        for (i, (key, reply)) in replies.iter().enumerate() {
            let (p, pull) = (&self.parts[i], &self.pulls[i]);
            if *key != p.key {
                return Err(Error::Data(format!(
                    "reply for key {key:#x} where {:#x} was expected",
                    p.key
                )));
            }
            // A reply at another scale than this rank pushes at comes from rounds this rank
            // did not take part in (a catch-up after a recalibration): push at the servers'
            // scale from now on. The reply scale sits where registration put it from the push
            // scale, and the servers move both together.
            if let Some(reply_log2s) = payload_log2s(pull.spec(), reply) {
                let registered =
                    |spec: &str| spec.parse().ok().and_then(CodecSpec::rescalable_log2s);
                let offset = registered(&self.specs[i].pull)
                    .zip(registered(&self.specs[i].push))
                    .map(|(pull, push)| pull - push);
                if let Some(offset) = offset {
                    rescale_memory(&mut self.memories[i], reply_log2s - offset)?;
                }
            }
            let ctx = codec_context(self.seed, self.round(), p.key);
            pull.decode_into(
                reply,
                &mut avg[p.tensor][p.offset..p.offset + p.len],
                &ctx,
                DecodeMode::Set,
            )?;
        }
        // On the CPU, where the replica's optimizer steps.
        let grads = avg
            .into_iter()
            .zip(&self.shapes)
            .map(|(v, s)| Tensor::from_vec(&Device::Cpu, s, v))
            .collect::<Result<Vec<_>>>()?;
        match &mut self.outer {
            // The round's end: the outer optimizer steps the anchor with the aggregated
            // pseudo-gradient, and the replica takes the new shared parameters in place of
            // those its local steps reached, with the step count of every round's local steps.
            Some(outer) => {
                outer.step(&grads)?;
                self.replica.set_parameters(outer.anchor())?;
                self.replica
                    .set_steps(outer.rounds() * u64::from(outer.config().local_steps));
            }
            None => self.replica.apply(&grads)?,
        }
        // The round is answered (or replayed past): nothing of it is pushed again.
        self.answered = self.unanswered.take();
        Ok(())
    }

    /// Folds this rank's pushes of round `step` (the round whose replies were applied last)
    /// that the servers did not sum back into their error-feedback memories: `late(key)` says
    /// whether the key's shard closed the round without this rank. Each such partition's
    /// memory takes back what its payload decodes to ([`Feedback::take_back`]), so that the
    /// next push carries this round's gradient instead of losing it. Returns the partitions
    /// folded. Needs residual memories (`ef`) on the compressed partitions; a partition sent
    /// uncompressed has no memory and its late push is dropped (BytePS's small tensors: the
    /// MLP's biases). A round this rank replayed or played without a share folds nothing.
    pub fn take_back_late_pushes(
        &mut self,
        step: u64,
        late: impl Fn(Key) -> bool,
    ) -> Result<usize> {
        let Some(answered) = self
            .answered
            .take()
            .filter(|a| a.step == step && a.samples > 0)
        else {
            return Ok(0);
        };
        let rank = self.collective.rank();
        let mut folded = 0;
        for (key, bytes) in answered.pushes.iter().filter(|(key, _)| late(*key)) {
            let Some(i) = self.parts.iter().position(|p| p.key == *key) else {
                continue;
            };
            let memory = &mut self.memories[i];
            if memory.memory() == Memory::None {
                // Sent uncompressed (below the job's min_compress_bytes), without a memory:
                // its late push is dropped.
                continue;
            }
            let ctx = codec_context(self.seed, step, *key).sent_by(rank);
            let sent = memory.codec().decode(bytes, self.parts[i].len, &ctx)?;
            memory.take_back(&sent)?;
            folded += 1;
        }
        Ok(folded)
    }
}

/// Moves a memory whose codec is rescalable LoCo to scale `2^log2s` (no-op for others, and
/// where it is there already).
fn rescale_memory(memory: &mut Feedback, log2s: i32) -> Result<()> {
    let spec = memory.codec().spec();
    if let Some(now) = spec.rescalable_log2s() {
        if now != log2s {
            if !(-100..=100).contains(&log2s) {
                return Err(Error::Data(format!(
                    "LoCo's scale cannot move to 2^{log2s}: past -100..=100"
                )));
            }
            memory.rescale(build(rescaled(spec, log2s)), log2s - now)?;
        }
    }
    Ok(())
}
