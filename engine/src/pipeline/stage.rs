//! One pipeline stage: a contiguous slice of the model, its optimizer, its copy of the sampler
//! and its ends of the error-feedback buffers at the cuts on either side (clapping.md
//! Algorithms 2–4). The same code runs a stage in-process and as a peer over QUIC.

use std::sync::Arc;

use super::data::PipelineData;
use super::message::RowCodec;
use super::mirror::Mirror;
use super::model::{StageInput, StageModel};
use super::sampler::{Draw, LazySampler};
use super::PipelineConfig;
use crate::algo::{HostOptimizer, Hyper};
use crate::autograd::{Graph, Var};
use crate::comm::stage::{Direction, StageLink, StageMessage};
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::tensor::{Device, Tensor};

/// The forward pass of a step, kept for its backward pass.
struct Pending {
    graph: Graph,
    /// This stage's input `ỹ_{e−1}` (a parameter of the graph, so that its gradient comes out).
    input: Option<Tensor>,
    output: Var,
    /// The mean loss, on the last stage.
    loss: Option<Var>,
    draw: Draw,
    compress: bool,
}

/// What one stage did in one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageStep {
    /// The batch's mean loss, on the last stage.
    pub loss: Option<f32>,
    /// Payload bytes this stage sent.
    pub bytes_sent: usize,
}

/// One pipeline stage: its slice of the model, optimizer, sampler and ends of the error-feedback
/// buffers at its cuts, talking to its neighbours through stage links.
pub struct Stage {
    /// The stage's position in the pipeline, 0 first.
    pub index: usize,
    config: Arc<PipelineConfig>,
    device: Device,
    model: StageModel,
    /// The model's parameters as one host vector, which the optimizer updates.
    weights: Vec<f32>,
    optimizer: HostOptimizer,
    sampler: LazySampler,
    data: Arc<PipelineData>,
    prev: Option<Box<dyn StageLink>>,
    next: Option<Box<dyn StageLink>>,
    /// Cut e−1's forward buffer (receiving end) and backward buffer (sending end).
    forward_in: Option<Mirror>,
    backward_out: Option<Mirror>,
    /// Cut e's forward buffer (sending end) and backward buffer (receiving end).
    forward_out: Option<Mirror>,
    backward_in: Option<Mirror>,
    step: u64,
    pending: Option<Pending>,
    /// The weight gradient of the last step (for tests).
    pub last_gradient: Vec<f32>,
    sent: usize,
}

/// The codec stream of cut `e` in direction `d`.
fn channel(cut: usize, d: Direction) -> u32 {
    (cut as u32) << 1 | d.code() as u32
}

impl Stage {
    /// Stage `index` of `config.stages`, with links to its neighbours (`None` at the ends).
    /// Every stage builds the whole model from the seed and keeps its own part, so the
    /// stages' initial weights are those of the unsplit model.
    pub fn new(
        index: usize,
        config: Arc<PipelineConfig>,
        device: &Device,
        data: Arc<PipelineData>,
        prev: Option<Box<dyn StageLink>>,
        next: Option<Box<dyn StageLink>>,
    ) -> Result<Stage> {
        config.check()?;
        let last = config.stages - 1;
        if index > last || prev.is_some() != (index > 0) || next.is_some() != (index < last) {
            return Err(Error::Config(format!(
                "stage {index} of {} needs links to exactly its neighbours",
                config.stages
            )));
        }
        data.check_fits(&config.model)?;
        let model = StageModel::build(
            &config.model,
            config.layers_of(index),
            index == last,
            device,
            config.seed,
        )?;
        let params = model.parameters();
        let sizes: Vec<usize> = params.iter().map(|p| p.numel()).collect();
        let weights = Tensor::read_many(&params)?.concat();
        let (fwd, bwd) = config.variant.policies();
        let (fcodec, bcodec): (RowCodec, RowCodec) = (
            config.forward_codec.parse()?,
            config.backward_codec.parse()?,
        );
        let mirror = |policy, codec: &RowCodec, cut: usize, d| {
            Mirror::new(
                policy,
                codec.clone(),
                config.batch,
                config.cut_width(cut),
                config.seed,
                channel(cut, d),
            )
        };
        let has_prev = index > 0;
        let has_next = index < last;
        let sampler = LazySampler::new(
            data.len(),
            config.batch,
            config.rule,
            config.variant.sampling(config.p),
            config.seed,
        );
        Ok(Stage {
            index,
            device: device.clone(),
            model,
            optimizer: config.optimizer.build(&sizes),
            weights,
            sampler,
            data,
            prev,
            next,
            forward_in: has_prev.then(|| mirror(fwd, &fcodec, index - 1, Direction::Forward)),
            backward_out: has_prev.then(|| mirror(bwd, &bcodec, index - 1, Direction::Backward)),
            forward_out: has_next.then(|| mirror(fwd, &fcodec, index, Direction::Forward)),
            backward_in: has_next.then(|| mirror(bwd, &bcodec, index, Direction::Backward)),
            config,
            step: 0,
            pending: None,
            last_gradient: Vec::new(),
            sent: 0,
        })
    }

