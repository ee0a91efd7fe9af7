//! Layer normalization on the CPU path: the arithmetic of `layernorm_ref` and
//! `layernorm_backward_ref` (and so of layernorm.wgsl), element for element, with rows split
//! over rayon, each row's sums taken from a slice the compiler vectorises, and no allocation
//! per row (the references collect two vectors per row of the backward pass).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::chunks::{for_each_chunk_pair_with, for_each_chunk_with};
use super::elementwise::CHUNK;
use super::output::Unwritten;
use super::vector_unit::widest;
use crate::kernels::column_sums::ColumnSums;
use crate::kernels::math::{sixteen_row_sums, workgroup_sum_of, ROW_LANES, SIDE_BY_SIDE};

/// `(y, stats)`: `y = (x - mean) * rstd * gamma + beta` per row, and `[mean, rstd]` per row.
pub fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    cols: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    assert!(cols > 0 && x.len().is_multiple_of(cols), "a partial row");
    assert!(
        gamma.len() == cols && beta.len() == cols,
        "gamma or beta not a row long"
    );
    // SAFETY: the group function writes every slot of its rows (`gamma` and `beta` are as
    // long as a row, asserted).
    unsafe {
        by_rows(
            x,
            cols,
            #[inline(always)]
            |rows, scratch, out, stats| {
                let [means, rstds] = if rows.len() == SIDE_BY_SIDE * cols {
                    group_stats(rows, scratch, cols, eps)
                } else {
                    let mut stats = [[0.0; SIDE_BY_SIDE]; 2];
                    for (r, row) in rows.chunks(cols).enumerate() {
                        let room = &mut scratch[..cols];
                        (stats[0][r], stats[1][r]) = row_stats(row, room, eps);
                    }
                    stats
                };
                let rows_and_outs = rows.chunks(cols).zip(out.chunks_mut(cols));
                for (r, ((row, out), stat)) in rows_and_outs.zip(stats.chunks_mut(2)).enumerate() {
                    let (mean, rstd) = (means[r], rstds[r]);
                    for (((o, &v), &g), &b) in out.iter_mut().zip(row).zip(gamma).zip(beta) {
                        o.write((v - mean) * rstd * g + b);
                    }
                    (stat[0], stat[1]) = (mean, rstd);
                }
            },
        )
    }
}

/// The `[means, rstds]` of 16 rows of `cols` values, one row to a vector lane: what
/// [`row_stats`] computes for each, through [`sixteen_row_sums`]. `scratch` holds 16 rows.
#[inline(always)]
fn group_stats(
    rows: &[f32],
    scratch: &mut [f32],
    cols: usize,
    eps: f32,
) -> [[f32; SIDE_BY_SIDE]; 2] {
    let row = |r: usize| &rows[r * cols..][..cols];
    let means = sixteen_row_sums(row).map(|sum| sum / cols as f32);
    for (r, deviations) in scratch.chunks_mut(cols).take(SIDE_BY_SIDE).enumerate() {
        let mean = means[r];
        for (o, &v) in deviations.iter_mut().zip(row(r)) {
            *o = (v - mean) * (v - mean);
        }
    }
    let rstds = sixteen_row_sums(|r| &scratch[r * cols..][..cols])
        .map(|sum| 1.0 / (sum / cols as f32 + eps).sqrt());
    [means, rstds]
}

