//! Reductions over one axis, over everything, and row-wise argmax (reduce.wgsl).
//!
//! Every reduction is computed in a fixed order that depends only on the shape, so repeated
//! runs give the same bits. The GPU sums in a different order than the CPU reference (a tree
//! against a running sum), which is why the two agree to a tolerance and not bit for bit.

use bytemuck::{Pod, Zeroable};

use rayon::prelude::*;

use crate::cpu::vector_unit::widest;

use super::{grid_1d, grid_groups, span_starts, LOOP_SPAN, REDUCE};
use crate::error::{shape_err, Result};
use crate::gpu::{Gpu, GpuBuf};
use crate::tensor::{DType, Device, Tensor};

/// How a reduction combines the elements along an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// Their sum (0 for none).
    Sum,
    /// Their maximum (-infinity for none).
    Max,
    /// Their minimum (+infinity for none).
    Min,
}

impl Reduce {
    fn code(self) -> u32 {
        self as u32
    }

    fn identity(self) -> f32 {
        match self {
            Reduce::Sum => 0.0,
            Reduce::Max => f32::NEG_INFINITY,
            Reduce::Min => f32::INFINITY,
        }
    }

    fn combine(self, acc: f32, v: f32) -> f32 {
        match self {
            Reduce::Sum => acc + v,
            Reduce::Max => acc.max(v),
            Reduce::Min => acc.min(v),
        }
    }
}

/// How a reduction of `[outer, len, inner]` is split across invocations; it fixes the
/// summation order, which the CPU reference follows too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// One invocation per output walks the axis in order (many outputs or a short axis).
    PerThread,
    /// 256 invocations per output, combined as a tree.
    PerWorkgroup,
    /// Per-workgroup partial results over chunks of `CHUNK`, then a reduction of the chunks.
    TwoPass { chunks: usize },
}

/// Axis length one workgroup reduces in a pass: 256 invocations x 256 elements each.
pub(super) const CHUNK: usize = 65536;
pub(super) const LANES: usize = 256;

pub(super) fn plan(outputs: usize, len: usize) -> Plan {
    // One invocation per output walks the whole axis, so only up to LOOP_SPAN elements: past
    // 65535 loop iterations llvmpipe stops an invocation's loops (see LOOP_SPAN).
    if len <= 256 || (outputs >= 4096 && len <= LOOP_SPAN) {
        Plan::PerThread
    } else if len <= CHUNK {
        Plan::PerWorkgroup
    } else {
        Plan::TwoPass {
            chunks: len.div_ceil(CHUNK),
        }
    }
}

/// CPU reference: `x` viewed as `[outer, len, inner]`, reduced over `len` in the order the
/// GPU plan uses, then multiplied by `scale`.
pub fn reduce_ref(
    x: &[f32],
    outer: usize,
    len: usize,
    inner: usize,
    op: Reduce,
    scale: f32,
) -> Vec<f32> {
    match plan(outer * inner, len) {
        Plan::PerThread => {
            let mut out = vec![op.identity(); outer * inner];
            if out.is_empty() {
                return out;
            }
            // Whole outer rows per task on the CPU path: each output's sum keeps its order.
            let rows_per_task = (crate::cpu::elementwise::CHUNK / (len * inner).max(1)).max(1);
            out.par_chunks_mut(rows_per_task * inner)
                .enumerate()
                .for_each(|(t, rows)| {
                    for (r, row) in rows.chunks_mut(inner).enumerate() {
                        let o = t * rows_per_task + r;
                        for j in 0..len {
                            for (acc, &v) in
                                row.iter_mut().zip(&x[(o * len + j) * inner..][..inner])
                            {
                                *acc = op.combine(*acc, v);
                            }
                        }
                        row.iter_mut().for_each(|v| *v *= scale);
                    }
                });
            out
        }
        Plan::PerWorkgroup => per_workgroup(x, outer, len, inner, op, scale),
        Plan::TwoPass { chunks } => {
            // Each chunk of the axis is what one workgroup of the first pass folds: the
            // per-workgroup plan over that chunk's rows, in memory order.
            let mut partial = vec![0.0; outer * chunks * inner];
            partial
                .par_chunks_mut(inner.max(1))
                .enumerate()
                .for_each(|(oc, part)| {
                    let (o, c) = (oc / chunks, oc % chunks);
                    let rows = CHUNK.min(len - c * CHUNK);
                    let x = &x[(o * len + c * CHUNK) * inner..][..rows * inner];
                    part.copy_from_slice(&per_workgroup(x, 1, rows, inner, op, 1.0));
                });
            reduce_ref(&partial, outer, chunks, inner, op, scale)
        }
    }
}

