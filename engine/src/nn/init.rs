//! Seeded parameter initialisation.

use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::{Device, Tensor};

/// A tensor with elements uniform in [-bound, bound), drawn on the CPU from `rng`.
pub fn uniform(device: &Device, shape: &[usize], bound: f32, rng: &mut Rng) -> Result<Tensor> {
    let n = shape.iter().product();
    let data = (0..n).map(|_| rng.uniform_in(-bound, bound)).collect();
    Tensor::from_vec(device, shape, data)
}

/// A tensor with elements normal with mean 0 and standard deviation `std`, drawn on the CPU.
pub fn normal(device: &Device, shape: &[usize], std: f32, rng: &mut Rng) -> Result<Tensor> {
    let n = shape.iter().product();
    let data = (0..n).map(|_| std * rng.normal()).collect();
    Tensor::from_vec(device, shape, data)
}
