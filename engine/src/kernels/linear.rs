//! A layer's affine map and activation, `f(x W + b)`, as one operation.
//!
//! Its definition is the composition of the existing kernels: the product (`matmul`), the
//! bias added with broadcasting (`binary`), the activation (`unary`). The GPU runs that
//! composition. The CPU path adds the bias, and applies the activation where it is cheap,
//! to each row of the product as soon as the row's sums are complete (`cpu::gemm::
//! matmul_then`): the same arithmetic on each element, so the same bits (test), without
//! writing the product to memory and reading it back once per step.

use super::binary::{binary, Binary};
use super::matmul::matmul;
use super::matmul_dims::MatmulDims;
use super::unary::{gelu_and_derivative, unary, Unary};
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// What [`forward`] gives: the layer's output, and what its gradient needs besides it.
pub struct Affine {
    /// `f(x W + b)`.
    pub y: Tensor,
    /// `x W + b` where `f`'s derivative cannot be read from `y` (tanh, ..., and GELU on
    /// the GPU); `None` without an activation, for ReLU (whose output is positive exactly
    /// where its input is), for an affine activation (whose derivative is a constant) and
    /// where `derivative` is kept instead.
    pub pre_activation: Option<Tensor>,
    /// `f'(x W + b)` for each element where the CPU path kept it (GELU,
    /// [`gelu_and_derivative`]), for the backward pass to multiply by.
    pub derivative: Option<Tensor>,
}

/// Whether `f'(z)` can be computed from `f(z)` in its place, with the same bits: `unary_
/// backward` given `y` rather than `z` computes the same gradient.
pub fn derivative_reads_output(f: Unary) -> bool {
    matches!(f, Unary::Relu | Unary::Affine { .. })
}

/// `f(x W + b)` for `x [.., inputs]`, `weight [inputs, outputs]`, `bias [outputs]`.
pub fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    f: Option<Unary>,
) -> Result<Affine> {
    if let Some(b) = bias {
        b.expect_dtype("linear", DType::F32)?;
        x.same_device("linear", b)?;
        let outputs = weight.shape().last().copied().unwrap_or(0);
        if b.shape() != [outputs] {
            return shape_err(
                "linear",
                format!(
                    "bias {:?} must be [{outputs}] for weight {:?}",
                    b.shape(),
                    weight.shape()
                ),
            );
        }
    }
    if weight.shape().len() != 2 {
        return shape_err(
            "linear",
            format!("weight must be [inputs, outputs], is {:?}", weight.shape()),
        );
    }
    match x.device() {
        Device::Cpu => cpu_forward(x, weight, bias, f),
        Device::Gpu(_) => {
            let mut z = matmul(x, weight, false, false)?;
            if let Some(b) = bias {
                z = binary(&z, b, Binary::Add)?;
            }
            Ok(match f {
                None => Affine {
                    y: z,
                    pre_activation: None,
                    derivative: None,
                },
                Some(f) if derivative_reads_output(f) => Affine {
                    y: unary(&z, f)?,
                    pre_activation: None,
                    derivative: None,
                },
                Some(f) => Affine {
                    y: unary(&z, f)?,
                    pre_activation: Some(z),
                    derivative: None,
                },
            })
        }
    }
}

fn cpu_forward(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, f: Option<Unary>) -> Result<Affine> {
    x.expect_dtype("linear", DType::F32)?;
    w.expect_dtype("linear", DType::F32)?;
    x.same_device("linear", w)?;
    let (dims, shape) = MatmulDims::infer(x.shape(), w.shape(), false, false)?;
    let (xs, ws) = (x.cpu_f32().expect("cpu"), w.cpu_f32().expect("cpu"));
    let b = bias.map(|b| b.cpu_f32().expect("cpu"));
    // The product with `f` applied in its rows: only the functions cheap enough to keep up
    // with the product and whose gradient needs no `z` (see `derivative_reads_output`).
    let z_of = |in_rows: Option<Unary>| -> Vec<f32> {
        match in_rows {
            None => with_bias(xs, ws, &dims, b, |z| z),
            Some(Unary::Relu) => with_bias(
                xs,
                ws,
                &dims,
                b,
                #[inline(always)]
                |z| Unary::Relu.apply(z),
            ),
            Some(Unary::Affine { alpha, beta }) => with_bias(
                xs,
                ws,
                &dims,
                b,
                #[inline(always)]
                move |z| Unary::Affine { alpha, beta }.apply(z),
            ),
            Some(other) => unreachable!("{other:?} is applied after the product"),
        }
    };
    Ok(match f {
        Some(Unary::Gelu) => {
            let z = Tensor::from_vec(x.device(), &shape, z_of(None))?;
            let (y, derivative) = gelu_and_derivative(&z)?;
            Affine {
                y,
                pre_activation: None,
                derivative: Some(derivative),
            }
        }
        Some(f) if !derivative_reads_output(f) => {
            let z = Tensor::from_vec(x.device(), &shape, z_of(None))?;
            Affine {
                y: unary(&z, f)?,
                pre_activation: Some(z),
                derivative: None,
            }
        }
        f => Affine {
            y: Tensor::from_vec(x.device(), &shape, z_of(f))?,
            pre_activation: None,
            derivative: None,
        },
    })
}