/// The per-workgroup plan's sums ([`lanes_then_tree`] with `op`'s identity and combine).
fn per_workgroup(
    x: &[f32],
    outer: usize,
    len: usize,
    inner: usize,
    op: Reduce,
    scale: f32,
) -> Vec<f32> {
    match op {
        Reduce::Sum => lanes_then_tree(x, outer, len, inner, scale, 0.0, |a, b| a + b),
        Reduce::Max => lanes_then_tree(x, outer, len, inner, scale, f32::NEG_INFINITY, f32::max),
        Reduce::Min => lanes_then_tree(x, outer, len, inner, scale, f32::INFINITY, f32::min),
    }
}

/// Columns of `inner` one task of [`lanes_then_tree`] reduces: a cache line of f32, or two or
/// four lines where the columns allow.
const COLUMNS_PER_TASK: usize = 16;

/// Elements of a reduction above which [`lanes_then_tree`] keeps a task per thread rather
/// than take wider blocks.
const WIDE_BLOCKS_MAX_ELEMENTS: usize = 1 << 18;

/// The per-workgroup plan of `[outer, len, inner]` over `len`, output for output as
/// [`workgroup_fold`] computes it (element `j` into lane `j % LANES` in ascending `j`, then
/// the lanes as a tree), but walking the input in memory order: each task keeps the 256
/// lanes of up to [`COLUMNS_PER_TASK`] (or 32 or 64) neighbouring outputs and adds each
/// row's run of them at once, where a fold per output would stride by `inner` and allocate
/// its lanes.
/// One `combine` per operation (the caller's `match`), not a `match` per element.
fn lanes_then_tree(
    x: &[f32],
    outer: usize,
    len: usize,
    inner: usize,
    scale: f32,
    identity: f32,
    combine: impl Fn(f32, f32) -> f32 + Sync,
) -> Vec<f32> {
    // Wider blocks where the columns allow: a task reads a row's run of 32 or 64 columns (two
    // or four cache lines side by side), where blocks of 16 read one line of each row, a row
    // apart. A large reduction keeps a task per thread. Which outputs a task holds changes
    // nothing in any output's sum. A throwaway probe on a 2-core Zen 5 EPYC, best of seven:
    // [2048, 64] 13.0 -> 5.7 us in one block of 64 (12.3 in two of 32), [2048, 256] 49-59 ->
    // 25-28 us; [25088, 32] took 54-57 us in one block of 32 against 23-38 in two of 16.
    let threads = rayon::current_num_threads();
    let large = len * inner > WIDE_BLOCKS_MAX_ELEMENTS;
    let per_task = [64, 32]
        .into_iter()
        .find(|&w| inner.is_multiple_of(w) && (!large || inner / w >= threads))
        .unwrap_or(COLUMNS_PER_TASK);
    let blocks = inner.div_ceil(per_task);
    let task = |t: usize| {
        let (o, b) = (t / blocks, t % blocks);
        let first = b * per_task;
        let width = per_task.min(inner - first);
        if width == per_task {
            let x = &x[o * len * inner + first..];
            return widest(
                #[inline(always)]
                || match per_task {
                    64 => full_block::<64>(x, len, inner, scale, identity, &combine),
                    32 => full_block::<32>(x, len, inner, scale, identity, &combine),
                    _ => full_block::<COLUMNS_PER_TASK>(x, len, inner, scale, identity, &combine),
                },
            );
        }
        if inner == 1 {
            let x = &x[o * len..][..len];
            return widest(
                #[inline(always)]
                || vec![one_column(x, scale, identity, &combine)],
            );
        }
        // lanes[l * width + c]: lane l of output column first + c.
        let mut lanes = vec![identity; LANES * width];
        for j in 0..len {
            let row = &x[(o * len + j) * inner + first..][..width];
            let lane = &mut lanes[(j % LANES) * width..][..width];
            for (acc, &v) in lane.iter_mut().zip(row) {
                *acc = combine(*acc, v);
            }
        }
        combine_lanes_as_tree(&mut lanes, width, &combine);
        lanes.truncate(width);
        lanes.iter_mut().for_each(|v| *v *= scale);
        lanes
    };
    let columns: Vec<Vec<f32>> = (0..outer * blocks).into_par_iter().map(task).collect();
    let mut out = Vec::with_capacity(outer * inner);
    for c in columns {
        out.extend_from_slice(&c);
    }
    out
}

