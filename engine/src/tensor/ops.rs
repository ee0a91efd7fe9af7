//! Method syntax for the kernels: `x.matmul(&w)?.add(&b)?.relu()?`, and `Tensor::full`, the
//! one constructor that launches a kernel (the tensor core below stays free of kernels).

use super::{Device, Tensor};
use crate::error::Result;
use crate::kernels::binary::{binary, Binary};
use crate::kernels::unary::{unary, Unary};
use crate::kernels::{copy, fill, matmul, reduce, softmax};

impl Tensor {
    /// An f32 tensor with every element `value`.
    pub fn full(device: &Device, shape: &[usize], value: f32) -> Result<Tensor> {
        fill::full(device, shape, value)
    }

    /// Matrix product `self * rhs` (batched over leading axes).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        matmul::matmul(self, rhs, false, false)
    }

    /// Matrix product with optional transposes of either operand.
    pub fn matmul_t(&self, rhs: &Tensor, trans_self: bool, trans_rhs: bool) -> Result<Tensor> {
        matmul::matmul(self, rhs, trans_self, trans_rhs)
    }

    /// Element-wise `self + rhs`, with broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Add)
    }

    /// Element-wise `self - rhs`, with broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Sub)
    }

    /// Element-wise `self * rhs`, with broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Mul)
    }

    /// Element-wise `self / rhs`, with broadcasting.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Div)
    }

    /// `alpha * self + beta`.
    pub fn affine(&self, alpha: f32, beta: f32) -> Result<Tensor> {
        unary(self, Unary::Affine { alpha, beta })
    }

    /// `alpha * self`.
    pub fn scale(&self, alpha: f32) -> Result<Tensor> {
        self.affine(alpha, 0.0)
    }

    /// Element-wise `max(self, 0)`.
    pub fn relu(&self) -> Result<Tensor> {
        unary(self, Unary::Relu)
    }

    /// Element-wise GELU (tanh approximation).
    pub fn gelu(&self) -> Result<Tensor> {
        unary(self, Unary::Gelu)
    }

    /// Element-wise hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        unary(self, Unary::Tanh)
    }

    /// Element-wise logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Tensor> {
        unary(self, Unary::Sigmoid)
    }

    /// Element-wise square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        unary(self, Unary::Sqrt)
    }

    /// Element-wise `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        unary(self, Unary::Exp)
    }

    /// Element-wise natural logarithm.
    pub fn ln(&self) -> Result<Tensor> {
        unary(self, Unary::Log)
    }

    /// Swaps the last two axes.
    pub fn t(&self) -> Result<Tensor> {
        copy::transpose(self)
    }

    /// Sums over `axis` (negative counts from the end), keeping it as size 1 when `keepdim`.
    pub fn sum_axis(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        reduce::sum_axis(self, axis, keepdim)
    }

    /// Averages over `axis` (negative counts from the end), keeping it as size 1 when `keepdim`.
    pub fn mean_axis(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        reduce::mean_axis(self, axis, keepdim)
    }

    /// The sum of every element, as a scalar tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        reduce::sum_all(self)
    }

    /// The mean of every element, as a scalar tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        reduce::mean_all(self)
    }

    /// Index of the largest element along the last axis (u32).
    pub fn argmax(&self) -> Result<Tensor> {
        reduce::argmax_last(self)
    }

    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Tensor> {
        softmax::softmax(self)
    }
}
