//! Causal self-attention on the CPU path, in the arithmetic of the composition that
//! `kernels::attention` runs on the GPU (permute, matmul, causal softmax, matmul, permute).
//!
//! The composition moves every head of every batch entry through memory five times: a
//! permutation of q, k and v into `[batch, heads, time, width]`, a product of `time` x
//! `time` scores, their softmax, a second product and a permutation back. Here a task takes
//! a batch entry, reads q, k and v where they lie in `[batch, time, heads * width]`, and
//! head by head computes the scores, their softmax, the weights after dropout and their
//! product with the values while they are in cache ([`forward`]); the backward pass
//! ([`backward`]) likewise keeps a head's gradients of the weights and scores in scratch. One
//! pass each way, no permutation.
//!
//! Every value is computed as the composition computes it: a product's element is a sum
//! from 0 over ascending `k` with a separately rounded multiply and add per term (as
//! `cpu::gemm` and its reference do), the softmax rows are `cpu::rows`' arithmetic run 16
//! rows side by side, one to a vector lane, and their gradient is `cpu::rows`' own. Dropout
//! on the weights is the dropout kernel's arithmetic on each head's stretch of them
//! (`kernels::dropout::apply_at`), drawn at the indices the whole tensor would draw; the
//! weights are kept before dropout, as the composition keeps them.
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

use std::mem::MaybeUninit;

use super::elementwise::{finite, largest_bits};
use super::output::{
    assume_written, unwritten_par_chunks_with, zeroed_and_unwritten_par_chunk_pairs,
    zeroed_par_chunk_triples,
};
use super::rows::softmax_backward_rows;
use super::strided_product::{banded_product, product, Band, Strided};
use super::vector_unit::widest;
use crate::kernels::dropout::{apply_at, DropoutMask};
use crate::kernels::math::{exp_block, EXP_BLOCK, ROW_LANES};

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

/// Head `h` of a batch entry `[time, heads * width]`, transposed into `[width, time]` whose
/// rows lie `out_stride` apart.
fn transpose_head(entry: &[f32], h: usize, sh: HeadShape, out: &mut [f32], out_stride: usize) {
    let (d, c) = (sh.width, sh.features());
    for (j, row) in entry.chunks_exact(c).enumerate() {
        for (p, &value) in row[h * d..][..d].iter().enumerate() {
            out[p * out_stride + j] = value;
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

/// Queries whose softmax rows run side by side, one to a vector lane (`weights`).
const QUERY_LANES: usize = 16;

/// Keys whose exps `softmax_in_lanes` takes a block at a time.
const KEYS_PER_BLOCK: usize = EXP_BLOCK / QUERY_LANES;

/// The attention weights `[batch, heads, time, time]` alone, a head per task: [`forward`]'s
/// weights where it has no output to pair them with (heads of no width).
fn weights(q: &[f32], k: &[f32], sh: HeadShape) -> Vec<f32> {
    // SAFETY: each chunk is a head's weights, and `head_weights` writes every one.
    unsafe {
        unwritten_par_chunks_with(
            sh.weights_numel(),
            sh.square(),
            || WeightsScratch::new(sh),
            |scratch, zh, weights_h| {
                let (z, h) = (zh / sh.heads, zh % sh.heads);
                widest(
                    #[inline(always)]
                    || {
                        head_weights(
                            (entry_of(q, z, sh), entry_of(k, z, sh)),
                            h,
                            sh,
                            scratch,
                            weights_h,
                        );
                    },
                )
            },
        )
    }
}

/// Batch entry `z` of q, k, v or the output, `[time, heads * width]`.
#[inline(always)]
fn entry_of(x: &[f32], z: usize, sh: HeadShape) -> &[f32] {
    &x[z * sh.entry()..][..sh.entry()]
}

/// Room for one head's weights: its queries transposed and its scores key by query, the
/// queries padded to whole vectors (the padding's scores stay 0 and are never read out).
struct WeightsScratch {
    q_t: Vec<f32>,
    scores_t: Vec<f32>,
    stride: usize,
    /// The head's weights after dropout.
    dropped: DropoutRoom,
}

/// Room for a head's weights (or their gradient) after dropout, and for the mask's words.
#[derive(Default)]
struct DropoutRoom {
    values: Vec<f32>,
    words: Vec<u32>,
}

impl WeightsScratch {
    fn new(sh: HeadShape) -> Self {
        let stride = sh.time.next_multiple_of(QUERY_LANES);
        WeightsScratch {
            q_t: vec![0.0; sh.width * stride],
            scores_t: vec![0.0; sh.time * stride],
            stride,
            dropped: DropoutRoom::default(),
        }
    }
}

/// Dropout on the attention weights: the mask, and the global index of the weights' first
/// element (`DropoutMask::offset`), so that a head's stretch of them draws the words the
/// whole tensor would.
pub type WeightsDropout<'a> = Option<(&'a DropoutMask, u32)>;

/// Head `h` of entry `z`'s weights `weights_h` as the product with the values sees them:
/// themselves, or after `dropout` (into `room`).
#[inline(always)]
fn dropped<'w>(
    weights_h: &'w [f32],
    dropout: WeightsDropout,
    (z, h): (usize, usize),
    sh: HeadShape,
    room: &'w mut DropoutRoom,
) -> &'w [f32] {
    match dropout {
        None => weights_h,
        Some((mask, first)) => {
            let at = ((z * sh.heads + h) * sh.square()) as u32;
            room.values.resize(weights_h.len(), 0.0);
            apply_at(
                mask,
                first + at,
                weights_h,
                &mut room.values,
                &mut room.words,
            );
            &room.values
        }
    }
}

