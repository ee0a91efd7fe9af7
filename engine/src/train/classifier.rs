//! An MLP classifier trained with minibatch cross-entropy: the spine's main job.

use std::str::FromStr;

use crate::autograd::Graph;
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::nn::{Activation, Mlp, Module};
use crate::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use crate::tensor::{Device, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    AdamW,
    Sgd,
}

impl FromStr for OptimizerKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "adamw" => Ok(OptimizerKind::AdamW),
            "sgd" => Ok(OptimizerKind::Sgd),
            other => Err(Error::Config(format!(
                "optimizer {other:?}: use adamw or sgd"
            ))),
        }
    }
}

/// Everything that defines a classifier run besides the data.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassifierConfig {
    /// Hidden layer widths, e.g. `[512, 256]`.
    pub hidden: Vec<usize>,
    pub activation: Activation,
    pub optimizer: OptimizerKind,
    pub lr: f32,
    /// AdamW's decoupled decay, or SGD's L2 term.
    pub weight_decay: f32,
    /// SGD momentum (Nesterov when `nesterov`).
    pub momentum: f32,
    pub nesterov: bool,
    pub seed: u64,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            hidden: vec![512, 256],
            activation: Activation::Relu,
            optimizer: OptimizerKind::AdamW,
            lr: 1e-3,
            weight_decay: 0.0,
            momentum: 0.9,
            nesterov: false,
            seed: 0,
        }
    }
}

/// A model, its optimizer and the device they live on.
pub struct Classifier {
    pub model: Mlp,
    pub optimizer: Box<dyn Optimizer>,
    pub device: Device,
    pub steps: u64,
}

impl Classifier {
    pub fn new(
        device: &Device,
        inputs: usize,
        classes: usize,
        config: &ClassifierConfig,
    ) -> Result<Self> {
        let mut sizes = vec![inputs];
        sizes.extend(&config.hidden);
        sizes.push(classes);
        let model = Mlp::new(device, &sizes, config.activation, config.seed)?;
        let optimizer: Box<dyn Optimizer> = match config.optimizer {
            OptimizerKind::AdamW => Box::new(AdamW::new(AdamWConfig {
                lr: config.lr,
                weight_decay: config.weight_decay,
                ..AdamWConfig::default()
            })),
            OptimizerKind::Sgd => Box::new(Sgd::new(SgdConfig {
                lr: config.lr,
                momentum: config.momentum,
                dampening: 0.0,
                weight_decay: config.weight_decay,
                nesterov: config.nesterov,
            })?),
        };
        Ok(Classifier {
            model,
            optimizer,
            device: device.clone(),
            steps: 0,
        })
    }

    /// Mean loss and parameter gradients of one batch (`x [batch, features]`, labels).
    pub fn loss_and_grads(&self, x: &[f32], labels: &[u32]) -> Result<(Tensor, Vec<Tensor>)> {
        let batch = labels.len();
        let features = self.model.sizes()[0];
        let xt = Tensor::from_vec(&self.device, &[batch, features], x.to_vec())?;
        let yt = Tensor::from_u32(&self.device, &[batch], labels.to_vec())?;
        let g = Graph::new(&self.device);
        let input = g.input(&xt);
        let logits = self.model.forward(&g, input)?;
        let loss = g.cross_entropy_mean(logits, &yt)?;
        let loss_value = g.value(loss);
        // Consuming the graph releases its handles on the parameters before the update.
        let grads = g.backward(loss)?.for_params(&self.model.parameters())?;
        Ok((loss_value, grads))
    }

    /// Applies gradients with the optimizer.
    pub fn apply(&mut self, grads: &[Tensor]) -> Result<()> {
        self.optimizer
            .step(&mut self.model.parameters_mut(), grads)?;
        self.steps += 1;
        Ok(())
    }

    /// One training step; returns the batch's mean loss as a one-element tensor (reading it
    /// waits for the GPU, so callers read losses in groups).
    pub fn step(&mut self, x: &[f32], labels: &[u32]) -> Result<Tensor> {
        let (loss, grads) = self.loss_and_grads(x, labels)?;
        self.apply(&grads)?;
        Ok(loss)
    }

