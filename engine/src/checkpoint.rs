//! Checkpoints in the safetensors format: an 8-byte little-endian header length, a JSON header
//! naming each tensor's dtype, shape and byte range, then the raw little-endian data. Files
//! (and snapshots received from peers) are untrusted: the reader checks every offset, size and
//! name, and caps the header, before touching the data.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};

/// Largest header accepted (safetensors' own limit is 100 MB).
const MAX_HEADER: usize = 100 << 20;

fn bad<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Data(format!(
        "not a valid checkpoint: {}",
        msg.into()
    )))
}

/// Named tensors and string metadata, as a checkpoint holds them.
pub type Contents = (Vec<(String, Tensor)>, BTreeMap<String, String>);

/// Serialises f32 tensors (read back from the GPU if there) and string metadata.
pub fn to_bytes(
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!(metadata));
    let mut data = vec![];
    // One readback (one wait on the GPU) for all tensors.
    let values = Tensor::read_many(&tensors.iter().map(|(_, t)| t).collect::<Vec<_>>())?;
    for ((name, t), values) in tensors.iter().zip(values) {
        let begin = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": t.shape(), "data_offsets": [begin, data.len()]}),
        );
    }
    let mut head =
        serde_json::to_vec(&Value::Object(header)).map_err(|e| Error::Data(e.to_string()))?;
    // Pad the header with spaces so that the data starts 8-byte aligned, as the format advises.
    while (8 + head.len()) % 8 != 0 {
        head.push(b' ');
    }
    let mut out = (head.len() as u64).to_le_bytes().to_vec();
    out.extend(head);
    out.extend(data);
    Ok(out)
}

/// Parses checkpoint bytes into named tensors on `device` (sorted by name) and metadata.
pub fn from_bytes(bytes: &[u8], device: &Device) -> Result<Contents> {
    if bytes.len() < 8 {
        return bad("shorter than its 8-byte header length");
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER as u64 || n > (bytes.len() - 8) as u64 {
        return bad(format!(
            "header of {n} bytes in a {}-byte file",
            bytes.len()
        ));
    }
    let data = &bytes[8 + n as usize..];
    let header: Map<String, Value> = match serde_json::from_slice(&bytes[8..8 + n as usize]) {
        Ok(Value::Object(m)) => m,
        _ => return bad("the header is not a JSON object"),
    };
    let mut metadata = BTreeMap::new();
    let mut ranges = vec![];
    let mut tensors = vec![];
    for (name, entry) in header {
        if name == "__metadata__" {
            let Value::Object(m) = entry else {
                return bad("__metadata__ is not an object");
            };
            for (k, v) in m {
                let Value::String(v) = v else {
                    return bad(format!("metadata {k} is not a string"));
                };
                metadata.insert(k, v);
            }
            continue;
        }
        let dtype = entry.get("dtype").and_then(Value::as_str);
        if dtype != Some("F32") {
            return bad(format!("{name}: dtype {dtype:?}, only F32 is supported"));
        }
        let shape: Option<Vec<usize>> = entry
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
        let offsets: Option<Vec<usize>> = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
        let (Some(shape), Some(offsets)) = (shape, offsets) else {
            return bad(format!("{name}: missing shape or data_offsets"));
        };
        let &[begin, end] = offsets.as_slice() else {
            return bad(format!("{name}: data_offsets must be two numbers"));
        };
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if begin > end
            || end > data.len()
            || numel.and_then(|n| n.checked_mul(4)) != Some(end - begin)
        {
            return bad(format!(
                "{name}: shape {shape:?} does not fit bytes {begin}..{end} of {}",
                data.len()
            ));
        }
        ranges.push((begin, end, name.clone()));
        let values = data[begin..end]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        tensors.push((name, Tensor::from_vec(device, &shape, values)?));
    }
    ranges.sort();
    if let Some(w) = ranges.windows(2).find(|w| w[0].1 > w[1].0) {
        return bad(format!("tensors {} and {} overlap", w[0].2, w[1].2));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((tensors, metadata))
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

    #[test]
    fn round_trip_and_refusals() {
        let d = Device::Cpu;
        let tensors = vec![
            (
                "a".to_string(),
                Tensor::from_vec(&d, &[2, 2], vec![1., 2., 3., 4.]).unwrap(),
            ),
            ("b".to_string(), Tensor::scalar(&d, 5.0).unwrap()),
        ];
        let meta = BTreeMap::from([("step".to_string(), "7".to_string())]);
        let bytes = to_bytes(&tensors, &meta).unwrap();
        assert_eq!(
            (8 + u64::from_le_bytes(bytes[..8].try_into().unwrap())) % 8,
            0
        );
        let (back, m) = from_bytes(&bytes, &d).unwrap();
        assert_eq!(m, meta);
        assert_eq!(back.len(), 2);
        assert_eq!(
            take(&back, "a").unwrap().to_vec().unwrap(),
            [1., 2., 3., 4.]
        );
        assert_eq!(take(&back, "b").unwrap().shape(), &[] as &[usize]);
        for cut in [0, 7, 8, 20, bytes.len() - 1] {
            assert!(from_bytes(&bytes[..cut], &d).is_err(), "truncated at {cut}");
        }
        let mut evil = bytes.clone();
        evil[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(from_bytes(&evil, &d).is_err());
    }
}
