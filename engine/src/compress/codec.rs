//! What every codec is: the `Codec` trait, the context that keys its randomness, how a
//! decoder applies its values, and what a codec promises.

use std::fmt;

use super::spec::CodecSpec;
use super::support;
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};

/// What keys a stochastic codec's randomness (and random-k's shared index set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodecContext {
    /// The run's shared seed, the same on every peer.
    pub seed: u64,
    /// Training step.
    pub step: u32,
    /// Tensor or partition key.
    pub key: u32,
    /// Who encodes: 0 for a server's reply (or a lone encoder), rank + 1 for a worker's push.
    /// Stochastic rounding draws an independent stream per sender, so that workers' rounding
    /// errors are independent and the server's re-compression is unbiased given what it
    /// received (byteps-clan.md Algorithm 3); random-k's index set ignores it and stays shared
    /// by every worker and the server (§7.13).
    pub stream: u32,
}

impl CodecContext {
    /// The context of worker `rank`'s push.
    pub fn sent_by(self, rank: usize) -> Self {
        CodecContext {
            stream: rank as u32 + 1,
            ..self
        }
    }

    /// The seed of stochastic rounding: the shared seed, mixed with the sender's stream
    /// (stream 0 keeps the seed itself).
    pub fn rounding_seed(&self) -> u64 {
        self.seed ^ (self.stream as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// Whether a decoder overwrites its output, adds into it or subtracts from it (the last is
/// how error feedback forms its residual `q - decode(encode(q))`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeMode {
    /// Overwrite the output with the decoded values.
    Set,
    /// Add the decoded values to the output.
    Add,
    /// Subtract the decoded values from the output.
    Subtract,
}

impl DecodeMode {
    /// Applies the decoded value `v` to `out`.
    #[inline(always)]
    pub fn apply(self, out: &mut f32, v: f32) {
        match self {
            DecodeMode::Set => *out = v,
            DecodeMode::Add => *out += v,
            DecodeMode::Subtract => *out -= v,
        }
    }
}

/// What a codec promises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Properties {
    /// Payload bits per element for a 1M-element partition.
    pub bits_per_element: f64,
    /// `E[decode(encode(x))] = x`.
    pub unbiased: bool,
    /// Draws random numbers (from the context).
    pub stochastic: bool,
}

/// A compression codec.
pub trait Codec: Send + Sync + fmt::Debug {
    /// The codec and parameters this instance implements, which its spec string parses back to.
    fn spec(&self) -> CodecSpec;

    /// What the codec promises: bits per element, bias and whether it draws random numbers.
    fn properties(&self) -> Properties;

    /// Exact payload size in bytes for `n` elements.
    fn payload_len(&self, n: usize) -> usize;

    /// Compresses `x`.
    fn encode(&self, x: &[f32], ctx: &CodecContext) -> Vec<u8>;

    /// Checks `payload` for `out.len()` elements, then writes (or adds) the decoded values.
    /// On error `out` is untouched.
    fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()>;

    /// Compresses `n` f32 values on the GPU; the result holds `payload_len(n)` bytes (its
    /// buffer is rounded up to whole words, padded with zeros).
    fn encode_gpu(&self, gpu: &Gpu, x: &GpuBuf, n: usize, ctx: &CodecContext) -> Result<GpuBuf>;

    /// Decodes a payload already on the GPU into `out` (`n` f32 values). The payload must
    /// have passed [`Codec::validate`]; the kernels never read or write out of bounds even if
    /// it did not, but the values would be meaningless.
    fn decode_gpu(
        &self,
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()>;

    /// Decoded values as a new vector.
    fn decode(&self, payload: &[u8], n: usize, ctx: &CodecContext) -> Result<Vec<f32>> {
        let mut out = vec![0.0; n];
        self.decode_into(payload, &mut out, ctx, DecodeMode::Set)?;
        Ok(out)
    }

    /// Adds the decoded values into `acc` (a server summing pushes).
    fn decode_add(&self, payload: &[u8], acc: &mut [f32], ctx: &CodecContext) -> Result<()> {
        self.decode_into(payload, acc, ctx, DecodeMode::Add)
    }

    /// Compresses `q` and writes `clean(q) - decode(payload)` into `residual`: the update of
    /// an error-feedback memory. Codecs may override this with a single fused pass, which must
    /// give these exact bits. Every codec decodes its own payloads, whatever the input (a test
    /// holds each to it); should one not, this is an error, never a panic, and `residual` is
    /// then unspecified.
    fn encode_residual(
        &self,
        q: &[f32],
        ctx: &CodecContext,
        residual: &mut [f32],
    ) -> Result<Vec<u8>> {
        use rayon::prelude::*;
        let payload = self.encode(q, ctx);
        residual
            .par_iter_mut()
            .zip(q)
            .for_each(|(r, &v)| *r = support::clean(v));
        self.decode_into(&payload, residual, ctx, DecodeMode::Subtract)?;
        Ok(payload)
    }

    /// Checks a payload without decoding it into anything.
    fn validate(&self, payload: &[u8], n: usize, ctx: &CodecContext) -> Result<()> {
        self.decode(payload, n, ctx).map(|_| ())
    }
}

/// Bits per element of a payload of `len` bytes for `n` elements.
pub(super) fn bits_per_element(len: usize, n: usize) -> f64 {
    8.0 * len as f64 / n as f64
}
