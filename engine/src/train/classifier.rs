//! An image classifier (an MLP or a small CNN) trained with minibatch cross-entropy.

use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::host_update::{self, HostUpdate};
use super::schedule::{clip_global_norm, WarmupCosine};
use super::state::{self, describe, Header, Saved};
use crate::autograd::Graph;
use crate::autograd::Var;
use crate::checkpoint::Precision;
use crate::cpu::pool::on_pool;
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::nn::{Activation, Cnn, CnnConfig, Mlp, Module};
use crate::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use crate::tensor::{Device, Tensor};

/// Which optimizer a classifier trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        match self {
            ClassifierModel::Mlp(m) => m.named_parameters(),
            ClassifierModel::Cnn(m) => m.named_parameters(),
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
    /// Classes, the width of the logits.
    pub classes: usize,
    /// What it was built from: the seed of the dropout masks, the schedule and clipping are
    /// read from here, and a checkpoint must have been written under the same config.
    pub config: ClassifierConfig,
    /// What a resumed run must share with this one about its data, as JSON (the CLI puts the
    /// dataset, the training samples, the batch and the epochs here; null by default):
    /// saved in checkpoints as part of the run's description.
    pub data: Value,
    /// The optimizer that steps the network's parameters.
    pub optimizer: Box<dyn Optimizer>,
    /// The device the parameters live on, and the optimizer state unless the optimizer steps
    /// on the CPU ([`Classifier::update_on_cpu`]).
    pub device: Device,
    /// Training steps taken.
    pub steps: u64,
    /// The CPU copies the optimizer steps, once [`Classifier::update_on_cpu`] asked for it.
    host: Option<HostUpdate>,
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
        let model = match Shape::of(inputs, classes, config)? {
            Shape::Mlp(sizes) => {
                ClassifierModel::Mlp(Mlp::new(device, &sizes, config.activation, config.seed)?)
            }
            Shape::Cnn(cnn) => ClassifierModel::Cnn(Box::new(Cnn::new(device, &cnn, config.seed)?)),
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
            classes,
            config: config.clone(),
            data: Value::Null,
            optimizer,
            device: device.clone(),
            steps: 0,
            host: None,
        })
    }

    /// Replaces the parameters' values (CPU tensors, in order), on the device and in the
    /// CPU copies the optimizer steps; the optimizer's state is kept.
    pub fn set_parameters(&mut self, values: &[Tensor]) -> Result<()> {
        host_update::set_values(&mut self.host, &mut self.model.parameters_mut(), values)
    }

    /// Steps the optimizer on the CPU from now on, whatever device the model computes on: its
    /// state moves to the CPU, and each step uploads the new parameters. Data-parallel replicas
    /// do this so that workers on different devices take the same update bit for bit
    /// (a GPU driver may fuse the multiply-adds of the optimizer's kernel; the CPU path is the
    /// reference every device agrees with). A model on the CPU is left as it is.
    pub fn update_on_cpu(&mut self) -> Result<()> {
        let params = self.model.parameters();
        self.host = HostUpdate::for_device(&self.device, &params, self.optimizer.as_mut())?;
        Ok(())
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
        on_pool(!self.device.is_gpu(), || {
            let (g, loss) = self.loss_graph(x, labels, first_sample)?;
            g.loss_and_grads(loss, &self.model.parameters())
        })
    }

    /// [`Classifier::loss_and_grads`] with each parameter's gradient handed to `ready` (with
    /// its position among the parameters) as soon as the backward pass has finished it
    /// ([`Graph::backward_as_ready`]); returns the mean loss.
    pub fn grads_as_ready(
        &self,
        x: &[f32],
        labels: &[u32],
        first_sample: usize,
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let (g, loss) = self.loss_graph(x, labels, first_sample)?;
        g.loss_as_ready(loss, &self.model.parameters(), ready)
    }

    /// The forward pass's tape and its mean loss, for the backward pass.
    fn loss_graph(&self, x: &[f32], labels: &[u32], first_sample: usize) -> Result<(Graph, Var)> {
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
        Ok((g, loss))
    }

    /// Applies gradients with the optimizer, after clipping them and setting the step's
    /// learning rate when the config asks for either.
    pub fn apply(&mut self, grads: &[Tensor]) -> Result<()> {
        on_pool(!self.device.is_gpu(), || {
            let mut grads = host_update::grads(&self.host, grads)?;
            if let Some(max_norm) = self.config.clip {
                clip_global_norm(&mut grads, max_norm)?;
            }
            if let Some(schedule) = &self.config.schedule {
                self.optimizer.set_lr(schedule.lr(self.steps));
            }
            host_update::step(
                &mut self.host,
                self.optimizer.as_mut(),
                &mut self.model.parameters_mut(),
                &grads,
            )
        })?;
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
        on_pool(!self.device.is_gpu(), || {
            let xt = Tensor::from_vec(&self.device, &[n, self.inputs], x.to_vec())?;
            let g = Graph::new(&self.device);
            let input = g.input(&xt);
            let logits = self.model.forward(&g, input, None)?;
            g.value(logits).argmax()?.to_vec_u32()
        })
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

    /// The digest replicas compare each round ([`Module::parameter_digest`]).
    pub fn parameter_digest(&self) -> Result<u64> {
        self.model.parameter_digest()
    }

    /// Parameters and optimizer state as checkpoint bytes (safetensors, f32): what
    /// [`Classifier::load_state`] resumes from.
    pub fn save_state(&self) -> Result<Vec<u8>> {
        state::write(
            self.header()?,
            &self.model,
            Some(self.optimizer.as_ref()),
            Precision::F32,
        )
    }

    /// The parameters alone in `precision`, with the run's description that rebuilds the
    /// model ([`Classifier::from_saved`]).
    pub fn save_weights(&self, precision: Precision) -> Result<Vec<u8>> {
        state::write(self.header()?, &self.model, None, precision)
    }

    /// Resumes from what [`Classifier::save_state`] wrote: refuses a checkpoint of another
    /// model or run (naming the difference), or of weights alone; nothing is changed then.
    pub fn load_state(&mut self, bytes: &[u8]) -> Result<()> {
        let saved = Saved::from_bytes(bytes, &self.device)?;
        saved.expect_run(self.model.name(), &self.describe()?)?;
        self.steps = saved.restore(&mut self.model, Some(self.optimizer.as_mut()))?;
        if self.host.is_some() {
            self.update_on_cpu()?;
        }
        Ok(())
    }

    /// The classifier a checkpoint describes (weights alone or a training state), built
    /// from its metadata and loaded onto the checkpoint's device; the optimizer's state is
    /// restored too when the checkpoint holds it.
    pub fn from_saved(saved: Saved) -> Result<Self> {
        if !["mlp", "cnn"].contains(&saved.model.as_str()) {
            return Err(Error::Data(format!(
                "the checkpoint's model is {}, not a classifier (mlp or cnn)",
                saved.model
            )));
        }
        let run: ClassifierRun = saved.run_as()?;
        let shape = Shape::of(run.inputs, run.classes, &run.config)?;
        saved.expect_model(shape.name())?;
        // The sizes come from the file: they must match its tensors before any allocation.
        saved.expect_weights(shape.parameter_count())?;
        let mut clf = Classifier::new(&saved.device, run.inputs, run.classes, &run.config)?;
        clf.data = run.data;
        clf.steps = saved.restore(&mut clf.model, Some(clf.optimizer.as_mut()))?;
        Ok(clf)
    }

    fn header(&self) -> Result<Header<'static>> {
        Ok(Header {
            model: self.model.name(),
            run: self.describe()?,
            steps: self.steps,
        })
    }

    /// The run's description: what rebuilds the model, and what a checkpoint must share
    /// with this run to resume it bit for bit.
    fn describe(&self) -> Result<Value> {
        describe(&ClassifierRun {
            inputs: self.inputs,
            classes: self.classes,
            config: self.config.clone(),
            data: self.data.clone(),
        })
    }
}

