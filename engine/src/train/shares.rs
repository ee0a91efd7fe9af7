//! How a global batch is cut into equal shares: the ranks' of a round, and the local steps'
//! of a rank's share.

/// The positions of this rank's share in a global batch of `len` samples: equal slices, the
/// first ranks taking one more sample when the batch does not divide.
pub fn rank_share(len: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / world, len % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// This rank's share of a global batch ([`rank_share`]).
pub fn rank_slice(global: &[usize], rank: usize, world: usize) -> &[usize] {
    &global[rank_share(global.len(), rank, world)]
}
