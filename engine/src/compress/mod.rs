//! Compression codecs: dense f32 in, payload bytes out, and back.
//!
//! Every codec has a CPU implementation (multithreaded with rayon; what parameter servers run)
//! and a WGSL one (`shaders/compress/`), and both produce the same bytes: reductions run in the
//! canonical order of [`support::canonical_sum`], and randomness comes from the counter-based
//! generator keyed by (seed, step, key, element index). Payload layouts are documented in each
//! codec's file and in docs/wire-format.md; a payload carries no header of its own, since the
//! frame around it names the codec, the key and the element count.
//!
//! Decoders treat payloads as untrusted: a wrong length, a bad scale or an out-of-range code is
//! an error, checked before anything is written, so a bad payload never corrupts an
//! accumulator.

mod codec;
mod dense;
mod fcc;
pub(crate) mod gpu;
pub mod mean_abs;
mod plain;
mod select;
mod sign;
mod sparse;
pub mod spec;
pub mod support;

pub use codec::{Codec, CodecContext, DecodeMode, Properties};
pub use spec::{Amount, CodecSpec, Levels, Norm, Rounding};

use crate::error::Result;

/// Builds the codec a spec names.
pub fn build(spec: CodecSpec) -> Box<dyn Codec> {
    match spec {
        CodecSpec::F32 | CodecSpec::F16 | CodecSpec::Bf16 => Box::new(plain::Plain::new(spec)),
        CodecSpec::Sign => Box::new(sign::ScaledSign),
        CodecSpec::SignRounds { rounds } => Box::new(fcc::RecursiveSign { rounds }),
        CodecSpec::Dither { .. }
        | CodecSpec::Natural
        | CodecSpec::Qsgd { .. }
        | CodecSpec::Loco { .. }
        | CodecSpec::BlockQ { .. } => Box::new(dense::DenseCodec::new(spec)),
        CodecSpec::TopK { .. } | CodecSpec::RandK { .. } | CodecSpec::Hybrid { .. } => {
            Box::new(sparse::Sparse::new(spec))
        }
    }
}

/// Parses a spec string and builds its codec.
pub fn parse(text: &str) -> Result<Box<dyn Codec>> {
    Ok(build(text.parse()?))
}

/// How many of a fixed-scale (LoCo) payload's `n` codes sit at either end of the code range,
/// where the quantizer clips: LoCo's sign that its scale s is too large. `None` for other
/// codecs, or a payload of the wrong length. Counted in the packed bytes, without unpacking:
/// a data-parallel worker counts every push.
pub fn clipped_codes(spec: CodecSpec, payload: &[u8], n: usize) -> Option<usize> {
    let CodecSpec::Loco {
        bits, rescalable, ..
    } = spec
    else {
        return None;
    };
    // A rescalable payload's scale comes first.
    let payload = if rescalable {
        payload.get(4..)?
    } else {
        payload
    };
    if payload.len() != support::packed_len(n, bits) {
        return None;
    }
    let mask = (1u64 << bits) - 1;
    let (top, bottom) = (
        support::to_pattern((1 << (bits - 1)) - 1, bits) as u64,
        support::to_pattern(-(1 << (bits - 1)), bits) as u64,
    );
    // Codes are LSB-first in the byte stream: refill a 64-bit window a byte at a time.
    let (mut window, mut held, mut bytes) = (0u64, 0u32, payload.iter());
    let mut clipped = 0;
    for _ in 0..n {
        while held < bits {
            window |= (*bytes.next()? as u64) << held;
            held += 8;
        }
        let code = window & mask;
        clipped += usize::from(code == top || code == bottom);
        window >>= bits;
        held -= bits;
    }
    Some(clipped)
}

/// The scale `log2 s` a rescalable LoCo payload was coded at (its first four bytes, f32
/// `2^log2s`); `None` for other codecs, or where those bytes are not such a scale.
pub fn payload_log2s(spec: CodecSpec, payload: &[u8]) -> Option<i32> {
    spec.rescalable_log2s()?;
    let scale = f32::from_le_bytes(payload.get(..4)?.try_into().ok()?);
    dense::loco_payload_log2s(&scale)
}

/// `spec` at scale `2^log2s` where it is a rescalable LoCo codec; other specs unchanged.
pub fn rescaled(spec: CodecSpec, log2s: i32) -> CodecSpec {
    match spec {
        CodecSpec::Loco {
            bits,
            rescalable: true,
            ..
        } => CodecSpec::Loco {
            bits,
            log2s,
            rescalable: true,
        },
        other => other,
    }
}

/// Every codec shader, for validation tests.
pub fn gpu_shaders() -> Vec<&'static crate::gpu::Shader> {
    gpu::shaders()
}
