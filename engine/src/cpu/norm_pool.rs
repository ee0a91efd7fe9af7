//! An image norm followed by max pooling over windows that do not overlap, as one operation
//! on the CPU path: the bits of the two in sequence (`cpu::layernorm::image_forward`, then
//! `kernels::pool::max_pool_fast`, and their backward passes), without the normalized images
//! or their gradient in memory.
//!
//! The CNN's image norm writes 128 × 14 × 14 × 32 floats (3.2 MB) that the pooling reads once
//! and keeps a quarter of. Backward, the pooling writes a gradient as large, three quarters of
//! it zeros, which the norm's backward pass reads twice (its channels' sums, then its input
//! gradient). Here each image is normalized and pooled while it is in cache, and the backward
//! pass builds each pixel's gradient from the pooled gradient and its winners where it needs
//! it.

use rayon::prelude::*;

use super::layernorm::{image_channel_sums, image_input_gradient, image_row, PixelGradients};
use super::output::{assume_written, zeroed, Unwritten};
use super::vector_unit::widest;
use crate::kernels::pool::{max_pool_row, PoolGeometry};

/// Whether [`forward`] and [`backward`] can take `pool`: windows that do not overlap, so that
/// each pixel has at most one pooled gradient.
pub fn windows_apart(pool: &PoolGeometry) -> bool {
    pool.stride >= pool.k
}

/// `(y, argmax, stats)`: `max_pool_fast(image_forward(x, gamma, beta))` an image at a time,
/// `y` and `argmax` `pool.out_shape()`, each winner the flat index of the normalized
/// element (`[n, h, w, c]`) it came from, and each image's `[mean, rstd]`.
pub fn forward(
    x: &[f32],
    channel_gamma: &[f32],
    channel_beta: &[f32],
    eps: f32,
    pool: &PoolGeometry,
) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let cols = pool.h * pool.w * pool.c;
    assert!(x.len() == pool.n * cols && channel_gamma.len() == pool.c);
    assert!(channel_beta.len() == pool.c && windows_apart(pool));
    let pooled = pool.out_h() * pool.out_w() * pool.c;
    let mut stats = vec![0.0f32; 2 * pool.n];
    if pooled * pool.n == 0 {
        return (vec![], vec![], stats);
    }
    let image = PoolGeometry { n: 1, ..*pool };
    let (mut y, mut at) = (
        Unwritten::new(pool.n * pooled),
        Unwritten::new(pool.n * pooled),
    );
    y.slots()
        .par_chunks_mut(pooled)
        .zip(at.slots().par_chunks_mut(pooled))
        .zip(stats.par_chunks_mut(2))
        .enumerate()
        .for_each_init(
            // The image's normalized values, and the room its statistics take.
            || (Unwritten::new(cols), vec![0.0f32; cols]),
            |(normed, room), (n, ((y, at), stat))| {
                let (y, at) = (zeroed(y), zeroed(at));
                widest(
                    #[inline(always)]
                    || {
                        let row = &x[n * cols..][..cols];
                        let slots = normed.slots();
                        let (mean, rstd) =
                            image_row(row, channel_gamma, channel_beta, room, eps, slots);
                        // SAFETY: `image_row` wrote every slot.
                        let normed = unsafe { assume_written(slots) };
                        let rows = y.chunks_mut(pool.out_w() * pool.c);
                        for (r, (y, at)) in
                            rows.zip(at.chunks_mut(pool.out_w() * pool.c)).enumerate()
                        {
                            max_pool_row(normed, &image, r, n * cols, y, at);
                        }
                        stat.copy_from_slice(&[mean, rstd]);
                    },
                )
            },
        );
    // SAFETY: the chunks cover both outputs, and each was zero-filled (`zeroed`).
    unsafe { (y.assume_init(), at.assume_init(), stats) }
}

/// The pixels' gradients of the normalized images: the pooling's backward pass of `dy` (each
/// pixel sums, from 0, the gradients of the windows whose maximum it was: with windows apart,
/// `0 + dy` where it won and 0 elsewhere), one pixel at a time.
struct PooledGradients<'a> {
    dy: &'a [f32],
    argmax: &'a [u32],
    channels: usize,
    /// Pooled pixels an image.
    pooled: usize,
    /// For each pixel of an image, its window among the image's pooled pixels, if any:
    /// looked up rather than found by four divisions a pixel, which cost the channels' sums
    /// more than their additions (throwaway per-op timer, session 15).
    window_of: Vec<Option<usize>>,
}

impl<'a> PooledGradients<'a> {
    fn new(dy: &'a [f32], argmax: &'a [u32], pool: &PoolGeometry) -> Self {
        let window_of = (0..pool.h * pool.w)
            .map(|p| {
                let (ih, iw) = (p / pool.w, p % pool.w);
                let (ph, pw) = (ih / pool.stride, iw / pool.stride);
                let inside = ph < pool.out_h()
                    && pw < pool.out_w()
                    && ih - ph * pool.stride < pool.k
                    && iw - pw * pool.stride < pool.k;
                inside.then_some(ph * pool.out_w() + pw)
            })
            .collect();
        PooledGradients {
            dy,
            argmax,
            channels: pool.c,
            pooled: pool.out_h() * pool.out_w(),
            window_of,
        }
    }
}

impl PixelGradients for PooledGradients<'_> {
    #[inline(always)]
    fn pixel<'a>(
        &'a self,
        j: usize,
        (image, at): (usize, usize),
        room: &'a mut [f32],
    ) -> &'a [f32] {
        let c = self.channels;
        let room = &mut room[..c];
        let Some(window) = self.window_of[at] else {
            room.fill(0.0);
            return room;
        };
        let window = (image * self.pooled + window) * c;
        let (winners, grads) = (&self.argmax[window..][..c], &self.dy[window..][..c]);
        let first = (j * c) as u32;
        for (l, ((d, &w), &g)) in room.iter_mut().zip(winners).zip(grads).enumerate() {
            *d = if w == first.wrapping_add(l as u32) {
                0.0 + g
            } else {
                0.0
            };
        }
        room
    }
}

/// `(dx, dgamma, dbeta)` of [`forward`] from `x`, gamma, its `stats` and `argmax`, and the
/// pooled output's gradient `dy`: `image_norm_backward` of `max_pool_backward_fast(dy)`, with
/// their bits. The channels' sums and the input gradient build each pixel's gradient as they
/// read it.
pub fn backward(
    x: &[f32],
    channel_gamma: &[f32],
    stats: &[f32],
    argmax: &[u32],
    dy: &[f32],
    pool: &PoolGeometry,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (c, cols) = (pool.c, pool.h * pool.w * pool.c);
    let pooled = pool.out_h() * pool.out_w() * c;
    assert!(x.len() == pool.n * cols && channel_gamma.len() == c && windows_apart(pool));
    assert!(stats.len() == 2 * pool.n && argmax.len() == pool.n * pooled);
    assert!(dy.len() == argmax.len());
    let gradients = PooledGradients::new(dy, argmax, pool);
    let (dgamma, dbeta) = image_channel_sums(x, stats, c, cols, &gradients);
    let dx = image_input_gradient(x, channel_gamma, stats, cols, &gradients);
    (dx, dgamma, dbeta)
}
