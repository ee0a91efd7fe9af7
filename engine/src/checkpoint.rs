//! Checkpoint files in the safetensors format, read and written by the `safetensors` crate:
//! named tensors (f32, f16 or bf16 in the file, f32 in memory) and string metadata.
//!
//! Files, and snapshots received from peers, are untrusted. The crate refuses a header over
//! 100 MB, tensors whose byte range does not match their shape and dtype, and tensors that
//! overlap, leave gaps or do not cover the data exactly. What it leaves to us, done here before
//! it parses: a tighter header cap, and data offsets past the end of the file, whose sum can
//! overflow inside the crate (a panic in builds with overflow checks).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use safetensors::{Dtype, SafeTensors, View};
use serde_json::Value;

use crate::compress::support::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};

/// Largest header accepted. murmur writes a few kilobytes (names, shapes, the run's
/// description); this leaves room for models of a hundred thousand tensors.
pub const MAX_HEADER: usize = 16 << 20;

fn bad<T>(msg: impl fmt::Display) -> Result<T> {
    Err(Error::Data(format!("not a valid checkpoint: {msg}")))
}

/// How tensors are stored in a file. Training checkpoints use f32, so that a resumed run
/// continues bit for bit; f16 and bf16 halve exported weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// IEEE binary32, exact.
    #[default]
    F32,
    /// IEEE binary16, rounded to nearest even; values beyond ±65504 are refused.
    F16,
    /// bfloat16 (f32's range, 8 bits of significand), rounded to nearest even.
    Bf16,
}

impl Precision {
    fn dtype(self) -> Dtype {
        match self {
            Precision::F32 => Dtype::F32,
            Precision::F16 => Dtype::F16,
            Precision::Bf16 => Dtype::BF16,
        }
    }

    /// The little-endian bytes of `values` in this precision; refuses a finite value that
    /// would become infinite (`name` says which tensor).
    fn encode(self, name: &str, values: &[f32]) -> Result<Vec<u8>> {
        let half = |to: fn(f32) -> u16, from: fn(u16) -> f32| -> Result<Vec<u8>> {
            let mut out = Vec::with_capacity(2 * values.len());
            for &v in values {
                let h = to(v);
                if v.is_finite() && !from(h).is_finite() {
                    return Err(Error::Data(format!(
                        "{name} holds {v:e}, beyond the range of {self}: store it as f32{}",
                        if self == Precision::F16 {
                            " or bf16"
                        } else {
                            ""
                        }
                    )));
                }
                out.extend(h.to_le_bytes());
            }
            Ok(out)
        };
        match self {
            Precision::F32 => Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            Precision::F16 => half(f32_to_f16, f16_to_f32),
            Precision::Bf16 => half(f32_to_bf16, bf16_to_f32),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        })
    }
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Precision::F32),
            "f16" => Ok(Precision::F16),
            "bf16" => Ok(Precision::Bf16),
            other => Err(Error::Config(format!(
                "dtype {other:?}: use f32, f16 or bf16"
            ))),
        }
    }
}

/// One tensor's encoded bytes, as the crate's writer takes them.
struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Named tensors and string metadata, as a checkpoint holds them.
pub type Contents = (Vec<(String, Tensor)>, BTreeMap<String, String>);

