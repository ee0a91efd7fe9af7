//! A byte-level GPT trained on next-byte prediction: AdamW with warm-up and cosine decay,
//! gradient clipping by global norm, evaluation in nats per byte, sampling, and resumable
//! checkpoints.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::host_update::{self, HostUpdate};
use super::state::{self, describe, Header, Saved};
use crate::autograd::{Graph, Var};
use crate::checkpoint::Precision;
use crate::cpu::pool::on_pool;
use crate::data::{lm_batch, lm_windows};
use crate::error::{Error, Result};
use crate::nn::{DropoutPlan, Gpt, GptConfig, Module};
use crate::optim::{AdamW, AdamWConfig, Optimizer};
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

use super::schedule::{clip_global_norm, WarmupCosine};

/// Everything that defines a language-model run besides the text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmConfig {
    /// The GPT's sizes.
    pub model: GptConfig,
    /// Sequences per step, each `model.context` bytes long.
    pub batch: usize,
    /// The learning-rate schedule.
    pub schedule: WarmupCosine,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f32,
    /// Largest global gradient norm; larger gradients are scaled down to it.
    pub clip: f32,
    /// Seeds the initial weights, the batches and the dropout masks.
    pub seed: u64,
}

impl LmConfig {
    /// Defaults for `steps` steps of training: peak learning rate 3e-3 after 100 steps of
    /// warm-up, decaying to a tenth.
    pub fn new(steps: u64) -> Self {
        LmConfig {
            model: GptConfig::default(),
            batch: 32,
            schedule: WarmupCosine {
                peak: 3e-3,
                warmup: 100.min(steps / 10),
                total: steps,
                min_ratio: 0.1,
            },
            weight_decay: 0.1,
            clip: 1.0,
            seed: 0,
        }
    }
}

/// One training step's readings, still on the device (reading them waits for the GPU).
pub struct LmStep {
    pub loss: Tensor,
    /// Global gradient norm before clipping.
    pub grad_norm: Tensor,
    pub lr: f32,
}

/// A byte-level GPT with its AdamW optimizer, trained on text windows.
pub struct LanguageModel {
    /// The network.
    pub model: Gpt,
    /// AdamW with betas (0.9, 0.95), its learning rate set from the schedule every step.
    pub optimizer: AdamW,
    /// The configuration the model was built from.
    pub config: LmConfig,
    /// The device the parameters live on, and the optimizer state unless the optimizer steps
    /// on the CPU ([`LanguageModel::update_on_cpu`]).
    pub device: Device,
    /// Training steps taken.
    pub steps: u64,
    /// The CPU copies the optimizer steps, once [`LanguageModel::update_on_cpu`] asked for it.
    host: Option<HostUpdate>,
}

impl LanguageModel {
    /// A freshly initialised model and optimizer for `config`; fails if the batch is empty or a
    /// model size is zero.
    pub fn new(device: &Device, config: &LmConfig) -> Result<Self> {
        if config.batch == 0 {
            return Err(Error::Config(
                "the batch must hold at least one sequence".into(),
            ));
        }
        Ok(LanguageModel {
            model: Gpt::new(device, &config.model, config.seed)?,
            optimizer: AdamW::new(AdamWConfig {
                lr: config.schedule.peak,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: config.weight_decay,
            }),
            config: config.clone(),
            device: device.clone(),
            steps: 0,
            host: None,
        })
    }

    fn context(&self) -> usize {
        self.model.config.context
    }

    /// Mean next-byte cross-entropy of `rows` sequences, and the graph to differentiate it.
    fn loss(
        &self,
        ids: Vec<u32>,
        targets: Vec<u32>,
        rows: usize,
        dropout: Option<DropoutPlan>,
    ) -> Result<(Graph, crate::autograd::Var)> {
        let t = ids.len() / rows;
        let ids = Tensor::from_u32(&self.device, &[rows, t], ids)?;
        let targets = Tensor::from_u32(&self.device, &[rows * t], targets)?;
        let g = Graph::new(&self.device);
        let logits = self.model.forward(&g, &ids, dropout)?;
        let logits = g.reshape(logits, &[rows * t, self.model.config.vocab])?;
        let loss = g.cross_entropy_mean(logits, &targets)?;
        Ok((g, loss))
    }

    /// One optimizer step on the batch that (seed, step) picks from `text`.
    pub fn step(&mut self, text: &[u8]) -> Result<LmStep> {
        let (ids, targets) = lm_batch(
            text,
            self.config.batch,
            self.context(),
            self.config.seed,
            self.steps,
        )?;
        let (loss, grads) = self.loss_and_grads(&ids, &targets, 0)?;
        let (grad_norm, lr) = self.apply(&grads)?;
        Ok(LmStep {
            loss,
            grad_norm,
            lr,
        })
    }

