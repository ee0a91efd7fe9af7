//! How a flat parameter vector is cut into compression blocks, each one key of the collective
//! with its own scale (liec-sgd.md §4): the LIEC code's `_take_tensors` buckets.

use crate::comm::Key;
use crate::error::{Error, Result};

/// One block of the flat vector: elements `offset..offset + len`, sent under `key`; `plain`
/// blocks travel uncompressed, in f32 both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The collective key the block is pushed and pulled under.
    pub key: Key,
    /// Index of the block's first element in the flat parameter vector.
    pub offset: usize,
    /// Number of elements in the block.
    pub len: usize,
    /// Whether the block travels uncompressed, as f32 both ways, with no error-feedback memory.
    pub plain: bool,
}

/// How tensors are grouped into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocking {
    /// The whole model is one block (SignSGD).
    Whole,
    /// Whole tensors in order, a new block whenever the next tensor would take the block past
    /// `bytes` of f32 (Blockwise-SignSGD; a tensor larger than the limit is a block alone).
    Bucket {
        /// Largest block in bytes of f32.
        bytes: usize,
    },
    /// As `Bucket`, but tensors of fewer than `threshold` bytes travel uncompressed, in buckets
    /// of their own: BytePS-Compress's size threshold (byteps-clan.md §5.3, 1,024,000 bytes
    /// there), where the constant cost of compressing a small tensor outweighs its bytes.
    Thresholded {
        /// Largest block in bytes of f32.
        bytes: usize,
        /// Tensors of fewer bytes of f32 than this travel uncompressed.
        threshold: usize,
    },
}

impl std::str::FromStr for Blocking {
    type Err = Error;

    /// `whole`, or `bucket:<bytes>[:threshold=<bytes>]` (a suffix k or M multiplies by 1024
    /// or 1024²).
    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "blocking {text:?}: use whole or bucket:<bytes>[:threshold=<bytes>] (for \
                 example bucket:64k or bucket:64k:threshold=16k)"
            ))
        };
        let size = |size: &str| -> Result<usize> {
            let (digits, unit) = match size.as_bytes().last() {
                Some(b'k' | b'K') => (&size[..size.len() - 1], 1024),
                Some(b'm' | b'M') => (&size[..size.len() - 1], 1024 * 1024),
                _ => (size, 1),
            };
            match digits.parse::<usize>() {
                Ok(n) if n > 0 => n.checked_mul(unit).ok_or_else(bad),
                _ => Err(bad()),
            }
        };
        match text.split_once(':') {
            None if text == "whole" => Ok(Blocking::Whole),
            Some(("bucket", rest)) => match rest.split_once(':') {
                None => Ok(Blocking::Bucket { bytes: size(rest)? }),
                Some((bytes, threshold)) => Ok(Blocking::Thresholded {
                    bytes: size(bytes)?,
                    threshold: size(threshold.strip_prefix("threshold=").ok_or_else(bad)?)?,
                }),
            },
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Blocking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = |bytes: usize| {
            if bytes.is_multiple_of(1024) {
                format!("{}k", bytes / 1024)
            } else {
                bytes.to_string()
            }
        };
        match *self {
            Blocking::Whole => write!(f, "whole"),
            Blocking::Bucket { bytes } => write!(f, "bucket:{}", size(bytes)),
            Blocking::Thresholded { bytes, threshold } => {
                write!(f, "bucket:{}:threshold={}", size(bytes), size(threshold))
            }
        }
    }
}

/// The blocks of a model whose parameter tensors have `sizes` elements, in order; block `i`
/// has key `i`.
pub fn blocks(sizes: &[usize], blocking: Blocking) -> Result<Vec<Block>> {
    let total: usize = sizes.iter().sum();
    if total == 0 {
        return Err(Error::Config(
            "a model without parameters has nothing to send".into(),
        ));
    }
    let mut out: Vec<Block> = Vec::new();
    let mut push = |offset: usize, len: usize, plain: bool| {
        out.push(Block {
            key: out.len() as Key,
            offset,
            len,
            plain,
        })
    };
    let (bytes, threshold) = match blocking {
        Blocking::Whole => {
            push(0, total, false);
            return Ok(out);
        }
        Blocking::Bucket { bytes } => (bytes, 0),
        Blocking::Thresholded { bytes, threshold } => (bytes, threshold),
    };
    // A bucket closes when the next tensor would take it past `bytes` or is on the other side
    // of the threshold.
    let (mut start, mut len, mut plain) = (0usize, 0usize, false);
    for &n in sizes.iter().filter(|&&n| n > 0) {
        let small = 4 * n < threshold;
        if len > 0 && (4 * (len + n) > bytes || small != plain) {
            push(start, len, plain);
            start += len;
            len = 0;
        }
        plain = small;
        len += n;
    }
    push(start, len, plain);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_group_whole_tensors_like_take_tensors() {
        let lens = |b: Vec<Block>| b.iter().map(|b| b.len).collect::<Vec<_>>();
        // 40-byte limit = 10 floats: [3, 4] fit, 5 would pass it, 20 is alone, then [1, 2].
        let b = blocks(&[3, 4, 5, 20, 1, 2], Blocking::Bucket { bytes: 40 }).unwrap();
        assert_eq!(lens(b.clone()), [7, 5, 20, 3]);
        assert_eq!(
            b.iter().map(|b| b.offset).collect::<Vec<_>>(),
            [0, 7, 12, 32]
        );
        assert_eq!(b.iter().map(|b| b.key).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(lens(blocks(&[3, 4], Blocking::Whole).unwrap()), [7]);
        assert!(blocks(&[0], Blocking::Whole).is_err());
        assert_eq!(
            "bucket:64k".parse::<Blocking>().unwrap(),
            Blocking::Bucket { bytes: 65536 }
        );
        assert_eq!("whole".parse::<Blocking>().unwrap().to_string(), "whole");
        assert!("bucket:0".parse::<Blocking>().is_err());
        assert!("bucket".parse::<Blocking>().is_err());
        assert!(b.iter().all(|b| !b.plain));
    }

    #[test]
    fn tensors_under_the_threshold_travel_plain_in_buckets_of_their_own() {
        // Threshold 16 bytes = 4 floats: 3, 1 and 2 are small; 4, 5 and 20 are compressed.
        let blocking: Blocking = "bucket:40:threshold=16".parse().unwrap();
        let b = blocks(&[3, 4, 5, 20, 1, 2], blocking).unwrap();
        let shape: Vec<(usize, bool)> = b.iter().map(|b| (b.len, b.plain)).collect();
        assert_eq!(shape, [(3, true), (9, false), (20, false), (3, true)]);
        assert_eq!(blocking.to_string(), "bucket:40:threshold=16");
        assert_eq!(
            "bucket:64k:threshold=16k".parse::<Blocking>().unwrap(),
            Blocking::Thresholded {
                bytes: 65536,
                threshold: 16384
            }
        );
        for bad in [
            "bucket:64k:16k",
            "bucket:64k:threshold=0",
            "bucket:64k:threshold=",
        ] {
            assert!(bad.parse::<Blocking>().is_err(), "{bad}");
        }
    }
}
