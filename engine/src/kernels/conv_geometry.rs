//! The shape of one convolution and the sizes derived from it: what the WGSL lowering, its
//! CPU references and the CPU path's lowering all take.

use crate::error::{shape_err, Result};

/// The window that reads padded input coordinate `i` at offset `k` inside it, if one does:
/// windows start every `stride` along an axis and there are `windows` of them. The backward
/// passes of convolution (col2im) and of pooling walk their inputs with it, each input
/// gathering from the outputs whose windows cover it.
#[inline(always)]
pub fn window_reading(i: usize, k: usize, stride: usize, windows: usize) -> Option<usize> {
    let start = i.checked_sub(k)?;
    (start % stride == 0 && start / stride < windows).then_some(start / stride)
}

/// The shape of one convolution: input `[n, h, w, c]`, a `kh x kw` window, stride and zero
/// padding on every side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Images in the batch.
    pub n: usize,
    /// Input height in pixels, before padding.
    pub h: usize,
    /// Input width in pixels, before padding.
    pub w: usize,
    /// Input channels.
    pub c: usize,
    /// Window height.
    pub kh: usize,
    /// Window width.
    pub kw: usize,
    /// Pixels between window positions, in both directions, at least 1.
    pub stride: usize,
    /// Zero pixels added on every side of the image.
    pub pad: usize,
}

impl ConvGeometry {
    /// The geometry of `x [n, h, w, c]` under a `kh x kw` window; an error if the window does
    /// not fit the padded image or the stride is zero.
    pub fn of(x: &[usize], kh: usize, kw: usize, stride: usize, pad: usize) -> Result<Self> {
        let &[n, h, w, c] = x else {
            return shape_err(
                "conv2d",
                format!("input must be [batch, height, width, channels], is {x:?}"),
            );
        };
        if stride == 0 || kh == 0 || kw == 0 || kh > h + 2 * pad || kw > w + 2 * pad || c == 0 {
            return shape_err(
                "conv2d",
                format!("a {kh}x{kw} window with stride {stride} and padding {pad} does not fit input {x:?}"),
            );
        }
        Ok(ConvGeometry {
            n,
            h,
            w,
            c,
            kh,
            kw,
            stride,
            pad,
        })
    }

    /// Output height: `(h + 2 pad - kh) / stride + 1`.
    pub fn out_h(&self) -> usize {
        (self.h + 2 * self.pad - self.kh) / self.stride + 1
    }

    /// Output width: `(w + 2 pad - kw) / stride + 1`.
    pub fn out_w(&self) -> usize {
        (self.w + 2 * self.pad - self.kw) / self.stride + 1
    }

    /// Columns of the im2col matrix: one (kh, kw, c) triple each.
    pub fn patch(&self) -> usize {
        self.kh * self.kw * self.c
    }

    /// `[n, out_h, out_w, patch]`.
    pub fn cols_shape(&self) -> [usize; 4] {
        [self.n, self.out_h(), self.out_w(), self.patch()]
    }

    /// The input position `(ih, iw)` that output `(oh, ow)` reads at window offset `(kh, kw)`,
    /// or `None` in the padding.
    pub(crate) fn source(
        &self,
        oh: usize,
        ow: usize,
        kh: usize,
        kw: usize,
    ) -> Option<(usize, usize)> {
        let ih = (oh * self.stride + kh).checked_sub(self.pad)?;
        let iw = (ow * self.stride + kw).checked_sub(self.pad)?;
        (ih < self.h && iw < self.w).then_some((ih, iw))
    }
}
