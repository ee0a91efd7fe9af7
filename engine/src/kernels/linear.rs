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
    check_layer(x, weight, bias)?;
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

/// The weight is a matrix and the bias, if any, an f32 vector of its outputs on `x`'s device.
fn check_layer(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    if let Some(b) = bias {
        x.same_device("linear", b)?;
        b.expect_dtype("linear", DType::F32)?;
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
    Ok(())
}

/// A tensor to add a product onto (a residual, an earlier gradient): f32 on `x`'s device, of
/// the product's `shape`. Checked on both paths: the GPU's addition would broadcast a tensor
/// of another shape.
fn check_onto(x: &Tensor, onto: &Tensor, shape: &[usize]) -> Result<()> {
    onto.expect_dtype("linear", DType::F32)?;
    x.same_device("linear", onto)?;
    if onto.shape() != shape {
        return shape_err(
            "linear",
            format!("{:?} to add onto a product of {shape:?}", onto.shape()),
        );
    }
    Ok(())
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
            None => product_then(xs, ws, &dims, (b, None), |z| z),
            Some(Unary::Relu) => product_then(
                xs,
                ws,
                &dims,
                (b, None),
                #[inline(always)]
                |z| Unary::Relu.apply(z),
            ),
            Some(Unary::Affine { alpha, beta }) => product_then(
                xs,
                ws,
                &dims,
                (b, None),
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

/// The product with `f(z + b_j)` applied to each row as it completes (`f(z)` without a bias),
/// then `onto + that` where there is a tensor to add it onto (of the product's shape: a
/// residual stream, an input's earlier gradient).
#[inline(always)]
fn product_then(
    x: &[f32],
    w: &[f32],
    dims: &MatmulDims,
    (bias, onto): (Option<&[f32]>, Option<&[f32]>),
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let n = dims.n;
    crate::cpu::gemm::matmul_then(
        x,
        w,
        dims,
        #[inline(always)]
        |i: usize, first_column: usize, row: &mut [f32]| {
            match bias {
                Some(b) => row
                    .iter_mut()
                    .zip(&b[first_column..])
                    .for_each(|(v, &b)| *v = f(*v + b)),
                None => row.iter_mut().for_each(|v| *v = f(*v)),
            }
            // `value + onto`: the bits of `onto + value` (an addition's operands commute).
            if let Some(r) = onto {
                row.iter_mut()
                    .zip(&r[i * n + first_column..])
                    .for_each(|(v, &r)| *v += r);
            }
        },
    )
}

/// `residual + (x W + b)`, the layer added onto a residual stream of its output's shape, as
/// one operation: the same bits as [`forward`] and an addition after it (test). The CPU
/// path adds the residual's row to each row of the product while it is in cache: a GPT
/// step's residual additions were each a pass of their own, over a product written to memory
/// and read back.
pub fn forward_onto(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    residual: &Tensor,
) -> Result<Tensor> {
    check_layer(x, weight, bias)?;
    let (dims, shape) = MatmulDims::infer(x.shape(), weight.shape(), false, false)?;
    check_onto(x, residual, &shape)?;
    match (x.cpu_f32(), weight.cpu_f32(), residual.cpu_f32()) {
        (Some(xs), Some(ws), Some(rs)) => {
            let b = bias.map(|b| b.cpu_f32().expect("cpu"));
            let y = product_then(xs, ws, &dims, (b, Some(rs)), |z| z);
            Tensor::from_vec(x.device(), &shape, y)
        }
        _ => binary(residual, &forward(x, weight, bias, None)?.y, Binary::Add),
    }
}

/// The gradient of a layer's input, `dz Wᵀ` for `dz [.., outputs]` and `weight [inputs,
/// outputs]`; with `onto` (of the input's shape), `onto + dz Wᵀ`: the input's gradient added
/// onto the one it already has, as the backward pass adds a node's contribution to an earlier
/// one, with the bits of the product and that addition (test). The CPU path adds each row as
/// its sums complete, while it is in cache: in a GPT step, the gradient of the input that
/// three projections share was added in passes of its own (a probe on the GPT's [2048, 64],
/// operands from beyond the caches: 97–128 µs as a product and an addition, 78–94 in one;
/// docs/benchmarks.md, session 23).
///
/// Multiplying by an activation's derivative in the same way (the gradient of a GELU layer's
/// output, [2048, 256]) was slower than a pass of its own, 272–314 µs against 258–277: the
/// derivative's rows read among the product's stalled it, where a pass streams them.
pub fn input_gradient(dz: &Tensor, weight: &Tensor, onto: Option<&Tensor>) -> Result<Tensor> {
    dz.expect_dtype("linear", DType::F32)?;
    weight.expect_dtype("linear", DType::F32)?;
    check_layer(dz, weight, None)?;
    dz.same_device("linear", weight)?;
    let (dims, shape) = MatmulDims::infer(dz.shape(), weight.shape(), false, true)?;
    if let Some(acc) = onto {
        check_onto(dz, acc, &shape)?;
    }
    let (Some(dzs), Some(ws)) = (dz.cpu_f32(), weight.cpu_f32()) else {
        let dx = matmul(dz, weight, false, true)?;
        return match onto {
            Some(acc) => acc.add(&dx),
            None => Ok(dx),
        };
    };
    let acc = onto.map(|acc| acc.cpu_f32().expect("cpu"));
    let dx = product_then(dzs, ws, &dims, (None, acc), |v| v);
    Tensor::from_vec(dz.device(), &shape, dx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autograd::{Graph, Var};
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

    /// A layer's input of `x_shape`, weight and bias for `outputs`, and a tensor of the
    /// output's shape; and the number of inputs.
    fn operands(seed: u64, x_shape: &[usize], outputs: usize) -> (usize, [Tensor; 4]) {
        let inputs = *x_shape.last().unwrap();
        let mut y_shape = x_shape.to_vec();
        *y_shape.last_mut().unwrap() = outputs;
        (
            inputs,
            [
                tensor(x_shape, seed, 1.0),
                tensor(&[inputs, outputs], seed + 10, 0.5),
                tensor(&[outputs], seed + 20, 0.5),
                tensor(&y_shape, seed + 30, 1.0),
            ],
        )
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
            let (inputs, [x, w, b, r]) = operands(seed as u64, &x_shape, outputs);
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

    /// `residual + layer(x)` and the gradients of `sum(y * s)` for x, the weight, the bias
    /// and the residual: as one operation, or as the layer and an addition.
    fn onto(params: &[&Tensor], s: &Tensor, fused: bool) -> (Tensor, Vec<Tensor>) {
        let g = Graph::new(&Device::Cpu);
        let (x, w, r) = (g.param(params[0]), g.param(params[1]), g.param(params[2]));
        let b = params.get(3).map(|b| g.param(b));
        let y = if fused {
            g.linear_onto(x, w, b, r).unwrap()
        } else {
            let y = g.linear(x, w, b, None).unwrap();
            g.add(r, y).unwrap()
        };
        let loss = g.sum_all(g.mul(y, g.input(s)).unwrap()).unwrap();
        let value = g.value(y);
        (value, g.loss_and_grads(loss, params).unwrap().1)
    }

    #[test]
    fn onto_a_residual_gives_the_layer_and_additions_bits() {
        // Rows of whole tiles and not, a stack sharing the weight, a product few rows tall
        // enough to split its columns between tasks (row indices from a column block), a
        // narrow one; with a bias and without.
        for (seed, (x_shape, outputs)) in [
            (vec![1, 1], 1),
            (vec![5, 7], 3),
            (vec![2, 13, 17], 33),
            (vec![40, 64], 70),
            (vec![50, 40], 9),
            (vec![300, 64], 64),
        ]
        .into_iter()
        .enumerate()
        {
            let (inputs, [x, w, b, s]) = operands(seed as u64, &x_shape, outputs);
            let r = s.scale(-3.0).unwrap();
            for params in [vec![&x, &w, &r, &b], vec![&x, &w, &r]] {
                let what = format!(
                    "{x_shape:?} x [{inputs}, {outputs}], bias {}",
                    params.len() == 4
                );
                let (y, grads) = onto(&params, &s, true);
                let (y_ref, grads_ref) = onto(&params, &s, false);
                assert_eq!(y.shape(), y_ref.shape(), "{what}");
                assert_eq!(bits(&y), bits(&y_ref), "output, {what}");
                for (i, (g, g_ref)) in grads.iter().zip(&grads_ref).enumerate() {
                    assert_eq!(bits(g), bits(g_ref), "gradient {i}, {what}");
                }
            }
        }
        let (x, w) = (tensor(&[4, 3], 1, 1.0), tensor(&[3, 2], 2, 1.0));
        assert!(
            forward_onto(&x, &w, None, &tensor(&[4, 3], 3, 1.0)).is_err(),
            "a residual of another shape"
        );
        assert!(
            forward_onto(&x, &w, None, &tensor(&[1, 2], 6, 1.0)).is_err(),
            "a residual that an addition would broadcast"
        );
        assert!(forward_onto(
            &x,
            &w,
            Some(&tensor(&[3], 4, 1.0)),
            &tensor(&[4, 2], 5, 1.0)
        )
        .is_err());
    }

    /// The reads of a GPT block, in a graph of `[rows, width]`: `x` read by a layer norm and
    /// added back onto, the norm's output read by three layers, then a GELU layer and one onto
    /// the residual. Its output and the gradients of `sum(out * s)` for every parameter;
    /// `combined` reads each node directly, so that the backward pass adds a node's gradient
    /// onto the one it has in the rows of the product or the norm that computes it, and
    /// otherwise through a reshape, which the backward pass adds in a pass of its own.
    fn shared_reads(params: &[&Tensor], s: &Tensor, combined: bool) -> (Tensor, Vec<Tensor>) {
        let g = Graph::new(&Device::Cpu);
        let v: Vec<Var> = params.iter().map(|p| g.param(p)).collect();
        let &[x, gamma, beta, w1, w2, w3, wf, bf, wp] = v.as_slice() else {
            panic!("nine parameters")
        };
        let via = |v: Var| {
            if combined {
                v
            } else {
                g.reshape(v, &g.shape(v)).unwrap()
            }
        };
        let h = g.layer_norm(via(x), gamma, beta, 1e-5).unwrap();
        let [a, b, c] = [w1, w2, w3].map(|w| g.linear(via(h), w, None, None).unwrap());
        let y = g.add(g.add(a, b).unwrap(), c).unwrap();
        let y = g.add(x, y).unwrap();
        let m = g.linear(via(y), wf, Some(bf), Some(Unary::Gelu)).unwrap();
        let out = g.linear_onto(via(m), wp, None, y).unwrap();
        let loss = g.sum_all(g.mul(out, g.input(s)).unwrap()).unwrap();
        let value = g.value(out);
        (value, g.loss_and_grads(loss, params).unwrap().1)
    }

    #[test]
    fn gradients_added_in_rows_give_the_additions_bits() {
        // Rows off the tiles and a stack of them; widths off the vector lanes.
        for (seed, (rows, width)) in [(1, 1), (7, 3), (45, 17), (130, 64)]
            .into_iter()
            .enumerate()
        {
            let seed = 100 + seed as u64;
            let square = |i: u64| tensor(&[width, width], seed + i, 0.5);
            let params = [
                tensor(&[rows, width], seed, 1.0),
                tensor(&[width], seed + 1, 0.5),
                tensor(&[width], seed + 2, 0.5),
                square(3),
                square(4),
                square(5),
                tensor(&[width, 4 * width], seed + 6, 0.5),
                tensor(&[4 * width], seed + 7, 0.5),
                tensor(&[4 * width, width], seed + 8, 0.5),
            ];
            let params: Vec<&Tensor> = params.iter().collect();
            let s = tensor(&[rows, width], seed + 9, 1.0);
            let (y, grads) = shared_reads(&params, &s, true);
            let (y_ref, grads_ref) = shared_reads(&params, &s, false);
            assert_eq!(bits(&y), bits(&y_ref), "output, [{rows}, {width}]");
            for (i, (g, g_ref)) in grads.iter().zip(&grads_ref).enumerate() {
                assert_eq!(bits(g), bits(g_ref), "gradient {i}, [{rows}, {width}]");
            }
        }
        // The addition checks its operand.
        let (dz, w) = (tensor(&[4, 2], 1, 1.0), tensor(&[3, 2], 2, 1.0));
        assert!(input_gradient(&dz, &w, Some(&tensor(&[4, 2], 3, 1.0))).is_err());
        assert!(input_gradient(&dz, &w, Some(&tensor(&[3], 4, 1.0))).is_err());
        assert!(input_gradient(&dz, &w, Some(&tensor(&[1, 3], 7, 1.0))).is_err());
        assert!(input_gradient(&dz, &tensor(&[3, 2, 1], 5, 1.0), None).is_err());
        let dx = input_gradient(&dz, &w, Some(&tensor(&[4, 3], 6, 1.0))).unwrap();
        assert_eq!(dx.shape(), [4, 3]);
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
