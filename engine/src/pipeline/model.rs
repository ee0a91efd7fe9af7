//! What a pipeline splits: an MLP cut between layers, or a GPT cut between transformer
//! blocks (clapping.md §7 R4), and the slice of it that one stage holds.
//!
//! Every stage builds the whole model from the seed and keeps its own part, so the stages'
//! initial weights are those of the unsplit model. A GPT slice differs from [`Gpt`] in one
//! way: the output projection is its own matrix, initialised as a copy of the token
//! embedding, instead of the embedding itself. Weight tying would put one tensor on the first
//! and the last stage and need a gradient exchange between them that the paper's pipeline
//! does not have; the untied model starts as the same function.

use std::fmt;
use std::ops::Range;

use crate::autograd::{Graph, Var};
use crate::error::{Error, Result};
use crate::nn::{prefixed, Activation, Block, Gpt, GptConfig, LayerNorm, Linear, Mlp, Module};
use crate::tensor::{Device, Tensor};

/// The model every stage agrees on.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSpec {
    /// Widths, input first, classes last, ReLU between layers; cuts fall between layers.
    Mlp(Vec<usize>),
    /// A byte-level GPT; cuts fall between blocks, the embeddings go with the first block and
    /// the final norm and output projection with the last.
    Gpt(GptConfig),
}

impl ModelSpec {
    /// The units that stages split among themselves: layers of an MLP, blocks of a GPT.
    pub fn units(&self) -> usize {
        match self {
            ModelSpec::Mlp(sizes) => sizes.len().saturating_sub(1),
            ModelSpec::Gpt(c) => c.layers,
        }
    }

    /// Shape of one batch of the activation entering unit `unit` (`unit > 0`); one sample
    /// is one row of what crosses a cut.
    pub fn activation_shape(&self, unit: usize, batch: usize) -> Vec<usize> {
        match self {
            ModelSpec::Mlp(sizes) => vec![batch, sizes[unit]],
            ModelSpec::Gpt(c) => vec![batch, c.context, c.dim],
        }
    }

    /// Values per sample of the activation entering unit `unit`.
    pub fn activation_width(&self, unit: usize) -> usize {
        self.activation_shape(unit, 1).iter().product()
    }

    /// Checks that the model can be built and split: an MLP needs at least two non-zero widths, a
    /// GPT positive sizes, `dim` a multiple of `heads` and no dropout.
    pub fn check(&self) -> Result<()> {
        match self {
            ModelSpec::Mlp(sizes) if sizes.len() < 2 || sizes.contains(&0) => Err(Error::Config(
                format!("an MLP needs at least two non-zero widths, got {sizes:?}"),
            )),
            ModelSpec::Gpt(c)
                if c.vocab == 0
                    || c.context == 0
                    || c.layers == 0
                    || c.dim == 0
                    || c.heads == 0
                    || !c.dim.is_multiple_of(c.heads) =>
            {
                Err(Error::Config(format!(
                    "a GPT needs positive sizes and a width divisible by the heads: {c:?}"
                )))
            }
            ModelSpec::Gpt(c) if c.dropout != 0.0 => Err(Error::Config(
                "pipeline stages run the GPT without dropout".into(),
            )),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSpec::Mlp(sizes) => write!(f, "an MLP {sizes:?}"),
            ModelSpec::Gpt(c) => write!(
                f,
                "a GPT of {} blocks, width {}, {} heads, context {}",
                c.layers, c.dim, c.heads, c.context
            ),
        }
    }
}

/// What enters a stage: the data (stage 0) or the activation received across the cut.
pub enum StageInput<'a> {
    /// Features `[batch, inputs]` for an MLP, token ids `[batch, context]` for a GPT.
    Data(&'a Tensor),
    /// The activation received from the previous stage, a leaf of this stage's graph.
    Received(Var),
}

/// One stage's part of the model.
pub enum StageModel {
    /// Consecutive layers of an MLP.
    Mlp {
        /// The stage's linear layers, in order, with ReLU between them.
        layers: Vec<Linear>,
        /// Whether the last layer gives the logits (no ReLU after it).
        last: bool,
    },
    /// Consecutive blocks of a GPT.
    Gpt(Box<GptSlice>),
}

/// Consecutive blocks of a GPT, with the embeddings on the first stage and the head on the
/// last.
pub struct GptSlice {
    /// Token `[vocab, dim]` and position `[context, dim]` embeddings.
    embeddings: Option<(Tensor, Tensor)>,
    blocks: Vec<Block>,
    /// Final layer norm and output projection `[vocab, dim]`.
    head: Option<(LayerNorm, Tensor)>,
}

