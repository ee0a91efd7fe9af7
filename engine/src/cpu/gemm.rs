//! The fast CPU matrix product: packed operands, a register-blocked micro-kernel chosen for
//! the CPU's vector width at run time, and rayon over row panels.
//!
//! It gives the bits of [`matmul_ref`](crate::kernels::matmul::matmul_ref), and so of the
//! WGSL kernels on lavapipe: every output element starts from 0 and takes `acc + a_ik * b_kj`
//! for k in ascending order, the product and the sum each rounded. Blocking changes only
//! which outputs are computed together, never the order of one output's terms, and each
//! accumulator stays in a register for the whole of k. Rust never contracts a multiply and
//! an add into a fused multiply-add on its own, so the unfused arithmetic is what the
//! compiler emits; [`Arithmetic::Fused`] (one rounding per term, different bits) exists for
//! the benchmark that measures what exactness costs, and is never what training runs.
//!
//! Hand-written rather than a BLAS crate: BLAS kernels sum k in blocks and with fused
//! multiply-adds, which gives other bits than the GPU kernels and the other peers.

use std::cell::RefCell;

use rayon::prelude::*;

use super::vector_unit::widest;
use crate::kernels::matmul_dims::MatmulDims;

/// How one term `acc + a * b` is rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arithmetic {
    /// The product and the sum rounded separately: the reference's bits (training uses this).
    Exact,
    /// One fused multiply-add per term: different bits; for measuring what exactness costs.
    Fused,
}

/// The micro-kernel sizes for this CPU, as `"<isa> <rows>x<columns>"` (for `murmur info`
/// and benchmark reports), with the narrow tile where [`matmul_on`] picks one.
pub fn describe() -> String {
    match Isa::detect() {
        Isa::Avx512 => format!("{}, 24x16 for at most 16 columns", Isa::Avx512),
        isa => isa.to_string(),
    }
}

/// `C = op(A) * op(B)` with the reference's bits (see the module comment).
pub fn matmul(a: &[f32], b: &[f32], d: &MatmulDims) -> Vec<f32> {
    matmul_with(a, b, d, Arithmetic::Exact)
}

/// `C = op(A) * op(B)` with the given arithmetic.
pub fn matmul_with(a: &[f32], b: &[f32], d: &MatmulDims, arithmetic: Arithmetic) -> Vec<f32> {
    matmul_on(Isa::detect(), a, b, d, arithmetic)
}

/// `C = op(A) * op(B)` on a given micro-kernel, which must be one of [`Isa::available`]
/// (panics otherwise): for the tests that check every kernel this CPU can run.
pub fn matmul_on(
    isa: Isa,
    a: &[f32],
    b: &[f32],
    d: &MatmulDims,
    arithmetic: Arithmetic,
) -> Vec<f32> {
    matmul_on_then(isa, a, b, d, arithmetic, |_: &mut [f32]| {})
}

/// `C = op(A) * op(B)` with the reference's bits, then `finish` on each row of C (`n`
/// values) as soon as its sums are complete, while the row is still in cache: a layer's
/// bias and activation (`kernels::linear`), without another pass over C in memory.
/// `finish` runs on the widest vector unit; write it `#[inline(always)]` so that it is
/// compiled there.
pub fn matmul_then(
    a: &[f32],
    b: &[f32],
    d: &MatmulDims,
    finish: impl Fn(&mut [f32]) + Sync,
) -> Vec<f32> {
    matmul_on_then(Isa::detect(), a, b, d, Arithmetic::Exact, finish)
}

