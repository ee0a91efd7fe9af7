//! Inverted dropout with a counter-based mask (dropout.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, DROPOUT};
use crate::error::{Error, Result};
use crate::rng::{element_u32, element_words, unit_f32};
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
    pub(crate) fn check(&self) -> Result<()> {
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

/// [`dropout_ref`] on the CPU path: each chunk's words drawn eight Philox blocks at a time
/// (`rng::element_words`), where the reference draws a block of four words per element and
/// keeps one. The same words, so the same bits (test).
fn dropout_fast(x: &[f32], mask: &DropoutMask, offset: u32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    crate::cpu::elementwise::for_chunks(
        &mut out,
        #[inline(always)]
        |start, chunk| {
            let x = &x[start..][..chunk.len()];
            apply_at(mask, offset + start as u32, x, chunk, &mut Vec::new());
        },
    );
    out
}

/// The mask applied to `x` into `out` (as long), element `j` of `x` being element `first + j`
/// of the global batch: [`dropout_fast`]'s arithmetic on any stretch of a tensor (a chunk of
/// it, or one head's attention weights in `cpu::attention`). Always inlined, to run on the
/// caller's vector unit. `words` is room for the mask's words, kept by a caller that applies
/// it often.
#[inline(always)]
pub(crate) fn apply_at(
    mask: &DropoutMask,
    first: u32,
    x: &[f32],
    out: &mut [f32],
    words: &mut Vec<u32>,
) {
    // Words come in blocks of four: start at the block holding the first element.
    let skip = (first % 4) as usize;
    words.resize(skip + x.len(), 0);
    element_words(mask.seed, mask.step, mask.key, first - skip as u32, words);
    // Copies the loop owns: read through the closure's captures, the rate was reloaded for
    // every element and the select ran one element at a time (`perf annotate`).
    let (rate, scale) = (mask.rate, mask.scale());
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(&words[skip..]) {
        *o = if unit_f32(w) >= rate { v * scale } else { 0.0 };
    }
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
            dropout_fast(x.cpu_f32().expect("cpu"), mask, offset),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_path_gives_the_references_bits() {
        // Offsets off the blocks of four words, lengths off them and past a chunk.
        let chunk = crate::cpu::elementwise::CHUNK;
        for (samples, per_sample, first_sample) in [
            (1, 1, 0),
            (3, 5, 1),
            (2, 7, 3),
            (4, chunk / 2 + 3, 2),
            (1, 3 * chunk + 1, 5),
        ] {
            let x: Vec<f32> = (0..samples * per_sample)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let mask = DropoutMask {
                rate: 0.3,
                seed: 11,
                step: 4,
                key: 2,
                first_sample,
                samples: samples as u32,
            };
            let offset = mask.offset(x.len()).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let want = dropout_ref(&x, &mask).unwrap();
            assert_eq!(
                bits(&dropout_fast(&x, &mask, offset)),
                bits(&want),
                "{samples} x {per_sample} from sample {first_sample}"
            );
        }
    }
}
