//! A convolution followed by max pooling over windows that do not overlap, as one operation
//! on the CPU path: the bits of the two in sequence (`cpu::conv::forward`, then
//! `kernels::pool::max_pool_fast`, and their backward passes), without the convolution's
//! output in memory.
//!
//! The CNN's first layer writes 128 × 784 × 16 floats (6.4 MB) that the pooling reads once
//! and keeps a quarter of; its backward pass writes as many gradients, three quarters of
//! them zeros, and the bias and weight gradients read them again. Here each image's
//! convolution is computed and pooled while it is in cache, and the gradients of the weight
//! and bias are summed from the pooled gradient and its winners directly. Windows of 2 x 2
//! every 2 pixels, on AVX-512, take `pairs`: pooled in registers, and a term per window row.

use rayon::prelude::*;

use super::output::zeroed_par_chunk_pairs;
use super::padded_image::PaddedImage;
use super::vector_unit::widest;
use crate::kernels::column_sums::ColumnSums;
use crate::kernels::conv_geometry::ConvGeometry;
use crate::kernels::pool::{max_pool_row, PoolGeometry};

mod pairs;

/// Channels a block of the convolution works on at once: one AVX-512 vector, in fixed-size
/// arrays that the compiler keeps in vector registers. A last block of fewer channels is
/// padded with zero weights and its extra lanes are dropped.
const LANES: usize = 16;

/// The weight `[patch, oc]` as blocks of [`LANES`] channels, `[blocks, patch]` arrays, the
/// last block padded with zeros; and the bias likewise.
fn weight_blocks(
    weight: &[f32],
    bias: Option<&[f32]>,
    oc: usize,
) -> (Vec<[f32; LANES]>, Vec<[f32; LANES]>) {
    let patch = weight.len() / oc.max(1);
    let blocks = oc.div_ceil(LANES);
    let lanes =
        |values: &[f32], b: usize| in_lanes(&values[b * LANES..(b * LANES + LANES).min(oc)]);
    let packed = (0..blocks)
        .flat_map(|b| (0..patch).map(move |i| (b, i)))
        .map(|(b, i)| lanes(&weight[i * oc..][..oc], b))
        .collect();
    let bias = bias.map_or(vec![], |bias| (0..blocks).map(|b| lanes(bias, b)).collect());
    (packed, bias)
}

/// The pooled output `[n, ph, pw, oc]` and each value's winner, as the flat index of the
/// convolution's output element `[n, oh, ow, oc]` it came from: `max_pool_fast` of
/// `cpu::conv::forward(x, weight, bias)`, an image at a time. Each output pixel's channels
/// are summed in vector lanes from the padded image directly, from 0 and a separately
/// rounded multiply and add per column in ascending order (the product's arithmetic), then
/// the bias added; no im2col columns.
pub fn forward(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    g: &ConvGeometry,
    pool: &PoolGeometry,
) -> (Vec<f32>, Vec<u32>) {
    forward_in(x, weight, bias, g, pool, pairs::applies(pool))
}

/// [`forward`], its windows pooled in registers (`pairs`) when `in_registers`.
fn forward_in(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    g: &ConvGeometry,
    pool: &PoolGeometry,
    in_registers: bool,
) -> (Vec<f32>, Vec<u32>) {
    let (pixels, patch, oc) = (g.out_h() * g.out_w(), g.patch(), pool.c);
    assert!(x.len() == g.n * g.h * g.w * g.c && weight.len() == patch * oc);
    assert!(bias.is_none_or(|b| b.len() == oc));
    assert_eq!((pool.n, pool.h, pool.w), (g.n, g.out_h(), g.out_w()));
    let image = PoolGeometry { n: 1, ..*pool };
    let pooled = pool.out_h() * pool.out_w() * oc;
    if pooled * g.n == 0 {
        return (vec![], vec![]);
    }
    let (weight, bias) = weight_blocks(weight, bias, oc);
    // An image per task: its padded input, and its convolution in the task's scratch unless
    // the windows are pooled in registers.
    zeroed_par_chunk_pairs(
        (g.n * pooled, pooled),
        (g.n * pooled, pooled),
        || {
            let conv = if in_registers { 0 } else { pixels * oc };
            (PaddedImage::new(g), vec![0.0f32; conv])
        },
        |(image_in, conv), n, y, at| {
            image_in.load(x, g, n);
            widest(
                #[inline(always)]
                || {
                    if in_registers {
                        pairs::forward_image(image_in, &weight, &bias, g, pool, n, y, at);
                        return;
                    }
                    convolve_image(image_in, &weight, &bias, g, oc, conv);
                    let rows = y.chunks_mut(pool.out_w() * oc);
                    for (r, (y, at)) in rows.zip(at.chunks_mut(pool.out_w() * oc)).enumerate() {
                        max_pool_row(conv, &image, r, n * pixels * oc, y, at);
                    }
                },
            )
        },
    )
}