/// The tree of the per-workgroup plan over `lanes` (`[LANES, width]`: lane `l`'s running
/// value of each of `width` outputs): lane `l` takes in lane `l + half` for halves of 128, 64,
/// ... 1, leaving each output's result in lane 0 (the first `width` values).
pub(super) fn combine_lanes_as_tree(
    lanes: &mut [f32],
    width: usize,
    combine: impl Fn(f32, f32) -> f32,
) {
    debug_assert_eq!(lanes.len(), LANES * width);
    let mut half = LANES / 2;
    while half > 0 {
        let (low, high) = lanes.split_at_mut(half * width);
        for (acc, &v) in low.iter_mut().zip(&high[..half * width]) {
            *acc = combine(*acc, v);
        }
        half /= 2;
    }
}

/// One task of [`lanes_then_tree`] over a whole block of `W` columns (16, 32 or 64), the
/// first of which is `x[0]`: the same lanes and tree, in arrays whose sizes the compiler
/// knows, so that each row's run is one vector operation on the widest vector unit (the
/// caller runs it in `widest`). Every bias gradient of a layer wider than 16 is such blocks:
/// through the generic loop, the sums of a [2048, 256] gradient took 0.51–0.55 ms on one
/// thread, in these blocks 0.19–0.27 (a throwaway probe on the 2-core Xeon, 2026-11-29).
#[inline(always)]
fn full_block<const W: usize>(
    x: &[f32],
    len: usize,
    inner: usize,
    scale: f32,
    identity: f32,
    combine: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let mut lanes = [[identity; W]; LANES];
    for j in 0..len {
        let row: &[f32; W] = x[j * inner..][..W].try_into().expect("a whole block");
        let lane = &mut lanes[j % LANES];
        *lane = std::array::from_fn(|c| combine(lane[c], row[c]));
    }
    let mut half = LANES / 2;
    while half > 0 {
        let (low, high) = lanes.split_at_mut(half);
        for (acc, v) in low.iter_mut().zip(&high[..half]) {
            *acc = std::array::from_fn(|c| combine(acc[c], v[c]));
        }
        half /= 2;
    }
    lanes[0].iter().map(|v| v * scale).collect()
}

/// One task of [`lanes_then_tree`] over a single column (`inner` 1: a whole tensor's sum, a
/// mean of a loss): element `j` into lane `j % LANES` as a run of [`LANES`] elements at a
/// time, the same lanes and tree. The generic loop took a slice and a remainder per element:
/// 0.7 ms of the GPT's 1.2 ms update went to its clipping's 50 sums of squares (throwaway
/// timer on the 2-core Xeon).
#[inline(always)]
fn one_column(x: &[f32], scale: f32, identity: f32, combine: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [identity; LANES];
    let mut runs = x.chunks_exact(LANES);
    for run in &mut runs {
        lanes = std::array::from_fn(|l| combine(lanes[l], run[l]));
    }
    for (lane, &v) in lanes.iter_mut().zip(runs.remainder()) {
        *lane = combine(*lane, v);
    }
    combine_lanes_as_tree(&mut lanes, 1, &combine);
    lanes[0] * scale
}

/// CPU reference of argmax over the last axis of `[rows, len]` (first maximum wins).
pub fn argmax_ref(x: &[f32], rows: usize, len: usize) -> Vec<u32> {
    (0..rows)
        .map(|r| {
            let row = &x[r * len..][..len];
            let mut best = 0;
            for (j, &v) in row.iter().enumerate().skip(1) {
                if v > row[best] {
                    best = j;
                }
            }
            best as u32
        })
        .collect()
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    outer: u32,
    len: u32,
    inner: u32,
    chunk: u32,
    chunks: u32,
    scale: f32,
    _pad: [u32; 2],
}

