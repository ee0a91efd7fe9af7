//! Softmax and softmax cross-entropy over the last axis (softmax.wgsl).

use bytemuck::{Pod, Zeroable};

use super::math::{exp, ln, workgroup_sum, ROW_LANES};
use super::{grid_1d, grid_groups, SOFTMAX};
use crate::error::{shape_err, Error, Result};
use crate::tensor::{DType, Device, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    causal: u32,
    _pad: u32,
}

impl Params {
    fn new(rows: usize, cols: usize, causal: bool) -> Self {
        Params {
            rows: rows as u32,
            cols: cols as u32,
            causal: causal as u32,
            _pad: 0,
        }
    }
}

fn rows_cols(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    x.expect_dtype(op, DType::F32)?;
    match x.shape().split_last() {
        Some((&cols, lead)) if cols > 0 => Ok((lead.iter().product(), cols)),
        _ => shape_err(
            op,
            format!("needs a non-empty last axis, shape is {:?}", x.shape()),
        ),
    }
}

/// Row maximum and sum of `exp(x - max)`, in the kernel's order.
fn max_and_sum(row: &[f32]) -> (f32, f32) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (m, workgroup_sum(row.iter().map(|&v| exp(v - m)), ROW_LANES))
}

/// CPU reference of a numerically stable softmax of one row.
pub fn softmax_row_ref(row: &[f32], out: &mut [f32]) {
    let (m, s) = max_and_sum(row);
    let inv = 1.0 / s;
    for (o, &v) in out.iter_mut().zip(row) {
        *o = exp(v - m) * inv;
    }
}

/// CPU reference of the per-row cross-entropy loss and the probabilities.
pub fn cross_entropy_ref(logits: &[f32], labels: &[u32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    let mut probs = vec![0.0; logits.len()];
    let losses = labels
        .iter()
        .enumerate()
        .map(|(r, &label)| {
            let row = &logits[r * cols..][..cols];
            softmax_row_ref(row, &mut probs[r * cols..][..cols]);
            let (m, s) = max_and_sum(row);
            ln(s) + m - row[label as usize]
        })
        .collect();
    (losses, probs)
}

/// Softmax over the last axis.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    softmax_masked(x, false)
}

/// Softmax over the last axis of square `[..., T, T]` attention scores under the causal
/// mask: query row `i` attends to keys `0..=i`; the other probabilities are exactly 0.
pub fn causal_softmax(x: &Tensor) -> Result<Tensor> {
    let s = x.shape();
    if s.len() < 2 || s[s.len() - 1] != s[s.len() - 2] {
        return shape_err(
            "causal_softmax",
            format!("needs square [..., T, T] scores, shape is {s:?}"),
        );
    }
    softmax_masked(x, true)
}

fn softmax_masked(x: &Tensor, causal: bool) -> Result<Tensor> {
    let (rows, cols) = rows_cols("softmax", x)?;
    match x.device() {
        Device::Cpu => {
            let y = crate::cpu::rows::softmax(x.cpu_f32().expect("cpu"), cols, causal);
            Tensor::from_vec(x.device(), x.shape(), y)
        }
        Device::Gpu(gpu) => {
            let y = gpu.alloc(4 * x.numel() as u64)?;
            let pipeline = gpu.pipeline(&SOFTMAX, "softmax_forward", &[]);
            let params = Params::new(rows, cols, causal);
            gpu.launch(
                &pipeline,
                &params,
                &[x.gpu_buf().expect("gpu"), &y],
                grid_groups(rows),
            );
            Ok(Tensor::from_gpu(gpu, x.shape(), DType::F32, y))
        }
    }
}

/// Gradient of softmax: `dx = y * (dy - sum(dy * y))` per row, from the output `y`.
pub fn softmax_backward(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let (rows, cols) = rows_cols("softmax_backward", y)?;
    y.same_device("softmax_backward", dy)?;
    if y.shape() != dy.shape() {
        return shape_err(
            "softmax_backward",
            format!("y {:?} and dy {:?}", y.shape(), dy.shape()),
        );
    }
    match y.device() {
        Device::Cpu => {
            let (ys, ds) = (y.cpu_f32().expect("cpu"), dy.cpu_f32().expect("cpu"));
            let dx = crate::cpu::rows::softmax_backward(ys, ds, cols);
            Tensor::from_vec(y.device(), y.shape(), dx)
        }
        Device::Gpu(gpu) => {
            let dx = gpu.alloc(4 * y.numel() as u64)?;
            let pipeline = gpu.pipeline(&SOFTMAX, "softmax_backward", &[]);
            let params = Params::new(rows, cols, false);
            let bufs = [y.gpu_buf().expect("gpu"), dy.gpu_buf().expect("gpu"), &dx];
            gpu.launch(&pipeline, &params, &bufs, grid_groups(rows));
            Ok(Tensor::from_gpu(gpu, y.shape(), DType::F32, dx))
        }
    }
}