impl StageModel {
    /// The units `units` of `spec` initialised from `seed`, `last` when this stage computes
    /// the logits.
    pub fn build(
        spec: &ModelSpec,
        units: Range<usize>,
        last: bool,
        device: &Device,
        seed: u64,
    ) -> Result<StageModel> {
        Ok(match spec {
            ModelSpec::Mlp(sizes) => StageModel::Mlp {
                layers: Mlp::new(device, sizes, Activation::Relu, seed)?
                    .layers
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| units.contains(i))
                    .map(|(_, l)| l)
                    .collect(),
                last,
            },
            ModelSpec::Gpt(config) => {
                let gpt = Gpt::new(device, config, seed)?;
                // A copy, not a clone: the graph knows parameters by their storage, and a
                // shared one would tie the two again when one stage holds both. Only the last
                // stage reads the embedding back to make it.
                let head = if last {
                    let wte = &gpt.token_embedding;
                    let head_weight = Tensor::from_vec(device, wte.shape(), wte.to_vec()?)?;
                    Some((gpt.ln_f, head_weight))
                } else {
                    None
                };
                let first = units.start == 0;
                StageModel::Gpt(Box::new(GptSlice {
                    embeddings: first
                        .then(|| (gpt.token_embedding.clone(), gpt.position_embedding.clone())),
                    blocks: gpt
                        .blocks
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| units.contains(i))
                        .map(|(_, b)| b)
                        .collect(),
                    head,
                }))
            }
        })
    }

    /// This stage's output: the activation sent on, or on the last stage the logits as
    /// `[samples, classes]` (a GPT's `[batch * context, vocab]`).
    pub fn forward(&self, g: &Graph, input: StageInput) -> Result<Var> {
        match self {
            StageModel::Mlp { layers, last } => {
                let mut h = match input {
                    StageInput::Data(x) => g.input(x),
                    StageInput::Received(h) => h,
                };
                for (i, layer) in layers.iter().enumerate() {
                    h = layer.forward(g, h)?;
                    if i + 1 < layers.len() || !last {
                        h = g.relu(h)?;
                    }
                }
                Ok(h)
            }
            StageModel::Gpt(slice) => slice.forward(g, input),
        }
    }
}

impl GptSlice {
    fn forward(&self, g: &Graph, input: StageInput) -> Result<Var> {
        let mut x = match (input, &self.embeddings) {
            (StageInput::Data(ids), Some((wte, wpe))) => {
                let &[_, t] = ids.shape() else {
                    return Err(Error::Config(format!(
                        "token ids must be [batch, context], are {:?}",
                        ids.shape()
                    )));
                };
                let positions = Tensor::from_u32(g.device(), &[t], (0..t as u32).collect())?;
                let tok = g.embedding(g.param(wte), ids)?;
                let pos = g.embedding(g.param(wpe), &positions)?;
                g.add(tok, pos)?
            }
            (StageInput::Received(x), None) => x,
            _ => {
                return Err(Error::Config(
                    "a GPT's first stage reads tokens, the others activations".into(),
                ))
            }
        };
        for block in &self.blocks {
            x = block.forward(g, x, None)?;
        }
        let Some((ln_f, head)) = &self.head else {
            return Ok(x);
        };
        let shape = g.shape(x);
        let x = ln_f.forward(g, x)?;
        let logits = g.matmul_t(x, g.param(head), false, true)?;
        let vocab = head.shape()[0];
        g.reshape(logits, &[shape[0] * shape[1], vocab])
    }
}

impl Module for StageModel {
    /// Names within the stage: its layers and blocks count from 0.
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        match self {
            StageModel::Mlp { layers, .. } => layers
                .iter()
                .enumerate()
                .flat_map(|(i, l)| prefixed(&format!("layers.{i}"), l))
                .collect(),
            StageModel::Gpt(s) => {
                let mut p = vec![];
                if let Some((wte, wpe)) = &s.embeddings {
                    p.push(("token_embedding".to_string(), wte));
                    p.push(("position_embedding".to_string(), wpe));
                }
                for (i, b) in s.blocks.iter().enumerate() {
                    p.extend(prefixed(&format!("blocks.{i}"), b));
                }
                if let Some((ln_f, head)) = &s.head {
                    p.extend(prefixed("ln_f", ln_f));
                    p.push(("head".to_string(), head));
                }
                p
            }
        }
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            StageModel::Mlp { layers, .. } => {
                layers.iter_mut().flat_map(|l| l.parameters_mut()).collect()
            }
            StageModel::Gpt(s) => {
                let mut p = vec![];
                if let Some((wte, wpe)) = &mut s.embeddings {
                    p.extend([wte, wpe]);
                }
                for b in &mut s.blocks {
                    p.extend(b.parameters_mut());
                }
                if let Some((ln_f, head)) = &mut s.head {
                    p.extend(ln_f.parameters_mut());
                    p.push(head);
                }
                p
            }
        }
    }
}
