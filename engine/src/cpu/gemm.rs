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
use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::output::{assume_written, write_slice, Unwritten};
use super::vector_unit::widest;
use crate::kernels::matmul_dims::MatmulDims;

mod tall;

#[cfg(target_arch = "x86_64")]
use tall::{is_tall, tall};
pub use tall::{tall_continue, tall_continue_on};

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
    let len = d.batch * d.m * d.n;
    if len == 0 {
        return vec![];
    }
    if d.k == 0 {
        let mut c = vec![0.0f32; len];
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

/// Computes every tile of one row panel: the packed panel of A (`k` groups of `MR`), the
/// packed B (`k` rows of `NR` per column panel), `k`, `n`, and the panel's rows of C, each
/// of which it writes (never reads: C needs no zeros first, `cpu::output`).
/// Unsafe because the x86 variants need the CPU features `Isa::available` checks for.
type PanelKernel = unsafe fn(&[f32], &[f32], usize, usize, &mut [MaybeUninit<f32>]);

/// The panel kernel for the target's baseline instruction set.
///
/// # Safety
/// None needed: it is unsafe only to share the type of the x86 variants.
unsafe fn baseline<const FUSED: bool>(
    a: &[f32],
    b: &[f32],
    k: usize,
    n: usize,
    c: &mut [MaybeUninit<f32>],
) {
    panel_tiles::<4, 8>(a, b, k, n, c, micro_kernel::<4, 8, FUSED>)
}

/// The panel kernels for wider vectors, with the micro-kernel written in intrinsics: the
/// compiler vectorises the fused form of the portable micro-kernel well but spills the
/// unfused one to the stack (seen in a throwaway probe on a 2-core AVX-512 EPYC, not kept;
/// to see it again, call `micro_kernel` from the x86 panel functions).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use super::panel_tiles;

    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<const FUSED: bool>(
        a: &[f32],
        b: &[f32],
        k: usize,
        n: usize,
        c: &mut [MaybeUninit<f32>],
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
        c: &mut [MaybeUninit<f32>],
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
        c: &mut [MaybeUninit<f32>],
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
        c: &mut [MaybeUninit<f32>],
    ) {
        // SAFETY: the caller guarantees AVX2 and FMA.
        panel_tiles::<6, 16>(a, b, k, n, c, |a, b| unsafe { tile_avx2::<FUSED>(a, b, k) })
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
    c: &mut [MaybeUninit<f32>],
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
    let row_panel = |z: usize, ip: usize, c_rows: &mut [MaybeUninit<f32>]| {
        let a_z = &a[if d.a_batched { z * a_stride } else { 0 }..][..a_stride];
        let b_z = &b_packed[if d.b_batched { z * panels * k * NR } else { 0 }..][..panels * k * NR];
        if a_in_place {
            // The panel's rows of A as they are stored (`!trans_a`): `k` values per row.
            let rows = c_rows.len() / n;
            // SAFETY: `matmul_on` checked that this CPU has the features `kernel` was built for.
            unsafe { kernel(&a_z[ip * MR * k..][..rows * k], b_z, k, n, c_rows) };
            // SAFETY: the panel kernel wrote every value of the panel's rows.
            finish_rows(unsafe { assume_written(c_rows) }, n, finish);
            return;
        }
        let mut a_scratch = take_scratch(&A_PANEL, k * MR);
        let a_panel = &mut a_scratch[..k * MR];
        pack_a_panel::<MR>(a_z, d, ip, a_panel);
        // SAFETY: `matmul_on` checked that this CPU has the features `kernel` was built for.
        unsafe { kernel(a_panel, b_z, k, n, c_rows) };
        put_scratch(&A_PANEL, a_scratch);
        // SAFETY: the panel kernel wrote every value of the panel's rows.
        finish_rows(unsafe { assume_written(c_rows) }, n, finish);
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
    c_rows: &mut [MaybeUninit<f32>],
    tile_of: impl Fn(&[f32], &[f32]) -> [[f32; NR]; MR],
) {
    let rows = c_rows.len() / n;
    // The column panels cover `n` (B is packed whole) and a tile's rows cover the panel's
    // `rows`: every value of `c_rows` is written.
    for (jp, b_panel) in b_packed.chunks_exact(k * NR).enumerate() {
        let tile = tile_of(a_panel, b_panel);
        let (j0, cols) = (jp * NR, NR.min(n - jp * NR));
        for (i, tile_row) in tile.iter().enumerate().take(rows) {
            // A whole tile row's length is known at compile time (see `pack_a_panel`).
            if cols == NR {
                write_slice(&mut c_rows[i * n + j0..][..NR], tile_row);
            } else {
                write_slice(&mut c_rows[i * n + j0..][..cols], &tile_row[..cols]);
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
