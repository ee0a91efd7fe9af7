//! Row-wise kernels on the CPU path (softmax, its gradient, softmax cross-entropy): each row's
//! arithmetic in the order of the references in `kernels::softmax` (and so of softmax.wgsl),
//! rows split over rayon. A row's values are computed once into the output and reused: the
//! references compute `exp(x - max)` twice per element, for the sum and for the output, which
//! gives the same value both times.

use rayon::prelude::*;

use super::elementwise::{for_rows, CHUNK};
use super::vector_unit::widest;
use crate::kernels::math::{
    combine_as_tree, exp_each, ln, sixteen_row_sums, workgroup_sum_of, ROW_LANES, SIDE_BY_SIDE,
};

/// The largest element of `row` (-inf when it is empty or every element is NaN), as
/// the references' fold from -inf gives it, taken 16 lanes at a time so that it vectorises:
/// `f32::max` passes over NaN, so the result does not depend on the order, except for which
/// zero wins between -0.0 and +0.0, and `x - max` is the same for both (`exp(±0)` is 1).
#[inline(always)]
fn max_of(row: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v);
        }
    }
    for (m, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *m = m.max(v);
    }
    // The lanes pairwise, halves at a time: a fold across them was a chain of 16 scalar
    // maxima, each with its NaN check, a fifth of causal attention's weights (`perf annotate`,
    // session 13). No lane is NaN (each started at -inf, and `f32::max` passes over NaN), so
    // a plain comparison gives the maximum.
    combine_as_tree(&mut lanes, |a, b| if b > a { b } else { a })
}

/// Writes `exp(x - max)` of `row` into `out` and returns `(max, sum)`, the sum in the
/// workgroup's lane order. The exps a stage at a time over the row (`exp_each`): a GPT
/// step's cross-entropy over [2048, 256] logits took 0.35 ms element by element.
#[inline(always)]
fn exp_shifted(row: &[f32], out: &mut [f32]) -> (f32, f32) {
    let m = max_of(row);
    let out = &mut out[..row.len()];
    for (o, &v) in out.iter_mut().zip(row) {
        *o = v - m;
    }
    exp_each(out);
    (m, workgroup_sum_of(out, ROW_LANES))
}

/// One row's softmax into `out`, as `softmax_row_ref`; returns `(max, sum)`.
#[inline(always)]
pub(super) fn softmax_row(row: &[f32], out: &mut [f32]) -> (f32, f32) {
    let (m, s) = exp_shifted(row, out);
    let inv = 1.0 / s;
    for o in out.iter_mut() {
        *o *= inv;
    }
    (m, s)
}

/// Softmax of each `cols`-long row of `x`; under the causal mask, row `r` covers its first
/// `r % cols + 1` elements and the rest are 0.
pub fn softmax(x: &[f32], cols: usize, causal: bool) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for_rows(
        &mut y,
        cols,
        #[inline(always)]
        |r, out| {
            let len = if causal { r % cols + 1 } else { cols };
            softmax_row(&x[r * cols..][..len], &mut out[..len]);
        },
    );
    y
}

/// `dx = y * (dy - sum(dy * y))` per row: the products go into `dx` first, for the sum.
pub fn softmax_backward(y: &[f32], dy: &[f32], cols: usize) -> Vec<f32> {
    let mut dx = vec![0.0; y.len()];
    for_rows(
        &mut dx,
        cols,
        #[inline(always)]
        |r, out| softmax_backward_row(&y[r * cols..][..cols], &dy[r * cols..][..cols], out),
    );
    dx
}

