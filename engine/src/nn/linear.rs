//! Fully connected layer `y = x W + b`.

use super::{init, Module};
use crate::autograd::{Graph, Var};
use crate::error::Result;
use crate::kernels::unary::Unary;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// A fully connected layer `y = x W + b`.
pub struct Linear {
    /// `[in, out]`, so the forward product needs no transpose.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's default initialisation: weight and bias uniform in ±1/sqrt(in).
    pub fn new(
        device: &Device,
        inputs: usize,
        outputs: usize,
        bias: bool,
        rng: &mut Rng,
    ) -> Result<Self> {
        let bound = 1.0 / (inputs.max(1) as f32).sqrt();
        let weight = init::uniform(device, &[inputs, outputs], bound, rng)?;
        let bias = if bias {
            Some(init::uniform(device, &[outputs], bound, rng)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// `x [..., in]` to `[..., out]`.
    pub fn forward(&self, g: &Graph, x: Var) -> Result<Var> {
        self.layer(g, x, None)
    }

    /// `f(x W + b)`: the layer and its activation as one operation of the graph.
    pub fn forward_then(&self, g: &Graph, x: Var, f: Unary) -> Result<Var> {
        self.layer(g, x, Some(f))
    }

    /// `residual + (x W + b)`: the layer added onto a residual stream as one operation of
    /// the graph ([`Graph::linear_onto`]).
    pub fn forward_onto(&self, g: &Graph, x: Var, residual: Var) -> Result<Var> {
        let bias = self.bias.as_ref().map(|b| g.param(b));
        g.linear_onto(x, g.param(&self.weight), bias, residual)
    }

    fn layer(&self, g: &Graph, x: Var, f: Option<Unary>) -> Result<Var> {
        let bias = self.bias.as_ref().map(|b| g.param(b));
        g.linear(x, g.param(&self.weight), bias, f)
    }

    /// Number of input features.
    pub fn inputs(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Number of output features.
    pub fn outputs(&self) -> usize {
        self.weight.shape()[1]
    }
}

/// Parameters of a [`Linear`] layer with a bias, `None` past `usize::MAX`.
pub(crate) fn linear_count(inputs: usize, outputs: usize) -> Option<usize> {
    inputs.checked_mul(outputs)?.checked_add(outputs)
}

impl Module for Linear {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        std::iter::once(("weight".to_string(), &self.weight))
            .chain(self.bias.as_ref().map(|b| ("bias".to_string(), b)))
            .collect()
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        std::iter::once(&mut self.weight)
            .chain(self.bias.as_mut())
            .collect()
    }
}
