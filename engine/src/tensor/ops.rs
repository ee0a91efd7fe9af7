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

    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Add)
    }

    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Sub)
    }

    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Mul)
    }

    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, Binary::Div)
    }

    /// `alpha * self + beta`.
    pub fn affine(&self, alpha: f32, beta: f32) -> Result<Tensor> {
        unary(self, Unary::Affine { alpha, beta })
    }

    pub fn scale(&self, alpha: f32) -> Result<Tensor> {
        self.affine(alpha, 0.0)
    }

    pub fn relu(&self) -> Result<Tensor> {
        unary(self, Unary::Relu)
    }

    pub fn gelu(&self) -> Result<Tensor> {
        unary(self, Unary::Gelu)
    }

    pub fn tanh(&self) -> Result<Tensor> {
        unary(self, Unary::Tanh)
    }

    pub fn sigmoid(&self) -> Result<Tensor> {
        unary(self, Unary::Sigmoid)
    }

    pub fn sqrt(&self) -> Result<Tensor> {
        unary(self, Unary::Sqrt)
    }

    pub fn exp(&self) -> Result<Tensor> {
        unary(self, Unary::Exp)
    }

    pub fn ln(&self) -> Result<Tensor> {
        unary(self, Unary::Log)
    }

    /// Swaps the last two axes.
    pub fn t(&self) -> Result<Tensor> {
        copy::transpose(self)
    }

    pub fn sum_axis(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        reduce::sum_axis(self, axis, keepdim)
    }

    pub fn mean_axis(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        reduce::mean_axis(self, axis, keepdim)
    }

    pub fn sum_all(&self) -> Result<Tensor> {
        reduce::sum_all(self)
    }

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
