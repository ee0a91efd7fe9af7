//! Deterministic transcendental functions and reduction orders shared by the CPU references
//! and the WGSL kernels (`shaders/common/math.wgsl` mirrors this file line for line).
//!
//! With these, and with every reference summing in the order its kernel does, the CPU and a
//! GPU that evaluates `a * b + c` (and `fma`) as a rounded product plus a rounded sum, as
//! lavapipe does, produce the same bits: the spine's MLP trains identically on both
//! (engine/tests/mnist_training.rs). Drivers that fuse multiply-adds differ in the last bits.

const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);

#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `v` truncated toward zero, for `v` inside ±2^30 (exp's arguments are within ±150 here;
/// anything outside, NaN included, is held at the nearest end first). `as i32` saturates and
/// maps NaN to 0, which no x86 vector instruction does: the compiler converted lane by lane,
/// 16 scalar `cvttss2si` with their overflow and NaN fix-ups per AVX-512 vector of the CPU
/// path's exp loop (seen in objdump). Held in range, the plain truncation is one
/// `vcvttps2dq`, and the value is the same.
#[inline(always)]
fn truncate_small(v: f32) -> i32 {
    const LIMIT: f32 = (1u32 << 30) as f32;
    // `max` and `min` return the other operand for NaN, so `held` is a number (`clamp` would
    // keep the NaN).
    #[allow(clippy::manual_clamp)]
    let held = v.max(-LIMIT).min(LIMIT);
    // SAFETY: `held` is finite and within i32's range.
    unsafe { held.to_int_unchecked::<i32>() }
}

/// `v.floor()` for |v| < 2^30, in arithmetic every x86-64 vector unit has: truncate, then
/// step down where that rounded a negative value up. `f32::floor` is a call into libm on
/// x86-64's baseline (SSE2 has no rounding instruction): `floorf` took 1.4–1.8% of a GPT step
/// on the CPU path, inside the loops around `exp`. Same value as `floor` in this range,
/// except that -0.0 comes out +0.0, which `exp` only multiplies by ln 2 and subtracts from
/// `x` (its argument is never -0.0: it adds 0.5).
#[inline(always)]
fn floor_small(v: f32) -> f32 {
    let t = truncate_small(v) as f32;
    if t > v {
        t - 1.0
    } else {
        t
    }
}

/// Above this, e^x overflows to infinity; below the other, it underflows to 0.
const EXP_HIGH: f32 = f32::from_bits(0x42b1_7217);
const EXP_LOW: f32 = f32::from_bits(0xc2cf_f1b4);

/// e^x for `x` inside the finite range, `k` = floor(x / ln 2 + 1/2): e^r for the reduced
/// r = x - k ln 2 by its polynomial, times 2^k in two halves (2^k alone may not be normal).
#[inline(always)]
fn exp_reduced(x: f32, k: f32) -> f32 {
    exp_scaled(exp_polynomial(exp_reduce(x, k)), k)
}

/// r = x - k ln 2, in two steps (ln 2's high part is exact in a product with `k`).
#[inline(always)]
fn exp_reduce(x: f32, k: f32) -> f32 {
    let mut r = x - k * LN2_HI;
    r -= k * LN2_LO;
    r
}

/// e^r for the reduced `r`, by Horner's rule.
#[inline(always)]
fn exp_polynomial(r: f32) -> f32 {
    let mut p = f32::from_bits(0x3950_0d01);
    p = p * r + f32::from_bits(0x3ab6_0b61);
    p = p * r + f32::from_bits(0x3c08_8889);
    p = p * r + f32::from_bits(0x3d2a_aaab);
    p = p * r + f32::from_bits(0x3e2a_aaab);
    p = p * r + 0.5;
    p = p * r + 1.0;
    p * r + 1.0
}

/// `p` times 2^k, in two halves.
#[inline(always)]
fn exp_scaled(p: f32, k: f32) -> f32 {
    let ki = truncate_small(k);
    let k1 = ki / 2;
    p * pow2i(k1) * pow2i(ki - k1)
}

