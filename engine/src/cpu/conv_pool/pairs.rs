//! [`super`]'s loops for the pooling every layer of a small CNN uses, windows of 2 x 2 every 2
//! pixels, on AVX-512. The forward pass keeps each window's four convolution values in
//! registers and pools them there: the convolution's output never reaches memory, and pixels
//! in no window are not computed. The weight's gradient takes, for each window and each of
//! its two rows, one term a channel: the winner's column value times the window's gradient
//! where the winner lies in that row, nothing elsewhere. With any pooling, the convolution's
//! output gradient is the window's gradient at the winner and 0 at the window's three other
//! pixels, whose terms (a finite column value times 0, ±0) change no sum from +0; so the
//! terms left are [`super`]'s pixel by pixel, in the same order, and the bits are the same.
//!
//! Written in intrinsics: in portable arrays, the compiler turned the lanes' selections
//! into gathers and 8-lane halves with spills (the `c1back` probe took 3.7-5.0 ms, against
//! 0.40 ms pixel by pixel). For the CNN's first layer on a 2-core AVX-512 EPYC (session 21,
//! probes `c1f` and `c1back`, best of several 0.3 s runs): the forward pass went from 0.36 ms
//! (the convolution an image at a time into scratch, then `max_pool_row`) to 0.146-0.148 ms;
//! the parameter gradients from 0.40 ms (each image's output gradient unpooled into scratch
//! by both threads, then a term per pixel) to 0.26-0.27 ms, the bias's sums in the same pass
//! (0.28-0.31 ms in a pass of their own).

use super::LANES;
use crate::cpu::gemm::Isa;
use crate::kernels::column_sums::ColumnSums;
use crate::kernels::conv_geometry::ConvGeometry;
use crate::kernels::pool::PoolGeometry;

use super::super::padded_image::PaddedImage;

/// Whether these loops take `pool`: 2 x 2 windows every 2 pixels, on a CPU with AVX-512.
pub(super) fn applies(pool: &PoolGeometry) -> bool {
    pool.k == 2 && pool.stride == 2 && Isa::detect() == Isa::Avx512
}

/// Each lane's index, to make a lane's flat index from its block's first.
const IOTA: [u32; LANES] = {
    let mut lanes = [0; LANES];
    let mut l = 0;
    while l < LANES {
        lanes[l] = l as u32;
        l += 1;
    }
    lanes
};

/// Windows pooled side by side: their 16 sums fill half of AVX-512's registers.
const WINDOWS: usize = 4;

/// Where a group of windows lies: image `n`, pooled row `ph`, first pooled column `pw`,
/// channel block `b`.
#[derive(Clone, Copy)]
struct Place {
    n: usize,
    ph: usize,
    pw: usize,
    b: usize,
}

/// The flat index of the first channel of block `b` at pixel `(oh, ow)` of image `n` of the
/// convolution's output, as the winners hold it.
#[inline(always)]
fn pixel_index(pool: &PoolGeometry, n: usize, (oh, ow): (usize, usize), b: usize) -> u32 {
    (((n * pool.h + oh) * pool.w + ow) * pool.c + b * LANES) as u32
}

