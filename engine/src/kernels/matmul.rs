//! Batched matrix product with optional transposes: C = op(A) * op(B).
//!
//! Two GPU kernels compute it: `matmul_tiled.wgsl` (shared-memory tiles, register blocking;
//! for real GPUs) and `matmul_rows.wgsl` (uniform row broadcasts; for CPU adapters such as
//! lavapipe, where it is 7x faster). A tuned GPU runs the kernel measured fastest for the
//! product's shape class ([`super::matmul_tune`]); an untuned one the adapter type's; and
//! `MURMUR_MATMUL=tiled|rows` overrides both. `matmul_ref` is the definition both are
//! tested against, and they give the same bits.

use bytemuck::{Pod, Zeroable};

use super::copy::{copy2d_gpu, Copy2d};
pub use super::matmul_choice::MatmulKernel;
pub use super::matmul_dims::MatmulDims;
use super::{span_starts, split_grid, MATMUL_ROWS, MATMUL_TILED};
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};
use crate::tensor::{DType, Device, Tensor};

/// The definition: each output element is the sum of its row-by-column products, in k
/// order from `acc = 0`. The kernels take the same steps with `fma`, which some drivers fuse
/// (results then differ in the last bits) and others, lavapipe among them, evaluate as a
/// rounded product and a rounded sum: there the reference gives the kernels' exact bits.
pub fn matmul_ref(a: &[f32], b: &[f32], d: &MatmulDims) -> Vec<f32> {
    let (m, n, k) = (d.m, d.n, d.k);
    let mut c = vec![0.0f32; d.batch * m * n];
    // Row-major [m, k] and [k, n] copies of this batch's operands, then an i-k-j loop whose
    // inner loop the compiler vectorises.
    let mut a_rm = vec![0.0f32; m * k];
    let mut b_rm = vec![0.0f32; k * n];
    for z in 0..d.batch {
        let a_z = &a[if d.a_batched { z * m * k } else { 0 }..][..m * k];
        let b_z = &b[if d.b_batched { z * k * n } else { 0 }..][..k * n];
        for i in 0..m {
            for p in 0..k {
                a_rm[i * k + p] = if d.trans_a {
                    a_z[p * m + i]
                } else {
                    a_z[i * k + p]
                };
            }
        }
        for p in 0..k {
            for j in 0..n {
                b_rm[p * n + j] = if d.trans_b {
                    b_z[j * k + p]
                } else {
                    b_z[p * n + j]
                };
            }
        }
        let c_z = &mut c[z * m * n..][..m * n];
        for i in 0..m {
            let row = &mut c_z[i * n..][..n];
            for p in 0..k {
                let av = a_rm[i * k + p];
                for (cv, bv) in row.iter_mut().zip(&b_rm[p * n..][..n]) {
                    *cv += av * bv;
                }
            }
        }
    }
    c
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch_offset: u32,
    a_batch_stride: u32,
    b_batch_stride: u32,
    c_batch_stride: u32,
    row_group_offset: u32,
    col_group_offset: u32,
    k_start: u32,
    k_stop: u32,
    _pad: u32,
}

/// Most of the contracted dimension one launch sums. llvmpipe (lavapipe, the software
/// adapter of GPU-less machines) ends an invocation's loops after 65535 iterations in all,
/// silently: one launch over k = 8192 lost a twentieth of the sum in the rows kernel (32 rows
/// per invocation), and the tiled kernel broke past k = 50,000. Longer products continue in
/// further launches from the partial sums in C, which gives the same bits as one launch.
const K_SPAN: usize = 4096;

/// Launches `pipeline` over a grid of `[column groups, row groups, batch]` workgroups, in as
/// many launches as the adapter's workgroups per dimension require (each launch tells the
/// kernel its offsets), and over the contracted dimension in spans of [`K_SPAN`].
fn launch_split(
    gpu: &Gpu,
    pipeline: &crate::gpu::Pipeline,
    base: Params,
    bufs: [&GpuBuf; 3],
    grid_xy: [usize; 2],
    batch: usize,
) {
    let max = gpu.info().limits.max_compute_workgroups_per_dimension as usize;
    let k = base.k as usize;
    for k_start in span_starts(k, K_SPAN) {
        for (offset, count) in split_grid([grid_xy[0], grid_xy[1], batch], max) {
            let params = Params {
                col_group_offset: offset[0],
                row_group_offset: offset[1],
                batch_offset: offset[2],
                k_start: k_start as u32,
                k_stop: (k_start + K_SPAN).min(k) as u32,
                ..base
            };
            gpu.launch(pipeline, &params, &bufs, count);
        }
    }
}