/// Head `h`'s weights `[time, time]` written into `weights_h`, every one, from a batch
/// entry's queries and keys: the causal softmax of `q kᵀ` (row `i` over keys `0..=i`, the
/// rest 0). Returns them.
///
/// The scores are computed transposed, key by query (`k qᵀ`: each score is the same sum in
/// the same order), so that 16 queries' scores for one key lie side by side and their softmax
/// rows run one to a lane (`softmax_in_lanes`). A row at a time, each row's max, exps, sum and
/// normalisation were one chain of dependent steps whose reductions ran across a vector's
/// lanes, and the GPT's short rows (16 to 64 keys) left the core waiting on them: the weights
/// took 0.35 ms of a layer's 0.68 ms of attention (probe, Zen 5).
#[inline(always)]
fn head_weights<'w>(
    (q_z, k_z): (&[f32], &[f32]),
    h: usize,
    sh: HeadShape,
    scratch: &mut WeightsScratch,
    weights_h: &'w mut [MaybeUninit<f32>],
) -> &'w mut [f32] {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    assert_eq!(weights_h.len(), sh.square(), "a head's weights");
    let WeightsScratch {
        q_t,
        scores_t,
        stride,
        ..
    } = scratch;
    let stride = *stride;
    if d == 0 {
        // Heads of no width: every score a sum of no terms, +0 (the softmax below left the
        // last head's exps here).
        scores_t.fill(0.0);
    } else {
        transpose_head(q_z, h, sh, q_t, stride);
        // Key `j`'s scores for the queries from its own block of lanes on (the earlier
        // queries never see it); a block of score rows never straddles two blocks of lanes,
        // as `SCORE_ROWS` divides `QUERY_LANES`.
        for j0 in (0..t).step_by(SCORE_ROWS) {
            let rows = SCORE_ROWS.min(t - j0);
            let first = j0 - j0 % QUERY_LANES;
            let k_rows = Strided::rows(k_z, j0 * c + h * d, c);
            let out = &mut scores_t[j0 * stride + first..];
            product(
                rows,
                t - first,
                d,
                k_rows,
                &q_t[first..],
                stride,
                out,
                stride,
            );
        }
    }
    for i0 in (0..t).step_by(QUERY_LANES) {
        softmax_in_lanes(scores_t, stride, i0, t, weights_h);
    }
    // SAFETY: the blocks of 16 rows from 0 cover the `time` rows, and `softmax_in_lanes`
    // wrote every key of each row.
    unsafe { assume_written(weights_h) }
}

