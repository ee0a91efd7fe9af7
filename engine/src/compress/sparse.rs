//! Sparsifiers: top-k, random-k and Clapping's hybrid of top-k and quantization.
//!
//! ```text
//! topk:K            k u32 indices (increasing) || k values (f32, or f16 with :f16)
//! randk:K           k f32 values, in increasing index order; the indices are the k largest
//!                   random words of (seed, step, key, i), the same on every peer
//! randk:K:explicit  k u32 indices (increasing) || k f32 values
//! hybrid:bits=B:topk=K
//!                   f32 scale = max |kept| || ceil(n/32) u32 words of support bits (element i
//!                   is bit i % 32 of word i / 32) || the kept values' B-bit codes, packed
//!                   LSB-first in index order: l = min(rne(|v| * (L / scale)), L),
//!                   L = 2^(B-1) - 1, value l * (scale / L)
//! ```
//! Top-k keeps the k largest |v| (ties: lower index first); random-k multiplies by n/k unless
//! `:unscaled`. k is `Amount::of(n)` (`of_ceil` for the hybrid, as Clapping's K = ceil(rho d)).

use rayon::prelude::*;

use super::codec::{bits_per_element, Codec, CodecContext, DecodeMode, Properties};
use super::gpu::sparse_gpu::{self, SparseLayout};
use super::select::select_top;
use super::spec::CodecSpec;
use super::support::{
    clean, f16_to_f32, pack, packed_len, payload_err, randk_factor, read_scale, scale_saturating,
    sign_extend, to_pattern, unpack, MAX_FACTOR, MAX_SCALE,
};
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};
use crate::rng::element_words;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Sparse {
    pub spec: CodecSpec,
}

/// Top-k key: |v| as bits (monotone in |v| for non-negative floats).
#[inline]
pub(crate) fn magnitude_key(v: f32) -> u32 {
    clean(v).to_bits() & 0x7fff_ffff
}

impl Sparse {
    pub fn new(spec: CodecSpec) -> Self {
        Sparse { spec }
    }

    /// Elements kept out of `n`.
    pub fn k(&self, n: usize) -> usize {
        match self.spec {
            CodecSpec::TopK { amount, .. } | CodecSpec::RandK { amount, .. } => amount.of(n),
            CodecSpec::Hybrid { amount, .. } => amount.of_ceil(n),
            _ => unreachable!(),
        }
    }

    /// The selected indices for `x` (or, for random-k, for any input of its length).
    pub fn select(&self, x: &[f32], ctx: &CodecContext) -> Vec<u32> {
        let (n, k) = (x.len(), self.k(x.len()));
        match self.spec {
            CodecSpec::RandK { .. } => random_indices(n, k, ctx),
            _ => select_top(n, k, |i| magnitude_key(x[i])),
        }
    }

    /// What the GPU kernels need to know of this sparsifier for `n` elements.
    fn gpu_layout(&self, n: usize) -> SparseLayout {
        SparseLayout {
            spec: self.spec,
            k: self.k(n),
            payload_len: self.payload_len(n),
        }
    }

    fn hybrid_levels(&self) -> (u32, f32) {
        let CodecSpec::Hybrid { bits, .. } = self.spec else {
            unreachable!()
        };
        (bits, ((1u32 << (bits - 1)) - 1) as f32)
    }

    fn name(&self) -> String {
        self.spec.to_string()
    }
}

/// Random-k's index set: the k largest random words, as the top-k machinery selects them.
pub(crate) fn random_indices(n: usize, k: usize, ctx: &CodecContext) -> Vec<u32> {
    use rayon::prelude::*;
    // The selection reads each key several times: draw the words once, in bulk.
    let mut words = vec![0u32; n];
    words
        .par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, w)| element_words(ctx.seed, ctx.step, ctx.key, (c << 16) as u32, w));
    select_top(n, k, |i| words[i])
}

fn read_u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

