//! What a worker trains, as its job names it: the replica it builds, the samples of the share
//! of a round shard 0 assigned it, and how the replica is measured. The image classifier
//! (mnist, fashion-mnist) and the byte-level GPT (shakespeare) go through the same worker
//! loop.

use std::path::Path;

use murmur_engine::data::{default_root, epoch_order, lm_batch, TextCorpus};
use murmur_engine::train::{Classifier, DataParallel, LanguageModel, Learner};
use murmur_net::ps::queue::{Assignment, Share};
use murmur_net::ps::QuicCollective;

use crate::calibration::{batch_log2s, recalibrated_bits};
use crate::data::Sets;
use crate::error::{NodeError, Result};
use crate::event::{Event, Events};
use crate::job::Job;

/// Validation windows a gpt job measures its loss on (`murmur train --model gpt`'s default).
const VALID_WINDOWS: usize = 256;

/// How a replica measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Measure {
    /// Test accuracy in [0, 1] (image models).
    Accuracy(f64),
    /// Validation loss in nats per byte (the language model).
    ValidLoss(f64),
}

/// The model-specific half of a worker.
pub(crate) trait Task {
    /// The replica it trains.
    type Model: Learner;

    /// Rounds in the whole job when no share is given back (what the learning-rate
    /// schedule spans).
    fn total_steps(&self) -> u64;

    /// Rounds between measurements when no share is given back: an epoch of images,
    /// `eval_every` rounds of text.
    fn period(&self) -> u64;

    /// The epoch as events show it: the pass over the training data, from 1, of the queue's
    /// epoch `epoch`; 0 where the task counts rounds, not epochs (the text, as
    /// `murmur train --model gpt` does).
    fn shown_epoch(&self, epoch: u32) -> u32;

    /// After the round that leaves `done` rounds played, of the queue's epoch `epoch`, with
    /// the next round of epoch `next` (`None` when unknown): the index of the measurement due
    /// then, if one is (its index picks the rank that measures).
    fn measurement(&self, done: u64, epoch: u32, next: Option<u32>) -> Option<u64>;

    /// Calls `f` with the samples of `share` (positions of the queue's epoch `epoch`) and the
    /// position of its first sample in the round's global batch, `first`; returns what `f`
    /// returned and the share's samples.
    fn with_share<R>(
        &mut self,
        epoch: u32,
        share: &Share,
        first: usize,
        f: impl FnOnce(<Self::Model as Learner>::Batch<'_>, usize) -> R,
    ) -> Result<(R, usize)>;

    /// Anything due before round `dp.round()` is played, which shard 0 cut as `round`
    /// (once per round, not again when the round is retried).
    fn before_round(
        &mut self,
        _dp: &mut DataParallel<QuicCollective, Self::Model>,
        _events: &Events,
        _rank: u16,
        _round: &Assignment,
    ) -> Result<()> {
        Ok(())
    }

    /// Measures the replica.
    fn measure(&self, model: &Self::Model) -> Result<Measure>;
}

/// The MLP classifier on an image dataset, an epoch at a time.
pub(crate) struct ImageTask {
    job: Job,
    sets: Sets,
    steps_per_epoch: u64,
    total_steps: u64,
    /// The sample order of the epoch `order_epoch`.
    order: Vec<usize>,
    order_epoch: Option<u32>,
}

impl ImageTask {
    /// The task of `job` on `sets`, whose training split must hold the samples the servers
    /// hand out per epoch.
    pub(crate) fn new(job: Job, sets: Sets) -> Result<ImageTask> {
        let handed_out = job.queue_spec()?.samples;
        if sets.train.len() as u64 != handed_out {
            return Err(NodeError::Job(format!(
                "the servers hand out {handed_out} samples an epoch, and this node's {} \
                 training split in {} holds {}: the workers must train on the same data",
                sets.dataset.name(),
                sets.root.display(),
                sets.train.len()
            )));
        }
        let (steps_per_epoch, total_steps) = job.steps(sets.train.len());
        Ok(ImageTask {
            job,
            sets,
            steps_per_epoch,
            total_steps,
            order: Vec::new(),
            order_epoch: None,
        })
    }

    /// The samples at positions `positions` of epoch `epoch`'s order; fails on a position
    /// past the training split (shard 0 sent it).
    fn samples(
        &mut self,
        epoch: u32,
        mut positions: impl Iterator<Item = u64>,
    ) -> Result<Vec<usize>> {
        if self.order_epoch != Some(epoch) {
            self.order = epoch_order(self.sets.train.len(), self.job.seed, epoch);
            self.order_epoch = Some(epoch);
        }
        let order = &self.order;
        positions.try_fold(Vec::new(), |mut samples, p| {
            let sample = usize::try_from(p).ok().and_then(|p| order.get(p));
            samples.push(*sample.ok_or_else(|| {
                NodeError::Job(format!(
                    "shard 0 assigned position {p} of a training split of {}",
                    order.len()
                ))
            })?);
            Ok(samples)
        })
    }
}

impl Task for ImageTask {
    type Model = Classifier;

    fn total_steps(&self) -> u64 {
        self.total_steps
    }

    fn period(&self) -> u64 {
        self.steps_per_epoch
    }

    fn shown_epoch(&self, epoch: u32) -> u32 {
        epoch + 1
    }

    /// At the end of each epoch (when the next round is of another), or when the next round
    /// is unknown.
    fn measurement(&self, _done: u64, epoch: u32, next: Option<u32>) -> Option<u64> {
        (next != Some(epoch)).then_some(u64::from(epoch))
    }