/// The causal softmax rows of queries `i0..i0 + 16` (those below `time`) from their scores
/// in `scores_t` (key `j`'s at `j * stride + i0`, one query to a lane), written into the
/// head's weights `[time, time]`; the exps are left in `scores_t`.
///
/// Each lane computes what `softmax_row` computes for its row, in the same order: the row
/// over `causal_span` keys, those past the query's own set to -inf; the max over them; the
/// exps; their sum in `ROW_LANES` partial sums (key `j` into partial `j % ROW_LANES`, in
/// ascending `j`, from +0) combined as `combine_as_tree` combines them; each exp times the
/// sum's reciprocal. Partial sums that no key reaches stay +0, as `softmax_row`'s padding
/// leaves them, and keys past a row's own are written as 0, as the row kernel leaves them.
#[inline(always)]
fn softmax_in_lanes(
    scores_t: &mut [f32],
    stride: usize,
    i0: usize,
    time: usize,
    out: &mut [MaybeUninit<f32>],
) {
    const L: usize = QUERY_LANES;
    // Every query of the block has the same span: `i0` is a multiple of 16.
    let span = causal_span(i0 + 1, time);
    let key = |j: usize| j * stride + i0;
    let mut max = [f32::NEG_INFINITY; L];
    for j in 0..span {
        let s: &mut [f32; L] = (&mut scores_t[key(j)..][..L]).try_into().unwrap();
        // Selects, not branches, so that the 16 lanes run as one vector: `f32::max` and a
        // conditional store compiled to a scalar loop. No lane's max is NaN (it starts at
        // -inf and a comparison with NaN keeps it), so the comparison is `f32::max`, but for
        // which zero wins between -0.0 and +0.0, and `exp(x - ±0)` is the same for both.
        let values = *s;
        for (r, ((x, m), value)) in s.iter_mut().zip(&mut max).zip(values).enumerate() {
            let masked = if j > i0 + r { f32::NEG_INFINITY } else { value };
            *x = masked;
            *m = if masked > *m { masked } else { *m };
        }
    }
    // The exps a stage at a time over `KEYS_PER_BLOCK` keys' lanes (`exp_block`), then
    // into the partial sums in ascending `j`.
    let mut partial = [0.0f32; L * ROW_LANES];
    for j0 in (0..span).step_by(KEYS_PER_BLOCK) {
        let keys = KEYS_PER_BLOCK.min(span - j0);
        let mut block = [0.0f32; EXP_BLOCK];
        for (j, shifted) in (j0..j0 + keys).zip(block.chunks_exact_mut(L)) {
            for ((e, &x), m) in shifted.iter_mut().zip(&scores_t[key(j)..][..L]).zip(&max) {
                *e = x - m;
            }
        }
        exp_block(&mut block);
        for (j, exps) in (j0..j0 + keys).zip(block.chunks_exact(L)) {
            let p = &mut partial[j % ROW_LANES * L..][..L];
            let s = &mut scores_t[key(j)..][..L];
            for ((x, p), &e) in s.iter_mut().zip(p).zip(exps) {
                *x = e;
                *p += e;
            }
        }
    }
    // Widths as constants, over one flat array: a loop over the widths, or arrays of lanes,
    // compiled into gathers and scatters, a third of the time.
    fold_half::<32>(&mut partial);
    fold_half::<16>(&mut partial);
    fold_half::<8>(&mut partial);
    fold_half::<4>(&mut partial);
    fold_half::<2>(&mut partial);
    fold_half::<1>(&mut partial);
    let inv: [f32; L] = std::array::from_fn(|r| 1.0 / partial[r]);
    weight_rows((scores_t, stride), i0, span, time, &inv, out);
}

