//! Exact selection of the k largest keys, the heart of top-k and random-k.
//!
//! The selected set is defined without reference to any algorithm: the k elements with the
//! largest u32 keys, ties going to the lower index. Top-k keys are the bits of |v| (which
//! order like the values for non-negative floats); random-k keys are random words. Finding
//! the threshold is a two-pass radix select (16 bits at a time), so the cost is O(n) however
//! k compares to n; the GPU (gpu.rs) computes the same threshold with the same histograms.

use rayon::prelude::*;

/// Elements per parallel task.
const TASK: usize = 1 << 16;

/// Up to this many elements, sorting beats the radix select, whose two 65,536-bin histograms
/// cost more than the selection itself on short vectors (a pipeline compresses activations
/// row by row, hundreds of rows of a few hundred values per step).
const SMALL: usize = 4096;

/// The k-th largest key, and how many elements with exactly that key belong to the top k
/// (the lowest-indexed ones). Requires `0 < k <= n`.
pub(crate) fn threshold(n: usize, k: usize, key: &(impl Fn(usize) -> u32 + Sync)) -> (u32, usize) {
    let histogram = |bin_of: &(dyn Fn(u32) -> Option<usize> + Sync)| -> Vec<u64> {
        (0..n.div_ceil(TASK))
            .into_par_iter()
            .fold(
                || vec![0u64; 1 << 16],
                |mut h, t| {
                    for i in t * TASK..((t + 1) * TASK).min(n) {
                        if let Some(b) = bin_of(key(i)) {
                            h[b] += 1;
                        }
                    }
                    h
                },
            )
            .reduce(
                || vec![0u64; 1 << 16],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            )
    };
    // Walks bins from the top until `want` elements are covered: (bin, count above it).
    let crossing = |h: &[u64], want: u64| -> (usize, u64) {
        let mut above = 0u64;
        for b in (0..h.len()).rev() {
            if above + h[b] >= want {
                return (b, above);
            }
            above += h[b];
        }
        unreachable!("want <= total count")
    };
    let high = histogram(&|k| Some((k >> 16) as usize));
    let (hb, above_hi) = crossing(&high, k as u64);
    let low = histogram(&|k| ((k >> 16) as usize == hb).then_some((k & 0xffff) as usize));
    let (lb, above_lo) = crossing(&low, k as u64 - above_hi);
    (
        (hb as u32) << 16 | lb as u32,
        (k as u64 - above_hi - above_lo) as usize,
    )
}

/// Indices of the top k keys in increasing order.
pub(crate) fn select_top(n: usize, k: usize, key: impl Fn(usize) -> u32 + Sync) -> Vec<u32> {
    if k == 0 || n == 0 {
        return vec![];
    }
    if k >= n {
        return (0..n as u32).collect();
    }
    if n <= SMALL {
        // The definition itself: largest keys first, ties to the lower index.
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            key(b as usize).cmp(&key(a as usize)).then(a.cmp(&b))
        });
        let mut top = order[..k].to_vec();
        top.sort_unstable();
        return top;
    }
    let (t, take_equal) = threshold(n, k, &key);
    let tasks = n.div_ceil(TASK);
    let range = |task: usize| task * TASK..((task + 1) * TASK).min(n);
    // Elements equal to the threshold before each task, so that each task knows how many of
    // its own it may still take.
    let equal_counts: Vec<usize> = (0..tasks)
        .into_par_iter()
        .map(|task| range(task).filter(|&i| key(i) == t).count())
        .collect();
    let mut equal_before = vec![0usize; tasks];
    for task in 1..tasks {
        equal_before[task] = equal_before[task - 1] + equal_counts[task - 1];
    }
    let parts: Vec<Vec<u32>> = (0..tasks)
        .into_par_iter()
        .map(|task| {
            let mut seen = equal_before[task];
            let mut out = vec![];
            for i in range(task) {
                let ki = key(i);
                if ki > t || (ki == t && seen < take_equal) {
                    out.push(i as u32);
                }
                seen += (ki == t) as usize;
            }
            out
        })
        .collect();
    let selected: Vec<u32> = parts.concat();
    debug_assert_eq!(selected.len(), k);
    selected
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, by sorting.
    fn brute(keys: &[u32], k: usize) -> Vec<u32> {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by(|&a, &b| keys[b].cmp(&keys[a]).then(a.cmp(&b)));
        let mut top: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
        top.sort_unstable();
        top
    }

    #[test]
    fn selection_matches_the_definition_with_ties_everywhere() {
        let mut rng = crate::rng::Rng::new(5, 0);
        for (n, distinct) in [
            (1usize, 5u32),
            (10, 3),
            (1000, 4),
            (SMALL, 7),
            (SMALL + 1, 7),
            (70_000, 50),
            (200_000, 1 << 30),
            (131_073, 1),
        ] {
            let keys: Vec<u32> = (0..n)
                .map(|_| (rng.below(distinct as usize) as u32).wrapping_mul(65_537))
                .collect();
            for k in [1, 2, n / 3, n.saturating_sub(1), n]
                .into_iter()
                .filter(|&k| k >= 1 && k <= n)
            {
                assert_eq!(
                    select_top(n, k, |i| keys[i]),
                    brute(&keys, k),
                    "n {n} k {k} distinct {distinct}"
                );
            }
        }
    }
}
