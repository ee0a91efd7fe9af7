//! An image classifier (an MLP or a small CNN) trained with minibatch cross-entropy.

use std::str::FromStr;

use super::schedule::{clip_global_norm, WarmupCosine};
use crate::autograd::Graph;
use crate::autograd::Var;
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::nn::{Activation, Cnn, CnnConfig, Mlp, Module};
use crate::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use crate::tensor::{Device, Tensor};

/// Which optimizer a classifier trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    /// AdamW with PyTorch's default betas and epsilon.
    AdamW,
    /// SGD, with momentum and Nesterov as configured.
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
    /// The MLP's activation between layers.
    pub activation: Activation,
    /// The optimizer of the parameters.
    pub optimizer: OptimizerKind,
    /// Learning rate.
    pub lr: f32,
    /// AdamW's decoupled decay, or SGD's L2 term.
    pub weight_decay: f32,
    /// SGD momentum (Nesterov when `nesterov`).
    pub momentum: f32,
    /// Whether SGD's momentum is Nesterov's.
    pub nesterov: bool,
    /// Seeds the initial weights and the dropout masks.
    pub seed: u64,
    /// A CNN instead of the MLP (`hidden` and `activation` then do not apply); its image
    /// side and class count are taken from the data.
    pub cnn: Option<CnnConfig>,
    /// Learning rate per step (otherwise `lr` throughout).
    pub schedule: Option<WarmupCosine>,
    /// Largest global gradient norm (otherwise no clipping).
    pub clip: Option<f32>,
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
            cnn: None,
            schedule: None,
            clip: None,
        }
    }
}

/// The classifier's network.
pub enum ClassifierModel {
    /// A multi-layer perceptron over flat features.
    Mlp(Mlp),
    /// A convolutional network over square one-channel images.
    Cnn(Box<Cnn>),
}

impl ClassifierModel {
    /// Logits for `x [batch, features]`; `dropout` is `(seed, step, first sample)` in
    /// training.
    fn forward(&self, g: &Graph, x: Var, dropout: Option<(u64, u32, u32)>) -> Result<Var> {
        match self {
            ClassifierModel::Mlp(m) => m.forward(g, x),
            ClassifierModel::Cnn(m) => m.forward(g, x, dropout),
        }
    }

    /// The network's kind, `mlp` or `cnn`, for logs and checkpoints.
    pub fn name(&self) -> &'static str {
        match self {
            ClassifierModel::Mlp(_) => "mlp",
            ClassifierModel::Cnn(_) => "cnn",
        }
    }

    /// FLOPs of one sample's forward pass in matmuls and convolutions.
    pub fn forward_flops(&self) -> f64 {
        match self {
            ClassifierModel::Mlp(m) => m
                .layers
                .iter()
                .map(|l| 2.0 * (l.inputs() * l.outputs()) as f64)
                .sum(),
            ClassifierModel::Cnn(m) => m.forward_flops(),
        }
    }
}

impl Module for ClassifierModel {
    fn parameters(&self) -> Vec<&Tensor> {
        match self {
            ClassifierModel::Mlp(m) => m.parameters(),
            ClassifierModel::Cnn(m) => m.parameters(),
        }
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            ClassifierModel::Mlp(m) => m.parameters_mut(),
            ClassifierModel::Cnn(m) => m.parameters_mut(),
        }
    }
}

/// A model, its optimizer and the device they live on.
pub struct Classifier {
    /// The network.
    pub model: ClassifierModel,
    /// Features per sample.
    pub inputs: usize,
    /// What it was built from: the seed of the dropout masks, the schedule and clipping are
    /// read from here, and a checkpoint must have been written under the same config.
    pub config: ClassifierConfig,
    /// What else a resumed run must share with this one (the CLI puts the batch size and
    /// data limits here); part of the checkpoint identity.
    pub run_tag: String,
    /// The optimizer that steps the network's parameters.
    pub optimizer: Box<dyn Optimizer>,
    /// The device the parameters and the optimizer state live on.
    pub device: Device,
    /// Training steps taken.
    pub steps: u64,
}