    /// Mean next-byte loss and parameter gradients of whole sequences (`ids` and `targets`,
    /// `context` bytes each, as [`lm_batch`] lays them out) whose first sequence is sequence
    /// `first_sample` of the step's global batch (0 for a whole batch; a data-parallel rank's
    /// share starts further in): dropout keys its masks by it.
    pub fn loss_and_grads(
        &self,
        ids: &[u32],
        targets: &[u32],
        first_sample: usize,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        on_pool(!self.device.is_gpu(), || {
            let (g, loss) = self.loss_graph(ids, targets, first_sample)?;
            g.loss_and_grads(loss, &self.model.parameters())
        })
    }

    /// [`LanguageModel::loss_and_grads`] with each parameter's gradient handed to `ready`
    /// (with its position among the parameters) as soon as the backward pass has finished it
    /// ([`Graph::backward_as_ready`]); returns the mean loss.
    pub fn grads_as_ready(
        &self,
        ids: &[u32],
        targets: &[u32],
        first_sample: usize,
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let (g, loss) = self.loss_graph(ids, targets, first_sample)?;
        g.loss_as_ready(loss, &self.model.parameters(), ready)
    }

    /// The forward pass's tape over whole sequences and its mean loss, for the backward pass.
    fn loss_graph(
        &self,
        ids: &[u32],
        targets: &[u32],
        first_sample: usize,
    ) -> Result<(Graph, Var)> {
        let context = self.context();
        if ids.is_empty() || ids.len() != targets.len() || !ids.len().is_multiple_of(context) {
            return Err(Error::Config(format!(
                "a batch of {} inputs and {} targets is not whole sequences of {context} bytes",
                ids.len(),
                targets.len()
            )));
        }
        let vocab = self.model.config.vocab;
        if let Some(bad) = ids.iter().chain(targets).find(|&&b| b as usize >= vocab) {
            return Err(Error::Config(format!(
                "byte id {bad} is past the vocabulary of {vocab}"
            )));
        }
        let rows = ids.len() / context;
        let first_sample = u32::try_from(first_sample)
            .ok()
            .zip(u32::try_from(rows).ok())
            .filter(|(first, rows)| first.checked_add(*rows).is_some())
            .map(|(first, _)| first)
            .ok_or_else(|| Error::Config(format!("sequences {first_sample}.. are past 2^32")))?;
        let dropout = (self.model.config.dropout > 0.0).then_some(DropoutPlan {
            rate: self.model.config.dropout,
            seed: self.config.seed,
            step: self.steps as u32,
            first_sample,
            samples: rows as u32,
        });
        self.loss(ids.to_vec(), targets.to_vec(), rows, dropout)
    }

    /// One AdamW step with `grads` (one per parameter, in order) after clipping them to the
    /// configuration's global norm, at the schedule's learning rate for this step. Returns
    /// the global norm before clipping and the learning rate.
    pub fn apply(&mut self, grads: &[Tensor]) -> Result<(Tensor, f32)> {
        let lr = self.config.schedule.lr(self.steps);
        let grad_norm = on_pool(!self.device.is_gpu(), || {
            let mut grads = host_update::grads(&self.host, grads)?;
            let grad_norm = clip_global_norm(&mut grads, self.config.clip)?;
            self.optimizer.set_lr(lr);
            host_update::step(
                &mut self.host,
                &mut self.optimizer,
                &mut self.model.parameters_mut(),
                &grads,
            )?;
            Ok::<_, Error>(grad_norm)
        })?;
        self.steps += 1;
        Ok((grad_norm, lr))
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
        self.host = HostUpdate::for_device(&self.device, &params, &mut self.optimizer)?;
        Ok(())
    }

    /// Mean loss in nats per byte over consecutive full-context windows of `text` (at most
    /// `max_windows` of them, evenly spread when there are more), `batch` windows at a time.
    pub fn evaluate(&self, text: &[u8], max_windows: usize, batch: usize) -> Result<f64> {
        let all: Vec<_> = lm_windows(text, self.context()).collect();
        if all.is_empty() {
            return Err(Error::Data("no full window of validation text".into()));
        }
        let stride = all.len().div_ceil(max_windows.max(1));
        let picked: Vec<_> = all.into_iter().step_by(stride).collect();
        let mut sums = vec![];
        for chunk in picked.chunks(batch.max(1)) {
            let ids = chunk.iter().flat_map(|(i, _)| i.iter().copied()).collect();
            let targets = chunk.iter().flat_map(|(_, t)| t.iter().copied()).collect();
            let (g, loss) = on_pool(!self.device.is_gpu(), || {
                self.loss(ids, targets, chunk.len(), None)
            })?;
            sums.push((g.value(loss), chunk.len()));
        }
        let values = Tensor::read_many(&sums.iter().map(|(t, _)| t).collect::<Vec<_>>())?;
        let total: f64 = values
            .iter()
            .zip(&sums)
            .map(|(v, (_, n))| v[0] as f64 * *n as f64)
            .sum();
        Ok(total / picked.len() as f64)
    }