/// Rows `i0..` (at most 16, below `time`) of a head's weights `out` (`[time, time]`), every
/// key of them: row `i0 + r` over keys `0..=i0 + r`, key `j`'s exp (at `j * stride + i0 + r`
/// in `scores_t`, of which the first `span` keys hold this block's) times `inv[r]`; +0 for the
/// keys past a row's own.
///
/// On AVX-512 a block of 16 keys at a time: each key's 16 products in one vector, turned into
/// 16 rows' runs of keys in registers (`vector_unit::transpose_16`). Element by element the
/// reads ran down a key's column of `scores_t` a row apart, and a GPT layer's attention
/// forward spent 40 µs of its 250 here (a throwaway probe on the 2-core Zen 5 EPYC, best of
/// 40 calls, hot caches): 250 -> 222-227 µs. The products are the same. Every key is written,
/// the masked ones as +0, so that the weights need no zero-fill before (a `memset` of 2 MiB
/// a layer for the GPT, 0.7% of a step's samples on the step's thread, `perf record`).
#[inline(always)]
fn weight_rows(
    (scores_t, stride): (&[f32], usize),
    i0: usize,
    span: usize,
    time: usize,
    inv: &[f32; QUERY_LANES],
    out: &mut [MaybeUninit<f32>],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: this CPU has AVX-512F.
        unsafe { x86::weight_rows((scores_t, stride), i0, span, time, inv, out) };
        return;
    }
    for (r, &inv) in inv.iter().enumerate().take(time - i0) {
        let i = i0 + r;
        for (j, w) in out[i * time..][..time].iter_mut().enumerate() {
            w.write(if j <= i {
                scores_t[j * stride + i0 + r] * inv
            } else {
                0.0
            });
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use super::QUERY_LANES;
    use crate::cpu::vector_unit::{first_lanes, transpose_16};

    /// [`super::weight_rows`] on AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weight_rows(
        (scores_t, stride): (&[f32], usize),
        i0: usize,
        span: usize,
        time: usize,
        inv: &[f32; QUERY_LANES],
        out: &mut [MaybeUninit<f32>],
    ) {
        const { assert!(QUERY_LANES == 16) };
        let rows = QUERY_LANES.min(time - i0);
        // Every key read (below `span`) has its 16 lanes inside `scores_t`, and every row
        // written is inside `out`.
        assert!(i0 < span && span <= time && stride >= i0 + QUERY_LANES);
        assert!(scores_t.len() >= (span - 1) * stride + i0 + QUERY_LANES);
        assert!(out.len() >= (i0 + rows) * time);
        // SAFETY: 16 floats.
        let inv = unsafe { _mm512_loadu_ps(inv.as_ptr()) };
        // Blocks of keys up to the rows' own block, `i0` (a multiple of 16).
        for j0 in (0..=i0).step_by(QUERY_LANES) {
            let products: [__m512; QUERY_LANES] = std::array::from_fn(|jj| {
                let j = j0 + jj;
                if j < span {
                    // SAFETY: j < span, asserted inside `scores_t` with its 16 lanes.
                    let exps = unsafe { _mm512_loadu_ps(scores_t.as_ptr().add(j * stride + i0)) };
                    _mm512_mul_ps(exps, inv)
                } else {
                    // Keys past the span: past every row's own, never written.
                    _mm512_setzero_ps()
                }
            });
            // SAFETY: this CPU has AVX-512F.
            let rows_of_keys = unsafe { transpose_16(products) };
            for (r, &row) in rows_of_keys.iter().enumerate().take(rows) {
                let at = out[(i0 + r) * time + j0..].as_mut_ptr().cast::<f32>();
                // SAFETY: the keys j0.. below `time` of row i0 + r, inside `out` (asserted);
                // lanes past them are masked off.
                unsafe {
                    if j0 < i0 {
                        // Below the rows' own block every key is at most the row's.
                        _mm512_storeu_ps(at, row);
                    } else {
                        // In it, keys i0 up to the row's own, then +0.
                        let own = _mm512_maskz_mov_ps(first_lanes(r + 1), row);
                        _mm512_mask_storeu_ps(at, first_lanes(time - j0), own);
                    }
                }
            }
        }
        // The keys past the rows' own block, +0.
        for r in 0..rows {
            for j in (i0 + QUERY_LANES..time).step_by(QUERY_LANES) {
                let at = out[(i0 + r) * time + j..].as_mut_ptr().cast::<f32>();
                // SAFETY: keys j.. below `time` of row i0 + r, inside `out`; lanes past them
                // masked off.
                unsafe { _mm512_mask_storeu_ps(at, first_lanes(time - j), _mm512_setzero_ps()) };
            }
        }
    }
}