/// `(y, stats)`: the rows of `x` (`cols` long) in groups of 16 (fewer at a task's end),
/// written into `y` by `group(rows, scratch, out, stats)`, which also writes each row's
/// `[mean, rstd]` into `stats`, with `scratch` as long as 16 rows; groups split between
/// rayon's tasks. The outputs are written, not zero-filled first: that was 0.7% of a GPT
/// step's samples (`perf report`, session 14).
///
/// The groups' loop is written inside the closure that `widest` inlines: kept in a closure of
/// its own, the compiler made that a function compiled for the baseline's SSE2 and called it
/// from `widest`, so every row ran on 4-lane vectors (seen in a throwaway `perf annotate`).
///
/// # Safety
/// `group` must write every slot of `out`.
unsafe fn by_rows(
    x: &[f32],
    cols: usize,
    group: impl Fn(&[f32], &mut [f32], &mut [MaybeUninit<f32>], &mut [f32]) + Sync,
) -> (Vec<f32>, Vec<f32>) {
    assert!(cols > 0 && x.len().is_multiple_of(cols), "a partial row");
    let rows = x.len() / cols;
    let rows_per_task = (CHUNK / cols).max(1);
    let mut y = Unwritten::new(x.len());
    let mut stats = vec![0.0; 2 * rows];
    for_each_chunk_pair_with(
        (y.slots(), rows_per_task * cols),
        (&mut stats, 2 * rows_per_task),
        // The squared deviations' room, in cache for the rows' second sums: a group's, made
        // once per thread (see `input_gradient`).
        || vec![0.0; SIDE_BY_SIDE.min(rows_per_task) * cols],
        |scratch, t, y, stats| {
            let x = &x[t * rows_per_task * cols..][..y.len()];
            widest(
                #[inline(always)]
                || {
                    let groups = x.chunks(SIDE_BY_SIDE * cols);
                    let outs = y.chunks_mut(SIDE_BY_SIDE * cols);
                    for ((rows, out), stats) in
                        groups.zip(outs).zip(stats.chunks_mut(2 * SIDE_BY_SIDE))
                    {
                        group(rows, scratch, out, stats);
                    }
                },
            )
        },
    );
    // SAFETY: the chunks of `y` cover it, whole rows each (asserted), and the caller's
    // `group` wrote every slot of each.
    (unsafe { y.assume_init() }, stats)
}

