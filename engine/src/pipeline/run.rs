//! [`Pipeline`]: all stages of a pipeline in one process, linked in-process. A step runs every
//! stage's forward pass in order, then every backward pass in reverse, which is the order
//! the messages need; stages in separate processes run the same `Stage` code and so produce
//! the same bits.

use std::sync::Arc;
use std::time::Duration;

use super::data::{PipelineData, TextWindows};
use super::model::{ModelSpec, StageInput};
use super::stage::{Stage, StageStep};
use super::PipelineConfig;
use crate::autograd::{Graph, Var};
use crate::comm::stage::{local_links, StageLink};
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};

/// What one pipeline step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The batch's mean loss (computed on the compressed forward pass).
    pub loss: f32,
    /// Payload bytes across every cut, both directions.
    pub bytes: usize,
}

/// Every stage of a pipeline in one process, linked by in-process channels.
pub struct Pipeline {
    stages: Vec<Stage>,
    config: Arc<PipelineConfig>,
    device: Device,
}

impl Pipeline {
    /// Builds every stage of `config` on `device`, all training on `data`, and links neighbours
    /// in-process; fails if the configuration cannot run.
    pub fn new(config: PipelineConfig, device: &Device, data: Arc<PipelineData>) -> Result<Self> {
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

    /// The configuration all stages share.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// One training step: every stage's forward pass in order, then every backward pass in reverse;
    /// reports the loss and the payload bytes across every cut.
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

    /// The stages, first to last.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The logits of the whole model for stage 0's input `x`, every stage in turn with
    /// nothing compressed: evaluation is the paper's "C. off", with no error-feedback state.
    pub fn logits(&self, g: &Graph, x: &Tensor) -> Result<Var> {
        let mut h = self.stages[0].model().forward(g, StageInput::Data(x))?;
        for s in &self.stages[1..] {
            h = s.model().forward(g, StageInput::Received(h))?;
        }
        Ok(h)
    }

    /// Fraction of `set` classified correctly by the whole model, without compression.
    pub fn accuracy(&self, set: &ImageSet, batch: usize) -> Result<f64> {
        image_accuracy(&self.device, set, batch, |g, x| self.logits(g, x))
    }

    /// Mean next-byte loss in nats over the windows of `text` (at most `max_windows`, evenly
    /// spread), without compression.
    pub fn text_loss(&self, text: &TextWindows, max_windows: usize, batch: usize) -> Result<f64> {
        if !matches!(&self.config.model, ModelSpec::Gpt(c) if c.context == text.context()) {
            return Err(Error::Config(format!(
                "windows of {} bytes for {}",
                text.context(),
                self.config.model
            )));
        }
        let stride = text.len().div_ceil(max_windows.max(1));
        let picked: Vec<usize> = (0..text.len()).step_by(stride.max(1)).collect();
        if picked.is_empty() {
            return Err(Error::Data("no window of text to evaluate".into()));
        }
        let mut total = 0.0;
        for chunk in picked.chunks(batch.max(1)) {
            let (inputs, targets) = text.batch(chunk);
            let c = text.context();
            let x = Tensor::from_u32(&self.device, &[chunk.len(), c], inputs)?;
            let targets = Tensor::from_u32(&self.device, &[chunk.len() * c], targets)?;
            let g = Graph::new(&self.device);
            let loss = g.cross_entropy_mean(self.logits(&g, &x)?, &targets)?;
            total += g.value(loss).item()? as f64 * chunk.len() as f64;
        }
        Ok(total / picked.len() as f64)
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

/// Fraction of `set` that `logits` (a model's forward pass from `[samples, features]`)
/// classifies correctly, evaluated in batches of `batch`.
pub fn image_accuracy(
    device: &Device,
    set: &ImageSet,
    batch: usize,
    logits: impl Fn(&Graph, &Tensor) -> Result<Var>,
) -> Result<f64> {
    let indices: Vec<usize> = (0..set.len()).collect();
    let mut correct = 0;
    for chunk in indices.chunks(batch.max(1)) {
        let (x, labels) = set.batch(chunk);
        let x = Tensor::from_vec(device, &[chunk.len(), set.features()], x)?;
        let g = Graph::new(device);
        let predicted = g.value(logits(&g, &x)?).argmax()?.to_vec_u32()?;
        correct += predicted
            .iter()
            .zip(&labels)
            .filter(|(p, y)| p == y)
            .count();
    }
    Ok(correct as f64 / set.len().max(1) as f64)
}
