//! A GPT-style decoder-only transformer over bytes: token and position embeddings, pre-norm
//! blocks of causal self-attention and GELU MLPs, a final layer norm, and logits from the
//! token embedding itself (weight tying).

use serde::{Deserialize, Serialize};

use super::attention::{Block, DropoutPlan};
use super::{init, linear_count, prefixed, LayerNorm, Module};
use crate::autograd::{Graph, Var};
use crate::error::{shape_err, Error, Result};
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// Sizes of a [`Gpt`]; the default is a tiny byte-level model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Number of token ids (256 for bytes).
    pub vocab: usize,
    /// Longest sequence the model reads, the number of learned positions.
    pub context: usize,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Width of the embeddings and of every block, a multiple of `heads`.
    pub dim: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// Dropout rate during training, in [0, 1) (0: none).
    pub dropout: f32,
}

impl Default for GptConfig {
    /// About 0.2M parameters: small enough to train on a CPU adapter in minutes.
    fn default() -> Self {
        GptConfig {
            vocab: 256,
            context: 64,
            layers: 4,
            dim: 64,
            heads: 4,
            dropout: 0.0,
        }
    }
}

impl GptConfig {
    /// Parameters of a [`Gpt`] of these sizes, counted without building it (`None` past
    /// `usize::MAX`), as [`Mlp::parameter_count_for`](super::Mlp::parameter_count_for).
    pub fn parameter_count(&self) -> Option<usize> {
        let d = self.dim;
        let wide = d.checked_mul(4)?;
        // Two layer norms, four attention projections, the MLP's two layers.
        let block = [
            d.checked_mul(4),
            linear_count(d, d)?.checked_mul(4),
            linear_count(d, wide),
            linear_count(wide, d),
        ]
        .into_iter()
        .try_fold(0usize, |n, p| n.checked_add(p?))?;
        [
            self.vocab.checked_mul(d),
            self.context.checked_mul(d),
            self.layers.checked_mul(block),
            d.checked_mul(2),
        ]
        .into_iter()
        .try_fold(0usize, |n, p| n.checked_add(p?))
    }
}

/// A GPT-2-style decoder-only transformer: token and position embeddings, pre-norm blocks and a
/// final layer norm, with the output projection tied to the token embedding.
pub struct Gpt {
    /// The sizes the model was built with.
    pub config: GptConfig,
    /// `[vocab, dim]`, also the output projection.
    pub token_embedding: Tensor,
    /// `[context, dim]`.
    pub position_embedding: Tensor,
    /// The transformer blocks, in order.
    pub blocks: Vec<Block>,
    /// Final layer norm before the output projection.
    pub ln_f: LayerNorm,
}

impl Gpt {
    /// A model of `config`'s sizes initialised from `seed` (block `i` from stream `i + 1`); fails
    /// if a size is zero.
    pub fn new(device: &Device, config: &GptConfig, seed: u64) -> Result<Self> {
        if config.vocab == 0 || config.context == 0 || config.layers == 0 || config.dim == 0 {
            return Err(Error::Config(format!(
                "every size of a GPT must be positive: {config:?}"
            )));
        }
        let mut rng = Rng::new(seed, 0);
        Ok(Gpt {
            token_embedding: init::normal(device, &[config.vocab, config.dim], 0.02, &mut rng)?,
            position_embedding: init::normal(
                device,
                &[config.context, config.dim],
                0.01,
                &mut rng,
            )?,
            blocks: (0..config.layers)
                .map(|i| {
                    Block::new(
                        device,
                        config.dim,
                        config.heads,
                        config.layers,
                        &mut Rng::new(seed, 1 + i as u32),
                    )
                })
                .collect::<Result<_>>()?,
            ln_f: LayerNorm::new(device, config.dim)?,
            config: config.clone(),
        })
    }

    /// Logits `[batch, time, vocab]` for u32 token ids `[batch, time]`, time at most the
    /// context. With `dropout`, block `i` uses mask sites `4i .. 4i + 3`.
    pub fn forward(&self, g: &Graph, ids: &Tensor, dropout: Option<DropoutPlan>) -> Result<Var> {
        let &[_, t] = ids.shape() else {
            return shape_err(
                "gpt",
                format!("token ids must be [batch, time], are {:?}", ids.shape()),
            );
        };
        if t == 0 || t > self.config.context {
            return shape_err(
                "gpt",
                format!("{t} tokens for a context of {}", self.config.context),
            );
        }
        let wte = g.param(&self.token_embedding);
        let positions = Tensor::from_u32(g.device(), &[t], (0..t as u32).collect())?;
        let tok = g.embedding(wte, ids)?;
        let pos = g.embedding(g.param(&self.position_embedding), &positions)?;
        let mut x = g.add(tok, pos)?;
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(g, x, dropout.map(|p| (p, 4 * i as u32)))?;
        }
        let x = self.ln_f.forward(g, x)?;
        g.matmul_t(x, wte, false, true)
    }

    /// FLOPs of one forward pass per token at sequence length `t` (matmuls only, the usual
    /// 2 x parameters-in-matmuls plus the attention products).
    pub fn forward_flops_per_token(&self, t: usize) -> f64 {
        let c = &self.config;
        let per_layer = 12 * c.dim * c.dim;
        let matmul_params = c.layers * per_layer + c.vocab * c.dim;
        // q k^T and att v: 2 x t x dim multiply-adds per token per layer on average t/2 keys
        // under the mask; the kernel computes all t.
        2.0 * matmul_params as f64 + (c.layers * 2 * 2 * t * c.dim) as f64
    }
}

impl Module for Gpt {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut p = vec![
            ("token_embedding".to_string(), &self.token_embedding),
            ("position_embedding".to_string(), &self.position_embedding),
        ];
        for (i, b) in self.blocks.iter().enumerate() {
            p.extend(prefixed(&format!("blocks.{i}"), b));
        }
        p.extend(prefixed("ln_f", &self.ln_f));
        p
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        let mut p = vec![&mut self.token_embedding, &mut self.position_embedding];
        for b in &mut self.blocks {
            p.extend(b.parameters_mut());
        }
        p.extend(self.ln_f.parameters_mut());
        p
    }
}
