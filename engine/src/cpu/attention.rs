//! Causal self-attention on the CPU path, in the arithmetic of the composition that
//! `kernels::attention` runs on the GPU (permute, matmul, causal softmax, matmul, permute).
//!
//! The composition moves every head of every batch entry through memory five times: a
//! permutation of q, k and v into `[batch, heads, time, width]`, a product of `time` x
//! `time` scores, their softmax, a second product and a permutation back. Here a task takes
//! a head (for the weights) or a batch entry (for the rest), reads q, k and v where they lie
//! in `[batch, time, heads * width]`, keeps a head's scores in cache from product to
//! softmax, and writes its output rows in place: two passes, no permutation.
//!
//! Every value is computed as the composition computes it: a product's element is a sum
//! from 0 over ascending `k` with a separately rounded multiply and add per term (as
//! `cpu::gemm` and its reference do), and the softmax rows and their gradient are
//! `cpu::rows`' own. The probabilities are kept between the passes (the composition keeps
//! them too), so dropout on them is the ordinary dropout kernel in between.
//!
//! Terms under the causal mask are left out where they cannot change a bit: about half of
//! every product but the scores' (throwaway probe on the GPT's shape, one layer: 2.45 ->
//! 2.07 ms forward and backward). A masked weight is +0, and a masked score's gradient is
//! `0 * (dw - s)`, so their terms are ±0 wherever the other factor is finite; every sum here
//! starts from +0, and adding ±0 to it changes nothing (a sum from +0 is never -0: `+0 + -0`
//! is +0, and an exact cancellation rounds to +0). The masked weights' gradients `dy vᵀ` are
//! left uncomputed (0) too: they reach the results only through the softmax's row sum as ±0
//! terms, which changes that sum at most in the sign of a zero, and that difference then only
//! meets sums from +0 as well. The composition differs where a masked term would be NaN or
//! infinite: a non-finite value or an overflow in a batch entry, which `finite` and `tame`
//! look for first; such an entry takes every term, as the composition does (test).

use super::output::{zeroed_par_chunk_pairs, zeroed_par_chunks, zeroed_par_chunks_with};
use super::rows::{softmax_backward_row, softmax_row};
use super::strided_product::{banded_product, product, Band, Strided};
use super::vector_unit::widest;

/// The shape of one attention call: `batch` entries of `time` positions, `heads` heads of
/// `width` features each, side by side in the feature axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    /// Batch entries.
    pub batch: usize,
    /// Positions per entry; query `i` attends to keys `0..=i`.
    pub time: usize,
    /// Heads, side by side in the feature axis.
    pub heads: usize,
    /// Features per head.
    pub width: usize,
}

impl HeadShape {
    /// Features per position: the heads side by side.
    pub fn features(&self) -> usize {
        self.heads * self.width
    }

    /// Floats per batch entry of q, k, v and the output, `[time, heads * width]`.
    fn entry(&self) -> usize {
        self.time * self.features()
    }

    /// Floats per head of the attention weights, `[time, time]`.
    fn square(&self) -> usize {
        self.time * self.time
    }

    /// Floats of q, k, v and the output: `[batch, time, heads * width]`.
    pub fn numel(&self) -> usize {
        self.batch * self.entry()
    }

    /// Floats of the attention weights: `[batch, heads, time, time]`.
    pub fn weights_numel(&self) -> usize {
        self.batch * self.heads * self.square()
    }
}

/// Head `h` of a batch entry `[time, heads * width]`, transposed into `[width, time]`.
fn transpose_head(entry: &[f32], h: usize, sh: HeadShape, out: &mut [f32]) {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    for (j, row) in entry.chunks_exact(c).enumerate() {
        for (p, &value) in row[h * d..][..d].iter().enumerate() {
            out[p * t + j] = value;
        }
    }
}

/// Rows of scores computed together, the block of `strided_product`.
const SCORE_ROWS: usize = 8;

/// The first `len` keys rounded up to whole 16-lane vectors, at most `time`: a short row's
/// loops then run whole vectors, where the compiler's epilogue for the last few lanes (exp
/// 4 lanes and 1 lane at a time) cost causal rows of every length more than their vectors.
fn causal_span(len: usize, time: usize) -> usize {
    len.next_multiple_of(16).min(time)
}

