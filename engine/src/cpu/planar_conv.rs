//! The forward pass of a convolution of stride 1, straight from a channel-planar copy of each
//! padded image, on AVX-512: each output pixel's channels are summed from 0 over the window's
//! columns in im2col's order (kh, kw, then input channel), a separately rounded multiply and
//! add a term, then the bias added: the bits of the product of im2col's columns and the
//! weight, plus the bias, which is what `cpu::conv::forward` computes otherwise.
//!
//! In the image as it lies (`[h, w, c]`), the pixels of an output row read a window column's
//! value `c` floats apart, and a block kernel must keep an address per pixel or a stride it
//! cannot fold into its loads. A row of the planar copy holds each channel's pixels side by
//! side (`[h, c, w]`, padded), so the row's pixels read one address plus constants, and a
//! row of up to 14 pixels takes two blocks of 16 output channels in 28 registers.
//!
//! For the CNN's second layer (128 images of 14 x 14 x 16, 3 x 3, 32 outputs) on a 2-core
//! AVX-512 EPYC (session 21, `fwdonly` probe, best of seven 0.3 s runs, three alternating
//! rounds): 0.626-0.632 ms, against 0.728-0.743 for the strided product on the image as it
//! lies, and 0.55 for the packed product on im2col's columns already in memory. Making the copies is an eighth of
//! it (`perf record`); the block kernel's loop is the product's (28 multiplies, 28 adds and
//! 14 broadcast loads a column).

use super::gemm::Isa;
use super::output::zeroed_par_chunks_with;
use super::vector_unit::widest;
use crate::kernels::conv_geometry::ConvGeometry;

/// Output channels a vector holds.
const LANES: usize = 16;

/// Output pixels of a row summed at once: with two blocks of output channels, 28 of
/// AVX-512's 32 registers.
const PIXELS: usize = 14;

/// Whether [`forward`] can take `g`: stride 1, on a CPU with AVX-512, which the block kernel
/// is written for.
pub fn applies(g: &ConvGeometry) -> bool {
    Isa::detect() == Isa::Avx512 && g.stride == 1
}

/// One padded image with each row's channels one after the other: value `(ih, c, iw)` of
/// the padded image at `(ih * c_count + c) * wide + iw`.
struct Planar {
    values: Vec<f32>,
    wide: usize,
}

impl Planar {
    fn new(g: &ConvGeometry) -> Self {
        let wide = g.w + 2 * g.pad;
        Planar {
            values: vec![0.0; (g.h + 2 * g.pad) * g.c * wide],
            wide,
        }
    }

    /// Holds image `n` of `x` (`[n, h, w, c]`); the padding stays 0. Always inlined, to run
    /// on the caller's vector unit.
    #[inline(always)]
    fn load(&mut self, x: &[f32], g: &ConvGeometry, n: usize) {
        let row = g.w * g.c;
        for ih in 0..g.h {
            let pixels = &x[(n * g.h + ih) * row..][..row];
            let plane = &mut self.values[(ih + g.pad) * g.c * self.wide..][..g.c * self.wide];
            for (c, channel) in plane.chunks_exact_mut(self.wide).enumerate() {
                let column = pixels[c..].iter().step_by(g.c);
                for (v, &x) in channel[g.pad..][..g.w].iter_mut().zip(column) {
                    *v = x;
                }
            }
        }
    }
}

/// The convolution `[n * oh * ow, oc]` of `x` (`[n, h, w, c]`) with `weight`
/// (`[kh*kw*c, oc]`) plus `bias`: the bits of `im2col(x) weight + bias`; [`applies`] must
/// hold.
pub fn forward(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    oc: usize,
    g: &ConvGeometry,
) -> Vec<f32> {
    assert!(applies(g));
    let (out_h, out_w) = (g.out_h(), g.out_w());
    assert!(x.len() == g.n * g.h * g.w * g.c && weight.len() == g.patch() * oc);
    assert!(bias.is_none_or(|b| b.len() == oc));
    let pixels = out_h * out_w;
    // The bias in whole vectors, a last partial block padded with 0.
    let mut padded_bias = vec![0.0f32; oc.div_ceil(LANES) * LANES];
    if let Some(bias) = bias {
        padded_bias[..oc].copy_from_slice(bias);
    }
    zeroed_par_chunks_with(
        g.n * pixels * oc,
        (pixels * oc).max(1),
        || Planar::new(g),
        |planar, n, y| {
            widest(
                #[inline(always)]
                || planar.load(x, g, n),
            );
            let kernel = Kernel {
                planar,
                weight,
                bias: bias.map(|_| padded_bias.as_slice()),
                oc,
                g,
            };
            for (oh, row) in y.chunks_exact_mut(out_w * oc).enumerate() {
                kernel.row(oh, row);
            }
        },
    )
}

/// One image's planar copy and what every row of its output reads.
struct Kernel<'a> {
    planar: &'a Planar,
    weight: &'a [f32],
    bias: Option<&'a [f32]>,
    oc: usize,
    g: &'a ConvGeometry,
}

