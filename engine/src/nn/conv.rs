//! 2-D convolution layer over NHWC images.

use super::{init, Module};
use crate::autograd::{Graph, Var};
use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// A 2-D convolution over NHWC images with a square kernel, lowered to im2col and a matrix product.
pub struct Conv2d {
    /// `[kernel*kernel*in_channels, out_channels]`, rows in (kh, kw, c) order: the im2col
    /// matrix times this is the convolution.
    pub weight: Tensor,
    /// `[out_channels]`, added to every output pixel.
    pub bias: Tensor,
    /// Side length of the square kernel.
    pub kernel: usize,
    /// Pixels between kernel positions, in both directions.
    pub stride: usize,
    /// Zero pixels added on every side of the input.
    pub pad: usize,
}

impl Conv2d {
    /// PyTorch's default initialisation: uniform in ±1/sqrt(fan_in).
    pub fn new(
        device: &Device,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        rng: &mut Rng,
    ) -> Result<Self> {
        let fan_in = kernel * kernel * in_channels;
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        Ok(Conv2d {
            weight: init::uniform(device, &[fan_in, out_channels], bound, rng)?,
            bias: init::uniform(device, &[out_channels], bound, rng)?,
            kernel,
            stride,
            pad,
        })
    }

    /// `x [n, h, w, in_channels]` to `[n, oh, ow, out_channels]`.
    pub fn forward(&self, g: &Graph, x: Var) -> Result<Var> {
        g.conv2d(
            x,
            g.param(&self.weight),
            Some(g.param(&self.bias)),
            (self.kernel, self.kernel),
            self.stride,
            self.pad,
        )
    }

    /// `x [n, h, w, in_channels]` to the output max-pooled over `pool x pool` windows every
    /// `pool` pixels, `[n, oh / pool, ow / pool, out_channels]`: [`forward`](Self::forward)
    /// then `max_pool2d` as one operation, the same bits.
    pub fn forward_max_pooled(&self, g: &Graph, x: Var, pool: usize) -> Result<Var> {
        g.conv2d_max_pool2d(
            x,
            g.param(&self.weight),
            Some(g.param(&self.bias)),
            (self.kernel, self.kernel),
            self.stride,
            self.pad,
            pool,
        )
    }

    /// Number of output channels (filters).
    pub fn out_channels(&self) -> usize {
        self.weight.shape()[1]
    }
}

impl Module for Conv2d {
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".into(), &self.weight), ("bias".into(), &self.bias)]
    }

    fn parameters_mut(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.weight, &mut self.bias]
    }
}
