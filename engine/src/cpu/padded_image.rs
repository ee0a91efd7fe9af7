//! One image of a convolution's input with its zero padding around it, so that every
//! output pixel's window reads it without a bounds decision: the values of `im2col_ref`
//! where they lie (`cpu::conv_pool`'s loops, and `cpu::conv`'s products read it as their
//! left operand).

use rayon::prelude::*;

use super::gemm::Gathered;
use super::strided_product::Strided;
use crate::kernels::conv_geometry::ConvGeometry;

/// One image with its zero padding around it, and where each im2col column reads it: column
/// `i` of output pixel `(oh, ow)` is `values[(oh * stride * wide + ow * stride) * c +
/// offsets[i]]`. im2col's values, without a bounds decision per column.
pub(super) struct PaddedImage {
    values: Vec<f32>,
    wide: usize,
    pub(super) offsets: Vec<usize>,
    /// One past the largest offset: a window from `at` reads `values[at..at + reach]`.
    reach: usize,
}

impl PaddedImage {
    pub(super) fn new(g: &ConvGeometry) -> Self {
        let wide = g.w + 2 * g.pad;
        let offsets: Vec<usize> = (0..g.patch())
            .map(|i| {
                let (kh, kw, ci) = (i / (g.kw * g.c), i / g.c % g.kw, i % g.c);
                (kh * wide + kw) * g.c + ci
            })
            .collect();
        let reach = offsets.iter().max().map_or(0, |&last| last + 1);
        PaddedImage {
            values: vec![0.0; (g.h + 2 * g.pad) * wide * g.c],
            wide,
            offsets,
            reach,
        }
    }

    /// The value `offset` (one of [`PaddedImage::offsets`]) past the window at `at`.
    ///
    /// # Safety
    /// `at` comes from [`PaddedImage::window`], which checks the window's whole reach once (a
    /// bounds check per column cost the convolution's inner loops a compare, a branch and
    /// two reloads of the vector's pointer and length for every multiply-add, `perf
    /// annotate`, session 13), and `offset < self.reach`.
    #[inline(always)]
    pub(super) unsafe fn at_unchecked(&self, at: usize, offset: usize) -> f32 {
        debug_assert!(offset < self.reach && at + self.reach <= self.values.len());
        // SAFETY: the caller's guarantee bounds at + offset.
        unsafe { *self.values.get_unchecked(at + offset) }
    }

    /// Holds image `n` of `x`; the padding stays 0.
    pub(super) fn load(&mut self, x: &[f32], g: &ConvGeometry, n: usize) {
        load_into(&mut self.values, self.wide, x, g, n)
    }

    /// Where output pixel `(oh, ow)`'s window starts; panics unless the whole window, up to
    /// [`PaddedImage::reach`], lies in the image, which is what [`PaddedImage::at_unchecked`]
    /// relies on.
    #[inline(always)]
    pub(super) fn window(&self, g: &ConvGeometry, oh: usize, ow: usize) -> usize {
        let at = (oh * g.stride * self.wide + ow * g.stride) * g.c;
        assert!(at + self.reach <= self.values.len());
        at
    }

    /// Where output row `oh`'s windows start: the first at `.0`, each next `.1` on. Panics
    /// unless the row's last window lies wholly in the image, which makes every one of them a
    /// window [`PaddedImage::at_unchecked`] can read.
    #[inline(always)]
    pub(super) fn row_of_windows(&self, g: &ConvGeometry, oh: usize) -> (usize, usize) {
        self.window(g, oh, g.out_w().saturating_sub(1));
        (self.window(g, oh, 0), g.stride * g.c)
    }

    /// im2col's rows of the image, `[out_h * out_w, patch]`, as the left operand of a
    /// product, read where they lie: an output row of pixels is a line of rows, a window's
    /// row (`kw * c` values side by side) a segment of steps.
    pub(super) fn columns(&self, g: &ConvGeometry) -> Strided<'_> {
        let a = Strided::rows(&self.values, 0, g.stride * g.c)
            .in_lines(g.out_w().max(1), g.stride * self.wide * g.c);
        // Without channels a product has no steps and reads nothing.
        if g.c == 0 {
            return a;
        }
        a.in_segments(g.kw * g.c, self.wide * g.c)
    }
}

/// Image `n` of `x` into `values`, a padded image `wide` values a row; the padding stays as
/// it is (0).
fn load_into(values: &mut [f32], wide: usize, x: &[f32], g: &ConvGeometry, n: usize) {
    let row = g.w * g.c;
    for ih in 0..g.h {
        let at = ((ih + g.pad) * wide + g.pad) * g.c;
        values[at..][..row].copy_from_slice(&x[(n * g.h + ih) * row..][..row]);
    }
}

/// Every image of a batch with its padding, one after the other, and where each output
/// pixel's window starts in them: im2col's columns as a tall product's left operand
/// ([`Gathered`]), for a weight gradient that reads them where they lie.
pub(super) struct PaddedBatch {
    values: Vec<f32>,
    /// For each output pixel of the batch, where its window starts in `values`.
    starts: Vec<usize>,
    /// For each im2col column, where it lies from a window's start.
    offsets: Vec<usize>,
}

impl PaddedBatch {
    /// `x [n, h, w, c]` padded, an image per task.
    pub(super) fn new(x: &[f32], g: &ConvGeometry) -> Self {
        let image = PaddedImage::new(g);
        let len = image.values.len();
        let mut values = vec![0.0f32; g.n * len];
        values
            .par_chunks_mut(len.max(1))
            .enumerate()
            .for_each(|(n, v)| load_into(v, image.wide, x, g, n));
        let mut starts = Vec::with_capacity(g.n * g.out_h() * g.out_w());
        for n in 0..g.n {
            for oh in 0..g.out_h() {
                let (first, step) = image.row_of_windows(g, oh);
                starts.extend((0..g.out_w()).map(|ow| n * len + first + ow * step));
            }
        }
        PaddedBatch {
            values,
            starts,
            offsets: image.offsets,
        }
    }

    /// im2col's `[n * oh * ow, patch]` columns, read where they lie.
    pub(super) fn columns(&self) -> Gathered<'_> {
        Gathered::new(&self.values, &self.starts, &self.offsets)
    }
}