/// Image `n`'s pooled output `y` and winners `at` (each `[ph, pw, oc]`), from its padded
/// input `image` and the weight's and bias's blocks (`super::weight_blocks`); [`applies`]
/// must hold.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_image(
    image: &PaddedImage,
    weight: &[[f32; LANES]],
    bias: &[[f32; LANES]],
    g: &ConvGeometry,
    pool: &PoolGeometry,
    n: usize,
    y: &mut [f32],
    at: &mut [u32],
) {
    assert!(applies(pool) && (pool.n, pool.h, pool.w) == (g.n, g.out_h(), g.out_w()));
    let pooled = pool.out_h() * pool.out_w() * pool.c;
    assert!(n < g.n && y.len() == pooled && at.len() == pooled);
    for (b, block) in weight.chunks_exact(g.patch()).enumerate() {
        let bias = bias.get(b);
        for ph in 0..pool.out_h() {
            // Where each of the window row's two convolution rows has its windows start
            // (every window of both checked), and the step from one pixel's to the next.
            let ((first, step), (second, _)) = (
                image.row_of_windows(g, 2 * ph),
                image.row_of_windows(g, 2 * ph + 1),
            );
            let rows = [first, second];
            let mut pw = 0;
            while pw < pool.out_w() {
                let count = WINDOWS.min(pool.out_w() - pw);
                let place = Place { n, ph, pw, b };
                // The count, and a step of one value (one channel at stride 1), as constants:
                // the sums stay in registers, and a row's loads are one address plus
                // constants.
                macro_rules! windows {
                    ($unit:literal, $($w:literal)*) => {
                        match count {
                            // SAFETY: `applies` checked for AVX-512; the rows' windows were
                            // checked by `row_of_windows`, and `y` and `at` hold the image.
                            $(#[cfg(target_arch = "x86_64")]
                            $w => unsafe {
                                x86::pool_windows::<$w, $unit>(
                                    image, block, bias, pool, place, rows, step, y, at,
                                )
                            },)*
                            _ => unreachable!("1 to WINDOWS windows"),
                        }
                    };
                }
                if step == 1 {
                    windows!(true, 1 2 3 4)
                } else {
                    windows!(false, 1 2 3 4)
                }
                pw += count;
            }
        }
    }
}