/// One image's convolution `[oh * ow, oc]` into `out`. Always inlined, to run on the caller's
/// vector unit.
#[inline(always)]
fn convolve_image(
    image: &PaddedImage,
    weight: &[[f32; LANES]],
    bias: &[[f32; LANES]],
    g: &ConvGeometry,
    oc: usize,
    out: &mut [f32],
) {
    for (b, block) in weight.chunks_exact(g.patch()).enumerate() {
        // A whole block's store as its own instance: with the partial block's in the same
        // loop, the compiler made both one `memcpy` call per pixel of a length chosen at run
        // time, more than the pixel's 9 multiply-adds cost (`perf annotate` of a throwaway
        // probe, session 15).
        if (b + 1) * LANES <= oc {
            convolve_block::<true>(image, block, bias.get(b), g, b, oc, out);
        } else {
            convolve_block::<false>(image, block, bias.get(b), g, b, oc, out);
        }
    }
}

/// Block `b`'s channels of one image's convolution into `out`; `WHOLE` when the block has
/// all [`LANES`] channels.
#[inline(always)]
fn convolve_block<const WHOLE: bool>(
    image: &PaddedImage,
    block: &[[f32; LANES]],
    bias: Option<&[f32; LANES]>,
    g: &ConvGeometry,
    b: usize,
    oc: usize,
    out: &mut [f32],
) {
    let out_w = g.out_w();
    for (oh, row) in out.chunks_exact_mut(out_w * oc).enumerate() {
        // Eight pixels at a time, whose sums are independent chains of additions, then four.
        let mut ow = 0;
        for group in row.chunks_exact_mut(PIXELS * oc) {
            convolve_pixels::<PIXELS, WHOLE>(image, block, bias, g, (oh, ow), b, oc, group);
            ow += PIXELS;
        }
        for group in row[ow * oc..].chunks_exact_mut(PIXELS / 2 * oc) {
            convolve_pixels::<{ PIXELS / 2 }, WHOLE>(image, block, bias, g, (oh, ow), b, oc, group);
            ow += PIXELS / 2;
        }
        for y in row[ow * oc..].chunks_exact_mut(oc) {
            convolve_pixels::<1, WHOLE>(image, block, bias, g, (oh, ow), b, oc, y);
            ow += 1;
        }
    }
}

/// Output pixels whose sums [`convolve_image`] takes side by side: the CNN's first layer took
/// 0.36 ms with eight against 0.375 with four (`c1f` probe, session 20).
const PIXELS: usize = 8;

/// Block `b`'s channels of `P` neighbouring output pixels from `(oh, ow)` on, into `out`
/// (`P * oc` floats); `WHOLE` as for [`convolve_block`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn convolve_pixels<const P: usize, const WHOLE: bool>(
    image: &PaddedImage,
    block: &[[f32; LANES]],
    bias: Option<&[f32; LANES]>,
    g: &ConvGeometry,
    (oh, ow): (usize, usize),
    b: usize,
    oc: usize,
    out: &mut [f32],
) {
    let at: [usize; P] = std::array::from_fn(|q| image.window(g, oh, ow + q));
    let mut acc = [[0.0f32; LANES]; P];
    for (w, &offset) in block.iter().zip(&image.offsets) {
        for (acc, &at) in acc.iter_mut().zip(&at) {
            // SAFETY: `at` is a window's, and `offset` one of the image's offsets.
            let v = unsafe { image.at_unchecked(at, offset) };
            *acc = std::array::from_fn(|l| acc[l] + v * w[l]);
        }
    }
    // Indexed rather than `chunks_exact_mut(oc)`, whose length is a division per call.
    for (q, acc) in acc.iter_mut().enumerate() {
        if let Some(bias) = bias {
            *acc = std::array::from_fn(|l| acc[l] + bias[l]);
        }
        let y = &mut out[q * oc + b * LANES..];
        if WHOLE {
            let y: &mut [f32; LANES] = (&mut y[..LANES]).try_into().expect("a block");
            *y = *acc;
        } else {
            let width = oc - b * LANES;
            y[..width].copy_from_slice(&acc[..width]);
        }
    }
}