fn tiled(gpu: &Gpu, a: &GpuBuf, b: &GpuBuf, d: &MatmulDims) -> Result<GpuBuf> {
    let c = gpu.alloc(4 * (d.batch * d.m * d.n) as u64)?;
    let pipeline = gpu.pipeline(
        &MATMUL_TILED,
        "main",
        &[
            ("TRANS_A", d.trans_a as u8 as f64),
            ("TRANS_B", d.trans_b as u8 as f64),
        ],
    );
    let params = Params {
        m: d.m as u32,
        n: d.n as u32,
        k: d.k as u32,
        batch_offset: 0,
        a_batch_stride: if d.a_batched { (d.m * d.k) as u32 } else { 0 },
        b_batch_stride: if d.b_batched { (d.k * d.n) as u32 } else { 0 },
        c_batch_stride: (d.m * d.n) as u32,
        row_group_offset: 0,
        col_group_offset: 0,
        k_start: 0,
        k_stop: 0,
        _pad: 0,
    };
    let grid = [d.n.div_ceil(64), d.m.div_ceil(64)];
    launch_split(gpu, &pipeline, params, [a, b, &c], grid, d.batch);
    Ok(c)
}

/// Rows per workgroup of matmul_rows.wgsl, and its most lanes per workgroup (8 columns each).
const ROWS_TM: usize = 32;
const ROWS_MAX_LANES: usize = 16;

/// Lanes per workgroup for `np` (padded) output columns: enough to cover them, a power of two
/// up to 16, so that narrow products do not pay for idle lanes.
fn rows_lanes(np: usize) -> usize {
    (np / 8).next_power_of_two().clamp(1, ROWS_MAX_LANES)
}

fn rows(gpu: &Gpu, a: &GpuBuf, b: &GpuBuf, d: &MatmulDims) -> Result<GpuBuf> {
    let kp = d.k.next_multiple_of(4).max(4);
    let np = d.n.next_multiple_of(8).max(8);
    let (a_count, b_count) = (
        if d.a_batched { d.batch } else { 1 },
        if d.b_batched { d.batch } else { 1 },
    );
    // Row-major, padded operands; the common case (no transpose, aligned sizes) needs no copy.
    let a_packed;
    let a_use = if !d.trans_a && kp == d.k {
        a
    } else {
        a_packed = copy2d_gpu(gpu, a, &Copy2d::new(a_count, d.m, d.k, d.trans_a, d.m, kp))?;
        &a_packed
    };
    let b_packed;
    let b_use = if !d.trans_b && kp == d.k && np == d.n {
        b
    } else {
        b_packed = copy2d_gpu(gpu, b, &Copy2d::new(b_count, d.k, d.n, d.trans_b, kp, np))?;
        &b_packed
    };
    let c = gpu.alloc(4 * (d.batch * d.m * np) as u64)?;
    let lanes = rows_lanes(np);
    let pipeline = gpu.pipeline(&MATMUL_ROWS, "main", &[("LANES", lanes as f64)]);
    let params = Params {
        m: d.m as u32,
        n: np as u32,
        k: kp as u32,
        batch_offset: 0,
        a_batch_stride: if d.a_batched { (d.m * kp) as u32 } else { 0 },
        b_batch_stride: if d.b_batched { (kp * np) as u32 } else { 0 },
        c_batch_stride: (d.m * np) as u32,
        row_group_offset: 0,
        col_group_offset: 0,
        k_start: 0,
        k_stop: 0,
        _pad: 0,
    };
    let grid = [np.div_ceil(8 * lanes), d.m.div_ceil(ROWS_TM)];
    launch_split(gpu, &pipeline, params, [a_use, b_use, &c], grid, d.batch);
    if np == d.n {
        Ok(c)
    } else {
        copy2d_gpu(gpu, &c, &Copy2d::new(d.batch, d.m, np, false, d.m, d.n))
    }
}