/// A row's `(mean, rstd)` as the reference computes them; the squared deviations go through
/// `scratch` (as long as the row) for their sum.
#[inline(always)]
fn row_stats(row: &[f32], scratch: &mut [f32], eps: f32) -> (f32, f32) {
    let cols = row.len();
    let mean = workgroup_sum_of(row, ROW_LANES) / cols as f32;
    for (o, &v) in scratch.iter_mut().zip(row) {
        *o = (v - mean) * (v - mean);
    }
    let var = workgroup_sum_of(scratch, ROW_LANES) / cols as f32;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Element `v` of a row of mean `mean` and 1/std `rstd`, normalized as the image norm's
/// layer norm does it with a gamma of ones and a beta of zeros: the forward pass and the
/// channels' sums of the backward pass both compute it here, so that they agree bit for bit.
#[inline(always)]
pub fn normalized(v: f32, mean: f32, rstd: f32) -> f32 {
    // The gamma of one and beta of zero, kept: `+ 0.0` turns a -0 into +0, as the
    // composition does.
    (v - mean) * rstd * 1.0 + 0.0
}

/// Image normalization (`kernels::image_norm`): each row normalized as [`forward`] does with a
/// gamma of ones and a beta of zeros ([`normalized`]), then scaled and shifted per channel
/// (the innermost `channels` of a row: NHWC pixels), as a product and a sum with
/// broadcasting compute it. Returns `(y, stats)`; the backward pass recomputes the
/// normalized values from `x` and `stats` rather than keeping them, which saves writing (and
/// reading back) a tensor as large as `x`.
pub fn image_forward(
    x: &[f32],
    channel_gamma: &[f32],
    channel_beta: &[f32],
    cols: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let channels = channel_gamma.len();
    assert!(channels > 0 && cols.is_multiple_of(channels) && channel_beta.len() == channels);
    // SAFETY: `image_row` writes every slot of its row.
    unsafe {
        by_rows(
            x,
            cols,
            #[inline(always)]
            |rows, scratch, out, stats| {
                let rows_and_outs = rows.chunks(cols).zip(out.chunks_mut(cols));
                for ((row, out), stat) in rows_and_outs.zip(stats.chunks_mut(2)) {
                    let scratch = &mut scratch[..cols];
                    let (mean, rstd) =
                        image_row(row, channel_gamma, channel_beta, scratch, eps, out);
                    (stat[0], stat[1]) = (mean, rstd);
                }
            },
        )
    }
}

/// One image of [`image_forward`] (`row`, pixels of `channel_gamma.len()` channels) into
/// `out`, every slot written; returns its `(mean, rstd)`. `scratch` is as long as the row.
/// Always inlined, to run on the caller's vector unit.
#[inline(always)]
pub(crate) fn image_row(
    row: &[f32],
    channel_gamma: &[f32],
    channel_beta: &[f32],
    scratch: &mut [f32],
    eps: f32,
    out: &mut [MaybeUninit<f32>],
) -> (f32, f32) {
    let channels = channel_gamma.len();
    assert!(out.len() == row.len() && row.len().is_multiple_of(channels));
    let (mean, rstd) = row_stats(row, scratch, eps);
    for (out, px) in out.chunks_mut(channels).zip(row.chunks(channels)) {
        let channel = channel_gamma.iter().zip(channel_beta);
        for ((o, &v), (&g, &b)) in out.iter_mut().zip(px).zip(channel) {
            o.write(normalized(v, mean, rstd) * g + b);
        }
    }
    (mean, rstd)
}

/// The input's gradient of a normalization whose output's gradient, times gamma, is what
/// `gamma_times(row, g, room)` writes into `g` for row `row` (`room`, as long as a row, is
/// free for building it): by groups of 16 rows in parallel, the reference's arithmetic;
/// with `onto` (as long as `x`), `onto + that` for each element.
fn input_gradient(
    x: &[f32],
    stats: &[f32],
    cols: usize,
    gamma_times: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
    onto: Option<&[f32]>,
) -> Vec<f32> {
    assert!(cols > 0 && x.len().is_multiple_of(cols), "a partial row");
    assert!(
        onto.is_none_or(|o| o.len() == x.len()),
        "onto not x's length"
    );
    let rows_per_task = (CHUNK / cols).max(1);
    let mut dx = Unwritten::new(x.len());
    // g = dy * gamma, then g * xhat, for the rows' two sums: room for a group, made once a
    // worker's run of tasks. Made for 16 rows in every task, the image norm's rows of 6272
    // values (two to a task) cost 51 MB of zeros a CNN step, a quarter of its backward pass
    // (`np` probe, session 20).
    let group_rows = SIDE_BY_SIDE.min(rows_per_task);
    for_each_chunk_with(
        dx.slots(),
        rows_per_task * cols,
        || GroupGradientScratch::new(group_rows, cols),
        |scratch, t, dx| {
            widest(
                #[inline(always)]
                || {
                    for (k, out) in dx.chunks_mut(SIDE_BY_SIDE * cols).enumerate() {
                        let first = t * rows_per_task + k * SIDE_BY_SIDE;
                        let group = first..first + out.len() / cols;
                        let onto = onto.map(|o| &o[first * cols..][..out.len()]);
                        group_input_gradient(x, stats, group, (&gamma_times, onto), scratch, out);
                    }
                },
            );
        },
    );
    // SAFETY: the chunks cover `dx`, whole rows each (asserted), and `group_input_gradient`
    // wrote every slot of every row.
    unsafe { dx.assume_init() }
}

/// Room for a group of [`group_input_gradient`]: `g = dy * gamma`, and `g * xhat`, 16 rows
/// each.
struct GroupGradientScratch {
    /// The rows' output gradients times gamma, which the caller writes.
    g: Vec<f32>,
    gx: Vec<f32>,
}

impl GroupGradientScratch {
    /// Room for `rows` rows (at most 16) of `cols` values.
    fn new(rows: usize, cols: usize) -> Self {
        GroupGradientScratch {
            g: vec![0.0; rows * cols],
            gx: vec![0.0; rows * cols],
        }
    }
}

/// The input gradient of rows `group` (at most 16) into `out` (as long as the rows, every
/// slot written), from `x`, the rows' `stats` and their output gradients times gamma, which
/// `gamma_times` writes into the scratch: the reference's arithmetic, the rows' sums side by
/// side ([`sixteen_row_sums`]) when the group is whole; added onto the rows' `onto` (as long
/// as `out`) where there is one. Always inlined, to run on the caller's vector unit.
#[inline(always)]
fn group_input_gradient(
    x: &[f32],
    stats: &[f32],
    group: std::ops::Range<usize>,
    (gamma_times, onto): (&impl Fn(usize, &mut [f32], &mut [f32]), Option<&[f32]>),
    scratch: &mut GroupGradientScratch,
    out: &mut [MaybeUninit<f32>],
) {
    let cols = out.len() / group.len();
    let (g, gx) = (&mut scratch.g, &mut scratch.gx);
    let row = |i: usize| &x[(group.start + i) * cols..][..cols];
    let stat = |i: usize| {
        (
            stats[2 * (group.start + i)],
            stats[2 * (group.start + i) + 1],
        )
    };
    for (i, (g, gx)) in g
        .chunks_mut(cols)
        .zip(gx.chunks_mut(cols))
        .take(group.len())
        .enumerate()
    {
        // `gx` is free until it is computed below.
        gamma_times(group.start + i, g, gx);
        let (mean, rstd) = stat(i);
        for ((gx, &g), &v) in gx.iter_mut().zip(&*g).zip(row(i)) {
            *gx = g * ((v - mean) * rstd);
        }
    }
    let (g, gx) = (&scratch.g, &scratch.gx);
    let (g_row, gx_row) = (
        |i: usize| &g[i * cols..][..cols],
        |i: usize| &gx[i * cols..][..cols],
    );
    let (sums_g, sums_gx) = if group.len() == SIDE_BY_SIDE {
        (sixteen_row_sums(g_row), sixteen_row_sums(gx_row))
    } else {
        let mut sums = ([0.0f32; SIDE_BY_SIDE], [0.0f32; SIDE_BY_SIDE]);
        for i in 0..group.len() {
            sums.0[i] = workgroup_sum_of(g_row(i), ROW_LANES);
            sums.1[i] = workgroup_sum_of(gx_row(i), ROW_LANES);
        }
        sums
    };
    for (i, out) in out.chunks_mut(cols).enumerate() {
        let (mean, rstd) = stat(i);
        let (mean_g, mean_gx) = (sums_g[i] / cols as f32, sums_gx[i] / cols as f32);
        let dx = |g: f32, v: f32| rstd * (g - mean_g - (v - mean) * rstd * mean_gx);
        let values = out.iter_mut().zip(g_row(i)).zip(row(i));
        match onto {
            // `acc + dx`, as the backward pass's accumulation adds a gradient to the one
            // before it.
            Some(onto) => {
                for (((o, &g), &v), &acc) in values.zip(&onto[i * cols..][..cols]) {
                    o.write(acc + dx(g, v));
                }
            }
            None => {
                for ((o, &g), &v) in values {
                    o.write(dx(g, v));
                }
            }
        }
    }
}

/// Where [`image_channel_sums`] reads each pixel's output gradient.
pub(crate) trait PixelGradients: Sync {
    /// Pixel `j`'s gradient, its channels' values; it is pixel `at` of image `image`.
    /// `room` has space for the values, for a gradient that is built rather than read.
    /// Always inlined, to run on the caller's vector unit.
    fn pixel<'a>(
        &'a self,
        j: usize,
        image_and_pixel: (usize, usize),
        room: &'a mut [f32],
    ) -> &'a [f32];
}