/// `values` (at most [`LANES`]) in a block's lanes, the rest `T::default()`.
#[inline(always)]
fn in_lanes<T: Copy + Default>(values: &[T]) -> [T; LANES] {
    match <&[T; LANES]>::try_from(values) {
        Ok(&whole) => whole,
        Err(_) => {
            let mut lanes = [T::default(); LANES];
            lanes[..values.len()].copy_from_slice(values);
            lanes
        }
    }
}

/// Whether [`parameter_gradients`] can sum for `pool`: windows that do not overlap, so that
/// each output pixel of the convolution has at most one pooled gradient.
pub fn sums_from_winners(pool: &PoolGeometry) -> bool {
    pool.stride >= pool.k
}

/// The gradients of the weight `[kh*kw*c, oc]` and, with `bias`, of the bias `[oc]`, from the
/// pooled output's gradient `dy` and [`forward`]'s winners `argmax`: the bits of
/// `im2col(x)ᵀ dh` and of `sum_to_shape(dh, [oc])` for `dh` the pooling's backward pass of
/// `dy` (`[n * oh * ow, oc]`), summed over the convolution's output pixels in ascending order
/// without `dh` in memory.
///
/// `dh` is zero where a pixel did not win its window's channel, and a product of a finite
/// column by zero adds ±0 to a sum from +0, which changes none of its bits; so this adds, per
/// pixel, each column times the winning channels' gradients and zeros for the others. The
/// caller sums from `dh` instead when `x` holds an infinity or a NaN (times zero, a NaN
/// there). Each task takes a share of the weight's rows and of the bias's running sums
/// (residues modulo the round of `ColumnSums`), so every sum keeps its one order: the last task took
/// the whole bias until session 20, half again the others' time for the CNN's first layer.
pub fn parameter_gradients(
    x: &[f32],
    argmax: &[u32],
    dy: &[f32],
    g: &ConvGeometry,
    pool: &PoolGeometry,
    bias: bool,
) -> (Vec<f32>, Option<Vec<f32>>) {
    parameter_gradients_in(x, argmax, dy, g, pool, bias, pairs::applies(pool))
}

/// [`parameter_gradients`], a term per window row (`pairs`) when `in_pairs`.
fn parameter_gradients_in(
    x: &[f32],
    argmax: &[u32],
    dy: &[f32],
    g: &ConvGeometry,
    pool: &PoolGeometry,
    bias: bool,
    in_pairs: bool,
) -> (Vec<f32>, Option<Vec<f32>>) {
    let (patch, oc) = (g.patch(), pool.c);
    let (out_h, out_w) = (g.out_h(), g.out_w());
    assert!(sums_from_winners(pool));
    assert_eq!((pool.n, pool.h, pool.w), (g.n, out_h, out_w));
    assert!(x.len() == g.n * g.h * g.w * g.c);
    assert!(argmax.len() == pool.out_shape().iter().product::<usize>() && dy.len() == argmax.len());
    let tasks = rayon::current_num_threads().clamp(1, patch.max(1));
    let rows_per_task = patch.div_ceil(tasks).max(1);
    let tasks = patch.div_ceil(rows_per_task).max(1);
    let round = ColumnSums::new(g.n * out_h * out_w, oc).round();
    let shares: Vec<_> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let rows = t * rows_per_task..((t + 1) * rows_per_task).min(patch);
            let residues = bias.then(|| t * round / tasks..(t + 1) * round / tasks);
            widest(
                #[inline(always)]
                || share(x, argmax, dy, g, pool, rows, residues, in_pairs),
            )
        })
        .collect();
    let mut dw = Vec::with_capacity(patch * oc);
    let mut db: Option<ColumnSums> = None;
    for (rows, sums) in shares {
        dw.extend_from_slice(&rows);
        match (db.as_mut(), sums) {
            (Some(db), Some((sums, residues))) => db.take_lanes(&sums, residues),
            (None, sums) => db = sums.map(|(sums, _)| sums),
            (Some(_), None) => unreachable!("every task sums the bias or none does"),
        }
    }
    let db = db.map(ColumnSums::finish);
    (dw, db)
}