/// [`softmax_backward_row`] for each `cols`-long row of `y`, `dy` and `out`, 16 rows at a
/// time with their sums side by side ([`sixteen_row_sums`]), the rest one at a time.
#[inline(always)]
pub(super) fn softmax_backward_rows(y: &[f32], dy: &[f32], cols: usize, out: &mut [f32]) {
    let group = SIDE_BY_SIDE * cols;
    let done = out.len() - out.len() % group;
    let mut groups = out.chunks_exact_mut(group);
    for (k, out) in (&mut groups).enumerate() {
        let (y, dy) = (&y[k * group..][..group], &dy[k * group..][..group]);
        for ((o, &d), &p) in out.iter_mut().zip(dy).zip(y) {
            *o = d * p;
        }
        let sums = sixteen_row_sums(|r| &out[r * cols..][..cols]);
        let rows = out.chunks_exact_mut(cols).zip(dy.chunks_exact(cols));
        for ((out, dy), (y, s)) in rows.zip(y.chunks_exact(cols).zip(sums)) {
            for ((o, &d), &p) in out.iter_mut().zip(dy).zip(y) {
                *o = p * (d - s);
            }
        }
    }
    let rest = out[done..].chunks_exact_mut(cols);
    for ((out, y), dy) in rest
        .zip(y[done..].chunks_exact(cols))
        .zip(dy[done..].chunks_exact(cols))
    {
        softmax_backward_row(y, dy, out);
    }
}

/// One row of [`softmax_backward`]: the products go into `out` first, for the sum.
#[inline(always)]
pub(super) fn softmax_backward_row(y: &[f32], dy: &[f32], out: &mut [f32]) {
    for ((o, &d), &p) in out.iter_mut().zip(dy).zip(y) {
        *o = d * p;
    }
    let s = workgroup_sum_of(out, ROW_LANES);
    for ((o, &d), &p) in out.iter_mut().zip(dy).zip(y) {
        *o = p * (d - s);
    }
}