    /// Predicted classes of `x [n, features]`.
    pub fn predict(&self, x: &[f32], n: usize) -> Result<Vec<u32>> {
        let xt = Tensor::from_vec(&self.device, &[n, self.model.sizes()[0]], x.to_vec())?;
        let g = Graph::new(&self.device);
        let input = g.input(&xt);
        let logits = self.model.forward(&g, input)?;
        g.value(logits).argmax()?.to_vec_u32()
    }

    /// Fraction of `set` classified correctly, evaluated in batches of `batch`.
    pub fn accuracy(&self, set: &ImageSet, batch: usize) -> Result<f64> {
        let mut correct = 0usize;
        let indices: Vec<usize> = (0..set.len()).collect();
        for chunk in indices.chunks(batch.max(1)) {
            let (x, y) = set.batch(chunk);
            let predicted = self.predict(&x, chunk.len())?;
            correct += predicted.iter().zip(&y).filter(|(p, t)| p == t).count();
        }
        Ok(correct as f64 / set.len().max(1) as f64)
    }
}

impl Classifier {
    /// Every parameter's bits in order, read back at once: what determinism tests compare.
    pub fn parameter_bits(&self) -> Result<Vec<u32>> {
        Ok(Tensor::read_many(&self.model.parameters())?
            .into_iter()
            .flatten()
            .map(f32::to_bits)
            .collect())
    }

    /// Parameters and optimizer state as checkpoint bytes (safetensors).
    pub fn save_state(&self) -> Result<Vec<u8>> {
        let opt = self.optimizer.export();
        let mut tensors: Vec<(String, Tensor)> = self
            .model
            .parameters()
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("param.{i}"), (*p).clone()))
            .collect();
        tensors.extend(
            opt.tensors
                .into_iter()
                .map(|(n, t)| (format!("optim.{n}"), t)),
        );
        let meta = std::collections::BTreeMap::from([
            ("format".to_string(), "murmur-classifier-1".to_string()),
            ("steps".to_string(), self.steps.to_string()),
            ("optimizer_steps".to_string(), opt.steps.to_string()),
        ]);
        crate::checkpoint::to_bytes(&tensors, &meta)
    }

    /// Restores what [`Classifier::save_state`] wrote, for a classifier of the same shape.
    pub fn load_state(&mut self, bytes: &[u8]) -> Result<()> {
        let (tensors, meta) = crate::checkpoint::from_bytes(bytes, &self.device)?;
        if meta.get("format").map(String::as_str) != Some("murmur-classifier-1") {
            return Err(Error::Data(
                "checkpoint is not a murmur classifier state".into(),
            ));
        }
        let number = |k: &str| {
            meta.get(k)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Error::Data(format!("checkpoint metadata lacks {k}")))
        };
        let (steps, optimizer_steps) = (number("steps")?, number("optimizer_steps")?);
        let loaded: Vec<Tensor> = (0..self.model.parameters().len())
            .map(|i| crate::checkpoint::take(&tensors, &format!("param.{i}")))
            .collect::<Result<_>>()?;
        for (p, t) in self.model.parameters().iter().zip(&loaded) {
            if p.shape() != t.shape() {
                return Err(Error::Data(format!(
                    "checkpoint parameter of shape {:?} for a model parameter of shape {:?}",
                    t.shape(),
                    p.shape()
                )));
            }
        }
        let optim = tensors
            .iter()
            .filter_map(|(n, t)| n.strip_prefix("optim.").map(|n| (n.to_string(), t.clone())))
            .collect();
        self.optimizer.import(crate::optim::OptimizerState {
            steps: optimizer_steps,
            tensors: optim,
        })?;
        for (p, t) in self.model.parameters_mut().into_iter().zip(loaded) {
            *p = t;
        }
        self.steps = steps;
        Ok(())
    }
}