/// GPU reduction of `[outer, len, inner]` over `len`, following [`plan`].
pub(crate) fn reduce_gpu(
    gpu: &Gpu,
    x: &GpuBuf,
    outer: usize,
    len: usize,
    inner: usize,
    op: Reduce,
    scale: f32,
) -> Result<GpuBuf> {
    let outputs = outer * inner;
    let out_of = |n: usize| gpu.alloc(4 * n as u64);
    if outputs == 0 {
        return out_of(0);
    }
    let base = Params {
        outer: outer as u32,
        len: len as u32,
        inner: inner as u32,
        chunk: 0,
        chunks: 1,
        scale,
        _pad: [0; 2],
    };
    let constants = [("OP", op.code() as f64)];
    match plan(outputs, len) {
        Plan::PerThread => {
            // Reads coalesce along `inner`.
            let out = out_of(outputs)?;
            gpu.launch(
                &gpu.pipeline(&REDUCE, "per_thread", &constants),
                &base,
                &[x, &out],
                grid_1d(outputs),
            );
            Ok(out)
        }
        Plan::PerWorkgroup => {
            let out = out_of(outputs)?;
            let params = Params {
                chunk: len as u32,
                ..base
            };
            gpu.launch(
                &gpu.pipeline(&REDUCE, "per_workgroup", &constants),
                &params,
                &[x, &out],
                grid_groups(outputs),
            );
            Ok(out)
        }
        Plan::TwoPass { chunks } => {
            let partial = out_of(outer * chunks * inner)?;
            let params = Params {
                chunk: CHUNK as u32,
                chunks: chunks as u32,
                scale: 1.0,
                ..base
            };
            let grid = grid_groups(outer * chunks * inner);
            gpu.launch(
                &gpu.pipeline(&REDUCE, "per_workgroup", &constants),
                &params,
                &[x, &partial],
                grid,
            );
            reduce_gpu(gpu, &partial, outer, chunks, inner, op, scale)
        }
    }
}

fn normalize_axis(op: &'static str, shape: &[usize], axis: isize) -> Result<usize> {
    let rank = shape.len() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return shape_err(op, format!("axis {axis} out of range for shape {shape:?}"));
    }
    Ok(a as usize)
}

fn reduce_view(
    x: &Tensor,
    outer: usize,
    len: usize,
    inner: usize,
    op: Reduce,
    scale: f32,
    out_shape: &[usize],
) -> Result<Tensor> {
    x.expect_dtype("reduce", DType::F32)?;
    match x.device() {
        Device::Cpu => Tensor::from_vec(
            x.device(),
            out_shape,
            reduce_ref(x.cpu_f32().expect("cpu"), outer, len, inner, op, scale),
        ),
        Device::Gpu(gpu) => {
            let out = reduce_gpu(gpu, x.gpu_buf().expect("gpu"), outer, len, inner, op, scale)?;
            Ok(Tensor::from_gpu(gpu, out_shape, DType::F32, out))
        }
    }
}

/// Reduces over `axis` (negative counts from the end); `keepdim` leaves a size-1 axis.
pub fn reduce_axis(x: &Tensor, axis: isize, op: Reduce, keepdim: bool) -> Result<Tensor> {
    reduce_axis_scaled(x, axis, op, keepdim, 1.0)
}

fn reduce_axis_scaled(
    x: &Tensor,
    axis: isize,
    op: Reduce,
    keepdim: bool,
    scale: f32,
) -> Result<Tensor> {
    let s = x.shape();
    let a = normalize_axis("reduce", s, axis)?;
    if op != Reduce::Sum && s[a] == 0 {
        return shape_err("reduce", format!("max/min over an empty axis of {s:?}"));
    }
    let outer: usize = s[..a].iter().product();
    let inner: usize = s[a + 1..].iter().product();
    let mut out_shape = s.to_vec();
    if keepdim {
        out_shape[a] = 1;
    } else {
        out_shape.remove(a);
    }
    reduce_view(x, outer, s[a], inner, op, scale, &out_shape)
}

/// Sum over `axis`.
pub fn sum_axis(x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
    reduce_axis(x, axis, Reduce::Sum, keepdim)
}

/// Mean over `axis`.
pub fn mean_axis(x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
    let a = normalize_axis("mean", x.shape(), axis)?;
    let len = x.shape()[a];
    reduce_axis_scaled(x, axis, Reduce::Sum, keepdim, 1.0 / len.max(1) as f32)
}

/// Sum of all elements, as a scalar tensor.
pub fn sum_all(x: &Tensor) -> Result<Tensor> {
    reduce_view(x, 1, x.numel(), 1, Reduce::Sum, 1.0, &[])
}

/// Mean of all elements, as a scalar tensor.
pub fn mean_all(x: &Tensor) -> Result<Tensor> {
    reduce_view(
        x,
        1,
        x.numel(),
        1,
        Reduce::Sum,
        1.0 / x.numel().max(1) as f32,
        &[],
    )
}