/// One level of `combine_as_tree` over `ROW_LANES` partial sums of 16 lanes each, laid end
/// to end: partial `l` plus partial `l + W`, for `l` below `W`.
#[inline(always)]
fn fold_half<const W: usize>(partial: &mut [f32; QUERY_LANES * ROW_LANES]) {
    let (low, high) = partial.split_at_mut(W * QUERY_LANES);
    for (a, &b) in low.iter_mut().zip(&high[..W * QUERY_LANES]) {
        *a += b;
    }
}

/// The band of a batch entry's products with its values: row `i` over keys `0..=i` (the
/// masked weights after them are +0) where the values are finite, every term otherwise.
#[inline(always)]
fn values_band(v_z: &[f32]) -> Band {
    causal_band(finite(v_z), Band::StepsThroughRow)
}

/// Head `h`'s output, its weights `weights_h` (`[time, time]`) times its values, into its
/// batch entry's `y_z`.
#[inline(always)]
fn head_values(
    weights_h: &[f32],
    v_z: &[f32],
    h: usize,
    sh: HeadShape,
    band: Band,
    y_z: &mut [f32],
) {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    let w_h = Strided::rows(weights_h, 0, t);
    banded_product(band, t, d, t, w_h, &v_z[h * d..], c, &mut y_z[h * d..], c);
}

/// The output `[batch, time, heads * width]` (each head's weights, after `dropout`, times its
/// values) and the weights `[batch, heads, time, time]` before dropout, a batch entry per
/// task: each head's weights are multiplied by its values as soon as they are written, while
/// they are in the core's cache. Run as two passes, the second read the weights (2 MiB a
/// layer for the GPT) back from beyond it: a GPT step's attention forward took 1.37 ms, 1.29
/// in one pass (a throwaway per-op timer, Zen 5).
pub fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sh: HeadShape,
    dropout: WeightsDropout,
) -> (Vec<f32>, Vec<f32>) {
    if sh.numel() == 0 {
        // No output, but weights where heads of no width still have positions.
        return (vec![], weights(q, k, sh));
    }
    // SAFETY: each task's `head_weights` writes every weight of its entry's heads.
    let (y, weights) = unsafe {
        zeroed_and_unwritten_par_chunk_pairs(
            (sh.numel(), sh.entry()),
            (sh.weights_numel(), sh.heads * sh.square()),
            || WeightsScratch::new(sh),
            |scratch, z, y_z, weights_z| {
                let (q_z, k_z, v_z) = (entry_of(q, z, sh), entry_of(k, z, sh), entry_of(v, z, sh));
                widest(
                    #[inline(always)]
                    || {
                        let band = values_band(v_z);
                        for (h, weights_h) in weights_z.chunks_exact_mut(sh.square()).enumerate() {
                            let weights_h = head_weights((q_z, k_z), h, sh, scratch, weights_h);
                            let w_h = dropped(weights_h, dropout, (z, h), sh, &mut scratch.dropped);
                            head_values(w_h, v_z, h, sh, band, y_z);
                        }
                    },
                )
            },
        )
    };
    (y, weights)
}

