//! Strided 2-D copies (copy2d.wgsl): transpose of the last two axes, and the padding and
//! cropping that the CPU-adapter matmul needs.

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, COPY2D};
use crate::error::{shape_err, Result};
use crate::gpu::{Gpu, GpuBuf};
use crate::tensor::{DType, Device, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
pub(crate) struct Copy2d {
    /// Output rows and columns per batch entry.
    pub rows: u32,
    pub cols: u32,
    pub batch: u32,
    pub _pad0: u32,
    /// The valid input region; output elements outside it are zero.
    pub in_rows: u32,
    pub in_cols: u32,
    /// Input strides, in elements.
    pub in_row: u32,
    pub in_col: u32,
    pub in_batch: u32,
    pub _pad1: [u32; 3],
}

impl Copy2d {
    /// Copies `[batch, rows, cols]` row-major input into `[batch, out_rows, out_cols]`,
    /// transposing the two axes when `transpose` (the input is then `[batch, cols, rows]`
    /// logically read as its transpose), zero-padding or cropping to the output size.
    pub fn new(
        batch: usize,
        rows: usize,
        cols: usize,
        transpose: bool,
        out_rows: usize,
        out_cols: usize,
    ) -> Self {
        let (in_row, in_col) = if transpose { (1, rows) } else { (cols, 1) };
        Copy2d {
            rows: out_rows as u32,
            cols: out_cols as u32,
            batch: batch as u32,
            _pad0: 0,
            in_rows: rows as u32,
            in_cols: cols as u32,
            in_row: in_row as u32,
            in_col: in_col as u32,
            in_batch: (rows * cols) as u32,
            _pad1: [0; 3],
        }
    }

    pub fn out_len(&self) -> usize {
        self.batch as usize * self.rows as usize * self.cols as usize
    }
}

/// CPU reference of copy2d.wgsl.
pub(crate) fn copy2d_ref(src: &[f32], c: &Copy2d) -> Vec<f32> {
    let mut out = vec![0.0; c.out_len()];
    let (rows, cols) = (c.rows as usize, c.cols as usize);
    for z in 0..c.batch as usize {
        for r in 0..rows.min(c.in_rows as usize) {
            for col in 0..cols.min(c.in_cols as usize) {
                let i = z * c.in_batch as usize + r * c.in_row as usize + col * c.in_col as usize;
                out[(z * rows + r) * cols + col] = src[i];
            }
        }
    }
    out
}

pub(crate) fn copy2d_gpu(gpu: &Gpu, src: &GpuBuf, c: &Copy2d) -> Result<GpuBuf> {
    let n = c.out_len();
    let out = gpu.alloc(4 * n as u64)?;
    let pipeline = gpu.pipeline(&COPY2D, "main", &[]);
    gpu.launch(&pipeline, c, &[src, &out], grid_1d(n));
    Ok(out)
}

/// Swaps the last two axes: `[..., r, c]` becomes `[..., c, r]`.
pub fn transpose(x: &Tensor) -> Result<Tensor> {
    x.expect_dtype("transpose", DType::F32)?;
    let s = x.shape();
    if s.len() < 2 {
        return shape_err(
            "transpose",
            format!("needs at least 2 axes, shape is {s:?}"),
        );
    }
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    let batch: usize = s[..s.len() - 2].iter().product();
    let mut out_shape = s.to_vec();
    let last = out_shape.len() - 1;
    out_shape.swap(last - 1, last);
    // Output [batch, c, r] reads input [batch, r, c] transposed.
    let params = Copy2d::new(batch, c, r, true, c, r);
    match x.device() {
        Device::Cpu => Tensor::from_vec(
            x.device(),
            &out_shape,
            copy2d_ref(x.cpu_f32().expect("cpu"), &params),
        ),
        Device::Gpu(gpu) => {
            let out = copy2d_gpu(gpu, x.gpu_buf().expect("gpu"), &params)?;
            Ok(Tensor::from_gpu(gpu, &out_shape, DType::F32, out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_transposes_pads_and_crops() {
        // 2x3 input.
        let src = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        // Transpose: logical input [3 rows, 2 cols] read from the 2x3 buffer.
        let t = Copy2d::new(1, 3, 2, true, 3, 2);
        assert_eq!(copy2d_ref(&src, &t), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        // Pad to 3x4.
        let p = Copy2d::new(1, 2, 3, false, 3, 4);
        assert_eq!(
            copy2d_ref(&src, &p),
            [1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        // Crop to 1x2.
        let c = Copy2d::new(1, 2, 3, false, 1, 2);
        assert_eq!(copy2d_ref(&src, &c), [1.0, 2.0]);
    }
}