/// The largest magnitude in `values` as f32 bits without the sign: below `f32::INFINITY`'s
/// bits when every value is finite, and then the largest finite magnitude's. An integer
/// maximum, so that the loop runs whole vectors (a loop that stops at the first non-finite
/// value runs one value a step).
#[inline(always)]
fn largest_bits(values: &[f32]) -> u32 {
    values
        .iter()
        .fold(0, |m, x| m.max(x.to_bits() & 0x7fff_ffff))
}

/// Every value finite: a masked term `±0 * x` is then ±0.
#[inline(always)]
fn finite(values: &[f32]) -> bool {
    largest_bits(values) < f32::INFINITY.to_bits()
}

/// For the backward pass through a batch entry's values: `dy` and `v` finite, and every
/// masked weight's gradient `dy_i · v_j` (`width` terms of at most `|dy| |v|` each) at most
/// 2^100, so that even after dropout's scale (at most 2^24) and in the softmax's row sum it
/// stays finite, as it is in the composition, where the uncomputed 0 stands for it.
#[inline(always)]
fn tame(dy: &[f32], v: &[f32], width: usize) -> bool {
    let (dy, v) = (largest_bits(dy), largest_bits(v));
    let finite = dy.max(v) < f32::INFINITY.to_bits();
    let largest = |bits: u32| f32::from_bits(bits) as f64;
    finite && width as f64 * largest(dy) * largest(v) <= 2f64.powi(100)
}

/// `band` where the masked terms vanish, else every term.
#[inline(always)]
fn causal_band(vanish: bool, band: Band) -> Band {
    if vanish {
        band
    } else {
        Band::Full
    }
}

/// The attention weights `[batch, heads, time, time]`: for each head, the causal softmax of
/// `q kᵀ` (row `i` over keys `0..=i`, the rest 0).
pub fn weights(q: &[f32], k: &[f32], sh: HeadShape) -> Vec<f32> {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    zeroed_par_chunks_with(
        sh.weights_numel(),
        sh.square(),
        || (vec![0.0f32; d * t], vec![0.0f32; t * t]),
        |(k_t, scores), zh, weights_h| {
            let (z, h) = (zh / sh.heads, zh % sh.heads);
            let (q_z, k_z) = (&q[z * sh.entry()..][..sh.entry()], &k[z * sh.entry()..]);
            widest(
                #[inline(always)]
                || {
                    transpose_head(&k_z[..sh.entry()], h, sh, k_t);
                    // The scores each block of rows reads: up to its last row's key, in
                    // whole vectors (the rest, never read, are left uncomputed).
                    for r0 in (0..t).step_by(SCORE_ROWS) {
                        let rows = SCORE_ROWS.min(t - r0);
                        let keys = causal_span(r0 + rows, t);
                        let q_rows = Strided::rows(q_z, r0 * c + h * d, c);
                        product(rows, keys, d, q_rows, k_t, t, &mut scores[r0 * t..], t);
                    }
                    for i in 0..t {
                        // Row `i` over keys `0..=i`, run over whole vectors: the keys past
                        // `i` score -inf, so their exp is +0, which changes neither the max
                        // nor any lane's sum (see `kernels::math::workgroup_sum_of`); their
                        // weights are set to 0 after, as the composition leaves them.
                        let (len, span) = (i + 1, causal_span(i + 1, t));
                        let row = &mut scores[i * t..][..span];
                        row[len..].fill(f32::NEG_INFINITY);
                        let out = &mut weights_h[i * t..][..span];
                        softmax_row(row, out);
                        out[len..].fill(0.0);
                    }
                },
            )
        },
    )
}

/// The output `[batch, time, heads * width]`: each head's weights times its values.
pub fn weighted_values(weights: &[f32], v: &[f32], sh: HeadShape) -> Vec<f32> {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    zeroed_par_chunks(sh.numel(), sh.entry(), |z, y_z| {
        let v_z = &v[z * sh.entry()..][..sh.entry()];
        widest(
            #[inline(always)]
            || {
                // Row `i` over keys `0..=i` (the masked weights after them are +0).
                let band = causal_band(finite(v_z), Band::StepsThroughRow);
                for h in 0..sh.heads {
                    let w_h = Strided::rows(weights, (z * sh.heads + h) * t * t, t);
                    let y_h = &mut y_z[h * d..];
                    banded_product(band, t, d, t, w_h, &v_z[h * d..], c, y_h, c);
                }
            },
        )
    })
}