/// The gradients `[dq, dk, dv]` of [`forward`] from the output's gradient `dy`, given the
/// weights before dropout (`dq` times `dq_times` where there is one, each entry's while it
/// is in cache): a batch entry per task, head by head, the weights' gradient
/// (`dy vᵀ`, then through `dropout`'s mask as dropout's gradient is) and the scores' (the
/// softmax's gradient) in `[time, time]` scratch, 16 KiB each at the GPT's 64 positions. Run
/// as two passes, the weights' gradient was a `[batch, heads, time, time]` tensor (2 MiB a
/// layer for the GPT) written by the first and read back by the second from beyond the core's
/// cache: a GPT step's attention backward took 1.88 ms, 1.58 in one pass (a throwaway per-op
/// timer, Zen 5); on hot caches the two are alike (probe: 0.27 and 0.26 ms a layer).
pub fn backward(
    weights: &[f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    dy: &[f32],
    sh: HeadShape,
    dropout: WeightsDropout,
    dq_times: Option<f32>,
) -> [Vec<f32>; 3] {
    let (t, d) = (sh.time, sh.width);
    if sh.numel() == 0 {
        return [vec![], vec![], vec![]];
    }
    zeroed_par_chunk_triples(
        (sh.numel(), sh.entry()),
        || {
            let square = || vec![0.0f32; t * t];
            (
                vec![0.0f32; d * t],
                square(),
                square(),
                DropoutRoom::default(),
            )
        },
        |(v_t, d_weights, d_scores, room), z, [dq_z, dk_z, dv_z]| {
            let (q_z, k_z) = (entry_of(q, z, sh), entry_of(k, z, sh));
            let (v_z, dy_z) = (entry_of(v, z, sh), entry_of(dy, z, sh));
            widest(
                #[inline(always)]
                || {
                    let bands = value_bands(dy_z, v_z, d);
                    let finite_entry = finite(q_z) && finite(k_z);
                    for h in 0..sh.heads {
                        let w_h = &weights[(z * sh.heads + h) * t * t..][..t * t];
                        // The weights' gradient and the values'; its masked part is 0, as a
                        // zero-filled tensor would leave it.
                        if bands.0 != Band::Full {
                            d_weights.fill(0.0);
                        }
                        let seen = dropped(w_h, dropout, (z, h), sh, room);
                        value_products((seen, v_z, dy_z), h, sh, bands, v_t, d_weights, dv_z);
                        // The scores' gradient, from the weights' before dropout.
                        let d_w_h = dropped(d_weights, dropout, (z, h), sh, room);
                        softmax_backward_rows(w_h, d_w_h, t, d_scores);
                        scores_products(d_scores, finite_entry, (q_z, k_z), h, sh, (dq_z, dk_z));
                    }
                    if let Some(alpha) = dq_times {
                        dq_z.iter_mut().for_each(|d| *d *= alpha);
                    }
                },
            )
        },
    )
}

/// The bands of a batch entry's weights' and values' gradients (`value_products`): the
/// weights' gradient only where they are not masked (the rest stay 0), and the values'
/// gradient `dv_j` from query `j` on (the terms before it have masked weights), where the
/// entry's gradient and values are tame; every term otherwise.
#[inline(always)]
fn value_bands(dy_z: &[f32], v_z: &[f32], width: usize) -> (Band, Band) {
    let causal = tame(dy_z, v_z, width);
    (
        causal_band(causal, Band::ColumnsThroughRow),
        causal_band(causal, Band::StepsFromRow),
    )
}

/// Head `h`'s share of the first half of the backward pass, given its weights `w_h` as the
/// product saw them (`[time, time]`): its weights' gradient `dy vᵀ` into `dw_h` and its
/// values' gradient `w_hᵀ dy` into the entry's `dv_z`, in the `bands` of [`value_bands`];
/// `v_t` is room for the head's values transposed.
#[inline(always)]
fn value_products(
    (w_h, v_z, dy_z): (&[f32], &[f32], &[f32]),
    h: usize,
    sh: HeadShape,
    (weights_band, values_band): (Band, Band),
    v_t: &mut [f32],
    dw_h: &mut [f32],
    dv_z: &mut [f32],
) {
    let (t, d, c) = (sh.time, sh.width, sh.features());
    transpose_head(v_z, h, sh, v_t, t);
    let dy_h = Strided::rows(dy_z, h * d, c);
    banded_product(weights_band, t, t, d, dy_h, v_t, t, dw_h, t);
    let w_t = Strided::columns(w_h, 0, t);
    let (dy_h, dv_h) = (&dy_z[h * d..], &mut dv_z[h * d..]);
    banded_product(values_band, t, d, t, w_t, dy_h, c, dv_h, c);
}

/// Head `h`'s share of the queries' and keys' gradients from its score gradients `d_scores`
/// (`[time, time]`): `dq_i` over keys `0..=i`, `dk_j` from query `j` on, the other score
/// gradients being masked, where they and the entry's queries and keys are finite
/// (`finite_entry`); every term otherwise.
#[inline(always)]
fn scores_products(
    d_scores: &[f32],
    finite_entry: bool,
    (q_z, k_z): (&[f32], &[f32]),
    h: usize,
    sh: HeadShape,
    (dq_z, dk_z): (&mut [f32], &mut [f32]),
) {
    let (t, d, c) = (sh.time, sh.width, sh.features());
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