/// `x` held inside the finite range of e^x (0 below it, see [`exp`]), and its `k`.
#[inline(always)]
fn exp_held(x: f32) -> (f32, f32) {
    let held = if x < EXP_LOW { 0.0 } else { x.min(EXP_HIGH) };
    (held, floor_small(held * LOG2E + 0.5))
}

/// e^x's edge cases chosen after the polynomial: `e` is its value on the held `x`.
#[inline(always)]
fn exp_edges(x: f32, e: f32) -> f32 {
    let e = if x > EXP_HIGH { f32::INFINITY } else { e };
    let e = if x < EXP_LOW { 0.0 } else { e };
    if x.is_nan() {
        x
    } else {
        e
    }
}

/// Elements the CPU path's loops over many exps hand [`exp_block`] at a time: 128 took a GELU
/// of [64, 256] in 6.6 µs on one core (Zen 5), 64 in 7.8 and 256 in 6.9 µs.
pub const EXP_BLOCK: usize = 128;

/// [`exp`] of every element of `v`, in place, with its bits: the same steps for each element,
/// taken a stage at a time over the block (the argument's reduction, the polynomial, the
/// scaling and the edge cases).
///
/// Element by element, exp is a chain of about 30 dependent operations, and a loop of such
/// chains keeps only the few iterations that fit in the core's scheduler in flight. GELU on
/// [64, 256] (1,024 vectors of 16 lanes) took 10.3 µs on one Zen 5 core, and as long with
/// its division replaced by a product; a stage at a time, each loop's iterations are short
/// and independent and the core overlaps many: 6.6 µs (docs/benchmarks.md, session 22).
#[inline(always)]
pub fn exp_block<const N: usize>(v: &mut [f32; N]) {
    let mut k = [0.0f32; N];
    let mut r = [0.0f32; N];
    for ((&x, k), r) in v.iter().zip(&mut k).zip(&mut r) {
        let (held, kx) = exp_held(x);
        *k = kx;
        *r = exp_reduce(held, kx);
    }
    for r in &mut r {
        *r = exp_polynomial(*r);
    }
    for ((x, &k), &p) in v.iter_mut().zip(&k).zip(&r) {
        *x = exp_edges(*x, exp_scaled(p, k));
    }
}

/// [`exp`] of every element of `values`, in place: [`exp_block`] over blocks of
/// [`EXP_BLOCK`], and over 16-lane vectors for the rest (zeros padding the last), so that
/// a short slice does not pay for a whole block.
#[inline(always)]
pub fn exp_each(values: &mut [f32]) {
    const LANES: usize = 16;
    let mut blocks = values.chunks_exact_mut(EXP_BLOCK);
    for block in &mut blocks {
        exp_block::<EXP_BLOCK>(block.try_into().expect("a whole block"));
    }
    for rest in blocks.into_remainder().chunks_mut(LANES) {
        let mut padded = [0.0f32; LANES];
        padded[..rest.len()].copy_from_slice(rest);
        exp_block(&mut padded);
        rest.copy_from_slice(&padded[..rest.len()]);
    }
}

/// e^x, accurate to a few ulp, identical to `det_exp` in math.wgsl.
///
/// Without branches: the polynomial runs on `x` held inside the finite range and the edge
/// cases (NaN, overflow, underflow) are chosen after it, so that the CPU path's loops over
/// it (GELU, sigmoid, tanh, softmax) have no branch to mispredict: 12% off a GPT step on
/// 2 cores (docs/benchmarks.md). Compiled for AVX-512 or AVX2 (`cpu::vector_unit::widest`),
/// those loops run a vector of lanes at a time, now that the conversions to integers are
/// plain truncations (`truncate_small`). Inside the range the held `x` is `x`, so the
/// arithmetic and its bits are those of the early-return form (test).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Below EXP_LOW the result is +0 whatever the polynomial gives, so the polynomial runs
    // on 0 there, not on EXP_LOW: at EXP_LOW its last products are subnormal, and on Intel
    // every vector instruction with a subnormal result takes a microcode assist (a hundred
    // cycles or more). Causal attention pads its rows' last vector with -inf keys, so a
    // quarter of its vectors paid it: a throwaway `perf record` of the CPU path's attention
    // weights put 26% of their samples on the instruction after those products. NaN runs
    // the polynomial on EXP_HIGH (`min` returns the number) and comes out as itself below.
    let (held, k) = exp_held(x);
    exp_edges(x, exp_reduced(held, k))
}