/// [`matmul_then`] on a given micro-kernel and arithmetic (see [`matmul_on`]).
pub fn matmul_on_then(
    isa: Isa,
    a: &[f32],
    b: &[f32],
    d: &MatmulDims,
    arithmetic: Arithmetic,
    finish: impl Fn(&mut [f32]) + Sync,
) -> Vec<f32> {
    let finish = &finish;
    assert!(
        Isa::available().contains(&isa),
        "this CPU cannot run the {isa} micro-kernel"
    );
    let mut c = vec![0.0f32; d.batch * d.m * d.n];
    if c.is_empty() {
        return c;
    }
    if d.k == 0 {
        finish_rows(&mut c, d.n, finish);
        return c;
    }
    // A stack of row-major A's times one shared B is one tall product: [batch * m, k] x
    // [k, n] has the same rows, each computed the same way (a convolution's im2col rows
    // arrive as [images, rows, columns, k] with m = the image width, far below a tile's
    // worth of work per batch entry).
    let folded;
    let d = if d.batch > 1 && d.a_batched && !d.b_batched && !d.trans_a {
        folded = MatmulDims {
            batch: 1,
            m: d.batch * d.m,
            a_batched: false,
            ..*d
        };
        &folded
    } else {
        d
    };
    let fused = arithmetic == Arithmetic::Fused;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && is_tall(d) {
        tall(a, b, d, &mut c, fused);
        // A tall product's rows are complete only after its last span of k, and it is a
        // weight's gradient, which nothing finishes: no need to finish them in cache.
        crate::cpu::elementwise::for_rows(&mut c, d.n, |_, row| finish(row));
        return c;
    }
    // At most 16 columns (attention's per-head values, a convolution of 16 channels) fill
    // half of a 12x32 tile: a 24x16 one does twice the useful work per step of k.
    let narrow = d.n <= 16 && d.m >= 24;
    // A short k (a transformer's projections: 64) leaves a 12x32 tile little work per packed
    // panel of A, and packing it is a transpose one element at a time: the tile reads A's rows
    // where they lie instead, 12 of them at most 256 long staying in the first two caches.
    #[cfg(target_arch = "x86_64")]
    let a_in_place = !d.trans_a && d.k <= 256;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if narrow && fused => {
            product::<24, 16>(a, b, d, &mut c, x86::avx512_narrow::<true>, false, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if narrow => {
            product::<24, 16>(a, b, d, &mut c, x86::avx512_narrow::<false>, false, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if a_in_place && fused => {
            product::<12, 32>(a, b, d, &mut c, x86::avx512_in_place::<true>, true, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if a_in_place => {
            product::<12, 32>(a, b, d, &mut c, x86::avx512_in_place::<false>, true, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if fused => {
            product::<12, 32>(a, b, d, &mut c, x86::avx512::<true>, false, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => product::<12, 32>(a, b, d, &mut c, x86::avx512::<false>, false, finish),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if fused => product::<6, 16>(a, b, d, &mut c, x86::avx2::<true>, false, finish),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => product::<6, 16>(a, b, d, &mut c, x86::avx2::<false>, false, finish),
        _ if fused => product::<4, 8>(a, b, d, &mut c, baseline::<true>, false, finish),
        _ => product::<4, 8>(a, b, d, &mut c, baseline::<false>, false, finish),
    }
    c
}

/// Whether `d` is a tall product: `op(A)^T`'s few rows times B's few columns over a long
/// `k`, both stored with `k` outermost, as a weight gradient is (a convolution's: im2col's
/// columns transposed times the output gradient, [9, 100352] x [100352, 16] for the first
/// layer of the CNN; a transformer's projections': [64, 2048] x [2048, 64]). Packed, its
/// panels cost more than its arithmetic: B padded from 16 to 32 columns and A to 12 rows,
/// 17 MB written and read again for 29 MFLOP, on one thread. `tall` reads the operands
/// where they are.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn is_tall(d: &MatmulDims) -> bool {
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

/// Columns of C per block of [`tall`]: two vectors of 16. Wider products take their columns
/// in blocks of this many, each block over the same span of `k` in turn.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const TALL_COLUMNS: usize = 32;

/// A block kernel of [`tall`]: `(a, b, dims, rows, columns, (steps of k, resume), the block's
/// rows of C)`; unsafe for the CPU features it needs.
#[cfg(target_arch = "x86_64")]
type TallBlock = unsafe fn(
    &[f32],
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
fn tall(a: &[f32], b: &[f32], d: &MatmulDims, c: &mut [f32], fused: bool) {
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
    let kernel_for = |width: usize| -> TallBlock {
        match (width > 16, fused) {
            (false, false) => x86::tall_block::<false, false>,
            (false, true) => x86::tall_block::<false, true>,
            (true, false) => x86::tall_block::<true, false>,
            (true, true) => x86::tall_block::<true, true>,
        }
    };
    let task = |(t, c_rows): (usize, &mut [f32])| {
        let task_rows = c_rows.len() / n;
        for k0 in (0..k).step_by(TALL_STEPS) {
            let steps = k0..(k0 + TALL_STEPS).min(k);
            for (block, c_block) in c_rows.chunks_mut(TALL_ROWS * n).enumerate() {
                let i0 = t * rows_per_task + block * TALL_ROWS;
                let rows = TALL_ROWS.min(task_rows - block * TALL_ROWS);
                for j0 in (0..n).step_by(TALL_COLUMNS) {
                    let columns = j0..(j0 + TALL_COLUMNS).min(n);
                    let block_kernel = kernel_for(columns.len());
                    let span = (steps.clone(), k0 > 0);
                    // SAFETY: `matmul_on` checked that this CPU has AVX-512F.
                    unsafe { block_kernel(a, b, d, i0..i0 + rows, columns, span, c_block) };
                }
            }
        }
    };
    if parallel {
        c.par_chunks_mut(rows_per_task * n)
            .enumerate()
            .for_each(task);
    } else {
        c.chunks_mut(rows_per_task * n).enumerate().for_each(task);
    }
}

/// `C += Aᵀ B` for `A [k, m]` and `B [k, n]`, both stored with `k` outermost (a tall
/// product's operands: a weight gradient's), on one thread: each element of C takes its terms in
/// ascending `k`, continuing the sum C holds. A product taken a span of `k` at a time this
/// way has the bits of the whole (an f32 stored and loaded is the same f32; from zeros, of
/// [`matmul`]), so a caller can build A a span at a time in cache instead of all of it in
/// memory (`cpu::conv::weight_gradient`). `k` is `a.len() / m`.
pub fn tall_continue(a: &[f32], b: &[f32], m: usize, n: usize, c: &mut [f32]) {
    tall_continue_on(Isa::detect(), a, b, m, n, c)
}

/// [`tall_continue`] on a given micro-kernel (for the tests; panics on one this CPU lacks).
/// The tall block kernel where there is AVX-512, elsewhere a plain loop with the same terms.
pub fn tall_continue_on(isa: Isa, a: &[f32], b: &[f32], m: usize, n: usize, c: &mut [f32]) {
    assert!(
        Isa::available().contains(&isa),
        "this CPU cannot run the {isa} micro-kernel"
    );
    let k = a.len().checked_div(m).unwrap_or(0);
    assert!(a.len() == k * m && b.len() == k * n && c.len() == m * n);
    if k == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        let d = MatmulDims {
            batch: 1,
            m,
            n,
            k,
            trans_a: true,
            trans_b: false,
            a_batched: false,
            b_batched: false,
        };
        for (block, c_block) in c.chunks_mut(TALL_ROWS * n).enumerate() {
            let rows = block * TALL_ROWS..block * TALL_ROWS + c_block.len() / n;
            for j0 in (0..n).step_by(TALL_COLUMNS) {
                let columns = j0..(j0 + TALL_COLUMNS).min(n);
                // SAFETY: Isa::available() said this CPU has AVX-512F.
                unsafe {
                    if columns.len() > 16 {
                        x86::tall_block::<true, false>(
                            a,
                            b,
                            &d,
                            rows.clone(),
                            columns,
                            (0..k, true),
                            c_block,
                        )
                    } else {
                        x86::tall_block::<false, false>(
                            a,
                            b,
                            &d,
                            rows.clone(),
                            columns,
                            (0..k, true),
                            c_block,
                        )
                    }
                }
            }
        }
        return;
    }
    for (a_row, b_row) in a.chunks_exact(m).zip(b.chunks_exact(n)) {
        for (&a_pi, c_row) in a_row.iter().zip(c.chunks_exact_mut(n)) {
            for (c_ij, &b_pj) in c_row.iter_mut().zip(b_row) {
                *c_ij += a_pi * b_pj;
            }
        }
    }
}

/// The vector instruction set a micro-kernel is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// 16 f32 lanes, 32 registers.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    /// 8 f32 lanes (FMA for the fused variant), 16 registers.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// Whatever the target's baseline gives (SSE2, NEON): the compiler vectorises.
    Baseline,
}

impl Isa {
    /// The widest micro-kernel this CPU runs: the one the CPU path uses.
    pub fn detect() -> Isa {
        Isa::available()[0]
    }

    /// Every micro-kernel this CPU can run, widest first (each gives the same bits).
    pub fn available() -> Vec<Isa> {
        let mut isas = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                isas.push(Isa::Avx2);
            }
        }
        isas.push(Isa::Baseline);
        isas
    }

    fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Baseline => "baseline",
        }
    }

    /// Rows and columns of the accumulator tile: as many accumulators as leave registers
    /// for one row of B and a broadcast of A.
    fn tile(self) -> (usize, usize) {
        match self {
            Isa::Avx512 => (12, 32),
            Isa::Avx2 => (6, 16),
            Isa::Baseline => (4, 8),
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mr, nr) = self.tile();
        write!(f, "{} {mr}x{nr}", self.name())
    }
}

/// Computes every tile of one row panel: the packed panel of A (`k` groups of `MR`), the
/// packed B (`k` rows of `NR` per column panel), `k`, `n`, and the panel's rows of C.
/// Unsafe because the x86 variants need the CPU features `Isa::available` checks for.
type PanelKernel = unsafe fn(&[f32], &[f32], usize, usize, &mut [f32]);

/// The panel kernel for the target's baseline instruction set.
///
/// # Safety
/// None needed: it is unsafe only to share the type of the x86 variants.
unsafe fn baseline<const FUSED: bool>(a: &[f32], b: &[f32], k: usize, n: usize, c: &mut [f32]) {
    panel_tiles::<4, 8>(a, b, k, n, c, micro_kernel::<4, 8, FUSED>)
}

/// The panel kernels for wider vectors, with the micro-kernel written in intrinsics: the
/// compiler vectorises the fused form of the portable micro-kernel well but spills the
/// unfused one to the stack (seen in a throwaway probe on a 2-core AVX-512 EPYC, not kept;
/// to see it again, call `micro_kernel` from the x86 panel functions).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::panel_tiles;

    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        // SAFETY: the caller guarantees AVX-512F.
        let packed: [usize; 12] = std::array::from_fn(|i| i);
        panel_tiles::<12, 32>(a, b, k, n, c, |a, b| unsafe {
            tile_avx512::<FUSED>(a, packed, 12, b, k)
        })
    }

    /// [`avx512`] with A's rows read where they lie (`a` holds the panel's rows of C's
    /// worth of rows of A, `k` values each, row-major) instead of from a packed panel.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512_in_place<const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        let rows = c.len() / n;
        // Rows past the panel's repeat its last one; their results are not stored.
        let in_place: [usize; 12] = std::array::from_fn(|i| i.min(rows - 1) * k);
        // SAFETY: the caller guarantees AVX-512F.
        panel_tiles::<12, 32>(a, b, k, n, c, |a, b| unsafe {
            tile_avx512::<FUSED>(a, in_place, 1, b, k)
        })
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512_narrow<const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        // SAFETY: the caller guarantees AVX-512F.
        panel_tiles::<24, 16>(a, b, k, n, c, |a, b| unsafe {
            tile_avx512_narrow::<FUSED>(a, b, k)
        })
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2<const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        // SAFETY: the caller guarantees AVX2 and FMA.
        panel_tiles::<6, 16>(a, b, k, n, c, |a, b| unsafe { tile_avx2::<FUSED>(a, b, k) })
    }

    /// `block_rows` (at most `TALL_ROWS`) and `columns` (at most `TALL_COLUMNS`) of a tall
    /// product's C over the steps `span.0` of `k` in registers, starting from the sums C holds
    /// when `span.1` (a later span) and from 0 otherwise: each step of `k` loads B's row's
    /// columns (two vectors when `TWO`, lanes past the columns masked off) and broadcasts A's
    /// values for the block's rows. `c_rows` starts at the block's first row. Rows
    /// past the block repeat its last row's value and are not stored: the loop is unrolled
    /// over `TALL_ROWS` accumulators whatever the block's size.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tall_block<const TWO: bool, const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        d: &super::MatmulDims,
        block_rows: std::ops::Range<usize>,
        columns: std::ops::Range<usize>,
        span: (std::ops::Range<usize>, bool),
        c_rows: &mut [f32],
    ) {
        use super::{TALL_COLUMNS, TALL_ROWS};
        let (m, n, k) = (d.m, d.n, d.k);
        let (i0, rows) = (block_rows.start, block_rows.len());
        let (steps, resume) = span;
        let (j0, width) = (columns.start, columns.len());
        assert!((1..=TALL_ROWS).contains(&rows) && i0 + rows <= m);
        assert!((1..=TALL_COLUMNS).contains(&width) && columns.end <= n);
        assert!(steps.end <= k && a.len() >= k * m && b.len() >= k * n);
        assert!(c_rows.len() >= rows * n);
        let lanes = |count: usize| -> __mmask16 { ((1u32 << count.min(16)) - 1) as __mmask16 };
        let (mask0, mask1) = (lanes(width), lanes(width.saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; TALL_ROWS];
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
            let a_row = p * m + i0;
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // SAFETY: a_row + rows - 1 < p * m + m <= k * m, asserted above.
                let av = _mm512_set1_ps(unsafe { *a.get_unchecked(a_row + i.min(rows - 1)) });
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

    /// A 12 x 32 tile: 24 accumulators of 16 lanes, two rows of B and a broadcast. Row `i`'s
    /// value of A at step `p` is `a[starts[i] + p * step]`: a packed panel (starts 0 to 11,
    /// step 12) or rows read in place (starts a row of `k` apart, step 1).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_avx512<const FUSED: bool>(
        a: &[f32],
        starts: [usize; 12],
        step: usize,
        b: &[f32],
        k: usize,
    ) -> [[f32; 32]; 12] {
        assert!(b.len() >= 32 * k);
        assert!(k == 0 || starts.iter().all(|&s| s + (k - 1) * step < a.len()));
        let mut acc = [[_mm512_setzero_ps(); 2]; 12];
        for p in 0..k {
            // SAFETY: p < k, and the assert bounds both panels.
            let (b0, b1) = unsafe {
                let row = b.as_ptr().add(32 * p);
                (_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16)))
            };
            for (acc_i, &start) in acc.iter_mut().zip(&starts) {
                // SAFETY: p < k, and the assert bounds every row's last value.
                let av = _mm512_set1_ps(unsafe { *a.get_unchecked(start + p * step) });
                if FUSED {
                    acc_i[0] = _mm512_fmadd_ps(av, b0, acc_i[0]);
                    acc_i[1] = _mm512_fmadd_ps(av, b1, acc_i[1]);
                } else {
                    acc_i[0] = _mm512_add_ps(acc_i[0], _mm512_mul_ps(av, b0));
                    acc_i[1] = _mm512_add_ps(acc_i[1], _mm512_mul_ps(av, b1));
                }
            }
        }
        let mut out = [[0.0f32; 32]; 12];
        for (row, acc_i) in out.iter_mut().zip(&acc) {
            // SAFETY: each row holds 32 floats.
            unsafe {
                _mm512_storeu_ps(row.as_mut_ptr(), acc_i[0]);
                _mm512_storeu_ps(row.as_mut_ptr().add(16), acc_i[1]);
            }
        }
        out
    }

    /// A 24 x 16 tile: 24 accumulators of 16 lanes, one row of B and a broadcast.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_avx512_narrow<const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        k: usize,
    ) -> [[f32; 16]; 24] {
        assert!(a.len() >= 24 * k && b.len() >= 16 * k);
        let mut acc = [_mm512_setzero_ps(); 24];
        for p in 0..k {
            // SAFETY: p < k, and the assert bounds both panels.
            let b0 = unsafe { _mm512_loadu_ps(b.as_ptr().add(16 * p)) };
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let av = _mm512_set1_ps(unsafe { *a.get_unchecked(24 * p + i) });
                *acc_i = if FUSED {
                    _mm512_fmadd_ps(av, b0, *acc_i)
                } else {
                    _mm512_add_ps(*acc_i, _mm512_mul_ps(av, b0))
                };
            }
        }
        let mut out = [[0.0f32; 16]; 24];
        for (row, acc_i) in out.iter_mut().zip(&acc) {
            // SAFETY: each row holds 16 floats.
            unsafe { _mm512_storeu_ps(row.as_mut_ptr(), *acc_i) };
        }
        out
    }

    /// A 6 x 16 tile: 12 accumulators of 8 lanes, two rows of B and a broadcast.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile_avx2<const FUSED: bool>(a: &[f32], b: &[f32], k: usize) -> [[f32; 16]; 6] {
        assert!(a.len() >= 6 * k && b.len() >= 16 * k);
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        for p in 0..k {
            // SAFETY: p < k, and the assert bounds both panels.
            let (b0, b1) = unsafe {
                let row = b.as_ptr().add(16 * p);
                (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)))
            };
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let av = _mm256_set1_ps(unsafe { *a.get_unchecked(6 * p + i) });
                if FUSED {
                    acc_i[0] = _mm256_fmadd_ps(av, b0, acc_i[0]);
                    acc_i[1] = _mm256_fmadd_ps(av, b1, acc_i[1]);
                } else {
                    acc_i[0] = _mm256_add_ps(acc_i[0], _mm256_mul_ps(av, b0));
                    acc_i[1] = _mm256_add_ps(acc_i[1], _mm256_mul_ps(av, b1));
                }
            }
        }
        let mut out = [[0.0f32; 16]; 6];
        for (row, acc_i) in out.iter_mut().zip(&acc) {
            // SAFETY: each row holds 16 floats.
            unsafe {
                _mm256_storeu_ps(row.as_mut_ptr(), acc_i[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), acc_i[1]);
            }
        }
        out
    }
}

