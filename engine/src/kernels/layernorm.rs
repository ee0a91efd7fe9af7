//! Layer normalization over the last axis (layernorm.wgsl).

use bytemuck::{Pod, Zeroable};

use super::math::{workgroup_sum, ROW_LANES};
use super::{grid_1d, grid_groups, span_starts, LAYERNORM, LOOP_SPAN};

use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    /// First row of this launch of `backward_params` (see [`LOOP_SPAN`]).
    span_start: u32,
}

/// CPU reference forward: returns `y` and per-row `[mean, rstd]`.
pub fn layernorm_ref(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    cols: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let rows = x.len() / cols;
    let mut y = vec![0.0; x.len()];
    let mut stats = vec![0.0; 2 * rows];
    for r in 0..rows {
        let row = &x[r * cols..][..cols];
        let mean = workgroup_sum(row.iter().copied(), ROW_LANES) / cols as f32;
        let var =
            workgroup_sum(row.iter().map(|v| (v - mean) * (v - mean)), ROW_LANES) / cols as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..cols {
            y[r * cols + j] = (row[j] - mean) * rstd * gamma[j] + beta[j];
        }
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
    }
    (y, stats)
}

/// CPU reference backward: `(dx, dgamma, dbeta)`.
pub fn layernorm_backward_ref(
    x: &[f32],
    gamma: &[f32],
    stats: &[f32],
    dy: &[f32],
    cols: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / cols;
    let mut dx = vec![0.0; x.len()];
    let (mut dgamma, mut dbeta) = (vec![0.0; cols], vec![0.0; cols]);
    for r in 0..rows {
        let (mean, rstd) = (stats[2 * r], stats[2 * r + 1]);
        let xhat: Vec<f32> = x[r * cols..][..cols]
            .iter()
            .map(|v| (v - mean) * rstd)
            .collect();
        let g: Vec<f32> = (0..cols).map(|j| dy[r * cols + j] * gamma[j]).collect();
        let mean_g = workgroup_sum(g.iter().copied(), ROW_LANES) / cols as f32;
        let mean_gx =
            workgroup_sum(g.iter().zip(&xhat).map(|(a, b)| a * b), ROW_LANES) / cols as f32;
        for j in 0..cols {
            dx[r * cols + j] = rstd * (g[j] - mean_g - xhat[j] * mean_gx);
            dgamma[j] += dy[r * cols + j] * xhat[j];
            dbeta[j] += dy[r * cols + j];
        }
    }
    (dx, dgamma, dbeta)
}

