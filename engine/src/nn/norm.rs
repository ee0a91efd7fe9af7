//! Normalization layers: layer norm over features, and its one-group form for images.

use super::Module;
use crate::autograd::{Graph, Var};
use crate::error::Result;
use crate::tensor::{Device, Tensor};

/// Learned scale (ones) and shift (zeros) over `dim` features or channels.
pub struct LayerNorm {
    /// Learned scale `[dim]`, initialised to ones.
    pub gamma: Tensor,
    /// Learned shift `[dim]`, initialised to zeros.
    pub beta: Tensor,
    /// Added to the variance before the square root (1e-5).
    pub eps: f32,
}

impl LayerNorm {
    /// A layer norm over `dim` features, scale one and shift zero.
    pub fn new(device: &Device, dim: usize) -> Result<Self> {
        Ok(LayerNorm {
            gamma: Tensor::full(device, &[dim], 1.0)?,
            beta: Tensor::zeros(device, &[dim])?,
            eps: 1e-5,
        })
    }

    /// Normalizes over the last axis.
    pub fn forward(&self, g: &Graph, x: Var) -> Result<Var> {
        g.layer_norm(x, g.param(&self.gamma), g.param(&self.beta), self.eps)
    }

    /// Normalizes NHWC images over each sample's (h, w, c), scale and shift per channel
    /// (GroupNorm with one group).
    pub fn forward_image(&self, g: &Graph, x: Var) -> Result<Var> {
        g.image_norm(x, g.param(&self.gamma), g.param(&self.beta), self.eps)
    }

    /// [`LayerNorm::forward_image`], then max pooling over `pool x pool` windows every `pool`
    /// pixels, as one operation ([`Graph::image_norm_max_pool2d`]).
    pub fn forward_image_max_pooled(&self, g: &Graph, x: Var, pool: usize) -> Result<Var> {
        let (gamma, beta) = (g.param(&self.gamma), g.param(&self.beta));
        g.image_norm_max_pool2d(x, gamma, beta, self.eps, pool)
    }
}

impl Module for LayerNorm {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("gamma".into(), &self.gamma), ("beta".into(), &self.beta)]
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.gamma, &mut self.beta]
    }
}
