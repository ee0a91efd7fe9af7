//! [`Pipeline`]: all stages of a pipeline in one process, linked in-process. A step runs every
//! stage's forward pass in order, then every backward pass in reverse, which is the order
//! the messages need; stages in separate processes run the same `Stage` code and so produce
//! the same bits.

use std::sync::Arc;
use std::time::Duration;

use super::stage::{Stage, StageStep};
use super::PipelineConfig;
use crate::autograd::Graph;
use crate::comm::stage::{local_links, StageLink};
use crate::data::ImageSet;
use crate::error::Result;
use crate::nn::Linear;
use crate::tensor::{Device, Tensor};

/// What one pipeline step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The batch's mean loss (computed on the compressed forward pass).
    pub loss: f32,
    /// Payload bytes across every cut, both directions.
    pub bytes: usize,
}

pub struct Pipeline {
    stages: Vec<Stage>,
    config: Arc<PipelineConfig>,
    device: Device,
}

impl Pipeline {
    pub fn new(config: PipelineConfig, device: &Device, data: Arc<ImageSet>) -> Result<Self> {
        config.check()?;
        let config = Arc::new(config);
        let mut prev: Option<Box<dyn StageLink>> = None;
        let mut stages = Vec::with_capacity(config.stages);
        for e in 0..config.stages {
            let next: Option<Box<dyn StageLink>>;
            let after: Option<Box<dyn StageLink>>;
            if e + 1 < config.stages {
                // Messages wait in the channel until the next stage runs, so the time limit
                // only matters when a stage is missing.
                let (a, b) = local_links(Duration::from_secs(600));
                next = Some(Box::new(a));
                after = Some(Box::new(b));
            } else {
                next = None;
                after = None;
            }
            let stage = Stage::new(e, config.clone(), device, data.clone(), prev.take(), next)?;
            stages.push(stage);
            prev = after;
        }
        Ok(Pipeline {
            stages,
            config,
            device: device.clone(),
        })
    }

    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    pub fn step(&mut self) -> Result<StepReport> {
        for s in &mut self.stages {
            s.forward()?;
        }
        let mut report = StepReport {
            loss: f32::NAN,
            bytes: 0,
        };
        for s in self.stages.iter_mut().rev() {
            let StageStep { loss, bytes_sent } = s.backward()?;
            report.bytes += bytes_sent;
            if let Some(loss) = loss {
                report.loss = loss;
            }
        }
        Ok(report)
    }

    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Fraction of `set` classified correctly by the whole model, without compression (the
    /// paper's "C. off"; there is no error-feedback state at evaluation).
    pub fn accuracy(&self, set: &ImageSet, batch: usize) -> Result<f64> {
        let layers: Vec<&Linear> = self.stages.iter().flat_map(|s| s.layers()).collect();
        mlp_accuracy(&layers, &self.device, set, batch)
    }

    /// Error-feedback state of the whole pipeline, in f32 values.
    pub fn memory_floats(&self) -> usize {
        self.stages.iter().map(Stage::memory_floats).sum()
    }

    /// Every stage's weights, in stage order.
    pub fn weight_bits(&self) -> Vec<u32> {
        self.stages.iter().flat_map(Stage::weight_bits).collect()
    }
}

/// Fraction of `set` that the MLP made of `layers` (ReLU between them) classifies correctly,
/// evaluated in batches of `batch`.
pub fn mlp_accuracy(
    layers: &[&Linear],
    device: &Device,
    set: &ImageSet,
    batch: usize,
) -> Result<f64> {
    let indices: Vec<usize> = (0..set.len()).collect();
    let mut correct = 0;
    for chunk in indices.chunks(batch.max(1)) {
        let (x, labels) = set.batch(chunk);
        let g = Graph::new(device);
        let t = Tensor::from_vec(device, &[chunk.len(), set.features()], x)?;
        let mut h = g.input(&t);
        for (i, layer) in layers.iter().enumerate() {
            h = layer.forward(&g, h)?;
            if i + 1 < layers.len() {
                h = g.relu(h)?;
            }
        }
        let predicted = g.value(h).argmax()?.to_vec_u32()?;
        correct += predicted
            .iter()
            .zip(&labels)
            .filter(|(p, y)| p == y)
            .count();
    }
    Ok(correct as f64 / set.len().max(1) as f64)
}