fn check(x: &Tensor, gamma: &Tensor) -> Result<(usize, usize)> {
    x.expect_dtype("layernorm", DType::F32)?;
    gamma.expect_dtype("layernorm", DType::F32)?;
    x.same_device("layernorm", gamma)?;
    let cols = *x.shape().last().unwrap_or(&0);
    if cols == 0 || gamma.shape() != [cols] {
        return shape_err(
            "layernorm",
            format!(
                "x {:?} needs gamma and beta of shape [{cols}], gamma is {:?}",
                x.shape(),
                gamma.shape()
            ),
        );
    }
    Ok((x.numel() / cols, cols))
}

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` over the last axis. Returns `y` and the
/// per-row statistics `[rows, 2]` (mean, 1/std) for the backward pass.
pub fn layernorm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = check(x, gamma)?;
    check(x, beta)?;
    match x.device() {
        Device::Cpu => {
            let (y, stats) = crate::cpu::layernorm::forward(
                x.cpu_f32().expect("cpu"),
                gamma.cpu_f32().expect("cpu"),
                beta.cpu_f32().expect("cpu"),
                cols,
                eps,
            );
            Ok((
                Tensor::from_vec(x.device(), x.shape(), y)?,
                Tensor::from_vec(x.device(), &[rows, 2], stats)?,
            ))
        }
        Device::Gpu(gpu) => {
            let y = gpu.alloc(4 * x.numel() as u64)?;
            let stats = gpu.alloc(8 * rows as u64)?;
            let pipeline = gpu.pipeline(&LAYERNORM, "forward", &[]);
            let params = Params {
                rows: rows as u32,
                cols: cols as u32,
                eps,
                span_start: 0,
            };
            let bufs = [
                x.gpu_buf().expect("gpu"),
                gamma.gpu_buf().expect("gpu"),
                beta.gpu_buf().expect("gpu"),
                &y,
                &stats,
            ];
            gpu.launch(&pipeline, &params, &bufs, grid_groups(rows));
            Ok((
                Tensor::from_gpu(gpu, x.shape(), DType::F32, y),
                Tensor::from_gpu(gpu, &[rows, 2], DType::F32, stats),
            ))
        }
    }
}

/// Gradients `(dx, dgamma, dbeta)` from the forward input, gamma, statistics and `dy`; with
/// `onto` (of `x`'s shape), `onto + dx` in place of `dx`: the input's gradient added onto the
/// one it already has, the bits of that addition after this (test). The CPU path adds it as
/// it writes `dx`: in a GPT step, each block's two layer norms' input gradients were added
/// to the residual stream's in passes of their own.
pub fn layernorm_backward(
    x: &Tensor,
    gamma: &Tensor,
    stats: &Tensor,
    dy: &Tensor,
    onto: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (rows, cols) = check(x, gamma)?;
    if dy.shape() != x.shape()
        || stats.shape() != [rows, 2]
        || onto.is_some_and(|o| o.shape() != x.shape())
    {
        return shape_err(
            "layernorm_backward",
            format!(
                "x {:?}, dy {:?}, stats {:?}, onto {:?}",
                x.shape(),
                dy.shape(),
                stats.shape(),
                onto.map(|o| o.shape())
            ),
        );
    }
    if let Some(o) = onto {
        o.expect_dtype("layernorm_backward", DType::F32)?;
        x.same_device("layernorm_backward", o)?;
    }
    match x.device() {
        Device::Cpu => {
            let (dx, dg, db) = crate::cpu::layernorm::backward(
                x.cpu_f32().expect("cpu"),
                gamma.cpu_f32().expect("cpu"),
                stats.cpu_f32().expect("cpu"),
                dy.cpu_f32().expect("cpu"),
                cols,
                onto.map(|o| o.cpu_f32().expect("cpu")),
            );
            let d = x.device();
            Ok((
                Tensor::from_vec(d, x.shape(), dx)?,
                Tensor::from_vec(d, &[cols], dg)?,
                Tensor::from_vec(d, &[cols], db)?,
            ))
        }
        Device::Gpu(gpu) => {
            let params = Params {
                rows: rows as u32,
                cols: cols as u32,
                eps: 0.0,
                span_start: 0,
            };
            let (xb, gb, sb, db) = (
                x.gpu_buf().expect("gpu"),
                gamma.gpu_buf().expect("gpu"),
                stats.gpu_buf().expect("gpu"),
                dy.gpu_buf().expect("gpu"),
            );
            let dx = gpu.alloc(4 * x.numel() as u64)?;
            let pipeline = gpu.pipeline(&LAYERNORM, "backward_input", &[]);
            gpu.launch(
                &pipeline,
                &params,
                &[xb, gb, sb, db, &dx],
                grid_groups(rows),
            );
            let (dgamma, dbeta) = (gpu.alloc(4 * cols as u64)?, gpu.alloc(4 * cols as u64)?);
            let pipeline = gpu.pipeline(&LAYERNORM, "backward_params", &[]);
            for span_start in span_starts(rows, LOOP_SPAN) {
                gpu.launch(
                    &pipeline,
                    &Params {
                        span_start: span_start as u32,
                        ..params
                    },
                    &[xb, sb, db, &dgamma, &dbeta],
                    grid_1d(cols),
                );
            }
            let dx = Tensor::from_gpu(gpu, x.shape(), DType::F32, dx);
            Ok((
                match onto {
                    Some(o) => o.add(&dx)?,
                    None => dx,
                },
                Tensor::from_gpu(gpu, &[cols], DType::F32, dgamma),
                Tensor::from_gpu(gpu, &[cols], DType::F32, dbeta),
            ))
        }
    }
}