/// Rows `rows` of the weight's gradient, and the bias's running sums for the pixels whose
/// index modulo [`ColumnSums::round`] lies in `bias`, if given: for each image and
/// block of channels, the convolution's output gradient for the block is built in scratch
/// from the winners ([`unpool`]), then each group of at most [`ROWS`] rows takes one pass
/// over the image's pixels in ascending order, the group's sums in registers; `in_pairs`,
/// each group takes a term per window row instead (`pairs::accumulate`), the first group the
/// bias's sums too, and nothing is built. Always inlined, to run on the caller's vector unit.
///
/// Built as it was read, each pixel's gradient cost its comparisons, its selection and its
/// window's address for every group of rows on every thread, and the loop kept its sums on
/// the stack: 0.53 ms for the CNN's first layer on a 2-core AVX-512 EPYC (`c1back` probe,
/// session 20), for 29 MFLOP; 0.49 ms built once an image, 0.39 ms with the bias's sums
/// shared between the tasks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn share(
    x: &[f32],
    argmax: &[u32],
    dy: &[f32],
    g: &ConvGeometry,
    pool: &PoolGeometry,
    rows: std::ops::Range<usize>,
    bias: Option<std::ops::Range<usize>>,
    in_pairs: bool,
) -> (Vec<f32>, Option<(ColumnSums, std::ops::Range<usize>)>) {
    let oc = pool.c;
    let blocks = oc.div_ceil(LANES);
    let pixels = g.out_h() * g.out_w();
    let mut image = PaddedImage::new(g);
    let offsets = image.offsets[rows.clone()].to_vec();
    // acc[b * rows + r]: row rows.start + r's sums of block b's channels.
    let mut acc = vec![[0.0f32; LANES]; blocks * rows.len()];
    let mut sums = bias.map(|residues| (ColumnSums::new(g.n * pixels, oc), residues));
    // Zeroed once: `unpool` leaves the pixels in no window alone.
    let mut dh = vec![[0.0f32; LANES]; if in_pairs { 0 } else { pixels }];
    for n in 0..g.n {
        image.load(x, g, n);
        for b in 0..blocks {
            let acc = &mut acc[b * rows.len()..][..rows.len()];
            let groups = acc.chunks_mut(ROWS).zip(offsets.chunks(ROWS));
            if in_pairs {
                // The first group's pass sums the bias too.
                let mut bias = sums.as_mut().map(|(sums, residues)| (sums, &*residues));
                for (group, offsets) in groups {
                    with_group_size!(group.len(), R => pairs::accumulate::<R>(
                        &image,
                        g,
                        pool,
                        argmax,
                        dy,
                        (n, b),
                        group.try_into().expect("the group's rows"),
                        offsets.try_into().expect("the group's offsets"),
                        bias.take(),
                    ));
                }
                continue;
            }
            unpool(argmax, dy, pool, (n, b), &mut dh);
            if let Some((sums, residues)) = sums.as_mut() {
                let width = LANES.min(oc - b * LANES);
                let (first, round) = (n * pixels, sums.round());
                // The image's pixels `j` with `j % round` in the residues.
                let starts = (first - first % round..first + pixels).step_by(round);
                let share = starts.flat_map(|start| {
                    (start + residues.start).max(first)..(start + residues.end).min(first + pixels)
                });
                for j in share {
                    let (lane, d) = (&mut sums.lane_of(j)[b * LANES..], &dh[j - first]);
                    // A whole block as fixed-size arrays, one vector: with the width known
                    // only at run time, a loop of single lanes.
                    if let Ok(lane) = <&mut [f32; LANES]>::try_from(&mut lane[..width]) {
                        *lane = std::array::from_fn(|l| lane[l] + d[l]);
                    } else {
                        for (s, &d) in lane.iter_mut().zip(d) {
                            *s += d;
                        }
                    }
                }
            }
            for (group, offsets) in groups {
                with_group_size!(group.len(), R => accumulate::<R>(
                    &image,
                    g,
                    &dh,
                    group.try_into().expect("the group's rows"),
                    offsets.try_into().expect("the group's offsets"),
                ));
            }
        }
    }
    let mut dw = vec![0.0f32; rows.len() * oc];
    for (b, block) in acc.chunks_exact(rows.len()).enumerate() {
        for (row, sums) in dw.chunks_exact_mut(oc).zip(block) {
            let width = LANES.min(oc - b * LANES);
            row[b * LANES..][..width].copy_from_slice(&sums[..width]);
        }
    }
    (dw, sums)
}