/// Products below this many multiply-adds run on the calling thread: rayon's hand-off
/// costs more than they do.
const PARALLEL_MIN_TERMS: usize = 1 << 16;

thread_local! {
    /// Each thread's packed panel of A, kept between calls (taken out while in use, so that
    /// a nested product on the same thread allocates its own instead of failing).
    static A_PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's packed B, kept between calls in the same way.
    static B_PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// This thread's scratch buffer, at least `len` long. What it holds is left from its last use:
/// a partial panel's padding lanes feed only accumulators whose results are never stored, so
/// they need not be zero (zeroing every buffer took about 1% of a GPT step).
fn take_scratch(key: &'static std::thread::LocalKey<RefCell<Vec<f32>>>, len: usize) -> Vec<f32> {
    let mut v = key.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if v.len() < len {
        v.resize(len, 0.0);
    }
    v
}

fn put_scratch(key: &'static std::thread::LocalKey<RefCell<Vec<f32>>>, v: Vec<f32>) {
    key.with(|s| *s.borrow_mut() = v);
}

/// The whole batched product: packs the operands for an `MR x NR` tile and runs `kernel`
/// (built for that tile) on each row panel.
fn product<const MR: usize, const NR: usize>(
    a: &[f32],
    b: &[f32],
    d: &MatmulDims,
    c: &mut [f32],
    kernel: PanelKernel,
    a_in_place: bool,
    finish: &(impl Fn(&mut [f32]) + Sync),
) {
    let (m, n, k) = (d.m, d.n, d.k);
    let panels = n.div_ceil(NR);
    let parallel = d.batch * m * n * k >= PARALLEL_MIN_TERMS;
    // A shared B is packed once for every batch entry.
    let b_len = if d.b_batched { d.batch } else { 1 } * panels * k * NR;
    let mut b_packed = take_scratch(&B_PACKED, b_len);
    let b_stride = k * n;
    // Every (batch entry, column panel) packs on its own.
    let pack = |(i, panel): (usize, &mut [f32])| {
        let (z, jp) = (i / panels, i % panels);
        pack_b_panel::<NR>(&b[z * b_stride..][..b_stride], d, jp, panel);
    };
    if parallel {
        b_packed[..b_len]
            .par_chunks_mut(k * NR)
            .enumerate()
            .for_each(pack);
    } else {
        b_packed[..b_len]
            .chunks_mut(k * NR)
            .enumerate()
            .for_each(pack);
    }
    let a_stride = m * k;
    let row_panel = |z: usize, ip: usize, c_rows: &mut [f32]| {
        let a_z = &a[if d.a_batched { z * a_stride } else { 0 }..][..a_stride];
        let b_z = &b_packed[if d.b_batched { z * panels * k * NR } else { 0 }..][..panels * k * NR];
        if a_in_place {
            // The panel's rows of A as they are stored (`!trans_a`): `k` values per row.
            let rows = c_rows.len() / n;
            // SAFETY: `matmul_on` checked that this CPU has the features `kernel` was built for.
            unsafe { kernel(&a_z[ip * MR * k..][..rows * k], b_z, k, n, c_rows) };
            finish_rows(c_rows, n, finish);
            return;
        }
        let mut a_scratch = take_scratch(&A_PANEL, k * MR);
        let a_panel = &mut a_scratch[..k * MR];
        pack_a_panel::<MR>(a_z, d, ip, a_panel);
        // SAFETY: `matmul_on` checked that this CPU has the features `kernel` was built for.
        unsafe { kernel(a_panel, b_z, k, n, c_rows) };
        put_scratch(&A_PANEL, a_scratch);
        finish_rows(c_rows, n, finish);
    };
    // Many small products (attention's, one per head) split by batch entry alone: a task per
    // row panel as well would cost more in hand-offs than a panel's work.
    let by_entry_alone = d.batch >= 4 * rayon::current_num_threads();
    if parallel && by_entry_alone {
        c.par_chunks_mut(m * n).enumerate().for_each(|(z, c_z)| {
            for (ip, rows) in c_z.chunks_mut(MR * n).enumerate() {
                row_panel(z, ip, rows);
            }
        });
    } else if parallel {
        c.par_chunks_mut(m * n).enumerate().for_each(|(z, c_z)| {
            c_z.par_chunks_mut(MR * n)
                .enumerate()
                .for_each(|(ip, rows)| row_panel(z, ip, rows))
        });
    } else {
        for (z, c_z) in c.chunks_mut(m * n).enumerate() {
            for (ip, rows) in c_z.chunks_mut(MR * n).enumerate() {
                row_panel(z, ip, rows);
            }
        }
    }
    put_scratch(&B_PACKED, b_packed);
}

/// `finish` on each `n`-long row of `c_rows`, compiled for the widest vector unit.
#[inline(always)]
fn finish_rows(c_rows: &mut [f32], n: usize, finish: &(impl Fn(&mut [f32]) + Sync)) {
    widest(
        #[inline(always)]
        || c_rows.chunks_exact_mut(n).for_each(finish),
    );
}

/// Rows `ip * MR ..` of op(A) as `k` groups of `MR` (row-minor), zero past the last row.
#[inline(always)]
fn pack_a_panel<const MR: usize>(a: &[f32], d: &MatmulDims, ip: usize, dst: &mut [f32]) {
    let (m, k) = (d.m, d.k);
    let i0 = ip * MR;
    let rows = MR.min(m - i0);
    if d.trans_a {
        // Stored [k, m]: each p holds the panel's rows side by side. A whole panel's copy has
        // a length known at compile time, which the compiler does with vector moves; a
        // length known only at run time is a call to memmove per step of k (memmove held
        // 11.8% and 13.4% of a CNN step's samples in two `perf record`s, docs/benchmarks.md;
        // the call graph put 9.9 of the 13.4 points under the products' packing and stores).
        if rows == MR {
            for (p, group) in dst.chunks_exact_mut(MR).enumerate() {
                group.copy_from_slice(&a[p * m + i0..][..MR]);
            }
        } else {
            for (p, group) in dst.chunks_exact_mut(MR).enumerate() {
                group[..rows].copy_from_slice(&a[p * m + i0..][..rows]);
            }
        }
    } else {
        for i in 0..rows {
            let row = &a[(i0 + i) * k..][..k];
            for (p, &v) in row.iter().enumerate() {
                dst[p * MR + i] = v;
            }
        }
    }
}

/// Columns `jp * NR ..` of op(B) as `k` rows of `NR`, zero past the last column.
#[inline(always)]
fn pack_b_panel<const NR: usize>(b: &[f32], d: &MatmulDims, jp: usize, dst: &mut [f32]) {
    let (n, k) = (d.n, d.k);
    let j0 = jp * NR;
    let cols = NR.min(n - j0);
    if d.trans_b {
        // Stored [n, k]: column j of op(B) is row j of B.
        for j in 0..cols {
            let col = &b[(j0 + j) * k..][..k];
            for (p, &v) in col.iter().enumerate() {
                dst[p * NR + j] = v;
            }
        }
    } else if cols == NR {
        // A length known at compile time, as in `pack_a_panel`.
        for (p, row) in dst.chunks_exact_mut(NR).enumerate() {
            row.copy_from_slice(&b[p * n + j0..][..NR]);
        }
    } else {
        for (p, row) in dst.chunks_exact_mut(NR).enumerate() {
            row[..cols].copy_from_slice(&b[p * n + j0..][..cols]);
        }
    }
}

/// Every tile of one row panel (see [`PanelKernel`]).
#[inline(always)]
fn panel_tiles<const MR: usize, const NR: usize>(
    a_panel: &[f32],
    b_packed: &[f32],
    k: usize,
    n: usize,
    c_rows: &mut [f32],
    tile_of: impl Fn(&[f32], &[f32]) -> [[f32; NR]; MR],
) {
    let rows = c_rows.len() / n;
    for (jp, b_panel) in b_packed.chunks_exact(k * NR).enumerate() {
        let tile = tile_of(a_panel, b_panel);
        let (j0, cols) = (jp * NR, NR.min(n - jp * NR));
        for (i, tile_row) in tile.iter().enumerate().take(rows) {
            // A whole tile row's length is known at compile time (see `pack_a_panel`).
            if cols == NR {
                c_rows[i * n + j0..][..NR].copy_from_slice(tile_row);
            } else {
                c_rows[i * n + j0..][..cols].copy_from_slice(&tile_row[..cols]);
            }
        }
    }
}

/// One `MR x NR` tile over the whole of k, in registers: the packed panels hold `k` groups
/// of `MR` values of A and `NR` values of B.
#[inline(always)]
fn micro_kernel<const MR: usize, const NR: usize, const FUSED: bool>(
    a_panel: &[f32],
    b_panel: &[f32],
) -> [[f32; NR]; MR] {
    let mut acc = [[0.0f32; NR]; MR];
    for (a_p, b_p) in a_panel.chunks_exact(MR).zip(b_panel.chunks_exact(NR)) {
        for i in 0..MR {
            let a_ip = a_p[i];
            for j in 0..NR {
                acc[i][j] = if FUSED {
                    a_ip.mul_add(b_p[j], acc[i][j])
                } else {
                    acc[i][j] + a_ip * b_p[j]
                };
            }
        }
    }
    acc
}
