//! Kernels: one file per family, each with the CPU reference (the definition) and the GPU
//! launch of its WGSL kernel side by side. Public functions take and return
//! [`Tensor`](crate::Tensor)s and run on whichever device their operands live on.
//!
//! Tolerances between the two paths are documented in `engine/tests/kernels_gpu_vs_cpu.rs`.

pub mod binary;
pub mod conv;
pub mod copy;
pub mod dropout;
pub mod embedding;
pub mod fill;
pub mod layernorm;
pub mod math;
pub mod matmul;
pub mod optim;
pub mod permute;
pub mod pool;
pub mod reduce;
pub mod softmax;
pub mod unary;

use crate::gpu::Shader;
use crate::wgsl;

/// The flat element index of a 2-D grid of 256-wide workgroups, included by every element-wise
/// kernel (launch sizes come from `grid_1d`).
pub static GRID: Shader = wgsl!("common/grid.wgsl");
pub(crate) static MATH: Shader = wgsl!("common/math.wgsl");
pub(crate) static ROWS: Shader = wgsl!("common/rows.wgsl");
/// The counter-based generator and the bit helpers of the codecs, which dropout and error
/// feedback draw on too: declared here, below all three.
pub(crate) static CODEC_COMMON: Shader = wgsl!("compress/common.wgsl");
pub(crate) static MATMUL_TILED: Shader = wgsl!("matmul_tiled.wgsl");
pub(crate) static MATMUL_ROWS: Shader = wgsl!("matmul_rows.wgsl");
pub(crate) static COPY2D: Shader = wgsl!("copy2d.wgsl", includes: [GRID]);
pub(crate) static FILL: Shader = wgsl!("fill.wgsl", includes: [GRID]);
pub(crate) static UNARY: Shader = wgsl!("unary.wgsl", includes: [GRID, MATH]);
pub(crate) static BINARY: Shader = wgsl!("binary.wgsl", includes: [GRID]);
pub(crate) static REDUCE: Shader = wgsl!("reduce.wgsl", includes: [GRID]);
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
/// Most workgroups in one dispatch dimension (WebGPU's default limit).
pub(crate) const MAX_GROUPS: usize = 65535;

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

#[cfg(test)]
mod tests {
    use super::*;

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
