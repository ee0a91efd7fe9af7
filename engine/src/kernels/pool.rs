//! Max and average pooling over square windows, NHWC, no padding (pool.wgsl).

use bytemuck::{Pod, Zeroable};

use super::conv_geometry::window_reading;
use super::{grid_1d, POOL};
use crate::cpu::elementwise::{collect_indexed, zeroed_rows};
use crate::cpu::output::zeroed_par_chunk_pairs;
use crate::cpu::vector_unit::widest;
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// How a pooling window combines its pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// The largest value in the window.
    Max,
    /// The mean of the window's `k * k` values.
    Avg,
}

/// Input `[n, h, w, c]` pooled over `k x k` windows every `stride` pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Images in the batch.
    pub n: usize,
    /// Input height in pixels.
    pub h: usize,
    /// Input width in pixels.
    pub w: usize,
    /// Channels.
    pub c: usize,
    /// Window side length.
    pub k: usize,
    /// Pixels between window positions, in both directions.
    pub stride: usize,
}

impl PoolGeometry {
    /// The geometry of `x [n, h, w, c]` under `k x k` windows; an error if the window does not fit
    /// or `k` or `stride` is zero.
    pub fn of(x: &[usize], k: usize, stride: usize) -> Result<Self> {
        match *x {
            [n, h, w, c] if k > 0 && stride > 0 && k <= h && k <= w => Ok(PoolGeometry {
                n,
                h,
                w,
                c,
                k,
                stride,
            }),
            _ => shape_err(
                "pool",
                format!("a {k}x{k} window with stride {stride} does not fit input {x:?} (NHWC)"),
            ),
        }
    }

    /// Output height: `(h - k) / stride + 1`.
    pub fn out_h(&self) -> usize {
        (self.h - self.k) / self.stride + 1
    }

    /// Output width: `(w - k) / stride + 1`.
    pub fn out_w(&self) -> usize {
        (self.w - self.k) / self.stride + 1
    }

    /// Output shape `[n, out_h, out_w, c]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.n, self.out_h(), self.out_w(), self.c]
    }

    fn params(&self) -> Params {
        Params {
            n: self.n as u32,
            h: self.h as u32,
            w: self.w as u32,
            c: self.c as u32,
            k: self.k as u32,
            stride: self.stride as u32,
            oh: self.out_h() as u32,
            ow: self.out_w() as u32,
        }
    }

    /// Flat input index of the corner of output `o`'s window.
    fn window_base(&self, o: usize) -> usize {
        let c = o % self.c;
        let t = o / self.c;
        let (ow, t) = (t % self.out_w(), t / self.out_w());
        let (oh, n) = (t % self.out_h(), t / self.out_h());
        ((n * self.h + oh * self.stride) * self.w + ow * self.stride) * self.c + c
    }

    /// The flat input indices of output `o`'s window, in (kh, kw) order.
    fn window(&self, o: usize) -> impl Iterator<Item = usize> + '_ {
        let base = self.window_base(o);
        (0..self.k)
            .flat_map(move |kh| (0..self.k).map(move |kw| base + (kh * self.w + kw) * self.c))
    }

    /// The output elements whose windows cover input `i`, in (kh, kw) order.
    fn covering(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let c = i % self.c;
        let t = i / self.c;
        let (iw, t) = (t % self.w, t / self.w);
        let (ih, n) = (t % self.h, t / self.h);
        let axis = move |x: usize, k: usize, len: usize| {
            let y = x.checked_sub(k)?;
            (y % self.stride == 0 && y / self.stride < len).then_some(y / self.stride)
        };
        (0..self.k).flat_map(move |kh| {
            (0..self.k).filter_map(move |kw| {
                let oh = axis(ih, kh, self.out_h())?;
                let ow = axis(iw, kw, self.out_w())?;
                Some(((n * self.out_h() + oh) * self.out_w() + ow) * self.c + c)
            })
        })
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    k: u32,
    stride: u32,
    oh: u32,
    ow: u32,
}

/// CPU reference forward: the pooled values and, for max pooling, the flat input index of
/// each maximum (the first in window order on ties; empty for average pooling).
pub fn pool_ref(x: &[f32], g: &PoolGeometry, kind: Pool) -> (Vec<f32>, Vec<u32>) {
    let outs = g.out_shape().iter().product();
    // Each output on its own (in parallel on the CPU path: the same bits).
    let pooled = collect_indexed(outs, |o| {
        let mut window = g.window(o);
        match kind {
            Pool::Max => {
                let first = window.next().expect("k >= 1");
                let (mut best, mut at) = (x[first], first);
                for j in window {
                    if x[j] > best {
                        (best, at) = (x[j], j);
                    }
                }
                (best, at as u32)
            }
            Pool::Avg => {
                let sum = window.fold(0.0f32, |acc, j| acc + x[j]);
                (sum / (g.k * g.k) as f32, 0)
            }
        }
    });
    let (y, mut argmax): (Vec<f32>, Vec<u32>) = pooled.into_iter().unzip();
    if kind == Pool::Avg {
        argmax.clear();
    }
    (y, argmax)
}