/// Largest element, as a scalar tensor.
pub fn max_all(x: &Tensor) -> Result<Tensor> {
    if x.numel() == 0 {
        return shape_err("max_all", "empty tensor");
    }
    reduce_view(x, 1, x.numel(), 1, Reduce::Max, 1.0, &[])
}

/// Sums `x` down to `shape`, the inverse of broadcasting `shape` up to `x.shape()`: the
/// gradient of a broadcast operand.
pub fn sum_to_shape(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let xs = x.shape().to_vec();
    if xs == shape {
        return Ok(x.clone());
    }
    if super::binary::broadcast_shape(shape, &xs)? != xs {
        return shape_err(
            "sum_to_shape",
            format!("{shape:?} does not broadcast to {xs:?}"),
        );
    }
    // Which axes of x are summed: leading extra axes, and axes where `shape` has 1.
    let offset = xs.len() - shape.len();
    let summed: Vec<bool> = (0..xs.len())
        .map(|i| i < offset || (shape[i - offset] == 1 && xs[i] != 1))
        .collect();
    // Merge runs of summed and kept axes, then reduce each summed run as one axis.
    let mut runs: Vec<(bool, usize)> = vec![];
    for (i, &s) in summed.iter().enumerate() {
        match runs.last_mut() {
            Some((rs, n)) if *rs == s => *n *= xs[i],
            _ => runs.push((s, xs[i])),
        }
    }
    let mut cur = x.reshape(&runs.iter().map(|r| r.1).collect::<Vec<_>>())?;
    for i in (0..runs.len()).rev() {
        if runs[i].0 {
            cur = sum_axis(&cur, i as isize, true)?;
        }
    }
    cur.reshape(shape)
}