    fn with_share<R>(
        &mut self,
        epoch: u32,
        share: &Share,
        first: usize,
        f: impl FnOnce(<Self::Model as Learner>::Batch<'_>, usize) -> R,
    ) -> Result<(R, usize)> {
        let samples = self.samples(epoch, share.positions())?;
        let (x, y) = self.sets.train.batch(&samples);
        Ok((f((&x, &y), first), samples.len()))
    }

    /// Moves LoCo's scale at the first round of every `loco_recalibrate_every`-th epoch
    /// (after the first), by the calibration's rule on that round's global batch at the
    /// current model: every worker gets the same scale and moves before it pushes (the
    /// assignment, the same for all, says which round is the epoch's first).
    fn before_round(
        &mut self,
        dp: &mut DataParallel<QuicCollective, Classifier>,
        events: &Events,
        rank: u16,
        assigned: &Assignment,
    ) -> Result<()> {
        let (Some(bits), Some(every)) = (
            recalibrated_bits(&self.job),
            self.job.loco_recalibrate_every,
        ) else {
            return Ok(());
        };
        let round = dp.round();
        let epoch = assigned.epoch;
        if assigned.round != 0 || epoch == 0 || !epoch.is_multiple_of(every) {
            return Ok(());
        }
        let positions = assigned.shares.iter().flat_map(Share::positions);
        let global = self.samples(epoch, positions)?;
        let log2s = batch_log2s(&dp.replica, &self.sets, &global, bits)?;
        let was = dp.push_log2s();
        dp.rescale(log2s)?;
        tracing::info!(
            "LoCo's scale recalibrated at round {round}: s = 2^{log2s} (was 2^{})",
            was.map_or("?".into(), |w| w.to_string())
        );
        events.emit(Event::Recalibrated {
            rank,
            step: round,
            log2s,
            was,
        });
        Ok(())
    }

    fn measure(&self, model: &Classifier) -> Result<Measure> {
        Ok(Measure::Accuracy(model.accuracy(&self.sets.test, 1000)?))
    }
}

/// The byte-level GPT on the Shakespeare corpus: each round's global batch is the windows
/// that (seed, round) picks, as `murmur train --model gpt` picks them, cut into the ranks'
/// shares.
pub(crate) struct TextTask {
    corpus: TextCorpus,
    /// Sequences in a round's global batch.
    global: usize,
    context: usize,
    seed: u64,
    eval_every: u64,
    total_steps: u64,
}

impl TextTask {
    /// Loads the corpus from `data` (default: `$MURMUR_DATA`, else `./data`).
    pub(crate) fn load(job: &Job, world: u16, data: Option<&Path>) -> Result<TextTask> {
        let root = data.map_or_else(default_root, Path::to_path_buf);
        let corpus = TextCorpus::load_shakespeare(&root)?;
        let (eval_every, total_steps) = job.gpt_steps();
        Ok(TextTask {
            corpus,
            global: job.batch * world as usize,
            context: job.gpt_config().context,
            seed: job.seed,
            eval_every,
            total_steps,
        })
    }
}

impl Task for TextTask {
    type Model = LanguageModel;

    fn total_steps(&self) -> u64 {
        self.total_steps
    }

    fn period(&self) -> u64 {
        self.eval_every
    }

    fn shown_epoch(&self, _epoch: u32) -> u32 {
        0
    }

    /// Every `eval_every` rounds, and at the end (the queue's one epoch over).
    fn measurement(&self, done: u64, epoch: u32, next: Option<u32>) -> Option<u64> {
        let every = self.eval_every.max(1);
        let due = done.is_multiple_of(every) || next != Some(epoch);
        due.then_some(done.saturating_sub(1) / every)
    }

    /// Position `p` is window `p mod global` of round `p / global`'s draw, so that a calm
    /// round's shares are the windows `murmur train --model gpt` takes in that round.
    fn with_share<R>(
        &mut self,
        _epoch: u32,
        share: &Share,
        first: usize,
        f: impl FnOnce(<Self::Model as Learner>::Batch<'_>, usize) -> R,
    ) -> Result<(R, usize)> {
        let (global, context) = (self.global as u64, self.context);
        let windows = share.samples() as usize;
        let (mut ids, mut targets) = (
            Vec::with_capacity(windows * context),
            Vec::with_capacity(windows * context),
        );
        // The round whose windows were drawn last, with its inputs and targets.
        type Drawn = (u64, (Vec<u32>, Vec<u32>));
        let mut drawn: Option<Drawn> = None;
        for position in share.positions() {
            let (round, window) = (position / global, (position % global) as usize);
            if drawn.as_ref().map(|(r, _)| *r) != Some(round) {
                let batch = lm_batch(&self.corpus.train, self.global, context, self.seed, round)?;
                drawn = Some((round, batch));
            }
            let (_, (round_ids, round_targets)) = drawn.as_ref().expect("drawn above");
            let rows = window * context..(window + 1) * context;
            ids.extend_from_slice(&round_ids[rows.clone()]);
            targets.extend_from_slice(&round_targets[rows]);
        }
        Ok((f((&ids, &targets), first), windows))
    }

    fn measure(&self, model: &LanguageModel) -> Result<Measure> {
        Ok(Measure::ValidLoss(model.evaluate(
            &self.corpus.valid,
            VALID_WINDOWS,
            32,
        )?))
    }
}