/// A classifier run's description in its checkpoints.
#[derive(Serialize, Deserialize)]
struct ClassifierRun {
    inputs: usize,
    classes: usize,
    config: ClassifierConfig,
    data: Value,
}

/// The network a config asks for, with the sizes taken from the data.
enum Shape {
    /// Widths, input first.
    Mlp(Vec<usize>),
    Cnn(CnnConfig),
}

impl Shape {
    fn of(inputs: usize, classes: usize, config: &ClassifierConfig) -> Result<Shape> {
        Ok(match &config.cnn {
            None => {
                let mut sizes = vec![inputs];
                sizes.extend(&config.hidden);
                sizes.push(classes);
                Shape::Mlp(sizes)
            }
            Some(cnn) => {
                let side = (inputs as f64).sqrt() as usize;
                if side.checked_mul(side) != Some(inputs) {
                    return Err(Error::Config(format!(
                        "the CNN takes square one-channel images; {inputs} features are not"
                    )));
                }
                Shape::Cnn(CnnConfig {
                    side,
                    channels: 1,
                    classes,
                    ..cnn.clone()
                })
            }
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Shape::Mlp(_) => "mlp",
            Shape::Cnn(_) => "cnn",
        }
    }

    fn parameter_count(&self) -> Option<usize> {
        match self {
            Shape::Mlp(sizes) => Mlp::parameter_count_for(sizes),
            Shape::Cnn(cnn) => cnn.parameter_count(),
        }
    }
}