    /// This step's forward pass (Algorithm 2): draw the batch, receive `ỹ_{e−1}` (or read the
    /// data), compute `y_e` and send it on.
    pub fn forward(&mut self) -> Result<()> {
        if self.pending.is_some() {
            return Err(Error::Config(format!(
                "stage {}: forward twice without a backward",
                self.index
            )));
        }
        let step = self.step;
        let draw = self.sampler.next_draw();
        let compress = step >= self.config.warmup;
        let batch = self.config.batch;
        let g = Graph::new(&self.device);
        let (h, input) = match (&mut self.prev, &mut self.forward_in) {
            (Some(link), Some(mirror)) => {
                let payload = link.expect(step, Direction::Forward)?;
                let values = mirror.receive(&payload, &draw, compress)?;
                let shape = self
                    .config
                    .model
                    .activation_shape(self.config.layers_of(self.index).start, batch);
                let t = Tensor::from_vec(&self.device, &shape, values)?;
                let x = g.param(&t);
                (self.model.forward(&g, StageInput::Received(x))?, Some(t))
            }
            _ => {
                let x = self.data.inputs(&self.device, &draw.ids)?;
                (self.model.forward(&g, StageInput::Data(&x))?, None)
            }
        };
        let mut loss = None;
        if let (Some(link), Some(mirror)) = (&mut self.next, &mut self.forward_out) {
            let y = g.value(h).to_vec()?;
            let (payload, _) = mirror.send(&y, &draw, compress);
            self.sent += payload.len();
            link.send(StageMessage {
                step,
                direction: Direction::Forward,
                payload,
            })?;
        } else {
            let labels = self.data.labels(&self.device, &draw.ids)?;
            loss = Some(g.cross_entropy_mean(h, &labels)?);
        }
        self.pending = Some(Pending {
            graph: g,
            input,
            output: h,
            loss,
            draw,
            compress,
        });
        Ok(())
    }

    /// This step's backward pass and update (Algorithms 3 and 4): receive `ṽ_e`, send
    /// `v_{e−1}`, both gradients at the weights the forward pass used, then step.
    pub fn backward(&mut self) -> Result<StageStep> {
        let Pending {
            graph,
            input,
            output,
            loss,
            draw,
            compress,
        } = self.pending.take().ok_or_else(|| {
            Error::Config(format!("stage {}: backward before forward", self.index))
        })?;
        let step = self.step;
        let loss_value = loss.map(|l| graph.value(l));
        let grads = match (loss, &mut self.next, &mut self.backward_in) {
            (Some(l), _, _) => graph.backward(l)?,
            (None, Some(link), Some(mirror)) => {
                let payload = link.expect(step, Direction::Backward)?;
                let v = mirror.receive(&payload, &draw, compress)?;
                let shape = graph.shape(output);
                let seed = Tensor::from_vec(&self.device, &shape, v)?;
                graph.backward_with(output, seed)?
            }
            _ => unreachable!("a stage without a loss has a successor"),
        };
        if let (Some(input), Some(link), Some(mirror)) =
            (&input, &mut self.prev, &mut self.backward_out)
        {
            let v = grads
                .of(input)
                .ok_or_else(|| Error::Config("the input gradient is missing".into()))?
                .to_vec()?;
            let (payload, _) = mirror.send(&v, &draw, compress);
            self.sent += payload.len();
            link.send(StageMessage {
                step,
                direction: Direction::Backward,
                payload,
            })?;
        }
        let params = self.model.parameters();
        let gradient =
            Tensor::read_many(&grads.for_params(&params)?.iter().collect::<Vec<_>>())?.concat();
        drop(grads);
        let hyper = Hyper {
            step,
            lr: self.config.lr_at(step),
            weight_decay: self.config.weight_decay,
        };
        self.optimizer.step(&mut self.weights, &gradient, hyper)?;
        self.upload_weights()?;
        self.last_gradient = gradient;
        self.step += 1;
        let bytes_sent = std::mem::take(&mut self.sent);
        Ok(StageStep {
            loss: loss_value.map(|t| t.item()).transpose()?,
            bytes_sent,
        })
    }

    fn upload_weights(&mut self) -> Result<()> {
        let mut offset = 0;
        for p in self.model.parameters_mut() {
            let n = p.numel();
            *p = Tensor::from_vec(
                &self.device,
                p.shape(),
                self.weights[offset..offset + n].to_vec(),
            )?;
            offset += n;
        }
        Ok(())
    }

    /// One whole step, for a stage that runs alone (its neighbours in other threads or
    /// processes).
    pub fn step(&mut self) -> Result<StageStep> {
        self.forward()?;
        self.backward()
    }

    /// Training steps this stage has completed.
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// This stage's part of the model, for evaluating the whole model.
    pub fn model(&self) -> &StageModel {
        &self.model
    }

    /// This stage's parameters in the order of [`Module::parameters`], as one vector.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// The bit patterns of [`Stage::weights`], for comparing runs bit for bit.
    pub fn weight_bits(&self) -> Vec<u32> {
        self.weights.iter().map(|w| w.to_bits()).collect()
    }

    /// Error-feedback state held here, in f32 values (clapping.md invariant 9).
    pub fn memory_floats(&self) -> usize {
        [
            &self.forward_in,
            &self.backward_out,
            &self.forward_out,
            &self.backward_in,
        ]
        .into_iter()
        .flatten()
        .map(Mirror::memory_floats)
        .sum()
    }

    /// The bits of the buffers of cut e−1 (forward, backward) held here.
    pub fn buffers_before(&self) -> Option<(Vec<u32>, Vec<u32>)> {
        Some((
            self.forward_in.as_ref()?.state_bits(),
            self.backward_out.as_ref()?.state_bits(),
        ))
    }

    /// The bits of the buffers of cut e (forward, backward) held here.
    pub fn buffers_after(&self) -> Option<(Vec<u32>, Vec<u32>)> {
        Some((
            self.forward_out.as_ref()?.state_bits(),
            self.backward_in.as_ref()?.state_bits(),
        ))
    }

    /// Fresh samples drawn so far, in epochs.
    pub fn epochs_drawn(&self) -> f64 {
        self.sampler.epochs_drawn()
    }
}