impl Classifier {
    /// A freshly initialised classifier from `inputs` features to `classes` logits; fails if a CNN
    /// is asked for and `inputs` is not a square image side squared.
    pub fn new(
        device: &Device,
        inputs: usize,
        classes: usize,
        config: &ClassifierConfig,
    ) -> Result<Self> {
        let model = match &config.cnn {
            None => {
                let mut sizes = vec![inputs];
                sizes.extend(&config.hidden);
                sizes.push(classes);
                ClassifierModel::Mlp(Mlp::new(device, &sizes, config.activation, config.seed)?)
            }
            Some(cnn) => {
                let side = (inputs as f64).sqrt() as usize;
                if side * side != inputs {
                    return Err(Error::Config(format!(
                        "the CNN takes square one-channel images; {inputs} features are not"
                    )));
                }
                let cnn = CnnConfig {
                    side,
                    channels: 1,
                    classes,
                    ..cnn.clone()
                };
                ClassifierModel::Cnn(Box::new(Cnn::new(device, &cnn, config.seed)?))
            }
        };
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
            inputs,
            config: config.clone(),
            run_tag: String::new(),
            optimizer,
            device: device.clone(),
            steps: 0,
        })
    }

    /// Mean loss and parameter gradients of one batch (`x [batch, features]`, labels) whose
    /// first sample is sample `first_sample` of the step's global batch (0 for a whole batch;
    /// a data-parallel rank's share starts further in): dropout keys its masks by it.
    pub fn loss_and_grads(
        &self,
        x: &[f32],
        labels: &[u32],
        first_sample: usize,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let batch = labels.len();
        let first_sample = u32::try_from(first_sample)
            .map_err(|_| Error::Config(format!("sample {first_sample} is past 2^32")))?;
        let xt = Tensor::from_vec(&self.device, &[batch, self.inputs], x.to_vec())?;
        let yt = Tensor::from_u32(&self.device, &[batch], labels.to_vec())?;
        let g = Graph::new(&self.device);
        let input = g.input(&xt);
        let logits = self.model.forward(
            &g,
            input,
            Some((self.config.seed, self.steps as u32, first_sample)),
        )?;
        let loss = g.cross_entropy_mean(logits, &yt)?;
        let loss_value = g.value(loss);
        // Consuming the graph releases its handles on the parameters before the update.
        let grads = g.backward(loss)?.for_params(&self.model.parameters())?;
        Ok((loss_value, grads))
    }

    /// Applies gradients with the optimizer, after clipping them and setting the step's
    /// learning rate when the config asks for either.
    pub fn apply(&mut self, grads: &[Tensor]) -> Result<()> {
        let mut grads = grads.to_vec();
        if let Some(max_norm) = self.config.clip {
            clip_global_norm(&mut grads, max_norm)?;
        }
        if let Some(schedule) = &self.config.schedule {
            self.optimizer.set_lr(schedule.lr(self.steps));
        }
        self.optimizer
            .step(&mut self.model.parameters_mut(), &grads)?;
        self.steps += 1;
        Ok(())
    }

    /// One training step; returns the batch's mean loss as a one-element tensor (reading it
    /// waits for the GPU, so callers read losses in groups).
    pub fn step(&mut self, x: &[f32], labels: &[u32]) -> Result<Tensor> {
        let (loss, grads) = self.loss_and_grads(x, labels, 0)?;
        self.apply(&grads)?;
        Ok(loss)
    }

    /// Predicted classes of `x [n, features]`.
    pub fn predict(&self, x: &[f32], n: usize) -> Result<Vec<u32>> {
        let xt = Tensor::from_vec(&self.device, &[n, self.inputs], x.to_vec())?;
        let g = Graph::new(&self.device);
        let input = g.input(&xt);
        let logits = self.model.forward(&g, input, None)?;
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
    /// Every parameter's bits in order ([`Module::parameter_bits`] of the model).
    pub fn parameter_bits(&self) -> Result<Vec<u32>> {
        self.model.parameter_bits()
    }

    /// Parameters and optimizer state as checkpoint bytes (safetensors).
    pub fn save_state(&self) -> Result<Vec<u8>> {
        super::state::save(
            &self.model.parameters(),
            self.optimizer.as_ref(),
            self.steps,
            self.format(),
            &self.identity(),
        )
    }

    /// Restores what [`Classifier::save_state`] wrote, for a classifier of the same shape.
    pub fn load_state(&mut self, bytes: &[u8]) -> Result<()> {
        let format = self.format();
        let identity = self.identity();
        self.steps = super::state::load(
            bytes,
            &self.device,
            format,
            &identity,
            self.model.parameters_mut(),
            self.optimizer.as_mut(),
        )?;
        Ok(())
    }

    /// What a checkpoint must share with this run to resume it bit for bit.
    fn identity(&self) -> String {
        format!("{:?}; {}", self.config, self.run_tag)
    }

    fn format(&self) -> &'static str {
        match self.model {
            ClassifierModel::Mlp(_) => "murmur-classifier-1",
            ClassifierModel::Cnn(_) => "murmur-cnn-1",
        }
    }
}
