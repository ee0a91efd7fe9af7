//! Causal multi-head self-attention and the pre-norm transformer block of GPT-2.

use super::{init, prefixed, LayerNorm, Linear, Module};
use crate::autograd::{Graph, Var};
use crate::error::{shape_err, Result};
use crate::kernels::dropout::DropoutMask;
use crate::kernels::unary::Unary;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// A linear layer with GPT-2's initialisation: weights normal(0, std), bias zero.
fn gpt_linear(
    device: &Device,
    inputs: usize,
    outputs: usize,
    std: f32,
    rng: &mut Rng,
) -> Result<Linear> {
    Ok(Linear {
        weight: init::normal(device, &[inputs, outputs], std, rng)?,
        bias: Some(Tensor::zeros(device, &[outputs])?),
    })
}

/// Dropout for one step of training: the mask of site `key` is drawn from (seed, step, key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutPlan {
    /// Probability that an element is dropped, in [0, 1).
    pub rate: f32,
    /// The run's seed.
    pub seed: u64,
    /// The training step, so that every step draws new masks.
    pub step: u32,
    /// The position of the batch's first sample in the step's global batch (0 for a whole
    /// batch), so that each sample draws its own masks wherever it is computed.
    pub first_sample: u32,
    /// Samples in the batch.
    pub samples: u32,
}

impl DropoutPlan {
    /// The mask of dropout site `key` for this step.
    pub fn mask(&self, key: u32) -> DropoutMask {
        DropoutMask {
            rate: self.rate,
            seed: self.seed,
            step: self.step,
            key,
            first_sample: self.first_sample,
            samples: self.samples,
        }
    }
}

/// `residual + dropout(layer(x))`: one operation where there is no dropout
/// ([`Linear::forward_onto`]), the same bits as the layer and an addition.
fn onto_residual(
    g: &Graph,
    layer: &Linear,
    x: Var,
    residual: Var,
    dropout: Option<DropoutMask>,
) -> Result<Var> {
    match dropout {
        None => layer.forward_onto(g, x, residual),
        Some(_) => g.add(residual, dropped(g, layer, x, dropout)?),
    }
}

/// `dropout(layer(x))`, or the layer alone without dropout.
fn dropped(g: &Graph, layer: &Linear, x: Var, dropout: Option<DropoutMask>) -> Result<Var> {
    let y = layer.forward(g, x)?;
    match dropout {
        Some(mask) => g.dropout(y, mask),
        None => Ok(y),
    }
}

/// `softmax(q k^T / sqrt(d) + causal mask) v` over `heads` heads of width `dim / heads`.
pub struct CausalSelfAttention {
    /// Projection of the input to the queries, `[dim, dim]`.
    pub query: Linear,
    /// Projection of the input to the keys, `[dim, dim]`.
    pub key: Linear,
    /// Projection of the input to the values, `[dim, dim]`.
    pub value: Linear,
    /// Output projection of the concatenated heads, `[dim, dim]`.
    pub proj: Linear,
    /// Number of heads; `dim` is a multiple of it.
    pub heads: usize,
}

impl CausalSelfAttention {
    /// `proj_std` initialises the output projection (GPT-2 scales it by 1/sqrt(2 layers)).
    pub fn new(
        device: &Device,
        dim: usize,
        heads: usize,
        proj_std: f32,
        rng: &mut Rng,
    ) -> Result<Self> {
        if heads == 0 || !dim.is_multiple_of(heads) {
            return shape_err(
                "attention",
                format!("width {dim} is not a multiple of {heads} heads"),
            );
        }
        Ok(CausalSelfAttention {
            query: gpt_linear(device, dim, dim, 0.02, rng)?,
            key: gpt_linear(device, dim, dim, 0.02, rng)?,
            value: gpt_linear(device, dim, dim, 0.02, rng)?,
            proj: gpt_linear(device, dim, dim, proj_std, rng)?,
            heads,
        })
    }

    /// `x [batch, time, dim]` to `[batch, time, dim]`; `dropout` (sites `key_base` and
    /// `key_base + 1`) drops attention weights and the output.
    pub fn forward(&self, g: &Graph, x: Var, dropout: Option<(DropoutPlan, u32)>) -> Result<Var> {
        let y = self.heads(g, x, dropout)?;
        dropped(g, &self.proj, y, dropout.map(|(p, key)| p.mask(key + 1)))
    }