/// The first half of the backward pass, through the weights-times-values product: the
/// gradient of the weights `[batch, heads, time, time]` (`dy vᵀ` per head) and of the values
/// (`weightsᵀ dy` per head, in place in `[batch, time, heads * width]`).
pub fn weighted_values_backward(
    weights: &[f32],
    v: &[f32],
    dy: &[f32],
    sh: HeadShape,
) -> (Vec<f32>, Vec<f32>) {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    if sh.numel() == 0 {
        return (vec![0.0f32; sh.weights_numel()], vec![]);
    }
    // A batch entry's chunk of each per task; a head's values transposed in the scratch.
    zeroed_par_chunk_pairs(
        (sh.weights_numel(), sh.heads * sh.square()),
        (sh.numel(), sh.entry()),
        || vec![0.0f32; d * t],
        |v_t, z, d_weights_z, dv_z| {
            let (v_z, dy_z) = (&v[z * sh.entry()..][..sh.entry()], &dy[z * sh.entry()..]);
            let dy_z = &dy_z[..sh.entry()];
            widest(
                #[inline(always)]
                || {
                    // The weights' gradient only where they are not masked (the rest stay
                    // 0), and the values' gradient `dv_j` from query `j` on (the terms
                    // before it have masked weights).
                    let causal = tame(dy_z, v_z, d);
                    let (weights_band, values_band) = (
                        causal_band(causal, Band::ColumnsThroughRow),
                        causal_band(causal, Band::StepsFromRow),
                    );
                    for (h, dw_h) in d_weights_z.chunks_exact_mut(t * t).enumerate() {
                        transpose_head(v_z, h, sh, v_t);
                        let dy_h = Strided::rows(dy_z, h * d, c);
                        banded_product(weights_band, t, t, d, dy_h, v_t, t, dw_h, t);
                        let w_t = Strided::columns(weights, (z * sh.heads + h) * t * t, t);
                        let (dy_h, dv_h) = (&dy_z[h * d..], &mut dv_z[h * d..]);
                        banded_product(values_band, t, d, t, w_t, dy_h, c, dv_h, c);
                    }
                },
            )
        },
    )
}

/// The second half of the backward pass, from the gradient of the weights `d_weights`: the
/// softmax's gradient per row (over whole rows, as the softmax backward kernel runs), then
/// the gradients of the queries (`dscores k`) and keys (`dscoresᵀ q`) in place.
pub fn scores_backward(
    weights: &[f32],
    d_weights: &[f32],
    q: &[f32],
    k: &[f32],
    sh: HeadShape,
) -> (Vec<f32>, Vec<f32>) {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    if sh.numel() == 0 {
        return (vec![], vec![]);
    }
    // A batch entry's chunk of each per task; a head's score gradients in the scratch.
    zeroed_par_chunk_pairs(
        (sh.numel(), sh.entry()),
        (sh.numel(), sh.entry()),
        || vec![0.0f32; t * t],
        |d_scores, z, dq_z, dk_z| {
            let (q_z, k_z) = (&q[z * sh.entry()..][..sh.entry()], &k[z * sh.entry()..]);
            let k_z = &k_z[..sh.entry()];
            widest(
                #[inline(always)]
                || {
                    let finite_entry = finite(q_z) && finite(k_z);
                    for h in 0..sh.heads {
                        let at = (z * sh.heads + h) * t * t;
                        let (w_h, dw_h) = (&weights[at..][..t * t], &d_weights[at..][..t * t]);
                        for ((w, dw), ds) in w_h
                            .chunks_exact(t)
                            .zip(dw_h.chunks_exact(t))
                            .zip(d_scores.chunks_exact_mut(t))
                        {
                            softmax_backward_row(w, dw, ds);
                        }
                        // `dq_i` over keys `0..=i`, `dk_j` from query `j` on: the other
                        // score gradients are masked.
                        let causal = finite_entry && finite(d_scores);
                        let ds = Strided::rows(d_scores, 0, t);
                        let (k_h, dq_h) = (&k_z[h * d..], &mut dq_z[h * d..]);
                        let band = causal_band(causal, Band::StepsThroughRow);
                        banded_product(band, t, d, t, ds, k_h, c, dq_h, c);
                        let ds_t = Strided::columns(d_scores, 0, t);
                        let (q_h, dk_h) = (&q_z[h * d..], &mut dk_z[h * d..]);
                        let band = causal_band(causal, Band::StepsFromRow);
                        banded_product(band, t, d, t, ds_t, q_h, c, dk_h, c);
                    }
                },
            )
        },
    )
}
