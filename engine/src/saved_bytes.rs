//! Serde adapters that write numeric vectors as one run of little-endian bytes, for the
//! states servers save every round (`feedback::SavedMemory`, `comm::owner::SavedOwner`): a
//! binary format then copies them whole instead of encoding element by element, which made
//! saving a 2 MB memory several times slower. Reading accepts exactly what writing gives.

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};

/// Bytes of any length, read as bytes or as a sequence of `u8`.
struct ByteVisitor;

impl<'de> Visitor<'de> for ByteVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("bytes")
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        // Grows as elements arrive: a claimed length allocates nothing.
        let mut out = Vec::new();
        while let Some(b) = seq.next_element()? {
            out.push(b);
        }
        Ok(out)
    }
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(ByteVisitor)
}

/// `Vec<f32>` as little-endian bytes.
pub mod f32s {
    use super::*;

    /// Writes the values as 4 little-endian bytes each.
    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        s.serialize_bytes(&raw)
    }

    /// Reads what [`serialize`] wrote; a length that is not a multiple of 4 is an error.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        let raw = bytes(d)?;
        if raw.len() % 4 != 0 {
            return Err(D::Error::custom(format!(
                "{} bytes of f32 values: not a multiple of 4",
                raw.len()
            )));
        }
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

/// `Option<Vec<f32>>` as an option of little-endian bytes.
pub mod opt_f32s {
    use super::*;

    /// Writes `None`, or the values as [`f32s`] does.
    pub fn serialize<S: Serializer>(v: &Option<Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wrapped<'a>(#[serde(with = "super::f32s")] &'a [f32]);
        match v {
            None => s.serialize_none(),
            Some(v) => s.serialize_some(&Wrapped(v)),
        }
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f32>>, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wrapped(#[serde(with = "super::f32s")] Vec<f32>);
        Ok(<Option<Wrapped> as serde::Deserialize>::deserialize(d)?.map(|w| w.0))
    }
}

/// `Vec<i8>` as bytes.
pub mod i8s {
    use super::*;

    /// Writes each value as its byte.
    pub fn serialize<S: Serializer>(v: &[i8], s: S) -> Result<S::Ok, S::Error> {
        let raw: Vec<u8> = v.iter().map(|&x| x as u8).collect();
        s.serialize_bytes(&raw)
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i8>, D::Error> {
        Ok(bytes(d)?.into_iter().map(|b| b as i8).collect())
    }
}

/// `Vec<u8>` as bytes (serde writes a plain `Vec<u8>` element by element).
pub mod u8s {
    use super::*;

    /// Writes the bytes as one run.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        bytes(d)
    }
}