/// e^x - 1, identical to `det_expm1`.
#[inline(always)]
pub fn expm1(x: f32) -> f32 {
    if x.abs() >= 0.5 {
        return exp(x) - 1.0;
    }
    let mut p = f32::from_bits(0x3638_ef1d);
    p = p * x + f32::from_bits(0x37d0_0d01);
    p = p * x + f32::from_bits(0x3950_0d01);
    p = p * x + f32::from_bits(0x3ab6_0b61);
    p = p * x + f32::from_bits(0x3c08_8889);
    p = p * x + f32::from_bits(0x3d2a_aaab);
    p = p * x + f32::from_bits(0x3e2a_aaab);
    p = p * x + 0.5;
    p = p * x + 1.0;
    p * x
}

/// Natural logarithm, identical to `det_log`.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    let mut v = x;
    let mut e = 0i32;
    if v < f32::MIN_POSITIVE {
        v *= 8_388_608.0;
        e = -23;
    }
    let bits = v.to_bits();
    e += ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > f32::from_bits(0x3fb5_04f3) {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut q = f32::from_bits(0x3dba_2e8c);
    q = q * z + f32::from_bits(0x3de3_8e39);
    q = q * z + f32::from_bits(0x3e12_4925);
    q = q * z + f32::from_bits(0x3e4c_cccd);
    q = q * z + f32::from_bits(0x3eaa_aaab);
    let log_m = 2.0 * s + 2.0 * s * (z * q);
    let ef = e as f32;
    ef * LN2_HI + (ef * LN2_LO + log_m)
}

/// Hyperbolic tangent, identical to `det_tanh`.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs().min(15.0);
    let t = expm1(2.0 * a);
    let y = t / (t + 2.0);
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// Logistic function, identical to `det_sigmoid`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// [`sigmoid`] of every element of `v`, in place, with its bits: the exps a stage at a time
/// ([`exp_block`]).
#[inline(always)]
pub fn sigmoid_block<const N: usize>(v: &mut [f32; N]) {
    for x in v.iter_mut() {
        *x = -*x;
    }
    exp_block(v);
    for e in v.iter_mut() {
        *e = 1.0 / (1.0 + *e);
    }
}

/// Invocations per row in the row-reduction kernels (`ROW_LANES` in shaders/common/rows.wgsl).
pub const ROW_LANES: usize = 64;

/// The sum a workgroup of `lanes` invocations computes: lane `t` adds elements `t`,
/// `t + lanes`, ... in order, then lanes combine as a binary tree (`lanes` a power of two).
pub fn workgroup_sum(values: impl Iterator<Item = f32>, lanes: usize) -> f32 {
    workgroup_fold(values, lanes, 0.0, |a, b| a + b)
}

/// [`workgroup_sum`] for any combining function with its identity. Up to 256 lanes live on
/// the stack: the CPU path folds every row of a layernorm or softmax with it, and a heap
/// allocation per row cost more than the row's arithmetic.
#[inline]
pub fn workgroup_fold(
    values: impl Iterator<Item = f32>,
    lanes: usize,
    identity: f32,
    combine: impl Fn(f32, f32) -> f32,
) -> f32 {
    const ON_STACK: usize = 256;
    let mut stack = [identity; ON_STACK];
    let mut heap = Vec::new();
    let partial: &mut [f32] = if lanes <= ON_STACK {
        &mut stack[..lanes]
    } else {
        heap.resize(lanes, identity);
        &mut heap
    };
    let mut lane = 0;
    for v in values {
        partial[lane] = combine(partial[lane], v);
        lane += 1;
        if lane == lanes {
            lane = 0;
        }
    }
    combine_as_tree(partial, combine)
}