/// CPU reference backward.
pub fn pool_backward_ref(dy: &[f32], argmax: &[u32], g: &PoolGeometry, kind: Pool) -> Vec<f32> {
    collect_indexed(g.n * g.h * g.w * g.c, |i| {
        let covering = g.covering(i);
        match kind {
            Pool::Max => covering
                .filter(|&o| argmax[o] as usize == i)
                .fold(0.0f32, |acc, o| acc + dy[o]),
            Pool::Avg => covering.fold(0.0f32, |acc, o| acc + dy[o]) / (g.k * g.k) as f32,
        }
    })
}

/// The CPU path's max pooling, with [`pool_ref`]'s bits and argmax (the first maximum in
/// window order): a window's pixels are walked once per output pixel with the channels
/// innermost, instead of an index decomposition per element; output rows run in parallel.
pub fn max_pool_fast(x: &[f32], g: &PoolGeometry) -> (Vec<f32>, Vec<u32>) {
    let (out_h, out_w, c) = (g.out_h(), g.out_w(), g.c);
    let outs = g.n * out_h * out_w * c;
    if outs == 0 {
        return (vec![], vec![]);
    }
    let row = out_w * c;
    // A row of pooled values and their argmax per task.
    zeroed_par_chunk_pairs(
        (outs, row),
        (outs, row),
        || (),
        |_, r, y: &mut [f32], at: &mut [u32]| {
            widest(
                #[inline(always)]
                || max_pool_row(x, g, r, 0, y, at),
            )
        },
    )
}

/// Row `r` (image `r / out_h`, output row `r % out_h`) of [`max_pool_fast`] into `y` and `at`
/// (`out_w * c` each), each winner's index counted from `first_index` as the index of `x[0]`.
/// Always inlined, to run on the caller's vector unit.
///
/// The window's pixels are the outer loop and the row's outputs the inner one: a pixel's
/// comparison updates an output with a masked store, and when the next pixel of the same
/// window came straight after, its load of that output could not be forwarded from the
/// masked store and waited for it (`perf annotate` of a throwaway probe: the pooling took
/// longer than the convolution before it, 2026-11-29). A row later, the store is done.
#[inline(always)]
pub(crate) fn max_pool_row(
    x: &[f32],
    g: &PoolGeometry,
    r: usize,
    first_index: usize,
    y: &mut [f32],
    at: &mut [u32],
) {
    let c = g.c;
    let (n, oh) = (r / g.out_h(), r % g.out_h());
    let corner = |ow: usize| ((n * g.h + oh * g.stride) * g.w + ow * g.stride) * c;
    for kh in 0..g.k {
        for kw in 0..g.k {
            let offset = (kh * g.w + kw) * c;
            for (ow, (y, at)) in y.chunks_mut(c).zip(at.chunks_mut(c)).enumerate() {
                let base = corner(ow) + offset;
                let pixel = &x[base..][..c];
                // The window's first pixel is taken as it is (a NaN there stays). Taken in
                // the same loop rather than by `copy_from_slice`, which was a `memcpy` call
                // of a length known only at run time for every window (`perf annotate`,
                // session 15). The indices in u32, as stored: `(index + j) as u32` without
                // 64-bit lanes.
                let first = kh == 0 && kw == 0;
                let index = (first_index + base) as u32;
                // Chosen without a branch, so that the channels vectorise.
                for (j, ((y, a), &v)) in y.iter_mut().zip(at.iter_mut()).zip(pixel).enumerate() {
                    let larger = first || v > *y;
                    *y = if larger { v } else { *y };
                    *a = if larger {
                        index.wrapping_add(j as u32)
                    } else {
                        *a
                    };
                }
            }
        }
    }
}

/// The CPU path's max-pooling backward, with [`pool_backward_ref`]'s bits: each input sums,
/// from 0 and in (kh, kw) order, the gradients of the outputs whose maximum it was; input
/// rows run in parallel.
pub fn max_pool_backward_fast(dy: &[f32], argmax: &[u32], g: &PoolGeometry) -> Vec<f32> {
    let (out_h, out_w, c) = (g.out_h(), g.out_w(), g.c);
    // The window that reads input coordinate `x` at offset `k`, if one does (no padding).
    let out_of = |x: usize, k: usize, len: usize| window_reading(x, k, g.stride, len);
    zeroed_rows(
        g.n * g.h * g.w * c,
        g.w * c,
        #[inline(always)]
        |r, dx| {
            let (n, ih) = (r / g.h, r % g.h);
            for (iw, acc) in dx.chunks_mut(c).enumerate() {
                let input = ((n * g.h + ih) * g.w + iw) * c;
                for kh in 0..g.k {
                    let Some(oh) = out_of(ih, kh, out_h) else {
                        continue;
                    };
                    for kw in 0..g.k {
                        let Some(ow) = out_of(iw, kw, out_w) else {
                            continue;
                        };
                        let out = ((n * out_h + oh) * out_w + ow) * c;
                        // Adding 0 where an output's maximum was elsewhere leaves every sum's
                        // bits as skipping it does: a sum from +0 is never -0, and x + 0 = x
                        // for any other x. Without the branch the channels vectorise.
                        let (winners, grads) = (&argmax[out..][..c], &dy[out..][..c]);
                        for (j, ((a, &w), &d)) in acc.iter_mut().zip(winners).zip(grads).enumerate()
                        {
                            *a += if w as usize == input + j { d } else { 0.0 };
                        }
                    }
                }
            }
        },
    )
}