/// `acc[r] += column value * dh` over image `n`'s pixels in ascending order, for block `b` and
/// the `R` weight rows whose columns read the padded image at `offsets` from each pixel's
/// window, `dh` the convolution's output gradient: a term per window row, the winner's, in
/// each lane whose winner lies in the row (see the module's note). With `bias`, also the
/// bias's running sums for the pixels whose index modulo [`ColumnSums::round`] lies in its
/// residues: each adds the window's gradient in the lanes it won. [`applies`] must hold.
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate<const R: usize>(
    image: &PaddedImage,
    g: &ConvGeometry,
    pool: &PoolGeometry,
    argmax: &[u32],
    dy: &[f32],
    (n, b): (usize, usize),
    acc: &mut [[f32; LANES]; R],
    offsets: &[usize; R],
    bias: Option<(&mut ColumnSums, &std::ops::Range<usize>)>,
) {
    assert!(bias
        .as_ref()
        .is_none_or(|(sums, _)| sums.round().is_power_of_two()));
    assert!(applies(pool) && (pool.n, pool.h, pool.w) == (g.n, g.out_h(), g.out_w()));
    assert!(n < g.n && b * LANES < pool.c);
    let len = pool.out_shape().iter().product::<usize>();
    assert!(argmax.len() == len && dy.len() == len);
    // SAFETY: `applies` checked for AVX-512, `offsets` are the image's, and the windows' lanes
    // lie in `argmax` and `dy` (asserted); the kernel checks each row's windows.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        x86::accumulate(image, g, pool, argmax, dy, (n, b), acc, offsets, bias)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "`applies` is false without AVX-512: {:?}",
        (n, b, acc.len(), offsets.len(), bias.is_some())
    )
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{pixel_index, Place, IOTA, LANES};
    use crate::cpu::vector_unit::first_lanes;
    use crate::kernels::column_sums::ColumnSums;
    use crate::kernels::conv_geometry::ConvGeometry;
    use crate::kernels::pool::PoolGeometry;

    use super::super::super::padded_image::PaddedImage;

    /// The lanes of block `b` that hold channels: all 16 but in a last partial block.
    #[inline(always)]
    fn lanes_of(pool: &PoolGeometry, b: usize) -> __mmask16 {
        first_lanes(pool.c - b * LANES)
    }

    /// `W` windows from `place`: the convolution's four values of each (from 0, a
    /// separately rounded multiply and add per column in ascending order, then the bias),
    /// then their maximum in (kh, kw) order, the first taken as it is and each later one
    /// where it is larger (an ordered compare: a NaN never replaces), as `max_pool_row`
    /// takes them; stored with each winner's flat index in the convolution's output. `rows`
    /// are where the two convolution rows' windows start, `step` the step between windows,
    /// 1 when `UNIT`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; the windows read must have been checked by
    /// `row_of_windows`, and `y` and `at` must hold the image's pooled values.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn pool_windows<const W: usize, const UNIT: bool>(
        image: &PaddedImage,
        block: &[[f32; LANES]],
        bias: Option<&[f32; LANES]>,
        pool: &PoolGeometry,
        Place { n, ph, pw, b }: Place,
        rows: [usize; 2],
        step: usize,
        y: &mut [f32],
        at: &mut [u32],
    ) {
        let step = if UNIT { 1 } else { step };
        // acc[q][r][kw]: window q's pixel in convolution row r, column kw.
        let mut acc = [[[_mm512_setzero_ps(); 2]; 2]; W];
        for (w, &offset) in block.iter().zip(&image.offsets) {
            // SAFETY: a whole array of LANES floats.
            let w = unsafe { _mm512_loadu_ps(w.as_ptr()) };
            for (r, &first) in rows.iter().enumerate() {
                let from = first + 2 * pw * step;
                for (q, window) in acc.iter_mut().enumerate() {
                    for (kw, acc) in window[r].iter_mut().enumerate() {
                        // SAFETY: a window of a row the caller checked.
                        let v = unsafe { image.at_unchecked(from + (2 * q + kw) * step, offset) };
                        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_set1_ps(v), w));
                    }
                }
            }
        }
        // SAFETY: a whole array of LANES floats or u32s.
        let (bias, iota) = unsafe {
            (
                bias.map(|bias| _mm512_loadu_ps(bias.as_ptr())),
                _mm512_loadu_si512(IOTA.as_ptr().cast()),
            )
        };
        let lanes = lanes_of(pool, b);
        for (q, window) in acc.iter().enumerate() {
            let ow = 2 * (pw + q);
            let index = |r: usize, kw: usize| {
                _mm512_set1_epi32(pixel_index(pool, n, (2 * ph + r, ow + kw), b) as i32)
            };
            let value = |r: usize, kw: usize| match bias {
                Some(bias) => _mm512_add_ps(window[r][kw], bias),
                None => window[r][kw],
            };
            let (mut best, mut winner) = (value(0, 0), index(0, 0));
            for (r, kw) in [(0, 1), (1, 0), (1, 1)] {
                let v = value(r, kw);
                let larger = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, best);
                best = _mm512_mask_blend_ps(larger, best, v);
                winner = _mm512_mask_blend_epi32(larger, winner, index(r, kw));
            }
            let out = ((ph * pool.out_w() + pw + q) * pool.c) + b * LANES;
            assert!(out + lanes.count_ones() as usize <= y.len().min(at.len()));
            // SAFETY: the block's channels lie in `y` and `at` (asserted); the other lanes
            // are not written.
            unsafe {
                _mm512_mask_storeu_ps(y.as_mut_ptr().add(out), lanes, best);
                _mm512_mask_storeu_epi32(
                    at.as_mut_ptr().add(out).cast(),
                    lanes,
                    _mm512_add_epi32(winner, iota),
                );
            }
        }
    }

    /// Window `(ph, pw)` of image `n`, block `b`: each lane's winner less its lane (the
    /// winning pixel's first index, whichever lane won), and its gradient; lanes past the
    /// block's channels are 0 in both.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, and the block's lanes of the window must lie in `argmax`
    /// and `dy`.
    #[inline(always)]
    unsafe fn window(
        argmax: &[u32],
        dy: &[f32],
        pool: &PoolGeometry,
        Place { n, ph, pw, b }: Place,
        iota: __m512i,
    ) -> (__m512i, __m512) {
        let lanes = lanes_of(pool, b);
        let window = ((n * pool.out_h() + ph) * pool.out_w() + pw) * pool.c + b * LANES;
        // SAFETY: the caller's; the other lanes are not read.
        let (winners, grads) = unsafe {
            (
                _mm512_maskz_loadu_epi32(lanes, argmax.as_ptr().add(window).cast()),
                _mm512_maskz_loadu_ps(lanes, dy.as_ptr().add(window)),
            )
        };
        (_mm512_sub_epi32(winners, iota), grads)
    }

    /// [`super::accumulate`].
    ///
    /// Each convolution row's windows are checked (`row_of_windows`) before they are read.
    ///
    /// # Safety
    /// As [`super::accumulate`] checks: AVX-512F, `offsets` the image's, and the windows'
    /// lanes in `argmax` and `dy`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn accumulate<const R: usize>(
        image: &PaddedImage,
        g: &ConvGeometry,
        pool: &PoolGeometry,
        argmax: &[u32],
        dy: &[f32],
        (n, b): (usize, usize),
        acc: &mut [[f32; LANES]; R],
        offsets: &[usize; R],
        mut bias: Option<(&mut ColumnSums, &std::ops::Range<usize>)>,
    ) {
        let lanes = lanes_of(pool, b);
        // SAFETY: whole arrays of LANES floats or u32s.
        let (mut sums, iota) = unsafe {
            (
                acc.map(|a| _mm512_loadu_ps(a.as_ptr())),
                _mm512_loadu_si512(IOTA.as_ptr().cast()),
            )
        };
        for ph in 0..pool.out_h() {
            for oh in [2 * ph, 2 * ph + 1] {
                let (first, step) = image.row_of_windows(g, oh);
                for pw in 0..pool.out_w() {
                    // SAFETY: the caller's.
                    let (winning, grads) =
                        unsafe { window(argmax, dy, pool, Place { n, ph, pw, b }, iota) };
                    let left = pixel_index(pool, n, (oh, 2 * pw), b);
                    let right = left.wrapping_add(pool.c as u32);
                    let won_left = _mm512_cmpeq_epi32_mask(winning, _mm512_set1_epi32(left as i32));
                    let won_right =
                        _mm512_cmpeq_epi32_mask(winning, _mm512_set1_epi32(right as i32));
                    let won = lanes & (won_left | won_right);
                    if let Some((bias, residues)) = bias.as_mut() {
                        let below_round = bias.round() - 1;
                        for (ow, won) in [(2 * pw, won_left), (2 * pw + 1, won_right)] {
                            let j = (n * pool.h + oh) * pool.w + ow;
                            if residues.contains(&(j & below_round)) {
                                let lane = bias.lane_of(j)[b * LANES..].as_mut_ptr();
                                // SAFETY: the block's channels of the running sums; the other
                                // lanes are neither read nor written. Lanes this pixel did
                                // not win add nothing (their 0 would change no sum).
                                unsafe {
                                    let s = _mm512_maskz_loadu_ps(lanes, lane);
                                    let s = _mm512_mask_add_ps(s, won, s, grads);
                                    _mm512_mask_storeu_ps(lane, lanes, s);
                                }
                            }
                        }
                    }
                    let at = first + 2 * pw * step;
                    for (sum, &offset) in sums.iter_mut().zip(offsets) {
                        // SAFETY: windows of a row the caller checked, at one of its offsets.
                        let (v_left, v_right) = unsafe {
                            (
                                image.at_unchecked(at, offset),
                                image.at_unchecked(at + step, offset),
                            )
                        };
                        let v = _mm512_mask_blend_ps(
                            won_right,
                            _mm512_set1_ps(v_left),
                            _mm512_set1_ps(v_right),
                        );
                        // The lanes whose winner lies elsewhere keep their sums: their terms
                        // would be ±0.
                        *sum = _mm512_mask_add_ps(*sum, won, *sum, _mm512_mul_ps(v, grads));
                    }
                }
            }
        }
        for (a, s) in acc.iter_mut().zip(sums) {
            // SAFETY: a whole array of LANES floats.
            unsafe { _mm512_storeu_ps(a.as_mut_ptr(), s) };
        }
    }
}