/// The gradients of pixels of `channels` values, side by side in `dy`.
pub(crate) struct DenseGradients<'d> {
    pub(crate) dy: &'d [f32],
    pub(crate) channels: usize,
}

impl PixelGradients for DenseGradients<'_> {
    #[inline(always)]
    fn pixel<'a>(&'a self, j: usize, _: (usize, usize), _: &'a mut [f32]) -> &'a [f32] {
        &self.dy[j * self.channels..][..self.channels]
    }
}

/// `(dgamma, dbeta)` of [`image_forward`]: the channels' sums of `dy * normed` and of `dy`
/// over every pixel, with the composition's bits (`sum_to_shape` of the product, and of
/// `dy`), `normed` recomputed from `x` (images of `cols` values) and its `stats` as it is
/// read. `gradients` gives each pixel's `dy` (`channels` values): the image norm's own
/// ([`DenseGradients`]), or one built from a pooling's gradient (`cpu::norm_pool`).
///
/// Each task takes the pixels of a share of the sums' lanes ([`ColumnSums::round`]) and sums
/// both for them in one pass, each lane's pixels in ascending order as one task would. Two
/// tasks, one a sum, did unequal work (the products and the normalization on one side) and
/// read `dy` twice.
pub(crate) fn image_channel_sums(
    x: &[f32],
    stats: &[f32],
    channels: usize,
    cols: usize,
    gradients: &impl PixelGradients,
) -> (Vec<f32>, Vec<f32>) {
    assert!(channels > 0 && cols.is_multiple_of(channels) && x.len().is_multiple_of(cols));
    let pixels = x.len() / channels;
    let round = ColumnSums::new(pixels, channels).round();
    let tasks = rayon::current_num_threads().clamp(1, round);
    let shares: Vec<_> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let residues = t * round / tasks..(t + 1) * round / tasks;
            let mut dgamma = ColumnSums::new(pixels, channels);
            let mut dbeta = ColumnSums::new(pixels, channels);
            let mut room = vec![0.0f32; channels];
            let image_pixels = cols / channels;
            widest(
                #[inline(always)]
                || {
                    // The image of the pixels at hand, followed without a division per pixel.
                    let (mut image, mut next_image) = (0, image_pixels);
                    for start in (0..pixels).step_by(round) {
                        let end = (start + residues.end).min(pixels);
                        for j in start + residues.start..end {
                            while j >= next_image {
                                image += 1;
                                next_image += image_pixels;
                            }
                            let at = j - (next_image - image_pixels);
                            let d = gradients.pixel(j, (image, at), &mut room);
                            let (mean, rstd) = (stats[2 * image], stats[2 * image + 1]);
                            let xr = &x[j * channels..][..channels];
                            for ((s, &d), &v) in dgamma.lane_of(j).iter_mut().zip(d).zip(xr) {
                                *s += d * normalized(v, mean, rstd);
                            }
                            dbeta.add(j, d);
                        }
                    }
                },
            );
            (residues, dgamma, dbeta)
        })
        .collect();
    let mut shares = shares.into_iter();
    let (_, mut dgamma, mut dbeta) = shares.next().expect("at least one task");
    for (residues, g, b) in shares {
        dgamma.take_lanes(&g, residues.clone());
        dbeta.take_lanes(&b, residues);
    }
    (dgamma.finish(), dbeta.finish())
}

