//! Tall products, `op(A)ᵀ B` with few rows and columns over a long `k`, as weight gradients
//! are: both operands read in place on AVX-512, each element's sum taken a span of `k` at a
//! time and carried in C between spans ([`tall`]), or, for a convolution's weight gradient,
//! A's rows gathered from its padded input where they lie ([`tall_gathered`]). The bits are
//! [`matmul`](super::matmul)'s.

#[cfg(target_arch = "x86_64")]
use std::mem::MaybeUninit;

use super::{Isa, PARALLEL_MIN_TERMS};
#[cfg(target_arch = "x86_64")]
use crate::cpu::chunks::for_each_chunk;
#[cfg(target_arch = "x86_64")]
use crate::cpu::output::zeroed;
use crate::kernels::matmul_dims::MatmulDims;

/// Whether `d` is a tall product: `op(A)^T`'s few rows times B's few columns over a long
/// `k`, both stored with `k` outermost, as a weight gradient is (a convolution's: im2col's
/// columns transposed times the output gradient, [9, 100352] x [100352, 16] for the first
/// layer of the CNN; a transformer's projections': [64, 2048] x [2048, 64]). Packed, its
/// panels cost more than its arithmetic: B padded from 16 to 32 columns and A to 12 rows,
/// 17 MB written and read again for 29 MFLOP, on one thread. `tall` reads the operands
/// where they are.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn is_tall(d: &MatmulDims) -> bool {
    d.batch == 1 && d.trans_a && !d.trans_b && d.n <= TALL_MAX_COLUMNS && d.k >= 256
}

/// The most columns a tall product has: the GPT's widest weight gradient, its MLP's [64,
/// 256]. Its projections' [64, 64] ran at 59-68 GFLOPS packed and 85-99 in place, the MLP's
/// at 66-71 and 74-90 (three alternating rounds, docs/benchmarks.md); a B row of 256 floats
/// over a span of k is 256 KB, still in the second-level cache.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_MAX_COLUMNS: usize = 256;

/// Rows of C per task of [`tall`]: one accumulator per row and 16 columns must fit in the
/// 32 vector registers with B's row.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_ROWS: usize = 12;

/// Rows of a short block, which runs this many accumulators instead of [`TALL_ROWS`] of
/// which the extra ones repeat its last row: a transformer's [64, n] weight gradient over two
/// threads gives each 32 rows, blocks of 12, 12 and 8, and the last threw away a third of its
/// multiply-adds (docs/benchmarks.md, session 13).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_SHORT_ROWS: usize = 8;

/// Columns of C per block of [`tall`]: two vectors of 16. Wider products take their columns
/// in blocks of this many, each block over the same span of `k` in turn.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_COLUMNS: usize = 32;

/// Steps of `k` ahead that a tall block asks for B's and A's rows. Its first block of rows
/// over a span of `k` reads them from memory (a weight gradient's operands were written by
/// earlier layers and have left the second-level cache), a row of B per step 1 KB from the
/// last for the GPT's [64, 256] gradient: too far apart for the hardware's stream prefetcher
/// to see, so each step waited on its loads. 16 steps ahead, whole GPT steps in blocks
/// alternating with and without within one process: +1.3 and +5.5% (10 rounds), +5.0 and
/// +4.2% (20 rounds); 8 ahead +3.6%, 32 ahead +4.6% (docs/benchmarks.md, session 14).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_PREFETCH: usize = 16;

/// A block kernel of [`tall`]: `(a, b, dims, rows, columns, (steps of k, resume), the block's
/// rows of C)`; unsafe for the CPU features it needs.
#[cfg(target_arch = "x86_64")]
type TallBlock<L> = unsafe fn(
    &L,
    &[f32],
    &MatmulDims,
    std::ops::Range<usize>,
    std::ops::Range<usize>,
    (std::ops::Range<usize>, bool),
    &mut [f32],
);

/// Steps of `k` a tall product's blocks of rows take in turn before the next: B's rows for
/// them (at most 32 floats each, 32 KB) and A's (a convolution's columns: 256 x 144 floats)
/// stay in the second-level cache while every block of rows reads them.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_STEPS: usize = 256;