/// Weight rows whose sums [`share`] keeps in registers at once (with AVX-512's 32 vector
/// registers, 8 sums leave room for the pixel's values).
const ROWS: usize = 8;

/// `$body` with `$r` a constant, the size `$len` of a group of 1 to [`ROWS`] weight rows: as
/// a constant, the group's sums stay in registers.
macro_rules! with_group_size {
    ($len:expr, $r:ident => $body:expr) => {
        with_group_size!(@sizes $len, $r, $body, 1 2 3 4 5 6 7 8)
    };
    (@sizes $len:expr, $r:ident, $body:expr, $($size:literal)*) => {
        match $len {
            $($size => {
                const $r: usize = $size;
                $body
            })*
            _ => unreachable!("groups of 1 to ROWS rows"),
        }
    };
}
use with_group_size;

/// Image `n`'s gradient of the convolution's output for channel block `b`, `dh` (one lane
/// array per output pixel): the window's gradient where the pixel won, 0 elsewhere. Pixels in
/// no window are the same for every image and block and are not written: `dh` comes zeroed.
/// A block's padded lanes have gradients of 0.
#[inline(always)]
fn unpool(
    argmax: &[u32],
    dy: &[f32],
    pool: &PoolGeometry,
    (n, b): (usize, usize),
    dh: &mut [[f32; LANES]],
) {
    // A whole block's loads as fixed-size arrays: with the partial block's `in_lanes` in the
    // same loop, the compiler built the lanes one at a time with shuffles, which took half of
    // [`parameter_gradients`]'s time (`perf annotate` of the `c1back` probe, session 20).
    if (b + 1) * LANES <= pool.c {
        unpool_block::<true>(argmax, dy, pool, (n, b), dh)
    } else {
        unpool_block::<false>(argmax, dy, pool, (n, b), dh)
    }
}

/// [`unpool`] for pixels in windows; `WHOLE` when block `b` has all [`LANES`] channels.
#[inline(always)]
fn unpool_block<const WHOLE: bool>(
    argmax: &[u32],
    dy: &[f32],
    pool: &PoolGeometry,
    (n, b): (usize, usize),
    dh: &mut [[f32; LANES]],
) {
    let (oc, out_w) = (pool.c, pool.w);
    let width = if WHOLE { LANES } else { pool.c - b * LANES };
    // The flat index of the image's first output element in the block: a pixel's winners
    // are `q * oc` on from it, lane by lane.
    let image_first = (n * pool.h * out_w * oc + b * LANES) as u32;
    for ph in 0..pool.out_h() {
        for oh in ph * pool.stride..ph * pool.stride + pool.k {
            for pw in 0..pool.out_w() {
                let window = ((n * pool.out_h() + ph) * pool.out_w() + pw) * oc + b * LANES;
                let (winners, grads): ([u32; LANES], [f32; LANES]) = if WHOLE {
                    let winners = &argmax[window..][..LANES];
                    let grads = &dy[window..][..LANES];
                    (
                        *<&[u32; LANES]>::try_from(winners).expect("a block"),
                        *<&[f32; LANES]>::try_from(grads).expect("a block"),
                    )
                } else {
                    (
                        in_lanes(&argmax[window..][..width]),
                        in_lanes(&dy[window..][..width]),
                    )
                };
                // Each lane's winner less its lane: the winning pixel's first index, compared
                // with each pixel's as one broadcast value.
                let winning: [u32; LANES] =
                    std::array::from_fn(|l| winners[l].wrapping_sub(l as u32));
                for ow in pw * pool.stride..pw * pool.stride + pool.k {
                    let q = oh * out_w + ow;
                    let first = image_first + (q * oc) as u32;
                    for ((d, &w), &grad) in dh[q].iter_mut().zip(&winning).zip(&grads) {
                        *d = if w == first { grad } else { 0.0 };
                    }
                }
            }
        }
    }
}