/// Runs the product on the GPU with an explicit kernel choice (tests and benchmarks).
pub fn matmul_gpu(
    gpu: &Gpu,
    a: &GpuBuf,
    b: &GpuBuf,
    d: &MatmulDims,
    kernel: MatmulKernel,
) -> Result<GpuBuf> {
    if d.batch * d.m * d.n == 0 {
        return gpu.alloc(0);
    }
    if d.k == 0 {
        return gpu.zeros(4 * (d.batch * d.m * d.n) as u64);
    }
    match kernel {
        MatmulKernel::Tiled => tiled(gpu, a, b, d),
        MatmulKernel::Rows => rows(gpu, a, b, d),
    }
}

/// `op(a) * op(b)` on the operands' device; see [`MatmulDims::infer`] for the shapes.
pub fn matmul(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor> {
    a.expect_dtype("matmul", DType::F32)?;
    b.expect_dtype("matmul", DType::F32)?;
    a.same_device("matmul", b)?;
    let (dims, out_shape) = MatmulDims::infer(a.shape(), b.shape(), trans_a, trans_b)?;
    match a.device() {
        Device::Cpu => {
            let c = crate::cpu::gemm::matmul(
                a.cpu_f32().expect("cpu"),
                b.cpu_f32().expect("cpu"),
                &dims,
            );
            Tensor::from_vec(a.device(), &out_shape, c)
        }
        Device::Gpu(gpu) => {
            let kernel = MatmulKernel::for_gpu(gpu, &dims)?;
            let c = matmul_gpu(
                gpu,
                a.gpu_buf().expect("gpu"),
                b.gpu_buf().expect("gpu"),
                &dims,
                kernel,
            )?;
            Ok(Tensor::from_gpu(gpu, &out_shape, DType::F32, c))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_kernel_lanes_cover_the_columns_without_idle_lanes() {
        for (np, lanes) in [
            (8, 1),
            (16, 2),
            (24, 4),
            (32, 4),
            (64, 8),
            (128, 16),
            (1024, 16),
        ] {
            assert_eq!(rows_lanes(np), lanes, "{np} columns");
        }
        for np in (8..=512).step_by(8) {
            let lanes = rows_lanes(np);
            let groups = np.div_ceil(8 * lanes);
            assert!(groups * 8 * lanes >= np);
            // At most one partly idle workgroup column, and no lane idle when one suffices.
            assert!(lanes == ROWS_MAX_LANES || groups == 1, "{np}");
        }
    }

    #[test]
    fn shapes_infer_with_transposes_and_broadcast_batches() {
        let (d, s) = MatmulDims::infer(&[2, 3], &[3, 4], false, false).unwrap();
        assert_eq!((d.m, d.n, d.k, d.batch, s), (2, 4, 3, 1, vec![2, 4]));
        let (d, s) = MatmulDims::infer(&[3, 2], &[4, 3], true, true).unwrap();
        assert_eq!((d.m, d.n, d.k, s), (2, 4, 3, vec![2, 4]));
        let (d, s) = MatmulDims::infer(&[5, 7, 2, 3], &[3, 4], false, false).unwrap();
        assert_eq!(
            (d.batch, d.a_batched, d.b_batched, s),
            (35, true, false, vec![5, 7, 2, 4])
        );
        assert!(MatmulDims::infer(&[2, 3], &[4, 5], false, false).is_err());
        assert!(MatmulDims::infer(&[2, 2, 3], &[3, 3, 4], false, false).is_err());
        assert!(MatmulDims::infer(&[3], &[3, 4], false, false).is_err());
    }

    #[test]
    fn reference_matches_hand_computed_products() {
        // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50]
        let (d, _) = MatmulDims::infer(&[2, 2], &[2, 2], false, false).unwrap();
        assert_eq!(
            matmul_ref(&[1., 2., 3., 4.], &[5., 6., 7., 8.], &d),
            [19., 22., 43., 50.]
        );
        // A^T with A = [1 3; 2 4] stored, B^T with B = [5 7; 6 8] stored: same product.
        let (d, _) = MatmulDims::infer(&[2, 2], &[2, 2], true, true).unwrap();
        assert_eq!(
            matmul_ref(&[1., 3., 2., 4.], &[5., 7., 6., 8.], &d),
            [19., 22., 43., 50.]
        );
        // Broadcast B over two batches.
        let (d, _) = MatmulDims::infer(&[2, 1, 2], &[2, 1], false, false).unwrap();
        assert_eq!(matmul_ref(&[1., 2., 3., 4.], &[10., 1.], &d), [12., 34.]);
    }
}
