//! Kernels: one file per family, each with the CPU reference (the definition) and the GPU
//! launch of its WGSL kernel side by side. Public functions take and return
//! [`Tensor`](crate::Tensor)s and run on whichever device their operands live on.
//!
//! Tolerances between the two paths are documented in `engine/tests/kernels_gpu_vs_cpu.rs`.

pub mod attention;
pub mod binary;
pub(crate) mod column_sums;
pub mod conv;
pub mod conv_geometry;
pub mod conv_pool;
pub mod copy;
pub mod dropout;
pub mod embedding;
pub mod fill;
pub mod image_norm;
pub mod layernorm;
pub mod linear;
pub mod math;
pub mod matmul;
pub mod matmul_choice;
pub mod matmul_dims;
pub mod matmul_tune;
pub mod norm_pool;
pub mod optim;
pub mod permute;
pub mod pool;
pub mod reduce;
pub mod softmax;
pub mod unary;

use crate::gpu::{Override, Shader};
use crate::wgsl;

/// The flat element index of a 2-D grid of 256-wide workgroups, included by every element-wise
/// kernel (launch sizes come from `grid_1d`).
pub static GRID: Shader = wgsl!("common/grid.wgsl");
pub(crate) static MATH: Shader = wgsl!("common/math.wgsl");
pub(crate) static ROWS: Shader = wgsl!("common/rows.wgsl");
/// The counter-based generator and the bit helpers of the codecs, which dropout and error
/// feedback draw on too: declared here, below all three.
pub(crate) static CODEC_COMMON: Shader = wgsl!("compress/common.wgsl");
pub(crate) static MATMUL_TILED: Shader = wgsl!("matmul_tiled.wgsl", overrides: [Override::codes("TRANS_A", 2), Override::codes("TRANS_B", 2)]);
pub(crate) static MATMUL_ROWS: Shader = wgsl!("matmul_rows.wgsl", overrides: [Override { name: "LANES", values: &[1.0, 2.0, 4.0, 8.0, 16.0] }]);
pub(crate) static COPY2D: Shader = wgsl!("copy2d.wgsl", includes: [GRID]);
pub(crate) static FILL: Shader = wgsl!("fill.wgsl", includes: [GRID]);
pub(crate) static UNARY: Shader =
    wgsl!("unary.wgsl", includes: [GRID, MATH], overrides: [Override::codes("OP", 10)]);
pub(crate) static BINARY: Shader = wgsl!("binary.wgsl", includes: [GRID], overrides: [Override::codes("OP", 6), Override::codes("BROADCAST", 2)]);
pub(crate) static REDUCE: Shader =
    wgsl!("reduce.wgsl", includes: [GRID], overrides: [Override::codes("OP", 3)]);
pub(crate) static SOFTMAX: Shader = wgsl!("softmax.wgsl", includes: [GRID, MATH, ROWS]);
pub(crate) static LAYERNORM: Shader = wgsl!("layernorm.wgsl", includes: [GRID, ROWS]);
pub(crate) static EMBEDDING: Shader = wgsl!("embedding.wgsl", includes: [GRID]);
pub(crate) static OPTIM: Shader = wgsl!("optim.wgsl", includes: [GRID]);
pub(crate) static CONV: Shader = wgsl!("conv.wgsl", includes: [GRID]);
pub(crate) static POOL: Shader = wgsl!("pool.wgsl", includes: [GRID]);
pub(crate) static PERMUTE: Shader = wgsl!("permute.wgsl", includes: [GRID]);
pub(crate) static DROPOUT: Shader = wgsl!("dropout.wgsl", includes: [GRID, CODEC_COMMON]);

/// The kernels' shaders, for validation tests (`crate::shaders` lists every one; the codecs
/// list their common.wgsl).
pub(crate) fn shaders() -> Vec<&'static Shader> {
    vec![
        &GRID,
        &MATH,
        &ROWS,
        &MATMUL_TILED,
        &MATMUL_ROWS,
        &COPY2D,
        &FILL,
        &UNARY,
        &BINARY,
        &REDUCE,
        &SOFTMAX,
        &LAYERNORM,
        &EMBEDDING,
        &OPTIM,
        &CONV,
        &POOL,
        &PERMUTE,
        &DROPOUT,
    ]
}

