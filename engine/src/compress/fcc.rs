//! Recursive scaled sign, Neolithic's "fast compressed communication" (FCC, liec-sgd.md §3):
//! `R` rounds, each compressing what the previous ones left, `m_r = C(x - Σ_{j<r} D(m_j))`,
//! decoded as `Σ_r D(m_r)`. One message stands for the R sequential messages of the paper (the
//! bytes are the same; the R round trips of latency are not modelled).
//!
//! ```text
//! R scaled-sign payloads (sign.rs layout, 8 * ceil(n/64) + 4 bytes each), in round order
//! ```

use super::codec::{bits_per_element, Codec, CodecContext, DecodeMode, Properties};
use super::plain::Plain;
use super::sign::ScaledSign;
use super::spec::CodecSpec;
use super::support::{check_payload_len, clean};
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};

#[derive(Debug, Clone, Copy)]
pub(crate) struct RecursiveSign {
    pub rounds: u32,
}

impl RecursiveSign {
    fn each(&self, n: usize) -> usize {
        ScaledSign.payload_len(n)
    }
}

impl Codec for RecursiveSign {
    fn spec(&self) -> CodecSpec {
        CodecSpec::SignRounds {
            rounds: self.rounds,
        }
    }

    fn properties(&self) -> Properties {
        Properties {
            bits_per_element: bits_per_element(self.payload_len(1 << 20), 1 << 20),
            unbiased: false,
            stochastic: false,
        }
    }

    fn payload_len(&self, n: usize) -> usize {
        self.rounds as usize * self.each(n)
    }

    fn encode(&self, x: &[f32], ctx: &CodecContext) -> Vec<u8> {
        // Non-finite values count as zero in every round.
        let mut left: Vec<f32> = x.iter().map(|&v| clean(v)).collect();
        let mut out = Vec::with_capacity(self.payload_len(x.len()));
        let mut next = vec![0.0f32; x.len()];
        for _ in 0..self.rounds {
            // What is left only shrinks (|l - s sign(l)| <= max(|l|, s) <= max |left|), so it
            // stays finite.
            let m = ScaledSign.encode_with_residual(&left, ctx, &mut next);
            std::mem::swap(&mut left, &mut next);
            out.extend_from_slice(&m);
        }
        out
    }

    fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        let n = out.len();
        check_payload_len("sign:rounds", payload, n, self.payload_len(n))?;
        // The rounds are summed first and then applied, so that adding a decoded payload adds
        // exactly what decoding it gives, and a bad payload leaves `out` untouched.
        let mut sum = vec![0.0f32; n];
        for (r, chunk) in payload.chunks(self.each(n)).enumerate() {
            let m = if r == 0 {
                DecodeMode::Set
            } else {
                DecodeMode::Add
            };
            ScaledSign.decode_into(chunk, &mut sum, ctx, m)?;
        }
        // Each round's scale is finite, but two huge ones of one sign add up past f32's range:
        // the sum saturates there (as the GPU decoder does), so that every payload the encoder
        // makes decodes.
        sum.iter_mut()
            .for_each(|v| *v = v.clamp(-f32::MAX, f32::MAX));
        out.iter_mut()
            .zip(&sum)
            .for_each(|(o, &v)| mode.apply(o, v));
        Ok(())
    }

    fn encode_gpu(&self, gpu: &Gpu, x: &GpuBuf, n: usize, ctx: &CodecContext) -> Result<GpuBuf> {
        let each = self.each(n) as u64;
        // The f32 codec's payload is `clean(x)`: non-finite values count as zero in every round.
        let left = f32_codec().encode_gpu(gpu, x, n, ctx)?;
        let out = gpu.zeros((self.payload_len(n) as u64).div_ceil(4) * 4)?;
        for r in 0..self.rounds as u64 {
            let m = ScaledSign.encode_gpu(gpu, &left, n, ctx)?;
            ScaledSign.decode_gpu(gpu, &m, &left, n, ctx, DecodeMode::Subtract)?;
            gpu.copy(&m, 0, &out, r * each, each);
        }
        Ok(out)
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
        let each = self.each(n) as u64;
        let part = gpu.alloc(each.div_ceil(4) * 4)?;
        let sum = gpu.alloc(4 * n.max(1) as u64)?;
        for r in 0..self.rounds as u64 {
            gpu.copy(payload, r * each, &part, 0, each);
            let m = if r == 0 {
                DecodeMode::Set
            } else {
                DecodeMode::Add
            };
            ScaledSign.decode_gpu(gpu, &part, &sum, n, ctx, m)?;
        }
        // The sum read as an f32 payload: decoding it applies it to `out` in `mode`.
        f32_codec().decode_gpu(gpu, &sum, out, n, ctx, mode)
    }
}

fn f32_codec() -> Plain {
    Plain::new(CodecSpec::F32)
}
