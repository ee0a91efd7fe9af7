//! Scaled sign, 1 bit per element: `C(v) = (|v|_1 / n) * sign(v)`, with sign(0) = +.
//!
//! ```text
//! ceil(n/64) u64 words, little-endian: element 64w + j is bit 63 - j of word w (MSB first),
//!                                      1 meaning negative; the tail of the last word is zero
//! f32 scale = (sum of |v|) / n, rounded once (compress::mean_abs)
//! ```
//! `8 * ceil(n/64) + 4` bytes, the BytePS-Compress artifact's layout.

use rayon::prelude::*;

use super::codec::{bits_per_element, Codec, CodecContext, DecodeMode, Properties};
use super::gpu::sign_gpu;
use super::mean_abs::mean_abs;
use super::spec::CodecSpec;
use super::support::{check_payload_len, clean, payload_err, read_scale};
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};

#[derive(Debug, Clone, Copy)]
pub(crate) struct ScaledSign;

fn words(n: usize) -> usize {
    n.div_ceil(64)
}

impl ScaledSign {
    /// The payload of `q`, and `clean(q) - decode(payload)` in `residual` (which cannot fail:
    /// the scale is finite by construction).
    pub(crate) fn encode_with_residual(
        &self,
        q: &[f32],
        ctx: &CodecContext,
        residual: &mut [f32],
    ) -> Vec<u8> {
        let payload = self.encode(q, ctx);
        let mut scale = [0u8; 4];
        scale.copy_from_slice(&payload[payload.len() - 4..]);
        let scale = f32::from_le_bytes(scale);
        residual.par_iter_mut().zip(q).for_each(|(r, &v)| {
            let v = clean(v);
            *r = v - if v < 0.0 { -scale } else { scale };
        });
        payload
    }
}

impl Codec for ScaledSign {
    fn spec(&self) -> CodecSpec {
        CodecSpec::Sign
    }

    fn properties(&self) -> Properties {
        Properties {
            bits_per_element: bits_per_element(self.payload_len(1 << 20), 1 << 20),
            unbiased: false,
            stochastic: false,
        }
    }

    fn payload_len(&self, n: usize) -> usize {
        8 * words(n) + 4
    }

    fn encode(&self, x: &[f32], _ctx: &CodecContext) -> Vec<u8> {
        let mut out = vec![0u8; self.payload_len(x.len())];
        let (bits, scale) = out.split_at_mut(8 * words(x.len()));
        bits.par_chunks_mut(8 * 4096)
            .zip(x.par_chunks(64 * 4096))
            .for_each(|(ws, xs)| {
                for (w, x64) in ws.chunks_mut(8).zip(xs.chunks(64)) {
                    let word = x64.iter().enumerate().fold(0u64, |acc, (j, &v)| {
                        acc | (((clean(v) < 0.0) as u64) << (63 - j))
                    });
                    w.copy_from_slice(&word.to_le_bytes());
                }
            });
        scale.copy_from_slice(&mean_abs(x).to_le_bytes());
        out
    }

    fn encode_residual(
        &self,
        q: &[f32],
        ctx: &CodecContext,
        residual: &mut [f32],
    ) -> Result<Vec<u8>> {
        Ok(self.encode_with_residual(q, ctx, residual))
    }

    fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        _ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        let n = out.len();
        check_payload_len("sign", payload, n, self.payload_len(n))?;
        let (bits, tail) = payload.split_at(8 * words(n));
        let scale = read_scale(tail, 0, "sign")?;
        if !n.is_multiple_of(64) {
            let last = u64::from_le_bytes(bits[bits.len() - 8..].try_into().expect("8 bytes"));
            if last & ((1u64 << (64 - n % 64)) - 1) != 0 {
                return Err(payload_err("sign", "nonzero padding bits".into()));
            }
        }
        // 4096 words per task: per-word tasks would cost more in scheduling than in work.
        out.par_chunks_mut(64 * 4096)
            .zip(bits.par_chunks(8 * 4096))
            .for_each(|(os, ws)| {
                for (o64, w) in os.chunks_mut(64).zip(ws.chunks_exact(8)) {
                    let word = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                    let value = |j: usize| {
                        f32::from_bits(scale.to_bits() | (((word >> (63 - j)) as u32 & 1) << 31))
                    };
                    // The mode is chosen once per word, so that each loop is a plain vector loop.
                    match mode {
                        DecodeMode::Set => {
                            o64.iter_mut().enumerate().for_each(|(j, o)| *o = value(j))
                        }
                        DecodeMode::Add => {
                            o64.iter_mut().enumerate().for_each(|(j, o)| *o += value(j))
                        }
                        DecodeMode::Subtract => {
                            o64.iter_mut().enumerate().for_each(|(j, o)| *o -= value(j))
                        }
                    }
                }
            });
        Ok(())
    }

    fn encode_gpu(&self, gpu: &Gpu, x: &GpuBuf, n: usize, _ctx: &CodecContext) -> Result<GpuBuf> {
        sign_gpu::encode(gpu, x, n)
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
        sign_gpu::decode(gpu, payload, out, n, mode)
    }
}
