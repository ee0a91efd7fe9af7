//! Where the algorithms get gradients from: a worker's model as flat host vectors.

use crate::error::{Error, Result};
use crate::nn::Module;
use crate::tensor::Tensor;
use crate::train::Classifier;

/// A worker's model as the algorithms see it: flat parameters, and the gradient of this
/// worker's batch at them.
pub trait Replica: Send {
    /// Element counts of the parameter tensors, in order (the layout of the flat vector).
    fn sizes(&self) -> Vec<usize>;

    /// The flat parameters.
    fn params(&self) -> Result<Vec<f32>>;

    /// Replaces the parameters.
    fn set_params(&mut self, flat: &[f32]) -> Result<()>;

    /// The mean loss and the flat gradient of this worker's batch of step `step`, at the
    /// parameters last set.
    fn loss_and_gradient(&mut self, step: u64) -> Result<(f32, Vec<f32>)>;
}

/// A classifier (MLP or CNN, on the CPU or a GPU) fed by `batch(step)`.
pub struct ClassifierReplica<F> {
    /// The classifier being trained, whose parameters are the replica's flat vector.
    pub clf: Classifier,
    batch: F,
    /// Where this worker's batches start in each step's global batch (dropout's keys).
    first_sample: usize,
}

impl<F: FnMut(u64) -> (Vec<f32>, Vec<u32>) + Send> ClassifierReplica<F> {
    /// A replica of `clf` that draws step `t`'s batch of (inputs, labels) from `batch(t)`, the
    /// whole of each step's global batch.
    pub fn new(clf: Classifier, batch: F) -> Self {
        ClassifierReplica {
            clf,
            batch,
            first_sample: 0,
        }
    }

    /// The same replica drawing the share of each global batch that starts at sample
    /// `first_sample` (a rank's share: [`crate::train::rank_share`]).
    pub fn sharing_from(self, first_sample: usize) -> Self {
        ClassifierReplica {
            first_sample,
            ..self
        }
    }
}

impl<F: FnMut(u64) -> (Vec<f32>, Vec<u32>) + Send> Replica for ClassifierReplica<F> {
    fn sizes(&self) -> Vec<usize> {
        self.clf
            .model
            .parameters()
            .iter()
            .map(|p| p.numel())
            .collect()
    }

    fn params(&self) -> Result<Vec<f32>> {
        Ok(Tensor::read_many(&self.clf.model.parameters())?.concat())
    }

    fn set_params(&mut self, flat: &[f32]) -> Result<()> {
        set_flat_params(&mut self.clf, flat)
    }

    fn loss_and_gradient(&mut self, step: u64) -> Result<(f32, Vec<f32>)> {
        let (x, labels) = (self.batch)(step);
        // Dropout (where a model has it) is keyed by the step.
        self.clf.steps = step;
        let (loss, grads) = self.clf.loss_and_grads(&x, &labels, self.first_sample)?;
        let mut all: Vec<&Tensor> = vec![&loss];
        all.extend(grads.iter());
        let mut host = Tensor::read_many(&all)?;
        let loss = host.remove(0)[0];
        Ok((loss, host.concat()))
    }
}

/// Replaces a classifier's parameters with the flat vector `flat` (tensors in order).
pub fn set_flat_params(clf: &mut Classifier, flat: &[f32]) -> Result<()> {
    let total = clf.model.parameter_count();
    if flat.len() != total {
        return Err(Error::Shape {
            op: "set parameters",
            detail: format!("the model has {total} parameters, got {}", flat.len()),
        });
    }
    let device = clf.device.clone();
    let mut offset = 0;
    for p in clf.model.parameters_mut() {
        let n = p.numel();
        let shape = p.shape().to_vec();
        *p = Tensor::from_vec(&device, &shape, flat[offset..offset + n].to_vec())?;
        offset += n;
    }
    Ok(())
}
