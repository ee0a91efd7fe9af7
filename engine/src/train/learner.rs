//! What data-parallel training needs of a model and its optimizer, so that one
//! [`DataParallel`](super::DataParallel) trains the classifiers and the byte-level GPT alike:
//! the gradients of a rank's share of a batch, the averaged gradients applied as one step, and
//! the state a snapshot carries.

use crate::error::Result;
use crate::nn::Module;
use crate::optim::Optimizer;
use crate::tensor::{Device, Tensor};

use super::state::Saved;
use super::{Classifier, LanguageModel};

/// A model with its optimizer, as a data-parallel rank holds it.
pub trait Learner {
    /// One rank's share of a round's global batch.
    type Batch<'a>;

    /// The device the parameters live on.
    fn device(&self) -> &Device;

    /// The parameters, in the order of their gradients.
    fn parameters(&self) -> Vec<&Tensor>;

    /// Optimizer steps taken: one per round.
    fn steps(&self) -> u64;

    /// The learning rate of the last step (the schedule's, where there is one).
    fn lr(&self) -> f32;

    /// The training samples in `batch` (images, or sequences of the language model): the
    /// weight of its gradients in a round's mean.
    fn samples(&self, batch: &Self::Batch<'_>) -> usize;

    /// The samples `range` of `batch` (positions in `0..samples(batch)`), as a batch: the
    /// local steps of an outer round each take one slice of the rank's share.
    fn sub_batch<'a>(
        &self,
        batch: &Self::Batch<'a>,
        range: std::ops::Range<usize>,
    ) -> Self::Batch<'a>;

    /// Mean loss and parameter gradients of `batch`, whose first sample is sample
    /// `first_sample` of the step's global batch (dropout keys its masks by it, so a sample
    /// draws the same mask on whichever rank computes it).
    fn loss_and_grads(
        &self,
        batch: Self::Batch<'_>,
        first_sample: usize,
    ) -> Result<(Tensor, Vec<Tensor>)>;

    /// [`Learner::loss_and_grads`] with each parameter's gradient handed to `ready` (with its
    /// position among [`Learner::parameters`]) as soon as the backward pass has finished it,
    /// last layer first: what lets a data-parallel rank push a layer's gradients while the
    /// backward pass computes earlier layers'. Returns the mean loss; the same bits.
    fn grads_as_ready(
        &self,
        batch: Self::Batch<'_>,
        first_sample: usize,
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<Tensor>;

    /// One optimizer step with the averaged gradients (after the clipping and the schedule
    /// the model's configuration asks for).
    fn apply(&mut self, grads: &[Tensor]) -> Result<()>;

    /// Replaces the parameters' values (CPU tensors, in the order of
    /// [`Learner::parameters`]), keeping the optimizer's state: how a replica takes the
    /// shared parameters at the end of an outer round.
    fn set_parameters(&mut self, values: &[Tensor]) -> Result<()>;

    /// Sets the step count (what the schedule and the dropout masks read): at the end of an
    /// outer round every replica counts the local steps of all the rounds played, whether it
    /// took them or not.
    fn set_steps(&mut self, steps: u64);

    /// Steps the optimizer on the CPU from now on, whatever device the model computes on, so
    /// that replicas on different devices take the same update bit for bit (a model on the
    /// CPU is left as it is). [`Learner::apply`] then takes gradients on the CPU.
    fn update_on_cpu(&mut self) -> Result<()>;

    /// Parameters, optimizer state and step count as checkpoint bytes.
    fn save_state(&self) -> Result<Vec<u8>>;

    /// Takes back what [`Learner::save_state`] wrote (of the same run).
    fn load_state(&mut self, bytes: &[u8]) -> Result<()>;

    /// The digest replicas compare each round ([`Module::parameter_digest`]).
    fn parameter_digest(&self) -> Result<u64>;

    /// The digest ([`Learner::parameter_digest`]) of the parameters in `snapshot`, bytes of
    /// [`Learner::save_state`] from a replica of this model (the run it describes is not
    /// compared): what a shard checks a snapshot by. An error if the bytes are not such a
    /// snapshot.
    fn snapshot_digest(&self, snapshot: &[u8]) -> Result<u64>;
}

impl Learner for Classifier {
    /// The share's images, `[samples, features]` row by row, and their labels.
    type Batch<'a> = (&'a [f32], &'a [u32]);

