//! Multi-layer perceptron of any depth.

use serde::{Deserialize, Serialize};

use super::{linear_count, prefixed, Linear, Module};
use crate::autograd::{Graph, Var};
use crate::error::{Error, Result};
use crate::kernels::unary::Unary;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// The non-linearity between an [`Mlp`]'s layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation.
    Gelu,
}

impl std::str::FromStr for Activation {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            other => Err(Error::Config(format!(
                "activation {other:?}: use relu or gelu"
            ))),
        }
    }
}

/// `sizes[0] -> sizes[1] -> ... -> sizes[n]`, the activation between layers, none after the last.
pub struct Mlp {
    /// The linear layers, input to output.
    pub layers: Vec<Linear>,
    /// The activation applied after every layer but the last.
    pub activation: Activation,
}

impl Mlp {
    /// Layer `i` draws its initial values from stream `i` of `seed`.
    pub fn new(
        device: &Device,
        sizes: &[usize],
        activation: Activation,
        seed: u64,
    ) -> Result<Self> {
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(Error::Config(format!(
                "an MLP needs at least two non-zero sizes, got {sizes:?}"
            )));
        }
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::new(device, w[0], w[1], true, &mut Rng::new(seed, i as u32)))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers, activation })
    }

    /// Logits for `x [batch, sizes[0]]`.
    pub fn forward(&self, g: &Graph, x: Var) -> Result<Var> {
        let mut h = x;
        for (i, layer) in self.layers.iter().enumerate() {
            h = if i + 1 < self.layers.len() {
                let f = match self.activation {
                    Activation::Relu => Unary::Relu,
                    Activation::Gelu => Unary::Gelu,
                };
                layer.forward_then(g, h, f)?
            } else {
                layer.forward(g, h)?
            };
        }
        Ok(h)
    }

    /// Parameters of an MLP of `sizes`, counted without building it (`None` past
    /// `usize::MAX`): what a checkpoint's tensors are checked against before a model is
    /// built from its metadata.
    pub fn parameter_count_for(sizes: &[usize]) -> Option<usize> {
        sizes
            .windows(2)
            .try_fold(0usize, |n, w| n.checked_add(linear_count(w[0], w[1])?))
    }

    /// Layer widths, input first.
    pub fn sizes(&self) -> Vec<usize> {
        let mut s = vec![self.layers[0].inputs()];
        s.extend(self.layers.iter().map(Linear::outputs));
        s
    }
}

impl Module for Mlp {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&format!("layers.{i}"), l))
            .collect()
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        self.layers
            .iter_mut()
            .flat_map(|l| l.parameters_mut())
            .collect()
    }
}