/// The input's gradient of [`image_forward`]: the normalization's, given that of its output
/// `dy * gamma` per channel (the gamma of ones multiplies it by one, which changes no bit),
/// each pixel's `dy` from `gradients` as [`image_channel_sums`] reads it.
pub(crate) fn image_input_gradient(
    x: &[f32],
    channel_gamma: &[f32],
    stats: &[f32],
    cols: usize,
    gradients: &impl PixelGradients,
) -> Vec<f32> {
    let channels = channel_gamma.len();
    assert!(channels > 0 && cols.is_multiple_of(channels));
    let image_pixels = cols / channels;
    input_gradient(
        x,
        stats,
        cols,
        #[inline(always)]
        |image, g, room| {
            for (at, g) in g.chunks_exact_mut(channels).enumerate() {
                let j = image * image_pixels + at;
                let d = gradients.pixel(j, (image, at), &mut *room);
                for ((g, &d), &w) in g.iter_mut().zip(d).zip(channel_gamma) {
                    *g = d * w;
                }
            }
        },
        None,
    )
}

/// `(dx, dgamma, dbeta)`. `dx` by rows in parallel; `dgamma` and `dbeta` by column blocks,
/// each column summed over the rows in ascending order from 0, as the reference does. With
/// `onto` (as long as `x`), `dx` is `onto + dx`, element by element: the input's gradient
/// added onto the one it already has, in the pass that computes it.
pub fn backward(
    x: &[f32],
    gamma: &[f32],
    stats: &[f32],
    dy: &[f32],
    cols: usize,
    onto: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let dx = input_gradient(
        x,
        stats,
        cols,
        #[inline(always)]
        |r, g, _| {
            for ((g, &d), &w) in g.iter_mut().zip(&dy[r * cols..][..cols]).zip(gamma) {
                *g = d * w;
            }
        },
        onto,
    );
    let (mut dgamma, mut dbeta) = (vec![0.0; cols], vec![0.0; cols]);
    // Each block of columns walks the rows in order, its columns side by side in vector lanes.
    // A whole block sums into arrays of a size known at compile time, which stay in registers
    // for all the rows; summed into the output slices, every row loaded and stored them again
    // (a probe on the GPT's [2048, 64], forward and backward, `perf report --sort srcline`:
    // 39.7% of all its samples on that loop's lines, a chain of store-to-load forwarding per
    // row).
    const BLOCK: usize = 16;
    for_each_chunk_pair_with(
        (&mut dgamma, BLOCK),
        (&mut dbeta, BLOCK),
        || (),
        |_, b, dg, db| {
            let first = b * BLOCK;
            widest(
                #[inline(always)]
                || {
                    if dg.len() == BLOCK {
                        let (mut g_sums, mut b_sums) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
                        sum_columns(x, dy, stats, cols, first, &mut g_sums, &mut b_sums);
                        dg.copy_from_slice(&g_sums);
                        db.copy_from_slice(&b_sums);
                    } else {
                        sum_columns(x, dy, stats, cols, first, dg, db);
                    }
                },
            )
        },
    );
    (dx, dgamma, dbeta)
}