    /// `length` bytes continuing `prompt`, drawn from the softmax at `temperature` with a
    /// seeded generator (the same seed gives the same text). Fails for a model whose
    /// vocabulary is not bytes.
    pub fn sample(
        &self,
        prompt: &[u8],
        length: usize,
        temperature: f32,
        seed: u64,
    ) -> Result<Vec<u8>> {
        let vocab = self.model.config.vocab;
        if vocab > 256 || prompt.iter().any(|&b| b as usize >= vocab) {
            return Err(Error::Config(format!(
                "a model of {vocab} token ids cannot read or write every byte of this prompt"
            )));
        }
        let mut text: Vec<u8> = if prompt.is_empty() {
            b"\n".to_vec()
        } else {
            prompt.to_vec()
        };
        let start = text.len();
        let mut rng = Rng::new(seed, 0x5A3B);
        for _ in 0..length {
            let window = &text[text.len().saturating_sub(self.context())..];
            let ids = Tensor::from_u32(
                &self.device,
                &[1, window.len()],
                window.iter().map(|&b| b as u32).collect(),
            )?;
            let g = Graph::new(&self.device);
            let logits = g.value(self.model.forward(&g, &ids, None)?).to_vec()?;
            let last = &logits[logits.len() - vocab..];
            text.push(sample_logits(last, temperature, &mut rng) as u8);
        }
        Ok(text[start..].to_vec())
    }

    /// Parameters, optimizer state and step count as checkpoint bytes (safetensors, f32):
    /// what [`LanguageModel::load_state`] resumes from.
    pub fn save_state(&self) -> Result<Vec<u8>> {
        state::write(
            self.header()?,
            &self.model,
            Some(&self.optimizer),
            Precision::F32,
        )
    }

    /// The parameters alone in `precision`, with the configuration that rebuilds the model
    /// ([`LanguageModel::from_saved`]).
    pub fn save_weights(&self, precision: Precision) -> Result<Vec<u8>> {
        state::write(self.header()?, &self.model, None, precision)
    }

    /// Resumes from what [`LanguageModel::save_state`] wrote: refuses a checkpoint of
    /// another model or run (naming the difference), or of weights alone; nothing is
    /// changed then.
    pub fn load_state(&mut self, bytes: &[u8]) -> Result<()> {
        let saved = Saved::from_bytes(bytes, &self.device)?;
        saved.expect_run(MODEL, &self.describe()?)?;
        self.steps = saved.restore(&mut self.model, Some(&mut self.optimizer))?;
        if self.host.is_some() {
            self.update_on_cpu()?;
        }
        Ok(())
    }

    /// The model a checkpoint describes (weights alone or a training state), built from its
    /// metadata on the checkpoint's device; the optimizer's state is restored too when the
    /// checkpoint holds it.
    pub fn from_saved(saved: Saved) -> Result<Self> {
        saved.expect_model(MODEL)?;
        let run: LmRun = saved.run_as()?;
        // The sizes come from the file: they must match its tensors before any allocation.
        saved.expect_weights(run.config.model.parameter_count())?;
        let mut lm = LanguageModel::new(&saved.device, &run.config)?;
        lm.steps = saved.restore(&mut lm.model, Some(&mut lm.optimizer))?;
        Ok(lm)
    }

    fn header(&self) -> Result<Header<'static>> {
        Ok(Header {
            model: MODEL,
            run: self.describe()?,
            steps: self.steps,
        })
    }

    /// The run's description: the whole config (model, batch, schedule, clipping, seed),
    /// which rebuilds the model and which a checkpoint must share to resume this run.
    fn describe(&self) -> Result<Value> {
        describe(&LmRun {
            config: self.config.clone(),
        })
    }
}

/// The model's kind in checkpoints.
const MODEL: &str = "gpt";

/// A language-model run's description in its checkpoints.
#[derive(Serialize, Deserialize)]
struct LmRun {
    config: LmConfig,
}

/// An index drawn from `softmax(logits / temperature)`; the argmax when temperature is 0.
fn sample_logits(logits: &[f32], temperature: f32, rng: &mut Rng) -> usize {
    let argmax = logits
        .iter()
        .enumerate()
        .fold(0, |best, (i, &v)| if v > logits[best] { i } else { best });
    if temperature <= 0.0 {
        return argmax;
    }
    let m = logits[argmax];
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| (((v - m) / temperature) as f64).exp())
        .collect();
    let mut u = rng.uniform() as f64 * weights.iter().sum::<f64>();
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i;
        }
        u -= w;
    }
    argmax
}