    fn device(&self) -> &Device {
        &self.device
    }

    fn parameters(&self) -> Vec<&Tensor> {
        self.model.parameters()
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn lr(&self) -> f32 {
        self.optimizer.lr()
    }

    fn samples(&self, (_, labels): &Self::Batch<'_>) -> usize {
        labels.len()
    }

    fn sub_batch<'a>(
        &self,
        (x, labels): &Self::Batch<'a>,
        range: std::ops::Range<usize>,
    ) -> Self::Batch<'a> {
        let features = self.inputs;
        (
            &x[range.start * features..range.end * features],
            &labels[range],
        )
    }

    fn loss_and_grads(
        &self,
        (x, labels): Self::Batch<'_>,
        first_sample: usize,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        Classifier::loss_and_grads(self, x, labels, first_sample)
    }

    fn grads_as_ready(
        &self,
        (x, labels): Self::Batch<'_>,
        first_sample: usize,
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        Classifier::grads_as_ready(self, x, labels, first_sample, ready)
    }

    fn apply(&mut self, grads: &[Tensor]) -> Result<()> {
        Classifier::apply(self, grads)
    }

    fn set_parameters(&mut self, values: &[Tensor]) -> Result<()> {
        Classifier::set_parameters(self, values)
    }

    fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    fn update_on_cpu(&mut self) -> Result<()> {
        Classifier::update_on_cpu(self)
    }

    fn save_state(&self) -> Result<Vec<u8>> {
        Classifier::save_state(self)
    }

    fn load_state(&mut self, bytes: &[u8]) -> Result<()> {
        Classifier::load_state(self, bytes)
    }

    fn parameter_digest(&self) -> Result<u64> {
        Classifier::parameter_digest(self)
    }

    fn snapshot_digest(&self, snapshot: &[u8]) -> Result<u64> {
        Saved::from_bytes(snapshot, &Device::Cpu)?.parameter_digest(&self.model)
    }
}

impl Learner for LanguageModel {
    /// The share's input bytes and next-byte targets, `context` of each per sequence
    /// ([`crate::data::lm_batch`]'s layout).
    type Batch<'a> = (&'a [u32], &'a [u32]);

    fn device(&self) -> &Device {
        &self.device
    }

    fn parameters(&self) -> Vec<&Tensor> {
        self.model.parameters()
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn lr(&self) -> f32 {
        self.optimizer.lr()
    }

    fn samples(&self, (_, targets): &Self::Batch<'_>) -> usize {
        targets.len() / self.model.config.context.max(1)
    }

    fn sub_batch<'a>(
        &self,
        (ids, targets): &Self::Batch<'a>,
        range: std::ops::Range<usize>,
    ) -> Self::Batch<'a> {
        let context = self.model.config.context;
        let bytes = range.start * context..range.end * context;
        (&ids[bytes.clone()], &targets[bytes])
    }

    fn loss_and_grads(
        &self,
        (ids, targets): Self::Batch<'_>,
        first_sample: usize,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        LanguageModel::loss_and_grads(self, ids, targets, first_sample)
    }

    fn grads_as_ready(
        &self,
        (ids, targets): Self::Batch<'_>,
        first_sample: usize,
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        LanguageModel::grads_as_ready(self, ids, targets, first_sample, ready)
    }

    fn apply(&mut self, grads: &[Tensor]) -> Result<()> {
        LanguageModel::apply(self, grads).map(drop)
    }

    fn set_parameters(&mut self, values: &[Tensor]) -> Result<()> {
        LanguageModel::set_parameters(self, values)
    }

    fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    fn update_on_cpu(&mut self) -> Result<()> {
        LanguageModel::update_on_cpu(self)
    }

    fn save_state(&self) -> Result<Vec<u8>> {
        LanguageModel::save_state(self)
    }

    fn load_state(&mut self, bytes: &[u8]) -> Result<()> {
        LanguageModel::load_state(self, bytes)
    }

    fn parameter_digest(&self) -> Result<u64> {
        self.model.parameter_digest()
    }

    fn snapshot_digest(&self, snapshot: &[u8]) -> Result<u64> {
        Saved::from_bytes(snapshot, &Device::Cpu)?.parameter_digest(&self.model)
    }
}
