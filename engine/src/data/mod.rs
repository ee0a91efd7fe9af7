//! Datasets from files: IDX images and labels (MNIST, Fashion-MNIST) with seeded shuffling,
//! and byte-level text (Shakespeare).
//!
//! File contents are untrusted: every decoder returns an error on bad input, never panics,
//! and caps what it will allocate.

mod idx;
mod images;
mod text;

pub use idx::{decode_idx, decode_idx_file_bytes, read_idx_file, IdxArray, MAX_IDX_BYTES};
pub use images::{ImageDataset, ImageSet, Split};
pub use text::{lm_batch, lm_windows, TextCorpus, HELD_OUT_PLAYS};

use std::path::PathBuf;

/// Where datasets live: `$MURMUR_DATA`, else the first `data/` folder found in the current
/// directory or one of its three parents (so that tests run from a crate folder find the
/// workspace's data).
pub fn default_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("MURMUR_DATA").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    cwd.ancestors()
        .take(4)
        .map(|d| d.join("data"))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| PathBuf::from("data"))
}

/// Shuffled minibatches of indices for one epoch; the order depends only on (seed, epoch).
pub fn epoch_batches(n: usize, batch: usize, seed: u64, epoch: u32) -> Vec<Vec<usize>> {
    epoch_order(n, seed, epoch)
        .chunks(batch.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// The order in which epoch `epoch` visits samples `0..n`: a seeded shuffle, the one
/// [`epoch_batches`] cuts into batches.
pub fn epoch_order(n: usize, seed: u64, epoch: u32) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    crate::rng::Rng::new(seed, 0x5EED_0000 ^ epoch).shuffle(&mut order);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_cover_every_sample_once_in_a_seeded_order() {
        let a = epoch_batches(10, 3, 1, 0);
        assert_eq!(a.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 1]);
        let mut all: Vec<usize> = a.concat();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(a, epoch_batches(10, 3, 1, 0));
        assert_ne!(a, epoch_batches(10, 3, 1, 1));
        assert_ne!(a, epoch_batches(10, 3, 2, 0));
    }
}