/// `acc[r] += column value * dh` over the image's pixels in ascending order, for the `R` rows
/// whose columns read the padded image at `offsets` from each pixel's window.
#[inline(always)]
fn accumulate<const R: usize>(
    image: &PaddedImage,
    g: &ConvGeometry,
    dh: &[[f32; LANES]],
    acc: &mut [[f32; LANES]; R],
    offsets: &[usize; R],
) {
    let out_w = g.out_w();
    if out_w == 0 {
        return;
    }
    let mut sums = *acc;
    for (oh, dh_row) in dh.chunks_exact(out_w).enumerate() {
        let (first, step) = image.row_of_windows(g, oh);
        for (ow, d) in dh_row.iter().enumerate() {
            let at = first + ow * step;
            for (sum, &offset) in sums.iter_mut().zip(offsets) {
                // SAFETY: `at` is a window of a row `row_of_windows` checked; `offsets` are
                // some of the image's.
                let v = unsafe { image.at_unchecked(at, offset) };
                *sum = std::array::from_fn(|l| sum[l] + v * d[l]);
            }
        }
    }
    *acc = sums;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed, 5);
        (0..n).map(|_| rng.normal()).collect()
    }

    fn bits<T: bytemuck::Pod>(v: &[T]) -> Vec<u32> {
        bytemuck::cast_slice::<T, u32>(v).to_vec()
    }

    #[test]
    fn windows_pooled_in_registers_give_the_pixel_loops_bits() {
        // 2 x 2 windows every 2 pixels, which `pairs` takes on AVX-512 (elsewhere there is
        // nothing to compare): the CNN's first layer; odd sides, a row and a column in no
        // window; groups of 4, 3 and 1 windows; a partial block of channels and two blocks;
        // several channels in, and a stride; ties (an image of zeros); a pooled gradient
        // with zeros.
        let pool_of = |g: &ConvGeometry, oc: usize| PoolGeometry {
            n: g.n,
            h: g.out_h(),
            w: g.out_w(),
            c: oc,
            k: 2,
            stride: 2,
        };
        for (i, &(n, h, w, c, kernel, stride, pad, oc)) in [
            (3, 28, 28, 1, 3, 1, 1, 16),
            (2, 9, 11, 1, 3, 1, 1, 5),
            (2, 8, 14, 3, 3, 1, 1, 21),
            (2, 13, 12, 2, 3, 2, 0, 16),
            (1, 6, 6, 1, 3, 1, 1, 16),
        ]
        .iter()
        .enumerate()
        {
            let g = ConvGeometry::of(&[n, h, w, c], kernel, kernel, stride, pad).unwrap();
            let pool = pool_of(&g, oc);
            if !pairs::applies(&pool) {
                return;
            }
            let seed = 40 + i as u64 * 4;
            let x = if i == 4 {
                vec![0.0; n * h * w * c]
            } else {
                values(n * h * w * c, seed)
            };
            let weight = values(g.patch() * oc, seed + 1);
            let bias = values(oc, seed + 2);
            let case = format!("case {i}: {g:?}, {oc} channels out");
            let fast = forward_in(&x, &weight, Some(&bias), &g, &pool, true);
            let slow = forward_in(&x, &weight, Some(&bias), &g, &pool, false);
            assert_eq!(bits(&fast.0), bits(&slow.0), "{case}: y");
            assert_eq!(fast.1, slow.1, "{case}: winners");
            let mut dy = values(fast.0.len(), seed + 3);
            dy.iter_mut().step_by(3).for_each(|v| *v = 0.0);
            let fast = parameter_gradients_in(&x, &slow.1, &dy, &g, &pool, true, true);
            let slow = parameter_gradients_in(&x, &slow.1, &dy, &g, &pool, true, false);
            assert_eq!(bits(&fast.0), bits(&slow.0), "{case}: weight gradient");
            let (fast, slow) = (fast.1.unwrap(), slow.1.unwrap());
            assert_eq!(bits(&fast), bits(&slow), "{case}: bias gradient");
        }
    }
}
