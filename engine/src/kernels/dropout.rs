//! Inverted dropout with a counter-based mask (dropout.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, DROPOUT};
use crate::error::{Error, Result};
use crate::rng::{element_u32, unit_f32};
use crate::tensor::{DType, Device, Tensor};

/// Where a dropout mask comes from: element `i` of the mask is a function of
/// `(seed, step, key, i)` alone, so the backward pass and every peer recompute it. `i` counts
/// from the start of the step's *global* batch: a tensor holding `samples` samples whose first
/// is sample `first_sample` of that batch starts at `first_sample * (numel / samples)`, so each
/// sample draws its own mask wherever it is computed (one process, or any rank's share of a
/// data-parallel round), and one process's masks are every rank's masks laid end to end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutMask {
    /// Probability that an element is dropped, in [0, 1); kept elements are scaled by `1 / (1 -
    /// rate)`.
    pub rate: f32,
    /// The run's seed.
    pub seed: u64,
    /// The training step, so that every step draws a new mask.
    pub step: u32,
    /// Distinguishes the dropout sites of one forward pass.
    pub key: u32,
    /// The position of the tensor's first sample in the step's global batch.
    pub first_sample: u32,
    /// Samples in the tensor, each one's elements contiguous (the leading axis or axes).
    pub samples: u32,
}

impl DropoutMask {
    fn check(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.rate) {
            return Err(Error::Config(format!(
                "dropout rate {} must be in [0, 1)",
                self.rate
            )));
        }
        Ok(())
    }

    /// The global index of the first of `numel` elements: `first_sample` samples of
    /// `numel / samples` elements each precede them.
    pub fn offset(&self, numel: usize) -> Result<u32> {
        let samples = self.samples as usize;
        if samples == 0 || !numel.is_multiple_of(samples) {
            return Err(Error::Shape {
                op: "dropout",
                detail: format!("{numel} elements do not split into {samples} samples"),
            });
        }
        let offset = self.first_sample as u64 * (numel / samples) as u64;
        if offset + numel as u64 > u32::MAX as u64 {
            return Err(Error::Config(
                "dropout over a global batch of more than 2^32 elements".into(),
            ));
        }
        Ok(offset as u32)
    }

    fn scale(&self) -> f32 {
        1.0 / (1.0 - self.rate)
    }

    /// Whether element `i` of the global batch is kept.
    pub fn keeps(&self, i: u32) -> bool {
        unit_f32(element_u32(self.seed, self.step, self.key, i)) >= self.rate
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    step: u32,
    key: u32,
    rate: f32,
    scale: f32,
    seed_lo: u32,
    seed_hi: u32,
    offset: u32,
}

/// CPU reference: `x * mask / (1 - rate)`.
pub fn dropout_ref(x: &[f32], mask: &DropoutMask) -> Result<Vec<f32>> {
    let scale = mask.scale();
    let offset = mask.offset(x.len())?;
    // Each element's draw depends on its index alone: parallel chunks give the same bits.
    Ok(crate::cpu::elementwise::collect_indexed(x.len(), |j| {
        if mask.keeps(offset + j as u32) {
            x[j] * scale
        } else {
            0.0
        }
    }))
}

/// Applies the mask to `x`: the forward pass on activations and, with the same mask, the
/// backward pass on their gradients.
pub fn dropout(x: &Tensor, mask: &DropoutMask) -> Result<Tensor> {
    x.expect_dtype("dropout", DType::F32)?;
    mask.check()?;
    let offset = mask.offset(x.numel())?;
    match x.device() {
        Device::Cpu => Tensor::from_vec(
            x.device(),
            x.shape(),
            dropout_ref(x.cpu_f32().expect("cpu"), mask)?,
        ),
        Device::Gpu(gpu) => {
            let n = x.numel();
            let out = gpu.alloc(4 * n as u64)?;
            let params = Params {
                n: n as u32,
                step: mask.step,
                key: mask.key,
                rate: mask.rate,
                scale: mask.scale(),
                seed_lo: mask.seed as u32,
                seed_hi: (mask.seed >> 32) as u32,
                offset,
            };
            let pipeline = gpu.pipeline(&DROPOUT, "apply_mask", &[]);
            gpu.launch(
                &pipeline,
                &params,
                &[x.gpu_buf().expect("gpu"), &out],
                grid_1d(n),
            );
            Ok(Tensor::from_gpu(gpu, x.shape(), DType::F32, out))
        }
    }
}
