//! The fast CPU matrix product: packed operands, a register-blocked micro-kernel chosen for
//! the CPU's vector width at run time, and rayon over row panels (or, for products with few
//! rows, over blocks of columns).
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
use std::mem::MaybeUninit;

use super::chunks::for_each_chunk;
use super::output::{assume_written, write_slice, Unwritten};
use super::pool::for_each_index;
use super::vector_unit::widest;
use crate::kernels::matmul_dims::MatmulDims;
use block::{Block, SharedOutput};

mod block;
mod tall;

#[cfg(target_arch = "x86_64")]
use tall::{is_tall, tall};
pub use tall::{tall_gathered, tall_gathered_on, Gathered};

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
    matmul_on_then(
        isa,
        a,
        b,
        d,
        arithmetic,
        |_: usize, _: usize, _: &mut [f32]| {},
    )
}

/// `C = op(A) * op(B)` with the reference's bits, then `finish(i, j, values)` on each row
/// `i` of C (counted through the batch, C seen as `[batch * m, n]`) as soon as its sums are
/// complete, while the row is still in cache: a layer's bias, activation and residual
/// (`kernels::linear`), without another pass over C in memory. `values` are the row's from
/// column `j` on: the whole row (`j` = 0), or a block of its columns when the product splits
/// its columns between tasks. `finish` runs on the widest vector unit; write
/// it `#[inline(always)]` so that it is compiled there.
pub fn matmul_then(
    a: &[f32],
    b: &[f32],
    d: &MatmulDims,
    finish: impl Fn(usize, usize, &mut [f32]) + Sync,
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
    finish: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let finish = &finish;
    assert!(
        Isa::available().contains(&isa),
        "this CPU cannot run the {isa} micro-kernel"
    );
    let len = d.batch * d.m * d.n;
    if len == 0 {
        return vec![];
    }
    if d.k == 0 {
        let mut c = vec![0.0f32; len];
        finish_rows(&mut c, 0, d.n, finish);
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
    // C's values are written by the tasks that compute them (`cpu::output`): a tall
    // product's zero-fill their rows first, the others' tiles store every value.
    let mut unwritten = Unwritten::new(len);
    let c = unwritten.slots();
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && is_tall(d) {
        tall(a, b, d, c, fused);
        // SAFETY: `tall`'s tasks zero-fill every row of C before they sum into it.
        let mut c = unsafe { unwritten.assume_init() };
        // A tall product's rows are complete only after its last span of k, and it is a
        // weight's gradient, which nothing finishes: no need to finish them in cache.
        crate::cpu::elementwise::for_rows(&mut c, d.n, |i, row| finish(i, 0, row));
        return c;
    }
    // At most 16 columns (attention's per-head values, a convolution of 16 channels) fill
    // half of a 12x32 tile: a 24x16 one does twice the useful work per step of k.
    let narrow = d.n <= 16 && d.m >= 24;
    // Packing a panel of A that is not transposed is a transpose one element at a time; the
    // 12x32 tile reads A's rows where they lie instead (12 streams for the prefetcher). First
    // for a short k (a transformer's projections: 64), where a packed panel did little work;
    // then for every k: in place, alternating blocks of calls in one process, paired medians
    // +4.3% at 1024^3, +6.1% and +9.1% at the MNIST MLP's forward [128, 784] x [784, 512]
    // and [128, 512] x [512, 256] (docs/benchmarks.md, session 16).
    #[cfg(target_arch = "x86_64")]
    let a_in_place = !d.trans_a;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if narrow && fused => {
            product::<24, 16>(a, b, d, c, x86::avx512_narrow::<true>, false, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if narrow => {
            product::<24, 16>(a, b, d, c, x86::avx512_narrow::<false>, false, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if a_in_place && fused => {
            product::<12, 32>(a, b, d, c, x86::avx512_in_place::<true>, true, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if a_in_place => {
            product::<12, 32>(a, b, d, c, x86::avx512_in_place::<false>, true, finish)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if fused => product::<12, 32>(a, b, d, c, x86::avx512::<true>, false, finish),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => product::<12, 32>(a, b, d, c, x86::avx512::<false>, false, finish),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if fused => product::<6, 16>(a, b, d, c, x86::avx2::<true>, false, finish),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => product::<6, 16>(a, b, d, c, x86::avx2::<false>, false, finish),
        _ if fused => product::<4, 8>(a, b, d, c, baseline::<true>, false, finish),
        _ => product::<4, 8>(a, b, d, c, baseline::<false>, false, finish),
    }
    // SAFETY: `product`'s row panels cover C, and its panel kernels write every value.
    unsafe { unwritten.assume_init() }
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

/// Computes every tile of one row panel's block of columns: the packed panel of A (`k`
/// groups of `MR`), the block's packed B (`k` rows of `NR` per column panel), `k`, and the
/// block of C, every value of which it writes (never reads: C needs no zeros first,
/// `cpu::output`). Unsafe because the x86 variants need the CPU features `Isa::available`
/// checks for.
type PanelKernel = unsafe fn(&[f32], &[f32], usize, &mut Block);

/// The panel kernel for the target's baseline instruction set.
///
/// # Safety
/// None needed: it is unsafe only to share the type of the x86 variants.
unsafe fn baseline<const FUSED: bool>(a: &[f32], b: &[f32], k: usize, c: &mut Block) {
    panel_tiles::<4, 8>(a, b, k, c, micro_kernel::<4, 8, FUSED>)
}

/// The panel kernels for wider vectors, with the micro-kernel written in intrinsics: the
/// compiler vectorises the fused form of the portable micro-kernel well but spills the
/// unfused one to the stack (seen in a throwaway probe on a 2-core AVX-512 EPYC, not kept;
/// to see it again, call `micro_kernel` from the x86 panel functions).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{panel_tiles, Block};

    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<const FUSED: bool>(a: &[f32], b: &[f32], k: usize, c: &mut Block) {
        // SAFETY: the caller guarantees AVX-512F.
        let packed: [usize; 12] = std::array::from_fn(|i| i);
        panel_tiles::<12, 32>(a, b, k, c, |a, b| unsafe {
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
        c: &mut Block,
    ) {
        let rows = c.rows();
        // Rows past the panel's repeat its last one; their results are not stored.
        let in_place: [usize; 12] = std::array::from_fn(|i| i.min(rows - 1) * k);
        // SAFETY: the caller guarantees AVX-512F.
        panel_tiles::<12, 32>(a, b, k, c, |a, b| unsafe {
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
        c: &mut Block,
    ) {
        // SAFETY: the caller guarantees AVX-512F.
        panel_tiles::<24, 16>(a, b, k, c, |a, b| unsafe {
            tile_avx512_narrow::<FUSED>(a, b, k)
        })
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2<const FUSED: bool>(a: &[f32], b: &[f32], k: usize, c: &mut Block) {
        // SAFETY: the caller guarantees AVX2 and FMA.
        panel_tiles::<6, 16>(a, b, k, c, |a, b| unsafe { tile_avx2::<FUSED>(a, b, k) })
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

/// Products with fewer row panels than this many per thread split their columns too: a
/// batch of 128 rows is 11 panels of 12, which two threads took 6 and 5 at a time.
const ROW_PANELS_PER_THREAD: usize = 8;

/// Column blocks per thread of a product that splits its columns: two, so that a thread
/// that falls behind can hand one on (one or two measured the same, docs/benchmarks.md).
const COLUMN_BLOCKS_PER_THREAD: usize = 2;

/// The whole batched product: packs the operands for an `MR x NR` tile and runs `kernel`
/// (built for that tile) on each row panel, or on each row panel of each block of columns.
fn product<const MR: usize, const NR: usize>(
    a: &[f32],
    b: &[f32],
    d: &MatmulDims,
    c: &mut [MaybeUninit<f32>],
    kernel: PanelKernel,
    a_in_place: bool,
    finish: &(impl Fn(usize, usize, &mut [f32]) + Sync),
) {
    let (m, n, k) = (d.m, d.n, d.k);
    let panels = n.div_ceil(NR);
    let parallel = d.batch * m * n * k >= PARALLEL_MIN_TERMS;
    let threads = rayon::current_num_threads();
    // Many small products (attention's, one per head) split by batch entry alone: a task per
    // row panel as well would cost more in hand-offs than a panel's work.
    let by_entry_alone = d.batch >= 4 * threads;
    let few_row_panels = d.batch * m.div_ceil(MR) < ROW_PANELS_PER_THREAD * threads;
    let kernel = RowPanel::<MR, NR> {
        kernel,
        a_in_place,
        a,
        d,
    };
    if parallel && !by_entry_alone && few_row_panels && panels >= 2 {
        return column_blocks(&kernel, b, c, threads, finish);
    }
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
        for_each_chunk(&mut b_packed[..b_len], k * NR, |i, panel| pack((i, panel)));
    } else {
        b_packed[..b_len]
            .chunks_mut(k * NR)
            .enumerate()
            .for_each(pack);
    }
    let row_panel = |z: usize, ip: usize, c_rows: &mut [MaybeUninit<f32>]| {
        let b_z = &b_packed[if d.b_batched { z * panels * k * NR } else { 0 }..][..panels * k * NR];
        kernel.run(z, ip, b_z, &mut Block::rows_of(c_rows, n));
        // SAFETY: the panel kernel wrote every value of the panel's rows.
        finish_rows(
            unsafe { assume_written(c_rows) },
            z * m + ip * MR,
            n,
            finish,
        );
    };
    if parallel && by_entry_alone {
        for_each_chunk(c, m * n, |z, c_z| {
            for (ip, rows) in c_z.chunks_mut(MR * n).enumerate() {
                row_panel(z, ip, rows);
            }
        });
    } else if parallel {
        for_each_chunk(c, m * n, |z, c_z| {
            for_each_chunk(c_z, MR * n, |ip, rows| row_panel(z, ip, rows))
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

/// A panel kernel with the A it reads: runs one row panel of one batch entry against packed
/// panels of B.
struct RowPanel<'a, const MR: usize, const NR: usize> {
    kernel: PanelKernel,
    a_in_place: bool,
    a: &'a [f32],
    d: &'a MatmulDims,
}

impl<const MR: usize, const NR: usize> RowPanel<'_, MR, NR> {
    /// Row panel `ip` of entry `z` times `b_panels` into `block`: A's rows where they lie, or
    /// packed into this thread's scratch first.
    #[inline(always)]
    fn run(&self, z: usize, ip: usize, b_panels: &[f32], block: &mut Block) {
        let (m, k) = (self.d.m, self.d.k);
        let a_z = &self.a[if self.d.a_batched { z * m * k } else { 0 }..][..m * k];
        if self.a_in_place {
            // The panel's rows of A as they are stored (`!trans_a`): `k` values per row.
            let rows = block.rows();
            // SAFETY: `matmul_on` checked that this CPU has the features `kernel` was built for.
            unsafe { (self.kernel)(&a_z[ip * MR * k..][..rows * k], b_panels, k, block) };
        } else {
            let mut a_scratch = take_scratch(&A_PANEL, k * MR);
            let a_panel = &mut a_scratch[..k * MR];
            pack_a_panel::<MR>(a_z, self.d, ip, a_panel);
            // SAFETY: as above.
            unsafe { (self.kernel)(a_panel, b_panels, k, block) };
            put_scratch(&A_PANEL, a_scratch);
        }
    }
}

/// [`product`] for few row panels: each task takes a block of columns of one batch entry,
/// packs B's panels for them alone (they stay in its core's cache) and runs every row panel
/// against them. Splitting by row panels alone, the MNIST MLP's [128, 784] x [784, 512] gave
/// its two threads 6 and 5 panels of 12 rows; by column blocks, paired medians of alternating
/// blocks of calls in one process were +19% for it, +12% for [128, 512] x [512, 256] and
/// +15% for the input gradient [128, 256] x [512, 256]ᵀ (docs/benchmarks.md, session 16).
fn column_blocks<const MR: usize, const NR: usize>(
    kernel: &RowPanel<MR, NR>,
    b: &[f32],
    c: &mut [MaybeUninit<f32>],
    threads: usize,
    finish: &(impl Fn(usize, usize, &mut [f32]) + Sync),
) {
    let d = kernel.d;
    let (m, n, k) = (d.m, d.n, d.k);
    let panels = n.div_ceil(NR);
    let per_block = panels.div_ceil(panels.min(COLUMN_BLOCKS_PER_THREAD * threads));
    let blocks = panels.div_ceil(per_block);
    let output = SharedOutput::new(c, n);
    for_each_index(d.batch * blocks, |task| {
        let (z, first_panel) = (task / blocks, task % blocks * per_block);
        let block_panels = per_block.min(panels - first_panel);
        let cols = first_panel * NR..n.min((first_panel + block_panels) * NR);
        let mut b_scratch = take_scratch(&B_PACKED, block_panels * k * NR);
        let b_block = &mut b_scratch[..block_panels * k * NR];
        let b_z = &b[if d.b_batched { z * k * n } else { 0 }..][..k * n];
        for (p, panel) in b_block.chunks_exact_mut(k * NR).enumerate() {
            pack_b_panel::<NR>(b_z, d, first_panel + p, panel);
        }
        for ip in 0..m.div_ceil(MR) {
            let rows = z * m + ip * MR..z * m + m.min((ip + 1) * MR);
            // SAFETY: each task has its own (entry, column block), and each of its blocks its
            // own rows: no two blocks share a value.
            let mut block = unsafe { output.block(rows.clone(), cols.clone()) };
            kernel.run(z, ip, b_block, &mut block);
            widest(
                #[inline(always)]
                || {
                    for i in 0..block.rows() {
                        // SAFETY: the panel kernel wrote every value of the block.
                        let row = unsafe { assume_written(block.row(i)) };
                        finish(rows.start + i, cols.start, row);
                    }
                },
            );
        }
        put_scratch(&B_PACKED, b_scratch);
    });
}

/// `finish` on each `n`-long row of `c_rows`, which are C's from row `first` on, compiled
/// for the widest vector unit.
#[inline(always)]
fn finish_rows(
    c_rows: &mut [f32],
    first: usize,
    n: usize,
    finish: &(impl Fn(usize, usize, &mut [f32]) + Sync),
) {
    widest(
        #[inline(always)]
        || {
            for (i, row) in c_rows.chunks_exact_mut(n).enumerate() {
                finish(first + i, 0, row);
            }
        },
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

/// Every tile of one row panel's block of columns (see [`PanelKernel`]).
#[inline(always)]
fn panel_tiles<const MR: usize, const NR: usize>(
    a_panel: &[f32],
    b_panels: &[f32],
    k: usize,
    c: &mut Block,
    tile_of: impl Fn(&[f32], &[f32]) -> [[f32; NR]; MR],
) {
    let (rows, block_cols) = (c.rows(), c.cols());
    // The column panels cover the block's columns and a tile's rows cover the panel's
    // `rows`: every value of the block is written.
    assert_eq!(
        b_panels.len(),
        block_cols.div_ceil(NR) * k * NR,
        "B's panels and C's block differ"
    );
    for (jp, b_panel) in b_panels.chunks_exact(k * NR).enumerate() {
        let tile = tile_of(a_panel, b_panel);
        let (j0, cols) = (jp * NR, NR.min(block_cols - jp * NR));
        for (i, tile_row) in tile.iter().enumerate().take(rows) {
            let row = c.row(i);
            // A whole tile row's length is known at compile time (see `pack_a_panel`).
            if cols == NR {
                write_slice(&mut row[j0..][..NR], tile_row);
            } else {
                write_slice(&mut row[j0..][..cols], &tile_row[..cols]);
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