/// The tall product (see [`is_tall`]) on AVX-512: blocks of at most [`TALL_ROWS`] rows and
/// [`TALL_COLUMNS`] columns of C, reading A's and B's rows in place, one task per thread over
/// a share of the rows. Each
/// task takes `k` in spans of [`TALL_STEPS`], running all its blocks over a span before the
/// next: each block's sums go to C and come back for the next span (exactly: an f32 stored
/// and loaded is the same f32), so every element is still one sum in ascending `k`. Before,
/// each block ran the whole of `k` alone and read all of B from memory again: twelve times for
/// the CNN's second layer, [144, 25088] x [25088, 32], whose columns had left the caches.
#[cfg(target_arch = "x86_64")]
pub(super) fn tall(a: &[f32], b: &[f32], d: &MatmulDims, c: &mut [MaybeUninit<f32>], fused: bool) {
    let (m, n, k) = (d.m, d.n, d.k);
    let parallel = m * n * k >= PARALLEL_MIN_TERMS;
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    // At least one block per task, and at least as many tasks as threads while there are rows.
    let tasks = threads.min(m.div_ceil(TALL_ROWS)).max(threads.min(m));
    let rows_per_task = m.div_ceil(tasks);
    let task = |(t, c_rows): (usize, &mut [MaybeUninit<f32>])| {
        let c_rows = zeroed(c_rows);
        for k0 in (0..k).step_by(TALL_STEPS) {
            let steps = k0..(k0 + TALL_STEPS).min(k);
            // SAFETY: `matmul_on` checked that this CPU has AVX-512F.
            unsafe {
                let a = &Dense { a, m: d.m };
                blocks_over_span(a, b, d, t * rows_per_task, c_rows, (steps, k0 > 0), fused)
            };
        }
    };
    if parallel {
        for_each_chunk(c, rows_per_task * n, |t, rows| task((t, rows)));
    } else {
        c.chunks_mut(rows_per_task * n).enumerate().for_each(task);
    }
}

/// The block kernel of `R` accumulator rows for two vectors of columns or one, fused or not.
#[cfg(target_arch = "x86_64")]
fn block_kernel<const R: usize, L: TallLeft>(two: bool, fused: bool, full: bool) -> TallBlock<L> {
    match (two, fused, full) {
        (false, false, false) => x86::tall_block::<false, false, R, false, L>,
        (false, true, false) => x86::tall_block::<false, true, R, false, L>,
        (true, false, false) => x86::tall_block::<true, false, R, false, L>,
        (true, true, false) => x86::tall_block::<true, true, R, false, L>,
        (false, false, true) => x86::tall_block::<false, false, R, true, L>,
        (false, true, true) => x86::tall_block::<false, true, R, true, L>,
        (true, false, true) => x86::tall_block::<true, false, R, true, L>,
        (true, true, true) => x86::tall_block::<true, true, R, true, L>,
    }
}

/// A tall product's left operand `A [k, m]`, read a block of columns at a time: for each step
/// `p` of `k`, the block's columns lie side by side from [`TallLeft::at`].
pub(super) trait TallLeft {
    /// Panics unless, for every step `p < k`, columns `columns` lie side by side from
    /// `at(p, columns.start)` within the values.
    fn check(&self, k: usize, columns: std::ops::Range<usize>);

    /// Where step `p`'s column `i` lies, for a read or a prefetch hint.
    ///
    /// # Safety
    /// `p < k` and `i` in columns that passed [`TallLeft::check`] for `k`.
    unsafe fn at(&self, p: usize, i: usize) -> *const f32;
}

/// `A [k, m]` stored row-major, as [`tall`]'s operands are: a layer's input, for its weight
/// gradient.
pub(super) struct Dense<'a> {
    pub(super) a: &'a [f32],
    pub(super) m: usize,
}

impl TallLeft for Dense<'_> {
    fn check(&self, k: usize, columns: std::ops::Range<usize>) {
        assert!(columns.end <= self.m && self.a.len() >= k * self.m);
    }

    #[inline(always)]
    unsafe fn at(&self, p: usize, i: usize) -> *const f32 {
        // SAFETY: the caller's `p < k`, `i < m` and `check` keep it inside `a`.
        unsafe { self.a.as_ptr().add(p * self.m + i) }
    }
}