    /// `residual + forward(x)`, the output projection added onto the residual as one
    /// operation where no dropout comes between them.
    pub fn forward_onto(
        &self,
        g: &Graph,
        x: Var,
        residual: Var,
        dropout: Option<(DropoutPlan, u32)>,
    ) -> Result<Var> {
        let y = self.heads(g, x, dropout)?;
        onto_residual(
            g,
            &self.proj,
            y,
            residual,
            dropout.map(|(p, key)| p.mask(key + 1)),
        )
    }

    /// The heads' outputs side by side, before the output projection.
    fn heads(&self, g: &Graph, x: Var, dropout: Option<(DropoutPlan, u32)>) -> Result<Var> {
        let shape = g.shape(x);
        let &[_, _, c] = shape.as_slice() else {
            return shape_err(
                "attention",
                format!("needs [batch, time, dim], is {shape:?}"),
            );
        };
        let d = c / self.heads;
        let scaled = Unary::Affine {
            alpha: 1.0 / (d as f32).sqrt(),
            beta: 0.0,
        };
        let q = self.query.forward_then(g, x, scaled)?;
        let k = self.key.forward(g, x)?;
        let v = self.value.forward(g, x)?;
        let mask = dropout.map(|(plan, key)| plan.mask(key));
        g.causal_attention(q, k, v, self.heads, mask)
    }
}

impl Module for CausalSelfAttention {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        [
            ("query", &self.query),
            ("key", &self.key),
            ("value", &self.value),
            ("proj", &self.proj),
        ]
        .into_iter()
        .flat_map(|(name, l)| prefixed(name, l))
        .collect()
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        [
            &mut self.query,
            &mut self.key,
            &mut self.value,
            &mut self.proj,
        ]
        .into_iter()
        .flat_map(|l| l.parameters_mut())
        .collect()
    }
}

/// `x + attn(ln1(x))`, then `x + mlp(ln2(x))` with a GELU MLP four times as wide.
pub struct Block {
    /// Layer norm before the attention.
    pub ln1: LayerNorm,
    /// The causal self-attention.
    pub attn: CausalSelfAttention,
    /// Layer norm before the MLP.
    pub ln2: LayerNorm,
    /// The MLP's first layer, `dim` to `4 * dim`.
    pub fc: Linear,
    /// The MLP's second layer, `4 * dim` back to `dim`.
    pub fc_proj: Linear,
}

impl Block {
    /// A block of width `dim` with `heads` heads, initialised as GPT-2 does: weights normal(0,
    /// 0.02), with the residual projections scaled down by `sqrt(2 * layers)` for a model of
    /// `layers` blocks.
    pub fn new(
        device: &Device,
        dim: usize,
        heads: usize,
        layers: usize,
        rng: &mut Rng,
    ) -> Result<Self> {
        let proj_std = 0.02 / ((2 * layers.max(1)) as f32).sqrt();
        Ok(Block {
            ln1: LayerNorm::new(device, dim)?,
            attn: CausalSelfAttention::new(device, dim, heads, proj_std, rng)?,
            ln2: LayerNorm::new(device, dim)?,
            fc: gpt_linear(device, dim, 4 * dim, 0.02, rng)?,
            fc_proj: gpt_linear(device, 4 * dim, dim, proj_std, rng)?,
        })
    }

    /// Dropout sites `key_base .. key_base + 3`.
    pub fn forward(&self, g: &Graph, x: Var, dropout: Option<(DropoutPlan, u32)>) -> Result<Var> {
        let x = self
            .attn
            .forward_onto(g, self.ln1.forward(g, x)?, x, dropout)?;
        let m = self
            .fc
            .forward_then(g, self.ln2.forward(g, x)?, Unary::Gelu)?;
        let mask = dropout.map(|(plan, key)| plan.mask(key + 2));
        onto_residual(g, &self.fc_proj, m, x, mask)
    }
}

impl Module for Block {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut p = prefixed("ln1", &self.ln1);
        p.extend(prefixed("attn", &self.attn));
        p.extend(prefixed("ln2", &self.ln2));
        p.extend(prefixed("fc", &self.fc));
        p.extend(prefixed("fc_proj", &self.fc_proj));
        p
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        let mut p = self.ln1.parameters_mut();
        p.extend(self.attn.parameters_mut());
        p.extend(self.ln2.parameters_mut());
        p.extend(self.fc.parameters_mut());
        p.extend(self.fc_proj.parameters_mut());
        p
    }
}