/// Index of the largest element along the last axis, as u32 (first wins on ties).
pub fn argmax_last(x: &Tensor) -> Result<Tensor> {
    x.expect_dtype("argmax", DType::F32)?;
    let s = x.shape();
    let Some((&len, lead)) = s.split_last() else {
        return shape_err("argmax", "needs at least one axis");
    };
    if len == 0 {
        return shape_err("argmax", format!("empty last axis in {s:?}"));
    }
    let rows: usize = lead.iter().product();
    match x.device() {
        Device::Cpu => Tensor::from_u32(
            x.device(),
            lead,
            argmax_ref(x.cpu_f32().expect("cpu"), rows, len),
        ),
        Device::Gpu(gpu) => {
            let out = gpu.alloc(4 * rows as u64)?;
            let pipeline = gpu.pipeline(&REDUCE, "argmax", &[]);
            let params = Params {
                outer: rows as u32,
                len: len as u32,
                inner: 1,
                chunk: 0,
                chunks: 1,
                scale: 1.0,
                _pad: [0; 2],
            };
            for start in span_starts(len, LOOP_SPAN) {
                gpu.launch(
                    &pipeline,
                    &Params {
                        chunk: start as u32,
                        ..params
                    },
                    &[x.gpu_buf().expect("gpu"), &out],
                    grid_1d(rows),
                );
            }
            Ok(Tensor::from_gpu(gpu, lead, DType::U32, out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::math::workgroup_fold;

    #[test]
    fn reference_reduces_the_middle_axis() {
        // [2, 3, 2]
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        assert_eq!(
            reduce_ref(&x, 2, 3, 2, Reduce::Sum, 1.0),
            [6., 9., 24., 27.]
        );
        assert_eq!(
            reduce_ref(&x, 2, 3, 2, Reduce::Max, 1.0),
            [4., 5., 10., 11.]
        );
        assert_eq!(reduce_ref(&x, 1, 12, 1, Reduce::Sum, 0.5), [33.]);
        assert_eq!(argmax_ref(&[1., 3., 3., 0., -1., -2.], 2, 3), [1, 0]);
    }

    #[test]
    fn the_per_workgroup_plan_walks_rows_with_each_outputs_fold_order() {
        // Awkward shapes in the per-workgroup plan (257..=65536 long, under 4096 outputs):
        // lanes not filled, column blocks cut short, single columns, several outer rows. Values of mixed
        // magnitude so that any other order changes the sums' bits.
        for &(outer, len, inner) in &[
            (1, 257, 1),
            (2, 4097, 1),
            (1, 512, 1),
            (1, 1000, 1),
            (3, 1000, 17),
            (2, 4099, 64),
            (1, 300, 33),
            // Blocks of 64 and of 32 columns (the wider blocks of small reductions).
            (1, 1000, 64),
            (2, 300, 256),
            (1, 2000, 96),
        ] {
            let x: Vec<f32> = (0..outer * len * inner)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 1.37f32.powi((i % 23) as i32 - 11))
                .collect();
            assert_eq!(plan(outer * inner, len), Plan::PerWorkgroup);
            for op in [Reduce::Sum, Reduce::Max, Reduce::Min] {
                let fast = reduce_ref(&x, outer, len, inner, op, 0.5);
                for o in 0..outer {
                    for i in 0..inner {
                        let values = (0..len).map(|j| x[(o * len + j) * inner + i]);
                        let folded =
                            workgroup_fold(values, LANES, op.identity(), |a, b| op.combine(a, b));
                        assert_eq!(
                            fast[o * inner + i].to_bits(),
                            (folded * 0.5).to_bits(),
                            "{op:?} of [{outer}, {len}, {inner}] at ({o}, {i})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_single_columns_elements_keep_their_lanes() {
        // Lane 0 holds 2^24 and lane 1 -2^24: 0.75 added to lane 0 is lost to rounding, added
        // to lane 1 it is not, so the sum tells which lane element `j` went to, for the last
        // element of every run of 256 and of the remainder.
        for len in [257usize, 300, 511, 512, 1000] {
            for j in (256..len).filter(|j| j % 256 < 2 || j % 256 == 255 || *j == len - 1) {
                let mut x = vec![0.0f32; len];
                let lane = j % LANES;
                x[(lane + 256 - 1) % 256] = -16_777_216.0;
                x[lane] = 16_777_216.0;
                x[j] = 0.75;
                let want = workgroup_fold(x.iter().copied(), LANES, 0.0, |a, b| a + b);
                let got = reduce_ref(&x, 1, len, 1, Reduce::Sum, 1.0)[0];
                assert_eq!(got.to_bits(), want.to_bits(), "0.75 at {j} of {len}");
            }
        }
    }

    #[test]
    fn the_two_pass_plan_folds_each_chunk_then_the_chunks_in_order() {
        // Past 65536 along the axis: a chunk cut short, several columns (a convolution's
        // bias gradient is [100352, 16] summed over its rows), several outer rows.
        for &(outer, len, inner) in &[(1usize, 65537usize, 1usize), (2, 70001, 3), (1, 140000, 17)]
        {
            let x: Vec<f32> = (0..outer * len * inner)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 1.37f32.powi((i % 23) as i32 - 11))
                .collect();
            let chunks = len.div_ceil(CHUNK);
            assert_eq!(plan(outer * inner, len), Plan::TwoPass { chunks });
            for op in [Reduce::Sum, Reduce::Max, Reduce::Min] {
                let fast = reduce_ref(&x, outer, len, inner, op, 0.5);
                for o in 0..outer {
                    for i in 0..inner {
                        let chunk_fold = |c: usize| {
                            let js = c * CHUNK..((c + 1) * CHUNK).min(len);
                            let values = js.map(|j| x[(o * len + j) * inner + i]);
                            workgroup_fold(values, LANES, op.identity(), |a, b| op.combine(a, b))
                        };
                        let want = (0..chunks)
                            .map(chunk_fold)
                            .fold(op.identity(), |a, b| op.combine(a, b));
                        assert_eq!(
                            fast[o * inner + i].to_bits(),
                            (want * 0.5).to_bits(),
                            "{op:?} of [{outer}, {len}, {inner}] at ({o}, {i})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn sum_to_shape_inverts_broadcasting() {
        let d = Device::Cpu;
        let x = Tensor::from_vec(&d, &[2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        assert_eq!(
            sum_to_shape(&x, &[3]).unwrap().to_vec().unwrap(),
            [5., 7., 9.]
        );
        assert_eq!(
            sum_to_shape(&x, &[2, 1]).unwrap().to_vec().unwrap(),
            [6., 15.]
        );
        assert_eq!(sum_to_shape(&x, &[]).unwrap().to_vec().unwrap(), [21.]);
        assert_eq!(sum_to_shape(&x, &[1, 1]).unwrap().shape(), [1, 1]);
        assert!(sum_to_shape(&x, &[2]).is_err());
    }
}