/// The product with `f(z + b_j)` applied to each row as it completes (`f(z)` without a bias).
#[inline(always)]
fn with_bias(
    x: &[f32],
    w: &[f32],
    dims: &MatmulDims,
    bias: Option<&[f32]>,
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    crate::cpu::gemm::matmul_then(
        x,
        w,
        dims,
        #[inline(always)]
        |first_column: usize, row: &mut [f32]| match bias {
            Some(b) => row
                .iter_mut()
                .zip(&b[first_column..])
                .for_each(|(v, &b)| *v = f(*v + b)),
            None => row.iter_mut().for_each(|v| *v = f(*v)),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autograd::Graph;
    use crate::rng::Rng;

    fn tensor(shape: &[usize], seed: u64, scale: f32) -> Tensor {
        let mut rng = Rng::new(seed, 1);
        let n = shape.iter().product();
        let v = (0..n).map(|_| scale * rng.normal()).collect();
        Tensor::from_vec(&Device::Cpu, shape, v).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The layer's output and the gradients of `sum(y * r)` for `x`, the weight and the bias:
    /// through the one operation, or through the product, the addition and the activation.
    fn layer(
        params: &[&Tensor],
        f: Option<Unary>,
        r: &Tensor,
        fused: bool,
    ) -> (Tensor, Vec<Tensor>) {
        let g = Graph::new(&Device::Cpu);
        let (x, w) = (g.param(params[0]), g.param(params[1]));
        let b = params.get(2).map(|b| g.param(b));
        let y = if fused {
            g.linear(x, w, b, f).unwrap()
        } else {
            let mut z = g.matmul(x, w).unwrap();
            if let Some(b) = b {
                z = g.add(z, b).unwrap();
            }
            match f {
                Some(f) => g.unary(z, f).unwrap(),
                None => z,
            }
        };
        let loss = g.sum_all(g.mul(y, g.input(r)).unwrap()).unwrap();
        let value = g.value(y);
        (value, g.loss_and_grads(loss, params).unwrap().1)
    }

    #[test]
    fn the_operation_gives_the_compositions_bits() {
        // Rows and columns off the tiles, a stack of inputs sharing the weight, inputs long
        // enough for the packed product; each activation the CPU path applies in the rows
        // and ones it applies after; with a bias and without.
        let activations = [
            None,
            Some(Unary::Relu),
            Some(Unary::Affine {
                alpha: 0.125,
                beta: 0.0,
            }),
            Some(Unary::Gelu),
            Some(Unary::Tanh),
        ];
        for (seed, (x_shape, outputs)) in [
            (vec![1, 1], 1),
            (vec![5, 7], 3),
            (vec![2, 13, 17], 33),
            (vec![30, 300], 20),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = seed as u64;
            let inputs = *x_shape.last().unwrap();
            let x = tensor(&x_shape, seed, 1.0);
            let w = tensor(&[inputs, outputs], seed + 10, 0.5);
            let b = tensor(&[outputs], seed + 20, 0.5);
            let mut y_shape = x_shape.clone();
            *y_shape.last_mut().unwrap() = outputs;
            let r = tensor(&y_shape, seed + 30, 1.0);
            for f in activations {
                for params in [vec![&x, &w, &b], vec![&x, &w]] {
                    let what = format!(
                        "{x_shape:?} x [{inputs}, {outputs}], {f:?}, bias {}",
                        params.len() == 3
                    );
                    let (y, grads) = layer(&params, f, &r, true);
                    let (y_ref, grads_ref) = layer(&params, f, &r, false);
                    assert_eq!(y.shape(), y_ref.shape(), "{what}");
                    assert_eq!(bits(&y), bits(&y_ref), "output, {what}");
                    for (i, (g, g_ref)) in grads.iter().zip(&grads_ref).enumerate() {
                        assert_eq!(bits(g), bits(g_ref), "gradient {i}, {what}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = tensor(&[4, 3], 1, 1.0);
        let w = tensor(&[3, 2], 2, 1.0);
        assert!(forward(&x, &w, Some(&tensor(&[3], 3, 1.0)), None).is_err());
        assert!(forward(&x, &tensor(&[4, 2], 4, 1.0), None, None).is_err());
        assert!(forward(&x, &tensor(&[3, 2, 1], 5, 1.0), None, None).is_err());
        assert!(forward(&x, &w, Some(&tensor(&[2], 6, 1.0)), Some(Unary::Relu)).is_ok());
    }
}