/// [`workgroup_sum`] of a slice, in a form the compiler vectorises: lane `t` adds the `t`-th
/// element of each `lanes`-long chunk, chunk after chunk (the same order: elements `t`,
/// `t + lanes`, ...), then the tree. The CPU path's softmax rows use it. Always inlined, so
/// that it runs on the vector unit of the loop that calls it (`cpu::vector_unit::widest`).
#[inline(always)]
pub fn workgroup_sum_of(values: &[f32], lanes: usize) -> f32 {
    const ON_STACK: usize = 256;
    if lanes == ROW_LANES {
        return sum_in_lanes::<ROW_LANES>(values);
    }
    if lanes > ON_STACK {
        return workgroup_sum(values.iter().copied(), lanes);
    }
    let mut stack = [0.0f32; ON_STACK];
    let partial = &mut stack[..lanes];
    for chunk in values.chunks(lanes) {
        for (p, &v) in partial.iter_mut().zip(chunk) {
            *p += v;
        }
    }
    combine_as_tree(partial, |a, b| a + b)
}

/// [`workgroup_sum_of`] over a number of lanes known at compile time (the row kernels' 64): the
/// partial sums stay in vector registers, and a last chunk shorter than `L` is padded with
/// +0, which changes no partial sum (each starts at +0, and a sum is -0 only when both of its
/// terms are, so no partial sum is ever -0, and `p + 0` is `p` for every other value).
/// Before, a 256-float array was zeroed for every row, and a short row's lanes were a loop
/// of variable length.
#[inline(always)]
fn sum_in_lanes<const L: usize>(values: &[f32]) -> f32 {
    let mut partial = [0.0f32; L];
    partials_in_lanes(values, &mut partial);
    combine_as_tree(&mut partial, |a, b| a + b)
}

/// The `L` partial sums of [`sum_in_lanes`], before their tree, added into `partial` (+0
/// each). Written into the caller's array: returned, the array was copied with `memmove`.
#[inline(always)]
fn partials_in_lanes<const L: usize>(values: &[f32], partial: &mut [f32; L]) {
    let mut chunks = values.chunks_exact(L);
    for chunk in &mut chunks {
        for (p, &v) in partial.iter_mut().zip(chunk) {
            *p += v;
        }
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut padded = [0.0f32; L];
        for (p, &v) in padded.iter_mut().zip(rest) {
            *p = v;
        }
        for (p, &v) in partial.iter_mut().zip(&padded) {
            *p += v;
        }
    }
}

/// Rows whose sums [`sixteen_row_sums`] takes side by side.
pub const SIDE_BY_SIDE: usize = 16;

/// [`workgroup_sum_of`] over [`ROW_LANES`] lanes of 16 rows at once (`row(r)` for `r` below
/// 16), the same sums bit for bit. Each row's partial sums are `sum_in_lanes`' and the
/// tree's first two levels (widths 32 and 16) run in the row's own lanes; its last four
/// (widths 8 to 1) run across the rows, one row to a vector lane. A row at a time, those four
/// levels were a chain of shuffles across one vector's lanes (or of stores and loads through
/// the stack) with each row's next step waiting on them: a layer norm's rows of 64 took about
/// 190 cycles each (probe, Zen 5).
#[inline(always)]
pub fn sixteen_row_sums<'a>(row: impl Fn(usize) -> &'a [f32]) -> [f32; SIDE_BY_SIDE] {
    const N: usize = SIDE_BY_SIDE;
    // Loops over arrays, not `array::from_fn`: that was called out of line, for the
    // baseline's vector unit, with copies between its arrays.
    let mut halves = [[0.0f32; 16]; N];
    for (r, half) in halves.iter_mut().enumerate() {
        let mut p = [0.0f32; ROW_LANES];
        partials_in_lanes(row(r), &mut p);
        for (l, h) in half.iter_mut().enumerate() {
            *h = (p[l] + p[l + 32]) + (p[l + 16] + p[l + 48]);
        }
    }
    let mut eighths = [[0.0f32; N]; 8];
    for (l, eighth) in eighths.iter_mut().enumerate() {
        for (r, e) in eighth.iter_mut().enumerate() {
            *e = halves[r][l] + halves[r][l + 8];
        }
    }
    for width in [4, 2, 1] {
        let (low, high) = eighths.split_at_mut(width);
        for (a, b) in low.iter_mut().zip(&high[..width]) {
            for (a, &b) in a.iter_mut().zip(b) {
                *a += b;
            }
        }
    }
    eighths[0]
}