impl Kernel<'_> {
    /// Output row `oh` into `row` (`ow * oc` values): [`PIXELS`] pixels at a time, then fewer,
    /// two blocks of output channels at a time, then one.
    fn row(&self, oh: usize, row: &mut [f32]) {
        let out_w = self.g.out_w();
        let blocks = self.oc.div_ceil(LANES);
        let mut ow = 0;
        while ow < out_w {
            let count = [PIXELS, 8, 4, 2, 1]
                .into_iter()
                .find(|&p| p <= out_w - ow)
                .expect("1 fits");
            let mut b = 0;
            while b < blocks {
                let two = b + 1 < blocks;
                macro_rules! pixels {
                    ($($p:literal)*) => {
                        match (count, two) {
                            $(($p, true) => self.block::<$p, 2>(oh, ow, b, row),
                            ($p, false) => self.block::<$p, 1>(oh, ow, b, row),)*
                            _ => unreachable!("a count of the list above"),
                        }
                    };
                }
                pixels!(14 8 4 2 1);
                b += if two { 2 } else { 1 };
            }
            ow += count;
        }
    }

    /// `P` pixels from `(oh, ow)`, `B` blocks of output channels from block `b`, into `row`.
    #[inline(always)]
    fn block<const P: usize, const B: usize>(
        &self,
        oh: usize,
        ow: usize,
        b: usize,
        row: &mut [f32],
    ) {
        let (g, wide) = (self.g, self.planar.wide);
        assert!(
            ow + P <= g.out_w()
                && oh < g.out_h()
                && (b + B) * LANES <= self.oc.next_multiple_of(LANES)
        );
        assert!(row.len() == g.out_w() * self.oc);
        // The window rows' last value read lies in the copy.
        let last = ((oh + g.kh - 1) * g.c + g.c - 1) * wide + ow + P - 1 + g.kw - 1;
        assert!(last < self.planar.values.len());
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `applies` checked for AVX-512; the reads lie in the copy (asserted above,
        // the largest of them), in the weight's rows, and the writes in `row`'s pixels.
        unsafe {
            x86::block::<P, B>(self, oh, ow, b, row)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!(
            "`applies` is false without AVX-512: {oh} {ow} {b} {}",
            row.len()
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Kernel, LANES};
    use crate::cpu::vector_unit::first_lanes;

    /// [`Kernel::block`]: each output's sum from 0 over the window's columns in im2col's
    /// order, a separately rounded multiply and add a term, then the bias.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, and the reads and writes must lie where `Kernel::block`
    /// checked.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block<const P: usize, const B: usize>(
        kernel: &Kernel,
        oh: usize,
        ow: usize,
        b: usize,
        row: &mut [f32],
    ) {
        let (g, oc, wide) = (kernel.g, kernel.oc, kernel.planar.wide);
        // The lanes of each block that hold output channels.
        let masks: [__mmask16; B] = std::array::from_fn(|i| first_lanes(oc - (b + i) * LANES));
        let values = kernel.planar.values.as_ptr();
        let weights = kernel.weight.as_ptr().add(b * LANES);
        let mut acc = [[_mm512_setzero_ps(); B]; P];
        for kh in 0..g.kh {
            for kw in 0..g.kw {
                // Where channel 0 of this window column lies for the block's first pixel, and
                // the column's row of the weight.
                let first = ((oh + kh) * g.c) * wide + ow + kw;
                let tap = (kh * g.kw + kw) * g.c;
                for c in 0..g.c {
                    // Pointers made from in-bounds offsets each column rather than stepped
                    // (which leaves them past the ends after the last): as fast in the
                    // `fwdonly` probe, where `wrapping_add` steps cost 4%.
                    let (at, weights) = (values.add(first + c * wide), weights.add((tap + c) * oc));
                    let w: [__m512; B] = std::array::from_fn(|i| {
                        // SAFETY: the weight's row for this column, the block's lanes.
                        unsafe { _mm512_maskz_loadu_ps(masks[i], weights.add(i * LANES)) }
                    });
                    for (p, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: pixel p's value of the column, in the copy.
                        let v = _mm512_set1_ps(unsafe { *at.add(p) });
                        for (a, &w) in acc.iter_mut().zip(&w) {
                            *a = _mm512_add_ps(*a, _mm512_mul_ps(v, w));
                        }
                    }
                }
            }
        }
        let out = row.as_mut_ptr().add(ow * oc + b * LANES);
        for (p, acc) in acc.iter().enumerate() {
            for (i, &a) in acc.iter().enumerate() {
                let a = match kernel.bias {
                    // SAFETY: the bias is padded to whole blocks.
                    Some(bias) => {
                        _mm512_add_ps(a, _mm512_loadu_ps(bias.as_ptr().add((b + i) * LANES)))
                    }
                    None => a,
                };
                // SAFETY: pixel ow + p's channels of the block, in `row`.
                _mm512_mask_storeu_ps(out.add(p * oc + i * LANES), masks[i], a);
            }
        }
    }
}
