//! What a worker trains, as its job names it: the replica it builds, its share of each round's
//! global batch, and how the replica is measured. The image classifier (mnist, fashion-mnist)
//! and the byte-level GPT (shakespeare) go through the same worker loop.

use std::path::Path;

use murmur_engine::data::{default_root, epoch_batches, lm_batch, TextCorpus};
use murmur_engine::train::{rank_share, Classifier, DataParallel, LanguageModel, Learner};
use murmur_net::ps::QuicCollective;

use crate::calibration::{batch_log2s, recalibrated_bits};
use crate::data::Sets;
use crate::error::Result;
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

    /// Rounds in the whole job.
    fn total_steps(&self) -> u64;

    /// Rounds between measurements: an epoch of images, `eval_every` rounds of text.
    fn period(&self) -> u64;

    /// The pass over the training data that round `round` belongs to, from 1; 0 where the
    /// task counts rounds, not epochs (the text, as `murmur train --model gpt` does).
    fn epoch(&self, round: u64) -> u32;

    /// Calls `f` with this rank's share of round `round`'s global batch and the position of
    /// its first sample in that batch; returns what `f` returned and the share's samples.
    fn with_share<R>(
        &mut self,
        round: u64,
        rank: u16,
        world: u16,
        f: impl FnOnce(<Self::Model as Learner>::Batch<'_>, usize) -> R,
    ) -> Result<(R, usize)>;

    /// Anything due before round `dp.round()` is played (once per round, not again when the
    /// round is retried).
    fn before_round(
        &mut self,
        _dp: &mut DataParallel<QuicCollective, Self::Model>,
        _events: &Events,
        _rank: u16,
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
    world: u16,
    steps_per_epoch: u64,
    total_steps: u64,
    /// The global batches of the epoch `batches_epoch`.
    batches: Vec<Vec<usize>>,
    batches_epoch: Option<u32>,
}

impl ImageTask {
    pub(crate) fn new(job: Job, sets: Sets, world: u16) -> ImageTask {
        let (steps_per_epoch, total_steps) = job.steps(sets.train.len());
        ImageTask {
            job,
            sets,
            world,
            steps_per_epoch,
            total_steps,
            batches: Vec::new(),
            batches_epoch: None,
        }
    }

    /// Round `round`'s global batch (sample indices), after [`ImageTask::draw_epoch`].
    fn global(&self, round: u64) -> &[usize] {
        &self.batches[(round % self.steps_per_epoch) as usize]
    }

    /// Draws the global batches of round `round`'s epoch, if they are not drawn yet.
    fn draw_epoch(&mut self, round: u64) {
        let epoch = (round / self.steps_per_epoch) as u32;
        if self.batches_epoch != Some(epoch) {
            let global = self.job.batch * self.world as usize;
            self.batches = epoch_batches(self.sets.train.len(), global, self.job.seed, epoch);
            self.batches_epoch = Some(epoch);
        }
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

    fn epoch(&self, round: u64) -> u32 {
        (round / self.steps_per_epoch) as u32 + 1
    }

    fn with_share<R>(
        &mut self,
        round: u64,
        rank: u16,
        world: u16,
        f: impl FnOnce(<Self::Model as Learner>::Batch<'_>, usize) -> R,
    ) -> Result<(R, usize)> {
        self.draw_epoch(round);
        let global = self.global(round);
        let share = rank_share(global.len(), rank as usize, world as usize);
        let (x, y) = self.sets.train.batch(&global[share.clone()]);
        Ok((f((&x, &y), share.start), share.len()))
    }

    /// Moves LoCo's scale at the first round of every `loco_recalibrate_every`-th epoch
    /// (after the first), by the calibration's rule on the epoch's first global batch at the
    /// current model: every worker gets the same scale and moves before it pushes.
    fn before_round(
        &mut self,
        dp: &mut DataParallel<QuicCollective, Classifier>,
        events: &Events,
        rank: u16,
    ) -> Result<()> {
        let (Some(bits), Some(every)) = (
            recalibrated_bits(&self.job),
            self.job.loco_recalibrate_every,
        ) else {
            return Ok(());
        };
        let round = dp.round();
        let epoch = self.epoch(round) - 1;
        let first_of_epoch = round.is_multiple_of(self.steps_per_epoch);
        if !first_of_epoch || epoch == 0 || !epoch.is_multiple_of(every) {
            return Ok(());
        }
        self.draw_epoch(round);
        let log2s = batch_log2s(&dp.replica, &self.sets, self.global(round), bits)?;
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

    fn epoch(&self, _round: u64) -> u32 {
        0
    }

    fn with_share<R>(
        &mut self,
        round: u64,
        rank: u16,
        world: u16,
        f: impl FnOnce(<Self::Model as Learner>::Batch<'_>, usize) -> R,
    ) -> Result<(R, usize)> {
        let (ids, targets) = lm_batch(
            &self.corpus.train,
            self.global,
            self.context,
            self.seed,
            round,
        )?;
        let share = rank_share(self.global, rank as usize, world as usize);
        let rows = share.start * self.context..share.end * self.context;
        Ok((
            f((&ids[rows.clone()], &targets[rows]), share.start),
            share.len(),
        ))
    }

    fn measure(&self, model: &LanguageModel) -> Result<Measure> {
        Ok(Measure::ValidLoss(model.evaluate(
            &self.corpus.valid,
            VALID_WINDOWS,
            32,
        )?))
    }
}