fn check_indices(indices: &[u32], n: usize, name: &str) -> Result<()> {
    for (j, w) in indices.windows(2).enumerate() {
        if w[0] >= w[1] {
            return Err(payload_err(
                name,
                format!("indices {} and {} are not increasing", j, j + 1),
            ));
        }
    }
    match indices.last() {
        Some(&last) if last as usize >= n => Err(payload_err(
            name,
            format!("index {last} is out of range for {n} elements"),
        )),
        _ => Ok(()),
    }
}

fn read_finite_f32s(bytes: &[u8], name: &str) -> Result<Vec<f32>> {
    let v: Vec<f32> = read_u32s(bytes).into_iter().map(f32::from_bits).collect();
    match v.iter().position(|x| !x.is_finite()) {
        Some(j) => Err(payload_err(name, format!("value {j} is not finite"))),
        None => Ok(v),
    }
}

impl Codec for Sparse {
    fn spec(&self) -> CodecSpec {
        self.spec
    }

    fn properties(&self) -> Properties {
        let n = 1 << 20;
        let scaled_randk = matches!(self.spec, CodecSpec::RandK { scaled: true, .. });
        Properties {
            bits_per_element: bits_per_element(self.payload_len(n), n),
            unbiased: scaled_randk,
            stochastic: matches!(self.spec, CodecSpec::RandK { .. }),
        }
    }

    fn payload_len(&self, n: usize) -> usize {
        let k = self.k(n);
        match self.spec {
            CodecSpec::TopK { f16_values, .. } => 4 * k + if f16_values { 2 * k } else { 4 * k },
            CodecSpec::RandK { shared_seed, .. } => {
                if shared_seed {
                    4 * k
                } else {
                    8 * k
                }
            }
            CodecSpec::Hybrid { bits, .. } => 4 + 4 * n.div_ceil(32) + packed_len(k, bits),
            _ => unreachable!(),
        }
    }

    fn encode(&self, x: &[f32], ctx: &CodecContext) -> Vec<u8> {
        let n = x.len();
        let idx = self.select(x, ctx);
        let k = idx.len();
        let mut out = Vec::with_capacity(self.payload_len(n));
        match self.spec {
            CodecSpec::TopK { f16_values, .. } => {
                out.extend(idx.iter().flat_map(|i| i.to_le_bytes()));
                if f16_values {
                    out.extend(idx.iter().flat_map(|&i| {
                        super::plain::half_code(CodecSpec::F16, x[i as usize]).to_le_bytes()
                    }));
                } else {
                    out.extend(idx.iter().flat_map(|&i| clean(x[i as usize]).to_le_bytes()));
                }
            }
            CodecSpec::RandK {
                shared_seed,
                scaled,
                ..
            } => {
                if !shared_seed {
                    out.extend(idx.iter().flat_map(|i| i.to_le_bytes()));
                }
                let (factor, limit) = if scaled {
                    randk_factor(n, k)
                } else {
                    (1.0, f32::MAX)
                };
                out.extend(idx.iter().flat_map(|&i| {
                    scale_saturating(clean(x[i as usize]), factor, limit).to_le_bytes()
                }));
            }
            CodecSpec::Hybrid { .. } => {
                let (bits, top) = self.hybrid_levels();
                let scale = idx
                    .iter()
                    .fold(0.0f32, |m, &i| m.max(clean(x[i as usize]).abs()))
                    .min(MAX_SCALE);
                out.extend(scale.to_le_bytes());
                let mut mask = vec![0u32; n.div_ceil(32)];
                idx.iter()
                    .for_each(|&i| mask[i as usize / 32] |= 1 << (i % 32));
                out.extend(mask.iter().flat_map(|w| w.to_le_bytes()));
                let factor = top / scale;
                let codes: Vec<u32> = idx
                    .iter()
                    .map(|&i| {
                        let v = clean(x[i as usize]);
                        let l = if factor > MAX_FACTOR {
                            0
                        } else {
                            (v.abs() * factor).round_ties_even().min(top) as i32
                        };
                        to_pattern(if v < 0.0 { -l } else { l }, bits)
                    })
                    .collect();
                let mut packed = vec![0u8; packed_len(k, bits)];
                pack(&codes, bits, &mut packed);
                out.extend(packed);
            }
            _ => unreachable!(),
        }
        debug_assert_eq!(out.len(), self.payload_len(n));
        out
    }

    fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        let (n, name) = (out.len(), self.name());
        let k = self.k(n);
        if payload.len() != self.payload_len(n) {
            return Err(payload_err(
                &name,
                format!(
                    "{} bytes for {n} elements (k = {k}), expected {}",
                    payload.len(),
                    self.payload_len(n)
                ),
            ));
        }
        let (indices, values): (Vec<u32>, Vec<f32>) = match self.spec {
            CodecSpec::TopK { f16_values, .. } => {
                let indices = read_u32s(&payload[..4 * k]);
                check_indices(&indices, n, &name)?;
                let values = if f16_values {
                    payload[4 * k..]
                        .chunks_exact(2)
                        .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                        .collect::<Vec<_>>()
                } else {
                    read_finite_f32s(&payload[4 * k..], &name)?
                };
                if let Some(j) = values.iter().position(|v| !v.is_finite()) {
                    return Err(payload_err(&name, format!("value {j} is not finite")));
                }
                (indices, values)
            }
            CodecSpec::RandK {
                shared_seed: true, ..
            } => (random_indices(n, k, ctx), read_finite_f32s(payload, &name)?),
            CodecSpec::RandK {
                shared_seed: false, ..
            } => {
                let indices = read_u32s(&payload[..4 * k]);
                check_indices(&indices, n, &name)?;
                (indices, read_finite_f32s(&payload[4 * k..], &name)?)
            }
            CodecSpec::Hybrid { .. } => {
                let (bits, top) = self.hybrid_levels();
                let scale = read_scale(payload, 0, &name)?;
                let mask = read_u32s(&payload[4..4 + 4 * n.div_ceil(32)]);
                if n % 32 != 0 && mask[mask.len() - 1] >> (n % 32) != 0 {
                    return Err(payload_err(
                        &name,
                        "support bits set past the last element".into(),
                    ));
                }
                let indices: Vec<u32> = (0..n as u32)
                    .filter(|&i| mask[i as usize / 32] >> (i % 32) & 1 == 1)
                    .collect();
                if indices.len() != k {
                    return Err(payload_err(
                        &name,
                        format!("{} support bits set, expected {k}", indices.len()),
                    ));
                }
                let step = scale / top;
                let codes = unpack(&payload[4 + 4 * mask.len()..], k, bits, &name)?;
                let values = codes
                    .iter()
                    .map(|&p| {
                        let c = sign_extend(p, bits);
                        (c.unsigned_abs() as f32 <= top)
                            .then_some(c as f32 * step)
                            .ok_or_else(|| payload_err(&name, format!("code {c} is out of range")))
                    })
                    .collect::<Result<Vec<f32>>>()?;
                if let Some(j) = values.iter().position(|v| !v.is_finite()) {
                    return Err(payload_err(&name, format!("kept value {j} overflows")));
                }
                (indices, values)
            }
            _ => unreachable!(),
        };
        if mode == DecodeMode::Set {
            out.par_iter_mut().for_each(|o| *o = 0.0);
        }
        // Indices are distinct (checked), so a kept value is written as it is, a negative zero
        // included, as the GPU's scatter writes it.
        for (&i, v) in indices.iter().zip(values) {
            mode.apply(&mut out[i as usize], v);
        }
        Ok(())
    }

    fn encode_gpu(&self, gpu: &Gpu, x: &GpuBuf, n: usize, ctx: &CodecContext) -> Result<GpuBuf> {
        sparse_gpu::encode(&self.gpu_layout(n), gpu, x, n, ctx)
    }

    fn decode_gpu(
        &self,
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        sparse_gpu::decode(&self.gpu_layout(n), gpu, payload, out, n, ctx, mode)
    }
}
