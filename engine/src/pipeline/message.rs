//! What crosses a cut: one payload per step and direction, made of one part per batch row.
//!
//! A row travels either raw (its f32 values, little-endian) or coded (the row codec's payload
//! for the row's compressed difference). Which rows are which follows from the step's draw and
//! the variant, which both ends derive themselves (clapping.md §9 A18), so the payload carries
//! no mask; its exact length is checked before anything is decoded, and a payload that does
//! not decode costs the step an error and leaves the receiver's buffers as they were.

use std::str::FromStr;

use crate::compress::{self, Codec, CodecContext, CodecSpec, DecodeMode};
use crate::error::{Error, Result};

/// A codec applied row by row, possibly a chain `a+b`: every codec but the last quantizes
/// and dequantizes in place, the last one encodes (clapping.md §5's "8-bit quantization then
/// natural compression" is `qsgd:bits=8+natural`). Only the last codec's payload travels.
pub struct RowCodec {
    text: String,
    chain: Vec<Box<dyn Codec>>,
}

impl std::fmt::Debug for RowCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Display for RowCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for RowCodec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let chain = text
            .split('+')
            .map(compress::parse)
            .collect::<Result<Vec<_>>>()?;
        Ok(RowCodec {
            text: text.to_string(),
            chain,
        })
    }
}

impl Clone for RowCodec {
    fn clone(&self) -> Self {
        self.text.parse().expect("it parsed before")
    }
}

impl RowCodec {
    /// Plain f32: the difference would be sent exactly, so rows travel raw instead (which
    /// also keeps `ỹ = y` bit for bit; `ỹ + (y − ỹ)` is not, clapping.md invariant 1).
    pub fn is_identity(&self) -> bool {
        self.chain.len() == 1 && self.chain[0].spec() == CodecSpec::F32
    }

    fn last(&self) -> &dyn Codec {
        self.chain.last().expect("a chain has a codec").as_ref()
    }

    /// Exact payload bytes of one coded row of `n` values (the last codec's payload length).
    pub fn payload_len(&self, n: usize) -> usize {
        self.last().payload_len(n)
    }

    /// Encodes one row: every codec but the last quantizes and dequantizes `x` in turn, the last
    /// one's payload is returned.
    pub fn encode(&self, x: &[f32], ctx: &CodecContext) -> Vec<u8> {
        let mut z = x.to_vec();
        for codec in &self.chain[..self.chain.len() - 1] {
            let payload = codec.encode(&z, ctx);
            codec
                .decode_into(&payload, &mut z, ctx, DecodeMode::Set)
                .expect("a codec decodes its own payloads");
        }
        self.last().encode(&z, ctx)
    }

    /// Decodes one row's payload with the last codec of the chain into `out`, applied as `mode`
    /// says; fails on a malformed payload.
    pub fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        self.last().decode_into(payload, out, ctx, mode)
    }
}

/// How one row travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The row's f32 values, little-endian, `4 * cols` bytes.
    Raw,
    /// The row codec's payload for the row's compressed difference.
    Coded,
}

/// The context of row `row`'s codec: keyed by the cut, the direction and the row, so that
/// stochastic codecs draw independent numbers for every row and every message.
pub fn row_context(seed: u64, step: u64, channel: u32, row: usize) -> CodecContext {
    CodecContext {
        seed,
        step: step as u32,
        key: (channel << 16) ^ row as u32,
        stream: 0,
    }
}

/// The payload's exact length for these parts.
pub fn payload_len(codec: &RowCodec, parts: &[Part], cols: usize) -> usize {
    parts
        .iter()
        .map(|p| match p {
            Part::Raw => 4 * cols,
            Part::Coded => codec.payload_len(cols),
        })
        .sum()
}

/// Splits a payload into its rows' parts after checking its length.
pub fn split<'a>(
    codec: &RowCodec,
    payload: &'a [u8],
    parts: &[Part],
    cols: usize,
) -> Result<Vec<&'a [u8]>> {
    let expected = payload_len(codec, parts, cols);
    if payload.len() != expected {
        return Err(Error::Payload {
            codec: format!("stage message ({codec})"),
            detail: format!(
                "{} bytes for {} rows of {cols}, expected {expected}",
                payload.len(),
                parts.len()
            ),
        });
    }
    let mut rest = payload;
    Ok(parts
        .iter()
        .map(|p| {
            let n = match p {
                Part::Raw => 4 * cols,
                Part::Coded => codec.payload_len(cols),
            };
            let (head, tail) = rest.split_at(n);
            rest = tail;
            head
        })
        .collect())
}

/// Little-endian f32 values of a raw row (whose length `split` checked); on error `out` is
/// untouched.
pub fn read_raw(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let values = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    if let Some(v) = values.clone().find(|v| !v.is_finite()) {
        return Err(Error::Payload {
            codec: "stage message (raw row)".into(),
            detail: format!("non-finite value {v}"),
        });
    }
    for (o, v) in out.iter_mut().zip(values) {
        *o = v;
    }
    Ok(())
}

/// Appends `values` to `out` as little-endian f32, the raw form of a row.
pub fn write_raw(values: &[f32], out: &mut Vec<u8>) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_sends_the_last_codecs_payload_of_the_first_codecs_output() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let ctx = row_context(5, 3, 1, 2);
        let chain: RowCodec = "qsgd:bits=8+natural".parse().unwrap();
        let q8 = compress::parse("qsgd:bits=8").unwrap();
        let nat = compress::parse("natural").unwrap();
        let z = q8.decode(&q8.encode(&x, &ctx), 37, &ctx).unwrap();
        assert_eq!(chain.encode(&x, &ctx), nat.encode(&z, &ctx));
        assert_eq!(chain.payload_len(37), nat.payload_len(37));
        assert!(!chain.is_identity());
        assert!("f32".parse::<RowCodec>().unwrap().is_identity());
        assert!("topk:0.1+nonsense".parse::<RowCodec>().is_err());
    }

    #[test]
    fn a_payload_of_the_wrong_length_or_with_non_finite_raw_values_is_refused() {
        let codec: RowCodec = "topk:0.25".parse().unwrap();
        let parts = [Part::Raw, Part::Coded];
        let n = payload_len(&codec, &parts, 8);
        assert_eq!(n, 32 + codec.payload_len(8));
        let payload = vec![0u8; n];
        assert_eq!(split(&codec, &payload, &parts, 8).unwrap()[0].len(), 32);
        assert!(split(&codec, &payload[1..], &parts, 8).is_err());
        assert!(split(&codec, &[payload.clone(), vec![0]].concat(), &parts, 8).is_err());
        let mut raw = Vec::new();
        write_raw(&[1.0, f32::NAN], &mut raw);
        let mut out = [7.0f32; 2];
        assert!(read_raw(&raw, &mut out).is_err());
        assert_eq!(out, [7.0; 2]);
        write_raw(&[1.0, 2.5], &mut raw);
        read_raw(&raw[8..], &mut out).unwrap();
        assert_eq!(out, [1.0, 2.5]);
    }
}
