//! The input gradient of a convolution of stride 1, `col2im(dy weightᵀ)`, as one pass over
//! its output gradient padded with zeros: each input pixel's channels sum, from 0 and in
//! (kh, kw) order, the column values that `dy weightᵀ` would give its window offsets, each
//! computed in registers from 0 over the output channels in ascending order, as the product
//! computes it. The columns never go to memory.
//!
//! col2im leaves out the window offsets that fall on padding; here they are summed from the
//! padded gradient's zeros, and come to +0 (every product `0 * w` is ±0 for a finite weight,
//! and a sum from +0 of ±0 terms is +0). Adding +0 changes no sum from +0 (none is ever -0),
//! so the bits are col2im's. A weight with an infinity or a NaN makes `0 * w` a NaN: the
//! caller takes the two steps then (`cpu::conv::input_gradient`).
//!
//! For the CNN's second layer (128 images of 14 x 14 x 16 from 32 channels), the product
//! wrote each image's 196 x 144 columns and col2im read them back: 0.71 ms and 0.14 ms on a
//! 2-core AVX-512 EPYC (`ig` probe, session 20); this pass takes 0.60 ms.

use super::gemm::Isa;
use super::output::zeroed_par_chunks_with;
use crate::kernels::conv_geometry::ConvGeometry;

/// Channels summed at once: one AVX-512 vector, in arrays the compiler keeps in registers.
const LANES: usize = 16;

/// Input pixels of a row summed side by side: eight chains of additions for each of the
/// window offset's sum and the pixel's, 16 of AVX-512's 32 registers.
const PIXELS: usize = 8;

/// Whether [`input_gradient`] can take `g` and this weight: stride 1, padding of at most the
/// window less one on each side, a finite weight, and a CPU with AVX-512, which the block
/// kernel is written for (in arrays and portable loops, the compiler turned the pixels' loads
/// into gathers: `ig` probe, 1.94 ms against the two steps' 0.86).
pub fn applies(g: &ConvGeometry, weight: &[f32]) -> bool {
    Isa::detect() == Isa::Avx512
        && g.stride == 1
        && g.pad < g.kh
        && g.pad < g.kw
        && weight.iter().all(|w| w.is_finite())
}

/// The gradient of the input `[n, h, w, c]` from `dy` (`[n * oh * ow, oc]`) and the weight
/// (`[kh*kw*c, oc]`), with `col2im(dy weightᵀ)`'s bits; `applies(g, weight)` must hold.
pub fn input_gradient(dy: &[f32], weight: &[f32], oc: usize, g: &ConvGeometry) -> Vec<f32> {
    assert!(applies(g, weight));
    let (out_h, out_w) = (g.out_h(), g.out_w());
    assert!(dy.len() == g.n * out_h * out_w * oc && weight.len() == g.patch() * oc);
    let blocks = g.c.div_ceil(LANES);
    // [kh * kw, blocks, oc] arrays of channels: window offset (kh, kw)'s weights for output
    // channel co, a block of input channels side by side; a last partial block padded with 0.
    let mut lanes = vec![[0.0f32; LANES]; g.kh * g.kw * blocks * oc];
    for (i, w_row) in weight.chunks_exact(oc).enumerate() {
        let (offset, ci) = (i / g.c, i % g.c);
        for (co, &w) in w_row.iter().enumerate() {
            lanes[(offset * blocks + ci / LANES) * oc + co][ci % LANES] = w;
        }
    }
    // The output gradient padded by the window less the padding on each side: input pixel
    // (ih, iw) reads offset (kh, kw) at padded pixel (ih + kh_max - 1 - kh, iw + ...).
    let (top, left) = (g.kh - 1 - g.pad, g.kw - 1 - g.pad);
    let (tall, wide) = (g.h + g.kh - 1, g.w + g.kw - 1);
    debug_assert!(top + out_h <= tall && left + out_w <= wide);
    let image = g.h * g.w * g.c;
    zeroed_par_chunks_with(
        g.n * image,
        image.max(1),
        || vec![0.0f32; tall * wide * oc],
        |padded, n, dx| {
            for oh in 0..out_h {
                let to = ((top + oh) * wide + left) * oc;
                let from = (n * out_h + oh) * out_w * oc;
                padded[to..][..out_w * oc].copy_from_slice(&dy[from..][..out_w * oc]);
            }
            let image = Image {
                padded,
                wide,
                oc,
                lanes: &lanes,
                blocks,
                g,
            };
            for (ih, row) in dx.chunks_exact_mut(g.w * g.c).enumerate() {
                image.row(ih, row);
            }
        },
    )
}