/// Workgroup width of the flat elementwise kernels (`WG` in common/grid.wgsl).
pub(crate) const WG: usize = 256;
/// Most workgroups in one dispatch dimension (WebGPU's default limit, which adapter
/// selection demands: see gpu::needs).
pub(crate) const MAX_GROUPS: usize = crate::gpu::WORKGROUPS_PER_DIMENSION as usize;

/// Most iterations of a data-dependent loop one invocation runs in a launch (`LOOP_SPAN` in
/// common/grid.wgsl). llvmpipe (lavapipe, the adapter of GPU-less machines) ends an
/// invocation's loops after 65535 iterations in all, without an error: a kernel that walks a
/// whole axis per invocation takes one launch per span and carries its partial result in
/// memory, which gives the same bits as one long loop.
pub(crate) const LOOP_SPAN: usize = 16384;

/// The first index of each span of `span` in `0..len`: one launch each. Always at least one
/// (0), so that a kernel over an empty axis still writes its zeros or identity.
pub(crate) fn span_starts(len: usize, span: usize) -> impl Iterator<Item = usize> {
    (0..len.max(1)).step_by(span)
}

/// Dispatch size covering `groups` workgroups: along x, spilling into y.
pub(crate) fn grid_groups(groups: usize) -> [u32; 3] {
    let x = groups.clamp(1, MAX_GROUPS);
    let y = groups.div_ceil(x);
    assert!(
        y <= MAX_GROUPS,
        "{groups} workgroups do not fit one dispatch"
    );
    [x as u32, y as u32, 1]
}

/// Dispatch size covering `n` elements with 256-wide workgroups (see `flat_index`).
pub(crate) fn grid_1d(n: usize) -> [u32; 3] {
    if n == 0 {
        return [0, 1, 1];
    }
    grid_groups(n.div_ceil(WG))
}

/// Splits a grid of `total` workgroups into launches of at most `max` per dimension: each
/// launch's (offset, count), offsets in workgroups, covering every workgroup once.
pub(crate) fn split_grid(total: [usize; 3], max: usize) -> Vec<([u32; 3], [u32; 3])> {
    let spans = |n: usize| -> Vec<(u32, u32)> {
        (0..n)
            .step_by(max)
            .map(|start| (start as u32, (n - start).min(max) as u32))
            .collect()
    };
    let mut launches = vec![];
    for (z0, z) in spans(total[2]) {
        for (y0, y) in spans(total[1]) {
            for (x0, x) in spans(total[0]) {
                launches.push(([x0, y0, z0], [x, y, z]));
            }
        }
    }
    launches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_span_is_the_shaders_span() {
        assert!(GRID
            .source
            .contains(&format!("const LOOP_SPAN: u32 = {LOOP_SPAN}u;")));
    }

    #[test]
    fn split_grids_cover_each_workgroup_once_within_the_limit() {
        for total in [[1, 1, 1], [5, 7, 3], [4, 4, 4], [9, 1, 1], [0, 3, 1]] {
            let launches = split_grid(total, 4);
            let mut seen = std::collections::HashSet::new();
            for (offset, count) in &launches {
                assert!(
                    count.iter().all(|&c| (1..=4).contains(&c)),
                    "{total:?}: {count:?}"
                );
                for z in 0..count[2] {
                    for y in 0..count[1] {
                        for x in 0..count[0] {
                            let at = (offset[0] + x, offset[1] + y, offset[2] + z);
                            assert!(seen.insert(at), "{total:?}: {at:?} twice");
                        }
                    }
                }
            }
            assert_eq!(seen.len(), total.iter().product::<usize>(), "{total:?}");
        }
        assert_eq!(split_grid([3, 2, 1], 65535), vec![([0, 0, 0], [3, 2, 1])]);
    }

    #[test]
    fn grids_cover_every_element_within_limits() {
        for n in [
            1usize,
            255,
            256,
            257,
            65535 * 256,
            65535 * 256 + 1,
            300_000_000,
        ] {
            let g = grid_1d(n);
            let covered = g[0] as usize * g[1] as usize * WG;
            assert!(covered >= n, "{n}: {g:?}");
            assert!(g[0] as usize <= MAX_GROUPS && g[1] as usize <= MAX_GROUPS);
            // No whole row of workgroups is wasted.
            assert!(covered - n < g[0] as usize * WG, "{n}: {g:?}");
        }
        assert_eq!(grid_1d(0)[0], 0, "empty launches dispatch nothing");
    }
}