/// Pools `x [n, h, w, c]`; returns the output and, for max pooling, the argmax indices (u32,
/// same shape) the backward pass needs.
pub fn pool(x: &Tensor, g: &PoolGeometry, kind: Pool) -> Result<(Tensor, Option<Tensor>)> {
    x.expect_dtype("pool", DType::F32)?;
    if x.shape() != [g.n, g.h, g.w, g.c] {
        return shape_err(
            "pool",
            format!("input {:?} does not match {g:?}", x.shape()),
        );
    }
    let shape = g.out_shape();
    let outs: usize = shape.iter().product();
    match x.device() {
        Device::Cpu => {
            let values = x.cpu_f32().expect("cpu");
            let (y, argmax) = match kind {
                Pool::Max => max_pool_fast(values, g),
                Pool::Avg => pool_ref(values, g, kind),
            };
            let argmax = match kind {
                Pool::Max => Some(Tensor::from_u32(x.device(), &shape, argmax)?),
                Pool::Avg => None,
            };
            Ok((Tensor::from_vec(x.device(), &shape, y)?, argmax))
        }
        Device::Gpu(gpu) => {
            let y = gpu.alloc(4 * outs as u64)?;
            let src = x.gpu_buf().expect("gpu");
            let argmax = match kind {
                Pool::Max => {
                    let argmax = gpu.alloc(4 * outs as u64)?;
                    let pipeline = gpu.pipeline(&POOL, "max_forward", &[]);
                    gpu.launch(&pipeline, &g.params(), &[src, &y, &argmax], grid_1d(outs));
                    Some(Tensor::from_gpu(gpu, &shape, DType::U32, argmax))
                }
                Pool::Avg => {
                    let pipeline = gpu.pipeline(&POOL, "avg_forward", &[]);
                    gpu.launch(&pipeline, &g.params(), &[src, &y], grid_1d(outs));
                    None
                }
            };
            Ok((Tensor::from_gpu(gpu, &shape, DType::F32, y), argmax))
        }
    }
}

/// The gradient with respect to the pooled input, from `dy` (and the forward's argmax for
/// max pooling).
pub fn pool_backward(
    dy: &Tensor,
    argmax: Option<&Tensor>,
    g: &PoolGeometry,
    kind: Pool,
) -> Result<Tensor> {
    dy.expect_dtype("pool_backward", DType::F32)?;
    if dy.shape() != g.out_shape()
        || argmax.is_some_and(|a| a.shape() != g.out_shape())
        || (kind == Pool::Max) != argmax.is_some()
    {
        return shape_err(
            "pool_backward",
            format!("dy {:?} does not match {g:?}", dy.shape()),
        );
    }
    let shape = [g.n, g.h, g.w, g.c];
    let n: usize = shape.iter().product();
    match dy.device() {
        Device::Cpu => {
            let argmax = argmax.map(|a| a.cpu_u32().expect("cpu")).unwrap_or(&[]);
            let dy_values = dy.cpu_f32().expect("cpu");
            let dx = match kind {
                Pool::Max => max_pool_backward_fast(dy_values, argmax, g),
                Pool::Avg => pool_backward_ref(dy_values, argmax, g, kind),
            };
            Tensor::from_vec(dy.device(), &shape, dx)
        }
        Device::Gpu(gpu) => {
            let dx = gpu.alloc(4 * n as u64)?;
            let src = dy.gpu_buf().expect("gpu");
            match argmax {
                Some(a) => {
                    let pipeline = gpu.pipeline(&POOL, "max_backward", &[]);
                    gpu.launch(
                        &pipeline,
                        &g.params(),
                        &[src, &dx, a.gpu_buf().expect("gpu")],
                        grid_1d(n),
                    );
                }
                None => {
                    let pipeline = gpu.pipeline(&POOL, "avg_backward", &[]);
                    gpu.launch(&pipeline, &g.params(), &[src, &dx], grid_1d(n));
                }
            }
            Ok(Tensor::from_gpu(gpu, &shape, DType::F32, dx))
        }
    }
}