/// Per-row losses `ln(sum) + max - logit[label]` and the probabilities, as
/// `cross_entropy_ref`.
pub fn cross_entropy(logits: &[f32], labels: &[u32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    let mut probs = vec![0.0; logits.len()];
    let mut losses = vec![0.0; labels.len()];
    let rows_per_task = (CHUNK / cols).max(1);
    probs
        .par_chunks_mut(rows_per_task * cols)
        .zip(losses.par_chunks_mut(rows_per_task))
        .enumerate()
        .for_each(|(t, (probs, losses))| {
            widest(
                #[inline(always)]
                || {
                    for (i, (out, loss)) in probs.chunks_mut(cols).zip(losses).enumerate() {
                        let r = t * rows_per_task + i;
                        let row = &logits[r * cols..][..cols];
                        let (m, s) = softmax_row(row, out);
                        *loss = ln(s) + m - row[labels[r] as usize];
                    }
                },
            )
        });
    (losses, probs)
}

/// `dlogits = (probs - onehot(label)) * dloss` per row (a label past the row matches no
/// column, as in the reference): one row per step in parallel tasks, where the reference
/// divided every index.
pub fn cross_entropy_backward(
    probs: &[f32],
    labels: &[u32],
    dloss: &[f32],
    cols: usize,
) -> Vec<f32> {
    let mut dx = vec![0.0; probs.len()];
    if dx.is_empty() {
        return dx;
    }
    for_rows(
        &mut dx,
        cols,
        #[inline(always)]
        |r, out| {
            let (label, d) = (labels[r] as usize, dloss[r]);
            for (j, (o, &p)) in out.iter_mut().zip(&probs[r * cols..][..cols]).enumerate() {
                let onehot = if j == label { 1.0 } else { 0.0 };
                *o = (p - onehot) * d;
            }
        },
    );
    dx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::softmax::{cross_entropy_ref, softmax_row_ref};

    /// Scores over a wide range, with ties, a row of equal values and a -inf.
    fn scores(n: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 0.037)
            .collect();
        if n > 3 {
            x[3] = f32::NEG_INFINITY;
        }
        x
    }

    #[test]
    fn softmax_rows_are_the_references() {
        for (rows, cols) in [(1, 1), (3, 5), (7, 64), (5, 65), (700, 33), (64 * 9, 64)] {
            let x = scores(rows * cols);
            for causal in [false, true] {
                if causal && rows % cols != 0 {
                    continue;
                }
                let got = softmax(&x, cols, causal);
                let mut want = vec![0.0; x.len()];
                for r in 0..rows {
                    let len = if causal { r % cols + 1 } else { cols };
                    softmax_row_ref(&x[r * cols..][..len], &mut want[r * cols..][..len]);
                }
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "[{rows}, {cols}], causal {causal}");
            }
        }
    }

    /// Rows whose maximum sits in every lane of the vector and in the shorter last chunk, and
    /// rows of NaNs, infinities and zeros of both signs: `max_of` combines its lanes in a tree,
    /// the references fold the row in order.
    #[test]
    fn maxima_in_any_lane_and_at_the_edges_are_the_references() {
        let cols = 37;
        let mut rows: Vec<Vec<f32>> = (0..cols)
            .map(|p| {
                let mut row: Vec<f32> = (0..cols).map(|j| (j % 5) as f32 * -0.25).collect();
                row[p] = 2.5;
                row
            })
            .collect();
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let mut with_nans: Vec<f32> = (0..cols).map(|j| j as f32 * 0.1).collect();
        with_nans[36] = nan;
        with_nans[5] = nan;
        rows.push(with_nans);
        rows.push(vec![nan; cols]);
        rows.push(vec![-inf; cols]);
        rows.push(
            (0..cols)
                .map(|j| if j % 2 == 0 { 0.0 } else { -0.0 })
                .collect(),
        );
        rows.push((0..cols).map(|j| if j == 20 { inf } else { 1.0 }).collect());
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let x: Vec<f32> = rows.concat();
        let got = softmax(&x, cols, false);
        for (r, row) in rows.iter().enumerate() {
            let mut want = vec![0.0; cols];
            softmax_row_ref(row, &mut want);
            let got = &got[r * cols..][..cols];
            assert!(got.iter().zip(&want).all(|(&a, &b)| same(a, b)), "row {r}");
        }
        let labels: Vec<u32> = (0..rows.len()).map(|r| (r % cols) as u32).collect();
        let (losses, _) = cross_entropy(&x, &labels, cols);
        let (want, _) = cross_entropy_ref(&x, &labels, cols);
        for (r, (&a, &b)) in losses.iter().zip(&want).enumerate() {
            assert!(same(a, b), "loss of row {r}: {a} against {b}");
        }
    }

    #[test]
    fn the_gradient_and_the_loss_are_the_references() {
        for (rows, cols) in [(1, 1), (3, 5), (7, 64), (5, 65), (700, 33), (300, 256)] {
            let x = scores(rows * cols);
            let y = softmax(&x, cols, false);
            let dy: Vec<f32> = (0..x.len()).map(|i| (i % 13) as f32 - 6.1).collect();
            let got = softmax_backward(&y, &dy, cols);
            for r in 0..rows {
                let (yr, dr) = (&y[r * cols..][..cols], &dy[r * cols..][..cols]);
                let s = crate::kernels::math::workgroup_sum(
                    dr.iter().zip(yr).map(|(d, y)| d * y),
                    ROW_LANES,
                );
                for j in 0..cols {
                    let want = yr[j] * (dr[j] - s);
                    assert_eq!(got[r * cols + j].to_bits(), want.to_bits(), "row {r}");
                }
            }
            let labels: Vec<u32> = (0..rows).map(|r| ((r * 31) % cols) as u32).collect();
            let (losses, probs) = cross_entropy(&x, &labels, cols);
            let (want_losses, want_probs) = cross_entropy_ref(&x, &labels, cols);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&losses), bits(&want_losses), "[{rows}, {cols}] losses");
            assert_eq!(
                bits(&probs),
                bits(&want_probs),
                "[{rows}, {cols}] probabilities"
            );
            let dloss: Vec<f32> = (0..rows).map(|r| 0.3 - r as f32 * 0.01).collect();
            let dlogits = cross_entropy_backward(&probs, &labels, &dloss, cols);
            let want: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let (r, j) = (i / cols, i % cols);
                    let onehot = if labels[r] as usize == j { 1.0 } else { 0.0 };
                    (probs[i] - onehot) * dloss[r]
                })
                .collect();
            assert_eq!(bits(&dlogits), bits(&want), "[{rows}, {cols}] dlogits");
        }
    }
}