/// Adds, over every row in order, `dy * xhat` to `dgamma` and `dy` to `dbeta` for the columns
/// from `first` (as many as `dgamma` holds), xhat recomputed as the reference does from the
/// row's statistics. Inlined into a caller whose sums are arrays, the sums stay in registers.
#[inline(always)]
fn sum_columns(
    x: &[f32],
    dy: &[f32],
    stats: &[f32],
    cols: usize,
    first: usize,
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let width = dgamma.len();
    for r in 0..x.len() / cols {
        let (mean, rstd) = (stats[2 * r], stats[2 * r + 1]);
        let (dyr, xr) = (
            &dy[r * cols + first..][..width],
            &x[r * cols + first..][..width],
        );
        for (((g, b), &d), &v) in dgamma.iter_mut().zip(dbeta.iter_mut()).zip(dyr).zip(xr) {
            *g += d * ((v - mean) * rstd);
            *b += d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::layernorm::{layernorm_backward_ref, layernorm_ref};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn forward_and_backward_are_the_references() {
        for (rows, cols) in [
            (1, 1),
            (3, 5),
            (9, 64),
            (5, 65),
            (700, 33),
            (2100, 64),
            (40, 300),
        ] {
            let n = rows * cols;
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1999) as f32 - 999.0) * 0.013 + (i / cols) as f32)
                .collect();
            let gamma: Vec<f32> = (0..cols).map(|j| 0.5 + (j % 7) as f32 * 0.21).collect();
            let beta: Vec<f32> = (0..cols).map(|j| (j % 5) as f32 * -0.3).collect();
            let dy: Vec<f32> = (0..n)
                .map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.07)
                .collect();
            let (y, stats) = forward(&x, &gamma, &beta, cols, 1e-5);
            let (want_y, want_stats) = layernorm_ref(&x, &gamma, &beta, cols, 1e-5);
            assert_eq!(bits(&y), bits(&want_y), "[{rows}, {cols}] y");
            assert_eq!(bits(&stats), bits(&want_stats), "[{rows}, {cols}] stats");
            let (dx, dg, db) = backward(&x, &gamma, &stats, &dy, cols, None);
            let (want_dx, want_dg, want_db) = layernorm_backward_ref(&x, &gamma, &stats, &dy, cols);
            assert_eq!(bits(&dx), bits(&want_dx), "[{rows}, {cols}] dx");
            // Onto an earlier gradient: the sum an addition after it gives.
            let acc: Vec<f32> = dy.iter().map(|d| d * -1.75 + 0.5).collect();
            let (onto, _, _) = backward(&x, &gamma, &stats, &dy, cols, Some(&acc));
            let want: Vec<f32> = acc.iter().zip(&want_dx).map(|(a, d)| a + d).collect();
            assert_eq!(bits(&onto), bits(&want), "[{rows}, {cols}] onto");
            assert_eq!(bits(&dg), bits(&want_dg), "[{rows}, {cols}] dgamma");
            assert_eq!(bits(&db), bits(&want_db), "[{rows}, {cols}] dbeta");
        }
    }
}
