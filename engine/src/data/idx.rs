//! The IDX format of MNIST-style datasets: a big-endian header, then raw elements.
//!
//! ```text
//! bytes 0-1  zero
//! byte  2    element type (0x08 = u8, the only one used by image datasets)
//! byte  3    number of dimensions d (1..=4 accepted)
//! 4 * d      each dimension, big-endian u32
//! rest       the elements, row-major; exactly the product of the dimensions
//! ```
//! Files may be gzip-compressed (detected by the gzip magic), as Debian ships them.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Largest decompressed IDX payload accepted (Fashion-MNIST's training images are 47 MB).
pub const MAX_IDX_BYTES: usize = 256 << 20;

/// A decoded IDX array of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Size of each dimension, outermost first.
    pub dims: Vec<usize>,
    /// The elements in row-major order, as many as the product of `dims`.
    pub data: Vec<u8>,
}

/// Decodes an uncompressed IDX buffer of u8 elements.
pub fn decode_idx(bytes: &[u8]) -> Result<IdxArray> {
    let bad = |msg: String| Err(Error::Data(format!("not an IDX file of bytes: {msg}")));
    if bytes.len() < 4 {
        return bad(format!(
            "{} bytes is shorter than the 4-byte magic",
            bytes.len()
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return bad(format!(
            "magic starts with {:02x}{:02x}, expected 0000",
            bytes[0], bytes[1]
        ));
    }
    if bytes[2] != 0x08 {
        return bad(format!(
            "element type 0x{:02x}, only 0x08 (unsigned byte) is supported",
            bytes[2]
        ));
    }
    let ndims = bytes[3] as usize;
    if !(1..=4).contains(&ndims) {
        return bad(format!("{ndims} dimensions, expected 1 to 4"));
    }
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return bad(format!(
            "header needs {header} bytes, file has {}",
            bytes.len()
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let expected = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(expected) = expected.filter(|&n| n <= MAX_IDX_BYTES) else {
        return bad(format!(
            "dimensions {dims:?} describe more than {MAX_IDX_BYTES} bytes"
        ));
    };
    let payload = &bytes[header..];
    if payload.len() != expected {
        return bad(format!(
            "dimensions {dims:?} need {expected} bytes of data, file has {}",
            payload.len()
        ));
    }
    Ok(IdxArray {
        dims,
        data: payload.to_vec(),
    })
}

/// Decodes IDX file contents, gunzipping them first if they are compressed. Decompression
/// stops just past the largest valid size, so a gzip bomb costs at most that much memory.
pub fn decode_idx_file_bytes(raw: &[u8]) -> Result<IdxArray> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return decode_idx(raw);
    }
    let mut out = Vec::new();
    // Header (at most 20 bytes) plus payload; one more byte tells an oversized file apart.
    flate2::read::GzDecoder::new(raw)
        .take(MAX_IDX_BYTES as u64 + 20 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::Data(format!("corrupt gzip data: {e}")))?;
    decode_idx(&out)
}

/// Reads and decodes an IDX file, raw or gzipped.
pub fn read_idx_file(path: &Path) -> Result<IdxArray> {
    let raw = std::fs::read(path)
        .map_err(|e| Error::Data(format!("cannot read {}: {e}", path.display())))?;
    decode_idx_file_bytes(&raw).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            v.extend(d.to_be_bytes());
        }
        v.extend(data);
        v
    }

    #[test]
    fn decodes_a_well_formed_file() {
        let a = decode_idx(&idx(&[2, 3], &[1, 2, 3, 4, 5, 6])).unwrap();
        assert_eq!(a.dims, [2, 3]);
        assert_eq!(a.data, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn rejects_every_kind_of_malformed_input() {
        let good = idx(&[2, 3], &[0; 6]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "shorter"),
            (vec![1, 0, 8, 1], "magic"),
            (vec![0, 0, 0x0d, 1, 0, 0, 0, 0], "element type"),
            (vec![0, 0, 8, 0], "dimensions"),
            (vec![0, 0, 8, 9], "dimensions"),
            (good[..10].to_vec(), "header"),
            (good[..good.len() - 1].to_vec(), "need 6 bytes"),
            ([good.clone(), vec![0]].concat(), "need 6 bytes"),
            (idx(&[u32::MAX, u32::MAX, u32::MAX], &[]), "more than"),
        ];
        for (bytes, expect) in cases {
            let err = decode_idx(&bytes).unwrap_err().to_string();
            assert!(err.contains(expect), "{bytes:?}: {err}");
        }
    }

    #[test]
    fn reads_gzip_and_reports_corrupt_gzip() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("murmur-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = idx(&[4], &[9, 8, 7, 6]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let gz = gz.finish().unwrap();
        std::fs::write(dir.join("a.gz"), &gz).unwrap();
        assert_eq!(read_idx_file(&dir.join("a.gz")).unwrap().data, [9, 8, 7, 6]);
        std::fs::write(dir.join("b.gz"), &gz[..gz.len() / 2]).unwrap();
        let err = read_idx_file(&dir.join("b.gz")).unwrap_err().to_string();
        assert!(err.contains("b.gz"), "{err}");
        let missing = read_idx_file(&dir.join("missing")).unwrap_err().to_string();
        assert!(missing.contains("cannot read"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