/// `A [k, m]` whose step `p`'s column `i` is `values[starts[p] + offsets[i]]`: a
/// convolution's im2col columns read from its padded input where they lie, a step an output
/// pixel (`cpu::conv::weight_gradient`).
pub struct Gathered<'a> {
    values: &'a [f32],
    starts: &'a [usize],
    offsets: &'a [usize],
    /// One past the largest of `starts`' values.
    reach: usize,
}

impl<'a> Gathered<'a> {
    /// Step `p`'s column `i` at `values[starts[p] + offsets[i]]`.
    pub fn new(values: &'a [f32], starts: &'a [usize], offsets: &'a [usize]) -> Self {
        let reach = starts.iter().max().map_or(0, |&s| s + 1);
        Gathered {
            values,
            starts,
            offsets,
            reach,
        }
    }

    /// Whether columns `columns` lie side by side at every step: a block of them can be read
    /// as [`Dense`]'s are.
    fn side_by_side(&self, columns: std::ops::Range<usize>) -> bool {
        let first = self.offsets[columns.start];
        self.offsets[columns]
            .iter()
            .enumerate()
            .all(|(j, &o)| o == first + j)
    }
}

impl TallLeft for Gathered<'_> {
    fn check(&self, k: usize, columns: std::ops::Range<usize>) {
        assert!(
            k <= self.starts.len() && !columns.is_empty() && self.side_by_side(columns.clone())
        );
        let last = self.offsets[columns.end - 1];
        assert!(self.reach.saturating_add(last) <= self.values.len());
    }

    #[inline(always)]
    unsafe fn at(&self, p: usize, i: usize) -> *const f32 {
        // SAFETY: the caller's `p < k <= starts.len()` and checked `i`; `check` bounded
        // every start plus the block's offsets by the values' length.
        unsafe {
            let start = *self.starts.get_unchecked(p);
            self.values
                .as_ptr()
                .add(start + *self.offsets.get_unchecked(i))
        }
    }
}

/// Every block of [`TALL_ROWS`] rows and [`TALL_COLUMNS`] columns of `c_rows` (rows
/// `first_row..` of the product `d`'s C) over the steps `span.0` of `k`, from the sums C holds
/// when `span.1` and from 0 otherwise: what [`tall`]'s and [`tall_gathered`]'s tasks run for
/// each span.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn blocks_over_span<L: TallLeft>(
    a: &L,
    b: &[f32],
    d: &MatmulDims,
    first_row: usize,
    c_rows: &mut [f32],
    span: (std::ops::Range<usize>, bool),
    fused: bool,
) {
    let n = d.n;
    let task_rows = c_rows.len() / n;
    for (block, c_block) in c_rows.chunks_mut(TALL_ROWS * n).enumerate() {
        let i0 = first_row + block * TALL_ROWS;
        let rows = TALL_ROWS.min(task_rows - block * TALL_ROWS);
        for j0 in (0..n).step_by(TALL_COLUMNS) {
            let columns = j0..(j0 + TALL_COLUMNS).min(n);
            let two = columns.len() > 16;
            let kernel = if rows <= TALL_SHORT_ROWS {
                block_kernel::<TALL_SHORT_ROWS, L>(two, fused, rows == TALL_SHORT_ROWS)
            } else {
                block_kernel::<TALL_ROWS, L>(two, fused, rows == TALL_ROWS)
            };
            // SAFETY: the caller guarantees AVX-512F.
            unsafe { kernel(a, b, d, i0..i0 + rows, columns, span.clone(), c_block) };
        }
    }
}

/// `C = Aᵀ B` for columns `rows` of a [`Gathered`] `A [k, m]` and `B [k, n]` (`k` is
/// `b.len() / n`), into `c` (`rows.len()` rows of `n`), on one thread: each element one sum
/// from 0 over ascending `k`, [`matmul`](super::matmul)'s bits for the product of the dense
/// `A`. The AVX-512 block kernel reads `A` where it lies when each block of rows lies side by
/// side at every step (a convolution's window rows of `kw * c` columns, blocks of
/// `TALL_ROWS` that do not cross them); elsewhere a plain loop with the same terms.
pub fn tall_gathered(
    a: &Gathered,
    b: &[f32],
    n: usize,
    rows: std::ops::Range<usize>,
    c: &mut [f32],
) {
    tall_gathered_on(Isa::detect(), a, b, n, rows, c)
}