/// Serialises tensors (read back from the GPU if there) in `precision`, with string
/// metadata. Equal contents give equal bytes.
pub fn to_bytes(
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
    precision: Precision,
) -> Result<Vec<u8>> {
    let mut names = HashSet::new();
    if let Some((name, _)) = tensors.iter().find(|(n, _)| !names.insert(n)) {
        return Err(Error::Data(format!(
            "two tensors are named {name} in one checkpoint"
        )));
    }
    // One readback (one wait on the GPU) for all tensors.
    let values = Tensor::read_many(&tensors.iter().map(|(_, t)| t).collect::<Vec<_>>())?;
    let encoded = tensors
        .iter()
        .zip(values)
        .map(|((name, t), values)| {
            Ok(Encoded {
                dtype: precision.dtype(),
                shape: t.shape().to_vec(),
                data: precision.encode(name, &values)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata: HashMap<String, String> = metadata.clone().into_iter().collect();
    let mut bytes =
        safetensors::serialize(tensors.iter().map(|(n, _)| n).zip(&encoded), Some(metadata))
            .map_err(|e| Error::Data(format!("writing a checkpoint: {e}")))?;
    sort_header(&mut bytes)?;
    Ok(bytes)
}

/// Rewrites the header of `bytes` with its keys sorted. The crate writes the metadata from a
/// `HashMap`, whose order changes from run to run; sorted, equal checkpoints are equal bytes
/// (what the resume tests compare, and what a checksum of a run relies on). A permutation of
/// the same keys and values has the same length, so the data does not move.
fn sort_header(bytes: &mut [u8]) -> Result<()> {
    let (n, header) = split_header(bytes)?;
    // serde_json's maps are sorted by key.
    let sorted: Value = serde_json::from_slice(header).map_err(|e| Error::Data(e.to_string()))?;
    let sorted = serde_json::to_vec(&sorted).map_err(|e| Error::Data(e.to_string()))?;
    let trimmed = header.trim_ascii_end().len();
    if sorted.len() != trimmed {
        return Err(Error::Data(format!(
            "sorting a checkpoint header changed its length from {trimmed} to {}",
            sorted.len()
        )));
    }
    bytes[8..8 + n][..trimmed].copy_from_slice(&sorted);
    Ok(())
}

/// The header length and the header bytes, checked against the file and [`MAX_HEADER`].
fn split_header(bytes: &[u8]) -> Result<(usize, &[u8])> {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return bad("shorter than its 8-byte header length");
    };
    let n = u64::from_le_bytes(*len);
    match usize::try_from(n) {
        Ok(n) if n <= MAX_HEADER && n <= rest.len() => Ok((n, &rest[..n])),
        _ => bad(format!(
            "a header of {n} bytes in a file of {} (at most {MAX_HEADER})",
            bytes.len()
        )),
    }
}

/// Refuses a tensor whose data would end past the end of the file, before the crate adds up
/// the offsets.
fn check_ends(header: &[u8], data_len: usize) -> Result<()> {
    let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(header) else {
        return bad("the header is not a JSON object");
    };
    for (name, entry) in entries.iter().filter(|(n, _)| *n != "__metadata__") {
        let end = entry.get("data_offsets").and_then(|o| o.get(1));
        match end.and_then(Value::as_u64) {
            Some(end) if end <= data_len as u64 => {}
            _ => {
                return bad(format!(
                    "tensor {name} ends at {}, past the {data_len} bytes of data",
                    end.map_or("no offset".into(), Value::to_string)
                ))
            }
        }
    }
    Ok(())
}

/// Parses checkpoint bytes into named tensors on `device` (sorted by name), converted to
/// f32, and metadata.
pub fn from_bytes(bytes: &[u8], device: &Device) -> Result<Contents> {
    let (n, header) = split_header(bytes)?;
    let data = &bytes[8 + n..];
    check_ends(header, data.len())?;
    let (_, parsed) = SafeTensors::read_metadata(bytes).or_else(bad)?;
    let metadata = parsed
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut tensors = vec![];
    for (name, info) in parsed.tensors() {
        let (begin, end) = info.data_offsets;
        let Some(raw) = data.get(begin..end) else {
            return bad(format!("tensor {name} lies outside the data"));
        };
        let values = match info.dtype {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => halves(raw).map(f16_to_f32).collect(),
            Dtype::BF16 => halves(raw).map(bf16_to_f32).collect(),
            other => {
                return bad(format!(
                    "tensor {name} is {other}; murmur reads F32, F16 and BF16"
                ))
            }
        };
        tensors.push((name, Tensor::from_vec(device, &info.shape, values)?));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((tensors, metadata))
}

fn halves(raw: &[u8]) -> impl Iterator<Item = u16> + '_ {
    raw.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
}

/// The tensor called `name`, or an error naming what is missing.
pub fn take(tensors: &[(String, Tensor)], name: &str) -> Result<Tensor> {
    tensors
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.clone())
        .ok_or_else(|| Error::Data(format!("checkpoint has no tensor {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(String, Tensor)> {
        let d = Device::Cpu;
        vec![
            (
                "layers.0.weight".to_string(),
                Tensor::from_vec(&d, &[2, 2], vec![1., -2.5, 3e-3, 4.]).unwrap(),
            ),
            ("b".to_string(), Tensor::scalar(&d, 5.0).unwrap()),
        ]
    }

    fn meta() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("steps".to_string(), "7".to_string()),
            ("format".to_string(), "test".to_string()),
            ("run".to_string(), r#"{"a":1}"#.to_string()),
        ])
    }

    /// A file of one header (with `header`'s tensors) and `data` bytes of data.
    fn raw(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    #[test]
    fn round_trip_is_exact_and_deterministic() {
        let d = Device::Cpu;
        let bytes = to_bytes(&sample(), &meta(), Precision::F32).unwrap();
        assert_eq!(
            (8 + u64::from_le_bytes(bytes[..8].try_into().unwrap())) % 8,
            0,
            "data starts 8-byte aligned"
        );
        // The metadata comes from a HashMap: many writes must still give one byte string.
        for _ in 0..8 {
            assert_eq!(to_bytes(&sample(), &meta(), Precision::F32).unwrap(), bytes);
        }
        let (back, m) = from_bytes(&bytes, &d).unwrap();
        assert_eq!(m, meta());
        let names: Vec<&str> = back.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["b", "layers.0.weight"]);
        let w = take(&back, "layers.0.weight").unwrap();
        assert_eq!(w.shape(), &[2, 2]);
        assert_eq!(w.to_vec().unwrap(), [1., -2.5, 3e-3, 4.]);
        assert_eq!(take(&back, "b").unwrap().shape(), &[] as &[usize]);
        assert!(take(&back, "c").is_err());
        // The crate's own reader agrees on dtype and shape.
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let view = st.tensor("layers.0.weight").unwrap();
        assert_eq!((view.dtype(), view.shape()), (Dtype::F32, &[2usize, 2][..]));
    }

    #[test]
    fn half_precisions_round_as_the_engine_does() {
        let d = Device::Cpu;
        let values: Vec<f32> = vec![0.1, -1.0 / 3.0, 65504.0, 1e-6, -0.0, 1.2345, 1e-40, 2.5e4];
        let t = vec![(
            "w".to_string(),
            Tensor::from_vec(&d, &[2, 4], values.clone()).unwrap(),
        )];
        for (p, to, from, dtype) in [
            (
                Precision::F16,
                f32_to_f16 as fn(f32) -> u16,
                f16_to_f32 as fn(u16) -> f32,
                Dtype::F16,
            ),
            (Precision::Bf16, f32_to_bf16, bf16_to_f32, Dtype::BF16),
        ] {
            let bytes = to_bytes(&t, &BTreeMap::new(), p).unwrap();
            let f32_len = to_bytes(&t, &BTreeMap::new(), Precision::F32)
                .unwrap()
                .len();
            assert_eq!(
                f32_len - bytes.len(),
                2 * values.len(),
                "{p} halves the data"
            );
            assert_eq!(
                SafeTensors::deserialize(&bytes)
                    .unwrap()
                    .tensor("w")
                    .unwrap()
                    .dtype(),
                dtype
            );
            let back = take(&from_bytes(&bytes, &d).unwrap().0, "w").unwrap();
            let want: Vec<u32> = values.iter().map(|&v| from(to(v)).to_bits()).collect();
            let got: Vec<u32> = back.to_vec().unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{p}");
            assert_eq!(back.shape(), &[2, 4]);
        }
        // f16 would turn 7e4 into infinity: refused, naming the tensor.
        let big = vec![(
            "big".to_string(),
            Tensor::from_vec(&d, &[1], vec![7e4]).unwrap(),
        )];
        let err = to_bytes(&big, &BTreeMap::new(), Precision::F16).unwrap_err();
        assert!(err.to_string().contains("big"), "{err}");
        assert!(to_bytes(&big, &BTreeMap::new(), Precision::Bf16).is_ok());
        assert_eq!("bf16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert!("f8".parse::<Precision>().is_err());
    }

    #[test]
    fn duplicate_names_are_refused_on_write() {
        let mut t = sample();
        t.push(t[0].clone());
        assert!(to_bytes(&t, &BTreeMap::new(), Precision::F32).is_err());
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let d = Device::Cpu;
        let bytes = to_bytes(&sample(), &meta(), Precision::F32).unwrap();
        for cut in 0..bytes.len() {
            assert!(from_bytes(&bytes[..cut], &d).is_err(), "truncated at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(from_bytes(&longer, &d).is_err(), "a trailing byte");
        for len in [u64::MAX, (MAX_HEADER + 1) as u64, bytes.len() as u64] {
            let mut evil = bytes.clone();
            evil[..8].copy_from_slice(&len.to_le_bytes());
            assert!(from_bytes(&evil, &d).is_err(), "header length {len}");
        }
        // Every single flipped byte in the header: an error or a clean parse, never a panic.
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for i in 8..8 + n {
            let mut flipped = bytes.clone();
            flipped[i] ^= 0x55;
            let _ = from_bytes(&flipped, &d);
        }
        let refused = [
            // Overlapping tensors.
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
            ),
            // A shape that does not match the byte range.
            (
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
            ),
            // A dtype murmur does not read.
            (
                r#"{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#,
                8,
            ),
            // An end past the data.
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                4,
            ),
            // A shape whose element count overflows.
            (
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
                8,
            ),
            // Metadata that is not strings.
            (r#"{"__metadata__":{"steps":7}}"#, 0),
            ("[1, 2]", 0),
        ];
        for (header, data) in refused {
            assert!(from_bytes(&raw(header, data), &d).is_err(), "{header}");
        }
        // Eight tensors whose sizes add up past usize::MAX: the crate would overflow summing
        // them; the ends are checked against the file first.
        let size = (1usize << 61) - 1;
        let header: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    r#""t{i}":{{"dtype":"U8","shape":[{size}],"data_offsets":[{},{}]}}"#,
                    i * size,
                    (i + 1) * size
                )
            })
            .collect();
        let header = format!("{{{}}}", header.join(","));
        assert!(from_bytes(&raw(&header, 0), &d).is_err());
    }
}