/// One image's padded output gradient and the weight's lanes.
struct Image<'a> {
    padded: &'a [f32],
    wide: usize,
    oc: usize,
    lanes: &'a [[f32; LANES]],
    blocks: usize,
    g: &'a ConvGeometry,
}

impl Image<'_> {
    /// Input row `ih`'s gradient into `row` (`w * c` values), [`PIXELS`] pixels at a time.
    #[inline(always)]
    fn row(&self, ih: usize, row: &mut [f32]) {
        let c = self.g.c;
        let mut iw = 0;
        while iw < self.g.w {
            let count = PIXELS.min(self.g.w - iw);
            for b in 0..self.blocks {
                // The count as a constant, so that the sums stay in registers.
                macro_rules! pixels {
                    ($($p:literal)*) => {
                        match count {
                            $($p => self.pixels::<$p>(ih, iw, b, &mut row[iw * c..][..$p * c]),)*
                            _ => unreachable!("1 to PIXELS pixels"),
                        }
                    };
                }
                pixels!(1 2 3 4 5 6 7 8);
            }
            iw += count;
        }
    }

    /// Block `b` of the channels of `P` input pixels from `(ih, iw)`, into `out` (`P * c`).
    #[inline(always)]
    fn pixels<const P: usize>(&self, ih: usize, iw: usize, b: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `applies` checked that this CPU has AVX-512F.
        unsafe {
            x86::pixels::<P>(self, ih, iw, b, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!(
            "`applies` is false without AVX-512: {ih} {iw} {b} {}",
            out.len()
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Image, LANES};
    use crate::cpu::vector_unit::first_lanes;

    /// [`Image::pixels`]: each offset's sums over the output channels in registers from 0,
    /// a separately rounded multiply and add a term, then added to the pixel's sums.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pixels<const P: usize>(
        image: &Image,
        ih: usize,
        iw: usize,
        b: usize,
        out: &mut [f32],
    ) {
        let (g, oc, wide) = (image.g, image.oc, image.wide);
        let width = LANES.min(g.c - b * LANES);
        assert!(ih < g.h && iw + P <= g.w && out.len() >= (P - 1) * g.c + b * LANES + width);
        let mut acc = [_mm512_setzero_ps(); P];
        for kh in 0..g.kh {
            for kw in 0..g.kw {
                // Input pixel iw + p reads this offset at padded pixel `at / oc + p`.
                let at = ((ih + g.kh - 1 - kh) * wide + iw + g.kw - 1 - kw) * oc;
                let reads = &image.padded[at..][..P * oc];
                let weights = &image.lanes[((kh * g.kw + kw) * image.blocks + b) * oc..][..oc];
                let mut term = [_mm512_setzero_ps(); P];
                for (co, w) in weights.iter().enumerate() {
                    // SAFETY: a whole array of LANES floats.
                    let w = unsafe { _mm512_loadu_ps(w.as_ptr()) };
                    for (p, t) in term.iter_mut().enumerate() {
                        // SAFETY: p * oc + co < P * oc, the length of `reads`.
                        let v = _mm512_set1_ps(unsafe { *reads.get_unchecked(p * oc + co) });
                        *t = _mm512_add_ps(*t, _mm512_mul_ps(v, w));
                    }
                }
                for (a, t) in acc.iter_mut().zip(term) {
                    *a = _mm512_add_ps(*a, t);
                }
            }
        }
        let mask = first_lanes(width);
        for (p, a) in acc.into_iter().enumerate() {
            // SAFETY: the pixel's block lies in `out` (asserted above); masked lanes are not
            // written.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(p * g.c + b * LANES), mask, a) };
        }
    }
}