/// [`tall_gathered`] on a given micro-kernel (for the tests; panics on one this CPU lacks).
pub fn tall_gathered_on(
    isa: Isa,
    a: &Gathered,
    b: &[f32],
    n: usize,
    rows: std::ops::Range<usize>,
    c: &mut [f32],
) {
    assert!(
        Isa::available().contains(&isa),
        "this CPU cannot run the {isa} micro-kernel"
    );
    let m = a.offsets.len();
    let k = b.len().checked_div(n).unwrap_or(0);
    assert!(b.len() == k * n && rows.end <= m && c.len() == rows.len() * n);
    assert!(k <= a.starts.len());
    c.fill(0.0);
    if k == 0 || n == 0 || rows.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // The blocks `blocks_over_span` takes, from the first row in steps of TALL_ROWS.
        let blocks = (rows.start..rows.end).step_by(TALL_ROWS);
        if blocks
            .clone()
            .all(|i0| a.side_by_side(i0..(i0 + TALL_ROWS).min(rows.end)))
        {
            let (d, _) = MatmulDims::infer(&[k, m], &[k, n], true, false)
                .expect("a tall product's operands, [k, m] and [k, n]");
            for k0 in (0..k).step_by(TALL_STEPS) {
                let steps = k0..(k0 + TALL_STEPS).min(k);
                // SAFETY: Isa::available() said this CPU has AVX-512F.
                unsafe { blocks_over_span(a, b, &d, rows.start, c, (steps, k0 > 0), false) };
            }
            return;
        }
    }
    for (p, b_row) in b.chunks_exact(n).enumerate() {
        for (i, c_row) in rows.clone().zip(c.chunks_exact_mut(n)) {
            let a_pi = a.values[a.starts[p] + a.offsets[i]];
            for (c_ij, &b_pj) in c_row.iter_mut().zip(b_row) {
                *c_ij += a_pi * b_pj;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::vector_unit::first_lanes;

    /// `block_rows` (at most `R`, itself at most `TALL_ROWS`) and `columns` (at most
    /// `TALL_COLUMNS`) of a tall product's C over the steps `span.0` of `k` in registers,
    /// starting from the sums C holds when `span.1` (a later span) and from 0 otherwise: each
    /// step of `k` loads B's row's columns (two vectors when `TWO`, lanes past the columns
    /// masked off) and broadcasts A's values for the block's rows. `c_rows` starts at the
    /// block's first row. Rows past the block repeat its last row's value and are not stored:
    /// the loop is unrolled over `R` accumulators whatever the block's size.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tall_block<
        const TWO: bool,
        const FUSED: bool,
        const R: usize,
        const FULL: bool,
        L: super::TallLeft,
    >(
        a: &L,
        b: &[f32],
        d: &super::MatmulDims,
        block_rows: std::ops::Range<usize>,
        columns: std::ops::Range<usize>,
        span: (std::ops::Range<usize>, bool),
        c_rows: &mut [f32],
    ) {
        use super::{TALL_COLUMNS, TALL_PREFETCH, TALL_ROWS, TALL_STEPS};
        let (m, n, k) = (d.m, d.n, d.k);
        let (i0, rows) = (block_rows.start, block_rows.len());
        let (steps, resume) = span;
        let (j0, width) = (columns.start, columns.len());
        const { assert!(R <= TALL_ROWS) };
        assert!((1..=R).contains(&rows) && i0 + rows <= m && (!FULL || rows == R));
        assert!((1..=TALL_COLUMNS).contains(&width) && columns.end <= n);
        assert!(steps.end <= k && b.len() >= k * n);
        a.check(k, block_rows.clone());
        assert!(c_rows.len() >= rows * n);
        let (mask0, mask1) = (first_lanes(width), first_lanes(width.saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        if resume {
            for (i, acc_i) in acc.iter_mut().enumerate().take(rows) {
                // SAFETY: row i of the block holds n floats, asserted above, of which the
                // columns from j0 are width long; masked lanes are not read.
                unsafe {
                    let from = c_rows.as_ptr().add(i * n + j0);
                    acc_i[0] = _mm512_maskz_loadu_ps(mask0, from);
                    if TWO {
                        acc_i[1] = _mm512_maskz_loadu_ps(mask1, from.add(16));
                    }
                }
            }
        }
        for p in steps {
            let ahead = p + TALL_PREFETCH;
            if ahead < k {
                // A hint, which never faults: the addresses are computed without `add`'s
                // promise to stay inside the slices, though they do.
                let b_ahead = b.as_ptr().wrapping_add(ahead * n + j0).cast::<i8>();
                _mm_prefetch::<_MM_HINT_T0>(b_ahead);
                if TWO {
                    _mm_prefetch::<_MM_HINT_T0>(b_ahead.wrapping_add(64));
                }
                // SAFETY: ahead < k, and row i0 passed `check`.
                _mm_prefetch::<_MM_HINT_T0>(unsafe { a.at(ahead, i0) }.cast::<i8>());
            }
            // The block's values of A a span later, into the second-level cache, asked for
            // once (by its first block of columns). A weight gradient's A is a layer's input,
            // written in the forward pass and gone from the caches by the backward pass; the
            // TALL_PREFETCH steps ahead are about 60 ns of arithmetic, less than a read from
            // memory, and each block found its values a cache line at a time, a row of A
            // apart. A span ahead, they wait in the cache (the GPT's largest: a task's 128
            // columns of A over 256 steps, 128 KB). On the GPT's [2048, 256]ᵀ x [2048, 64] with A
            // evicted (a throwaway probe on the 2-core Zen 5 EPYC, mean of 200 calls):
            // 306-325 -> 228-234 µs, 173-181 with A in cache; in its training step, timed per
            // call over 120 steps in three alternating runs, 249-264 -> 214-224 µs. The first
            // span still reads from memory.
            let next = p + TALL_STEPS;
            if j0 == 0 && next < k {
                // SAFETY: next < k, and the block's rows passed `check`.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T1>(a.at(next, i0).cast::<i8>());
                    _mm_prefetch::<_MM_HINT_T1>(a.at(next, i0 + rows - 1).cast::<i8>());
                }
            }
            // SAFETY: row p of B holds n floats from p * n < k * n, the columns from j0
            // width of them; lanes past them are masked off (a masked load does not touch
            // them).
            let (b0, b1) = unsafe {
                let row = b.as_ptr().add(p * n + j0);
                let b1 = if TWO {
                    _mm512_maskz_loadu_ps(mask1, row.add(16))
                } else {
                    _mm512_setzero_ps()
                };
                (_mm512_maskz_loadu_ps(mask0, row), b1)
            };
            // SAFETY: p < k, and the block's rows passed `check` above.
            let a_row = unsafe { a.at(p, i0) };
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // SAFETY: p < k, and the block's rows passed `check` above.
                // A full block's rows at offsets known when compiling: with the clamp to the
                // last row, each broadcast took its offset from the stack.
                let row = if FULL { i } else { i.min(rows - 1) };
                let av = _mm512_set1_ps(unsafe { *a_row.add(row) });
                if FUSED {
                    acc_i[0] = _mm512_fmadd_ps(av, b0, acc_i[0]);
                    if TWO {
                        acc_i[1] = _mm512_fmadd_ps(av, b1, acc_i[1]);
                    }
                } else {
                    acc_i[0] = _mm512_add_ps(acc_i[0], _mm512_mul_ps(av, b0));
                    if TWO {
                        acc_i[1] = _mm512_add_ps(acc_i[1], _mm512_mul_ps(av, b1));
                    }
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate().take(rows) {
            // SAFETY: as for the loads above; masked lanes are not written.
            unsafe {
                let out = c_rows.as_mut_ptr().add(i * n + j0);
                _mm512_mask_storeu_ps(out, mask0, acc_i[0]);
                if TWO {
                    _mm512_mask_storeu_ps(out.add(16), mask1, acc_i[1]);
                }
            }
        }
    }
}
