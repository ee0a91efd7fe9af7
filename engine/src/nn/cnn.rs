//! A small convolutional network for 28x28 grey images (MNIST, Fashion-MNIST):
//! conv 3x3 (c1) - relu - maxpool 2 - conv 3x3 (c2) - image norm - relu - maxpool 2 -
//! linear (hidden) - relu - dropout - linear (classes).

use serde::{Deserialize, Serialize};

use super::{linear_count, prefixed, Conv2d, LayerNorm, Linear, Module};
use crate::autograd::{Graph, Var};
use crate::error::{Error, Result};
use crate::kernels::dropout::DropoutMask;
use crate::kernels::unary::Unary;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// Sizes of a [`Cnn`]; the default fits MNIST.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnConfig {
    /// Height and width of the square input images in pixels, a multiple of 4.
    pub side: usize,
    /// Channels of the input images (1 for greyscale).
    pub channels: usize,
    /// Output channels of the first convolution.
    pub conv1: usize,
    /// Output channels of the second convolution.
    pub conv2: usize,
    /// Width of the hidden linear layer.
    pub hidden: usize,
    /// Number of classes, the width of the logits.
    pub classes: usize,
    /// Dropout rate after the hidden layer during training, in [0, 1).
    pub dropout: f32,
}

impl Default for CnnConfig {
    fn default() -> Self {
        CnnConfig {
            side: 28,
            channels: 1,
            conv1: 16,
            conv2: 32,
            hidden: 128,
            classes: 10,
            dropout: 0.25,
        }
    }
}

impl CnnConfig {
    /// Parameters of a [`Cnn`] of these sizes, counted without building it (`None` past
    /// `usize::MAX`), as [`Mlp::parameter_count_for`](super::Mlp::parameter_count_for).
    pub fn parameter_count(&self) -> Option<usize> {
        // A 3x3 convolution is a linear map from 9 input channels' worth of pixels.
        let conv = |i: usize, o: usize| linear_count(9usize.checked_mul(i)?, o);
        let flat = (self.side / 4)
            .checked_mul(self.side / 4)?
            .checked_mul(self.conv2)?;
        [
            conv(self.channels, self.conv1),
            conv(self.conv1, self.conv2),
            self.conv2.checked_mul(2),
            linear_count(flat, self.hidden),
            linear_count(self.hidden, self.classes),
        ]
        .into_iter()
        .try_fold(0usize, |n, p| n.checked_add(p?))
    }
}

/// A small convolutional classifier for square images: two 3×3 convolutions with max pooling, then
/// two linear layers.
pub struct Cnn {
    /// The sizes the network was built with.
    pub config: CnnConfig,
    /// First convolution, 3×3, `channels` to `conv1` channels.
    pub conv1: Conv2d,
    /// Second convolution, 3×3, `conv1` to `conv2` channels.
    pub conv2: Conv2d,
    /// Image normalisation after the second convolution, with a learned scale and shift per
    /// channel.
    pub norm: LayerNorm,
    /// Hidden linear layer, from the flattened pooled image to `hidden`.
    pub fc1: Linear,
    /// Output layer, `hidden` to `classes` logits.
    pub fc2: Linear,
}

impl Cnn {
    /// Layer `i` draws its initial values from stream `i` of `seed`.
    pub fn new(device: &Device, config: &CnnConfig, seed: u64) -> Result<Self> {
        if !config.side.is_multiple_of(4) || config.side == 0 {
            return Err(Error::Config(format!(
                "the CNN pools twice by 2: image side {} must be a multiple of 4",
                config.side
            )));
        }
        let rng = |i| Rng::new(seed, i);
        let flat = (config.side / 4) * (config.side / 4) * config.conv2;
        Ok(Cnn {
            conv1: Conv2d::new(device, config.channels, config.conv1, 3, 1, 1, &mut rng(0))?,
            conv2: Conv2d::new(device, config.conv1, config.conv2, 3, 1, 1, &mut rng(1))?,
            norm: LayerNorm::new(device, config.conv2)?,
            fc1: Linear::new(device, flat, config.hidden, true, &mut rng(2))?,
            fc2: Linear::new(device, config.hidden, config.classes, true, &mut rng(3))?,
            config: config.clone(),
        })
    }

    /// Logits for `x [batch, side*side*channels]` (rows of pixels, channels last). `dropout`
    /// names the step's mask: (seed, step, the batch's first sample in the step's global
    /// batch); `None` evaluates without dropout.
    pub fn forward(&self, g: &Graph, x: Var, dropout: Option<(u64, u32, u32)>) -> Result<Var> {
        let c = &self.config;
        let batch = g.shape(x)[0];
        let h = g.reshape(x, &[batch, c.side, c.side, c.channels])?;
        // ReLU after max pooling rather than before, on a quarter of the pixels: the same
        // values bit for bit, and the same gradients (ReLU keeps order, so a window's largest
        // input gives its largest output and has the same winner; where none is positive,
        // both give 0 and a zero gradient, whose sign the sums that follow absorb). Test:
        // `relu_and_max_pooling_commute_bit_for_bit`; the CNN's runs keep their bits.
        let h = g.relu(self.conv1.forward_max_pooled(g, h, 2)?)?;
        let h = self.conv2.forward(g, h)?;
        let h = g.relu(self.norm.forward_image_max_pooled(g, h, 2)?)?;
        let flat = g.shape(h)[1..].iter().product();
        let h = g.reshape(h, &[batch, flat])?;
        let mut h = self.fc1.forward_then(g, h, Unary::Relu)?;
        if let Some((seed, step, first_sample)) = dropout {
            let mask = DropoutMask {
                rate: c.dropout,
                seed,
                step,
                key: 0,
                first_sample,
                samples: batch as u32,
            };
            h = g.dropout(h, mask)?;
        }
        self.fc2.forward(g, h)
    }

    /// Multiply-adds of one forward pass per sample, times two: the FLOPs the benchmark
    /// reports (convolutions and linear layers; elementwise work is not counted).
    pub fn forward_flops(&self) -> f64 {
        let c = &self.config;
        let s = c.side as f64;
        let conv1 = s * s * (9 * c.channels * c.conv1) as f64;
        let conv2 = (s / 2.0) * (s / 2.0) * (9 * c.conv1 * c.conv2) as f64;
        let fc = (self.fc1.inputs() * c.hidden + c.hidden * c.classes) as f64;
        2.0 * (conv1 + conv2 + fc)
    }
}

impl Module for Cnn {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut p = prefixed("conv1", &self.conv1);
        p.extend(prefixed("conv2", &self.conv2));
        p.extend(prefixed("norm", &self.norm));
        p.extend(prefixed("fc1", &self.fc1));
        p.extend(prefixed("fc2", &self.fc2));
        p
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        let mut p = self.conv1.parameters_mut();
        p.extend(self.conv2.parameters_mut());
        p.extend(self.norm.parameters_mut());
        p.extend(self.fc1.parameters_mut());
        p.extend(self.fc2.parameters_mut());
        p
    }
}
