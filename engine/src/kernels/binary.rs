//! Elementwise binary operations with NumPy-style broadcasting (binary.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, BINARY};
use crate::error::{shape_err, Result};
use crate::tensor::{numel, DType, Device, Tensor};

/// An element-wise operation of two operands, applied with broadcasting by [`binary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// The larger of `a` and `b`.
    Max,
    /// The smaller of `a` and `b`.
    Min,
}

impl Binary {
    /// Every operation, for tests and tables.
    pub const ALL: [Binary; 6] = [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Max,
        Binary::Min,
    ];

    fn code(self) -> u32 {
        self as u32
    }

    /// CPU reference.
    pub fn apply(self, x: f32, y: f32) -> f32 {
        match self {
            Binary::Add => x + y,
            Binary::Sub => x - y,
            Binary::Mul => x * y,
            Binary::Div => x / y,
            Binary::Max => x.max(y),
            Binary::Min => x.min(y),
        }
    }
}

/// The shape two operands broadcast to: trailing axes aligned, each pair equal or one of
/// them 1.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            1
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => shape_err("broadcast", format!("{a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// Element strides of `shape` read as `out` (rank-aligned from the right; 0 along broadcast
/// axes).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; out.len()];
    let mut step = 1;
    for i in (0..shape.len()).rev() {
        let o = i + out.len() - shape.len();
        strides[o] = if shape[i] == 1 && out[o] != 1 {
            0
        } else {
            step
        };
        step *= shape[i];
    }
    strides
}

/// Drops size-1 axes and merges neighbours that are contiguous in both operands, so that the
/// kernel's four axes suffice for any practical broadcast: the output's dims and each
/// operand's strides.
pub fn collapse(out: &[usize], sa: &[usize], sb: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let (mut dims, mut a, mut b): (Vec<usize>, Vec<usize>, Vec<usize>) = (vec![], vec![], vec![]);
    for i in 0..out.len() {
        if out[i] == 1 {
            continue;
        }
        if let Some(&last) = dims.last() {
            let j = dims.len() - 1;
            // Merging axis i into the previous one needs prev_stride == stride * size.
            if a[j] == sa[i] * out[i] && b[j] == sb[i] * out[i] {
                dims[j] = last * out[i];
                a[j] = sa[i];
                b[j] = sb[i];
                continue;
            }
        }
        dims.push(out[i]);
        a.push(sa[i]);
        b.push(sb[i]);
    }
    (dims, a, b)
}

/// CPU reference: walks every output coordinate; `sa` and `sb` are the operands' strides
/// for `out` (see `broadcast_strides`).
pub fn binary_ref(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    out: &[usize],
    op: Binary,
) -> Vec<f32> {
    let n = numel(out);
    let mut result = Vec::with_capacity(n);
    let mut coord = vec![0usize; out.len()];
    for _ in 0..n {
        let ia: usize = coord.iter().zip(sa).map(|(c, s)| c * s).sum();
        let ib: usize = coord.iter().zip(sb).map(|(c, s)| c * s).sum();
        result.push(op.apply(a[ia], b[ib]));
        for ax in (0..out.len()).rev() {
            coord[ax] += 1;
            if coord[ax] < out[ax] {
                break;
            }
            coord[ax] = 0;
        }
    }
    result
}

/// The CPU path: `a op b` over collapsed dims and strides (see `collapse`), with the
/// reference's bits, one monomorphised loop per operation, each element computed by
/// `op.apply` itself.
pub fn binary_fast(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    dims: &[usize],
    op: Binary,
) -> Vec<f32> {
    use crate::cpu::elementwise::broadcast;
    match op {
        Binary::Add => broadcast(a, sa, b, sb, dims, |x, y| Binary::Add.apply(x, y)),
        Binary::Sub => broadcast(a, sa, b, sb, dims, |x, y| Binary::Sub.apply(x, y)),
        Binary::Mul => broadcast(a, sa, b, sb, dims, |x, y| Binary::Mul.apply(x, y)),
        Binary::Div => broadcast(a, sa, b, sb, dims, |x, y| Binary::Div.apply(x, y)),
        Binary::Max => broadcast(a, sa, b, sb, dims, |x, y| Binary::Max.apply(x, y)),
        Binary::Min => broadcast(a, sa, b, sb, dims, |x, y| Binary::Min.apply(x, y)),
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    _pad: [u32; 3],
    dims: [u32; 4],
    a_strides: [u32; 4],
    b_strides: [u32; 4],
}

/// `a op b` with broadcasting.
pub fn binary(a: &Tensor, b: &Tensor, op: Binary) -> Result<Tensor> {
    a.expect_dtype("binary", DType::F32)?;
    b.expect_dtype("binary", DType::F32)?;
    a.same_device("binary", b)?;
    let out_shape = broadcast_shape(a.shape(), b.shape())?;
    binary_into_shape(a, b, op, &out_shape)
}

/// `x` repeated along broadcast axes to `shape` (the gradient of a sum over those axes).
pub fn broadcast_to(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    x.expect_dtype("broadcast_to", DType::F32)?;
    if broadcast_shape(x.shape(), shape)? != shape {
        return shape_err(
            "broadcast_to",
            format!("{:?} does not broadcast to {shape:?}", x.shape()),
        );
    }
    let zero = Tensor::zeros(x.device(), &[])?;
    binary_into_shape(x, &zero, Binary::Add, shape)
}

/// Runs `a op b` producing `out_shape`, which both operands broadcast to.
fn binary_into_shape(a: &Tensor, b: &Tensor, op: Binary, out_shape: &[usize]) -> Result<Tensor> {
    let (sa, sb) = (
        broadcast_strides(a.shape(), out_shape),
        broadcast_strides(b.shape(), out_shape),
    );
    match a.device() {
        Device::Cpu => {
            let (dims, sa, sb) = collapse(out_shape, &sa, &sb);
            let (a, b) = (a.cpu_f32().expect("cpu"), b.cpu_f32().expect("cpu"));
            let c = binary_fast(a, &sa, b, &sb, &dims, op);
            Tensor::from_vec(&Device::Cpu, out_shape, c)
        }
        Device::Gpu(gpu) => {
            let n = numel(out_shape);
            let same = a.shape() == out_shape && b.shape() == out_shape;
            let (dims, sa, sb) = collapse(out_shape, &sa, &sb);
            if dims.len() > 4 {
                return shape_err(
                    "binary",
                    format!(
                        "broadcasting {:?} with {:?} needs more than 4 axes",
                        a.shape(),
                        b.shape()
                    ),
                );
            }
            // Left-pad to 4 axes; leading axes of size 1 with stride 0.
            let pad = |v: &[usize], fill: usize| {
                let mut r = [fill as u32; 4];
                for (i, x) in v.iter().enumerate() {
                    r[4 - v.len() + i] = *x as u32;
                }
                r
            };
            let params = Params {
                n: n as u32,
                _pad: [0; 3],
                dims: pad(&dims, 1),
                a_strides: pad(&sa, 0),
                b_strides: pad(&sb, 0),
            };
            let out = gpu.alloc(4 * n as u64)?;
            let pipeline = gpu.pipeline(
                &BINARY,
                "main",
                &[
                    ("OP", op.code() as f64),
                    ("BROADCAST", (!same) as u8 as f64),
                ],
            );
            gpu.launch(
                &pipeline,
                &params,
                &[a.gpu_buf().expect("gpu"), b.gpu_buf().expect("gpu"), &out],
                grid_1d(n),
            );
            Ok(Tensor::from_gpu(gpu, out_shape, DType::F32, out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes_follow_numpy() {
        assert_eq!(broadcast_shape(&[4, 3], &[3]).unwrap(), [4, 3]);
        assert_eq!(broadcast_shape(&[2, 1, 3], &[5, 1]).unwrap(), [2, 5, 3]);
        assert_eq!(broadcast_shape(&[], &[2, 2]).unwrap(), [2, 2]);
        assert!(broadcast_shape(&[4, 3], &[4]).is_err());
    }

    #[test]
    fn collapse_merges_contiguous_axes_and_keeps_broadcasts() {
        let out = [2, 3, 4];
        let (d, a, b) = collapse(
            &out,
            &broadcast_strides(&[2, 3, 4], &out),
            &broadcast_strides(&[4], &out),
        );
        assert_eq!((d, a, b), (vec![6, 4], vec![4, 1], vec![0, 1]));
        let (d, a, b) = collapse(
            &out,
            &broadcast_strides(&[2, 3, 4], &out),
            &broadcast_strides(&[2, 3, 4], &out),
        );
        assert_eq!((d, a, b), (vec![24], vec![1], vec![1]));
    }

    #[test]
    fn reference_broadcasts_rows_and_columns() {
        let d = Device::Cpu;
        let a = Tensor::from_vec(&d, &[2, 2], vec![1., 2., 3., 4.]).unwrap();
        let b = Tensor::from_vec(&d, &[2], vec![10., 20.]).unwrap();
        assert_eq!(
            binary(&a, &b, Binary::Add).unwrap().to_vec().unwrap(),
            [11., 22., 13., 24.]
        );
        let a = Tensor::from_vec(&d, &[2, 1], vec![1., 2.]).unwrap();
        let b = Tensor::from_vec(&d, &[3], vec![10., 20., 30.]).unwrap();
        assert_eq!(
            binary(&a, &b, Binary::Mul).unwrap().to_vec().unwrap(),
            [10., 20., 30., 20., 40., 60.]
        );
        let col = Tensor::from_vec(&d, &[2, 1], vec![1., 2.]).unwrap();
        assert_eq!(
            broadcast_to(&col, &[2, 3]).unwrap().to_vec().unwrap(),
            [1., 1., 1., 2., 2., 2.]
        );
        assert!(broadcast_to(&col, &[3, 3]).is_err());
    }
}
