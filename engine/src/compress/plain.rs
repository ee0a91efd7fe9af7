//! Casts: f32 (identity), f16 and bf16.
//!
//! ```text
//! f32:  n little-endian f32            (4n bytes)
//! f16:  n little-endian IEEE binary16  (2n bytes), round to nearest even
//! bf16: n little-endian bfloat16       (2n bytes), round to nearest even
//! ```
//! Like every codec, these encode non-finite inputs as 0 and their decoders refuse non-finite
//! values; f16 and bf16 saturate at their largest finite value instead of overflowing.

use rayon::prelude::*;

use super::codec::{Codec, CodecContext, DecodeMode, Properties};
use super::gpu::plain_gpu;
use super::spec::CodecSpec;
use super::support::{
    bf16_to_f32, check_payload_len, clean, f16_to_f32, f32_to_bf16, f32_to_f16, payload_err,
};
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};

/// Largest finite f16, and the largest f32 that rounds to a finite bf16.
const F16_MAX: f32 = 65504.0;
const BF16_MAX: f32 = f32::from_bits(0x7f7f_0000);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain {
    spec: CodecSpec,
}

impl Plain {
    pub fn new(spec: CodecSpec) -> Self {
        Plain { spec }
    }

    fn width(&self) -> usize {
        if self.spec == CodecSpec::F32 {
            4
        } else {
            2
        }
    }
}

/// The 16-bit code of `v` (f16 or bf16).
pub(super) fn half_code(spec: CodecSpec, v: f32) -> u16 {
    let v = clean(v);
    match spec {
        CodecSpec::F16 => f32_to_f16(v.clamp(-F16_MAX, F16_MAX)),
        _ => f32_to_bf16(v.clamp(-BF16_MAX, BF16_MAX)),
    }
}

fn half_value(spec: CodecSpec, h: u16) -> f32 {
    match spec {
        CodecSpec::F16 => f16_to_f32(h),
        _ => bf16_to_f32(h),
    }
}

impl Codec for Plain {
    fn spec(&self) -> CodecSpec {
        self.spec
    }

    fn properties(&self) -> Properties {
        Properties {
            bits_per_element: 8.0 * self.width() as f64,
            unbiased: self.spec == CodecSpec::F32,
            stochastic: false,
        }
    }

    fn payload_len(&self, n: usize) -> usize {
        self.width() * n
    }

    fn encode(&self, x: &[f32], _ctx: &CodecContext) -> Vec<u8> {
        let mut out = vec![0u8; self.payload_len(x.len())];
        match self.spec {
            CodecSpec::F32 => out
                .par_chunks_mut(4)
                .zip(x)
                .for_each(|(o, &v)| o.copy_from_slice(&clean(v).to_le_bytes())),
            spec => out
                .par_chunks_mut(2)
                .zip(x)
                .for_each(|(o, &v)| o.copy_from_slice(&half_code(spec, v).to_le_bytes())),
        }
        out
    }

    fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        _ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        let name = self.spec.to_string();
        check_payload_len(&name, payload, out.len(), self.payload_len(out.len()))?;
        let value = |b: &[u8]| match self.spec {
            CodecSpec::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")),
            spec => half_value(spec, u16::from_le_bytes(b.try_into().expect("2 bytes"))),
        };
        // Check in large blocks first, so that a bad payload writes nothing.
        let w = self.width();
        const BLOCK: usize = 1 << 14;
        if let Some(i) = payload
            .par_chunks(BLOCK * w)
            .enumerate()
            .find_map_first(|(c, block)| {
                block
                    .chunks_exact(w)
                    .position(|b| !value(b).is_finite())
                    .map(|j| c * BLOCK + j)
            })
        {
            return Err(payload_err(&name, format!("element {i} is not finite")));
        }
        out.par_chunks_mut(BLOCK)
            .zip(payload.par_chunks(BLOCK * w))
            .for_each(|(os, block)| {
                os.iter_mut()
                    .zip(block.chunks_exact(w))
                    .for_each(|(o, b)| mode.apply(o, value(b)));
            });
        Ok(())
    }

    fn encode_gpu(&self, gpu: &Gpu, x: &GpuBuf, n: usize, _ctx: &CodecContext) -> Result<GpuBuf> {
        plain_gpu::encode(self.spec, gpu, x, n)
    }

    fn decode_gpu(
        &self,
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        _ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        plain_gpu::decode(self.spec, gpu, payload, out, n, mode)
    }
}