/// The last stage of a workgroup's fold: lanes combine pairwise, `t` with `t + width`, for
/// halving widths (`partial.len()` a power of two).
#[inline(always)]
pub(crate) fn combine_as_tree(partial: &mut [f32], combine: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = partial.len() / 2;
    while width > 0 {
        let (low, high) = partial.split_at_mut(width);
        for (a, &b) in low.iter_mut().zip(&high[..width]) {
            *a = combine(*a, b);
        }
        width /= 2;
    }
    partial[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of every length class (shorter than the 64 lanes, a whole chunk, past it, several
    /// chunks), with -0.0, infinities and NaN among them: each of the 16 sums is the bits of
    /// `workgroup_sum_of` on its row.
    #[test]
    fn sixteen_row_sums_are_workgroup_sums() {
        for cols in [1, 5, 33, 64, 65, 128, 300] {
            let mut x: Vec<f32> = (0..SIDE_BY_SIDE * cols)
                .map(|i| ((i * 7919 % 1999) as f32 - 999.0) * 0.013 + (i / cols) as f32)
                .collect();
            // Row 1 all -0.0 (its sum is +0 only through the lanes' +0 start), row 2 with
            // an infinity, row 3 with a NaN, row 4 with opposite infinities.
            x[cols..2 * cols].fill(-0.0);
            x[2 * cols + cols / 2] = f32::INFINITY;
            x[3 * cols] = f32::NAN;
            x[4 * cols] = f32::INFINITY;
            x[5 * cols - 1] = f32::NEG_INFINITY;
            let got = sixteen_row_sums(|r| &x[r * cols..][..cols]);
            for (r, got) in got.iter().enumerate() {
                let want = workgroup_sum_of(&x[r * cols..][..cols], ROW_LANES);
                assert_eq!(got.to_bits(), want.to_bits(), "[16, {cols}] row {r}");
            }
        }
    }

    /// `exp` as it was written before it lost its branches (and as math.wgsl still is), with
    /// libm's floor.
    fn exp_with_early_returns(x: f32) -> f32 {
        if x.is_nan() {
            return x;
        }
        if x > EXP_HIGH {
            return f32::INFINITY;
        }
        if x < EXP_LOW {
            return 0.0;
        }
        exp_reduced(x, (x * LOG2E + 0.5).floor())
    }

    /// exp's edges and every 3001st f32.
    fn exp_arguments() -> impl Iterator<Item = f32> {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            EXP_HIGH,
            EXP_LOW,
            f32::from_bits(1),
        ];
        let sweep = (0..u32::MAX / 3001).map(|i| f32::from_bits(i * 3001));
        specials.into_iter().chain(sweep)
    }

    #[test]
    fn branch_free_exp_gives_the_early_return_forms_bits() {
        for x in exp_arguments() {
            let (got, want) = (exp(x), exp_with_early_returns(x));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "exp({x:e}): {got:e} against {want:e}"
            );
        }
    }

    #[test]
    fn the_staged_exp_gives_exps_bits() {
        // The sweep of the test above, a block at a time, on the vector unit the CPU path runs
        // it on (where the compiler vectorises the stages) and as plain code.
        let values: Vec<f32> = exp_arguments().collect();
        let same = |got: f32, want: f32| {
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
        };
        for block in values.chunks(EXP_BLOCK) {
            let mut padded = [1.5f32; EXP_BLOCK];
            padded[..block.len()].copy_from_slice(block);
            let (mut plain, mut widest) = (padded, padded);
            exp_block(&mut plain);
            crate::cpu::vector_unit::widest(
                #[inline(always)]
                || exp_block(&mut widest),
            );
            // And through `exp_each` at every length up to a block (whole vectors, a
            // padded rest).
            let mut each = padded;
            exp_each(&mut each[..block.len()]);
            assert!(
                block.iter().zip(&each).all(|(&x, &e)| same(e, exp(x))),
                "exp_each"
            );
            for ((&x, &p), &w) in padded.iter().zip(&plain).zip(&widest) {
                assert!(
                    same(p, exp(x)),
                    "exp_block({x:e}): {p:e} against {:e}",
                    exp(x)
                );
                assert!(
                    same(w, exp(x)),
                    "widest exp_block({x:e}): {w:e} against {:e}",
                    exp(x)
                );
            }
        }
    }

    #[test]
    fn floor_small_is_floor_over_exps_range() {
        // Every 997th f32 from -160 to 160, integers and their neighbours among them.
        let mut checked = 0;
        for bits in (0..0x4320_0000u32)
            .step_by(997)
            .chain(0x3f7f_fff0..0x3f80_0010)
        {
            for v in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if v == 0.0 {
                    continue;
                }
                assert_eq!(floor_small(v).to_bits(), v.floor().to_bits(), "at {v:e}");
                checked += 1;
            }
        }
        for n in (-160..=160).filter(|n| *n != 0) {
            let v = n as f32;
            for w in [
                v,
                f32::from_bits(v.to_bits() + 1),
                f32::from_bits(v.to_bits() - 1),
            ] {
                if w != 0.0 {
                    assert_eq!(floor_small(w).to_bits(), w.floor().to_bits(), "at {w:e}");
                }
            }
        }
        assert!(checked > 2_000_000);
    }

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_and_log_are_accurate_to_a_few_ulp() {
        let mut worst = (0u32, 0u32);
        let mut x = -87.0f32;
        while x < 88.0 {
            worst.0 = worst.0.max(ulps(exp(x), (x as f64).exp() as f32));
            x += 0.0137;
        }
        let mut y = 1e-30f32;
        while y < 1e30 {
            worst.1 = worst.1.max(ulps(ln(y), (y as f64).ln() as f32));
            y *= 1.37;
        }
        assert!(
            worst.0 <= 2 && worst.1 <= 2,
            "exp {} ulp, ln {} ulp",
            worst.0,
            worst.1
        );
    }

    #[test]
    fn special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-100.0) > 0.0, "subnormal results survive");
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert!(ln(-1.0).is_nan());
        assert!(
            (ln(1e-40) - (1e-40f64).ln() as f32).abs() < 1e-4,
            "subnormal input"
        );
        assert_eq!(tanh(1e4), 1.0);
        assert_eq!(tanh(-1e4), -1.0);
        assert!((tanh(1e-6) - 1e-6).abs() < 1e-12, "no cancellation near 0");
        assert!((expm1(1e-7) - 1e-7).abs() < 1e-13);
        assert_eq!(sigmoid(-200.0), 0.0);
    }

    #[test]
    fn the_slice_sum_is_the_workgroup_sum() {
        // Values whose sum depends on the order: large and small magnitudes mixed.
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * if i % 3 == 0 { 1e6 } else { 1e-3 })
            .collect();
        for len in [0, 1, 2, 31, 63, 64, 65, 127, 128, 200, 1000] {
            for lanes in [1, 2, 64, 256, 512] {
                let row = &values[..len];
                let (got, want) = (
                    workgroup_sum_of(row, lanes),
                    workgroup_sum(row.iter().copied(), lanes),
                );
                assert_eq!(got.to_bits(), want.to_bits(), "len {len}, {lanes} lanes");
            }
        }
    }

    #[test]
    fn workgroup_sum_is_the_tree_order() {
        let v: Vec<f32> = (1..=10).map(|i| i as f32).collect();
        assert_eq!(workgroup_sum(v.iter().copied(), 4), 55.0);
        // The order is observable: lanes [1e8 - 1e8, 1 + 1] give 2, a running sum gives 1
        // (1e8 + 1 rounds back to 1e8).
        assert_eq!(workgroup_sum([1e8f32, 1.0, -1e8, 1.0].into_iter(), 2), 2.0);
        assert_eq!([1e8f32, 1.0, -1e8, 1.0].iter().sum::<f32>(), 1.0);
    }
}