fn check_labels(logits: &Tensor, labels: &Tensor, rows: usize) -> Result<()> {
    labels.expect_dtype("cross_entropy", DType::U32)?;
    logits.same_device("cross_entropy", labels)?;
    if labels.numel() != rows {
        return shape_err(
            "cross_entropy",
            format!("{rows} rows of logits but {} labels", labels.numel()),
        );
    }
    Ok(())
}

/// Softmax cross-entropy per row of `logits [..., classes]` against u32 `labels [...]`.
/// Returns the losses (shape of `labels`) and the softmax probabilities, which the backward
/// pass reuses. Labels must be below the class count (checked on the CPU; on the GPU a larger
/// label contributes no target term, so validate labels when loading data).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = rows_cols("cross_entropy", logits)?;
    check_labels(logits, labels, rows)?;
    match logits.device() {
        Device::Cpu => {
            let ls = labels.cpu_u32().expect("cpu");
            if let Some(&bad) = ls.iter().find(|&&l| l as usize >= cols) {
                return Err(Error::Data(format!(
                    "label {bad} is out of range for {cols} classes"
                )));
            }
            let xs = logits.cpu_f32().expect("cpu");
            let (losses, probs) = crate::cpu::rows::cross_entropy(xs, ls, cols);
            Ok((
                Tensor::from_vec(logits.device(), labels.shape(), losses)?,
                Tensor::from_vec(logits.device(), logits.shape(), probs)?,
            ))
        }
        Device::Gpu(gpu) => {
            let losses = gpu.alloc(4 * rows as u64)?;
            let probs = gpu.alloc(4 * logits.numel() as u64)?;
            let pipeline = gpu.pipeline(&SOFTMAX, "xent_forward", &[]);
            let params = Params::new(rows, cols, false);
            let bufs = [
                logits.gpu_buf().expect("gpu"),
                labels.gpu_buf().expect("gpu"),
                &losses,
                &probs,
            ];
            gpu.launch(&pipeline, &params, &bufs, grid_groups(rows));
            Ok((
                Tensor::from_gpu(gpu, labels.shape(), DType::F32, losses),
                Tensor::from_gpu(gpu, logits.shape(), DType::F32, probs),
            ))
        }
    }
}

/// Gradient of the per-row losses: `dlogits = (probs - onehot(labels)) * dloss`.
pub fn cross_entropy_backward(probs: &Tensor, labels: &Tensor, dloss: &Tensor) -> Result<Tensor> {
    let (rows, cols) = rows_cols("cross_entropy_backward", probs)?;
    check_labels(probs, labels, rows)?;
    dloss.expect_dtype("cross_entropy_backward", DType::F32)?;
    if dloss.numel() != rows {
        return shape_err(
            "cross_entropy_backward",
            format!("{rows} rows but dloss has {} elements", dloss.numel()),
        );
    }
    match probs.device() {
        Device::Cpu => {
            let (ps, ls, ds) = (
                probs.cpu_f32().expect("cpu"),
                labels.cpu_u32().expect("cpu"),
                dloss.cpu_f32().expect("cpu"),
            );
            let dx = crate::cpu::rows::cross_entropy_backward(ps, ls, ds, cols);
            Tensor::from_vec(probs.device(), probs.shape(), dx)
        }
        Device::Gpu(gpu) => {
            let dx = gpu.alloc(4 * probs.numel() as u64)?;
            let pipeline = gpu.pipeline(&SOFTMAX, "xent_backward", &[]);
            let params = Params::new(rows, cols, false);
            let bufs = [
                probs.gpu_buf().expect("gpu"),
                labels.gpu_buf().expect("gpu"),
                dloss.gpu_buf().expect("gpu"),
                &dx,
            ];
            gpu.launch(&pipeline, &params, &bufs, grid_1d(rows * cols));
            Ok(Tensor::from_gpu(gpu, probs.shape(), DType::F32, dx))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_is_stable_for_huge_logits() {
        let (loss, probs) = cross_entropy_ref(&[1000.0, 0.0, -1000.0], &[0], 3);
        assert!(loss[0].abs() < 1e-6, "{loss:?}");
        assert!((probs[0] - 1.0).abs() < 1e-6 && probs[2] == 0.0);
        // Uniform logits: loss is ln(classes).
        let (loss, _) = cross_entropy_ref(&[0.5; 10], &[3], 10);
        assert!((loss[0] - 10f32.ln()).abs() < 1e-5);
    }
}
