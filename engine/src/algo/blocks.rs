//! How a flat parameter vector is cut into compression blocks, each one key of the collective
//! with its own scale (liec-sgd.md §4): the LIEC code's `_take_tensors` buckets.

use crate::comm::Key;
use crate::error::{Error, Result};

/// One block of the flat vector: elements `offset..offset + len`, sent under `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub key: Key,
    pub offset: usize,
    pub len: usize,
}

/// How tensors are grouped into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocking {
    /// The whole model is one block (SignSGD).
    Whole,
    /// Whole tensors in order, a new block whenever the next tensor would take the block past
    /// `bytes` of f32 (Blockwise-SignSGD; a tensor larger than the limit is a block alone).
    Bucket { bytes: usize },
}

impl std::str::FromStr for Blocking {
    type Err = Error;

    /// `whole`, or `bucket:<bytes>` (a suffix k or M multiplies by 1024 or 1024²).
    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "blocking {text:?}: use whole or bucket:<bytes> (for example bucket:64k)"
            ))
        };
        match text.split_once(':') {
            None if text == "whole" => Ok(Blocking::Whole),
            Some(("bucket", size)) => {
                let (digits, unit) = match size.as_bytes().last() {
                    Some(b'k' | b'K') => (&size[..size.len() - 1], 1024),
                    Some(b'm' | b'M') => (&size[..size.len() - 1], 1024 * 1024),
                    _ => (size, 1),
                };
                let bytes: usize = digits.parse().map_err(|_| bad())?;
                if bytes == 0 {
                    return Err(bad());
                }
                Ok(Blocking::Bucket {
                    bytes: bytes * unit,
                })
            }
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Blocking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocking::Whole => write!(f, "whole"),
            Blocking::Bucket { bytes } if bytes % 1024 == 0 => {
                write!(f, "bucket:{}k", bytes / 1024)
            }
            Blocking::Bucket { bytes } => write!(f, "bucket:{bytes}"),
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
    let mut push = |offset: usize, len: usize| {
        out.push(Block {
            key: out.len() as Key,
            offset,
            len,
        })
    };
    match blocking {
        Blocking::Whole => push(0, total),
        Blocking::Bucket { bytes } => {
            let (mut start, mut len) = (0usize, 0usize);
            for &n in sizes.iter().filter(|&&n| n > 0) {
                if len > 0 && 4 * (len + n) > bytes {
                    push(start, len);
                    start += len;
                    len = 0;
                }
                len += n;
            }
            push(start, len);
        }
    }
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
    }
}
