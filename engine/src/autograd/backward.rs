//! The backward pass: one rule per [`Op`], applied in reverse tape order.

use std::collections::HashMap;

use super::{Grads, Graph, Op, Var};
use crate::error::{shape_err, Result};
use crate::kernels::binary::{broadcast_to, Binary};
use crate::kernels::linear;
use crate::kernels::matmul::{matmul, MatmulDims};
use crate::kernels::reduce::sum_to_shape;
use crate::kernels::unary::{times_derivative, unary, unary_backward, Unary};
use crate::kernels::{
    attention, conv, conv_pool, dropout, embedding, image_norm, layernorm, norm_pool, permute,
    pool, softmax,
};
use crate::tensor::Tensor;

/// What the backward pass does with a parameter's gradient once nothing more can add to it:
/// called with the parameter's storage id and the gradient.
pub(super) type Ready<'a> = &'a mut dyn FnMut(usize, Tensor) -> Result<()>;

/// Backpropagates `seed`, the gradient of some scalar with respect to `output` (ones for a
/// one-element loss), through the tape. With `ready`, each parameter's gradient is handed to
/// it the moment it is final, while the pass goes on to earlier layers (and is not in the
/// returned [`Grads`]): a parameter's leaf sits on the tape before every node that reads it,
/// so when the reverse walk reaches the leaf, every contribution has been added.
pub(super) fn run(
    graph: Graph,
    output: Var,
    seed: Option<Tensor>,
    mut ready: Option<Ready<'_>>,
) -> Result<Grads> {
    let nodes = graph.nodes.into_inner();
    let params = graph.params.into_inner();
    let mut param_at: Vec<Option<usize>> = vec![None; nodes.len()];
    for (&storage, v) in &params {
        param_at[v.0] = Some(storage);
    }
    let loss = output;
    let out_value = &nodes[loss.0].value;
    let seed = match seed {
        Some(seed) if seed.shape() == out_value.shape() => seed,
        Some(seed) => {
            return shape_err(
                "backward",
                format!(
                    "a seed of shape {:?} for an output of shape {:?}",
                    seed.shape(),
                    out_value.shape()
                ),
            )
        }
        None if out_value.numel() == 1 => Tensor::full(out_value.device(), out_value.shape(), 1.0)?,
        None => {
            return shape_err(
                "backward",
                format!(
                    "the loss must have one element, has shape {:?}",
                    out_value.shape()
                ),
            )
        }
    };
    let mut grads: Vec<Option<Tensor>> = vec![None; nodes.len()];
    grads[loss.0] = Some(seed);
    // Layers whose gradient in `grads` their only reader has already carried through their
    // activation (the queries' scale, through attention's backward pass): the gradient of
    // the layer's `x W + b`.
    let mut through_activation = vec![false; nodes.len()];

    for i in (0..=loss.0).rev() {
        let node = &nodes[i];
        if let (Some(ready), Some(storage)) = (ready.as_mut(), param_at[i]) {
            if let Some(grad) = grads[i].take() {
                ready(storage, grad)?;
            }
            continue;
        }
        if !node.needs_grad || matches!(node.op, Op::Leaf) {
            continue;
        }
        let Some(dy) = grads[i].take() else { continue };
        let value = |v: Var| &nodes[v.0].value;
        let needs = |v: Var| nodes[v.0].needs_grad;
        // Each rule yields (input, gradient) pairs; accumulation is shared below.
        let contributions: Vec<(Var, Tensor)> = match &node.op {
            Op::Leaf => unreachable!("leaves are skipped"),
            Op::MatMul {
                a,
                b,
                trans_a,
                trans_b,
            } => {
                let [da, db] = matmul_grads(
                    value(*a),
                    value(*b),
                    *trans_a,
                    *trans_b,
                    &dy,
                    [needs(*a), needs(*b)],
                )?;
                [(*a, da), (*b, db)]
                    .into_iter()
                    .filter_map(|(v, g)| g.map(|g| (v, g)))
                    .collect()
            }
            Op::Linear {
                x,
                weight,
                bias,
                activation,
                pre_activation,
                derivative,
                residual,
            } => {
                // The rules of the composition it replaces, in its order: the residual
                // addition's (its operand first, as `add(residual, y)` gives it), the
                // activation's, the bias addition's (the bias sums dz over the rows), the
                // product's.
                let z = pre_activation.as_ref().unwrap_or(&node.value);
                let dz = match (activation, derivative) {
                    _ if through_activation[i] => dy.clone(),
                    (None, _) => dy.clone(),
                    (Some(_), Some(derivative)) => times_derivative(derivative, &dy)?,
                    (Some(f), None) => unary_backward(z, &dy, *f)?,
                };
                let mut out = vec![];
                if let Some(r) = residual.filter(|r| needs(*r)) {
                    out.push((r, dy.clone()));
                }
                if let Some(b) = bias.filter(|b| needs(*b)) {
                    out.push((b, sum_to_shape(&dz, value(b).shape())?));
                }
                if needs(*x) {
                    let others = [Some(*weight), *residual, *bias].into_iter().flatten();
                    let earlier = earlier_gradient(&mut grads, *x, others);
                    let dx = linear::input_gradient(&dz, value(*weight), earlier.as_ref())?;
                    out.push((*x, dx));
                }
                let [_, dw] = matmul_grads(
                    value(*x),
                    value(*weight),
                    false,
                    false,
                    &dz,
                    [false, needs(*weight)],
                )?;
                out.extend(dw.map(|dw| (*weight, dw)));
                out
            }
            Op::Binary { a, b, op } => {
                let (av, bv) = (value(*a), value(*b));
                let mut out = vec![];
                if needs(*a) {
                    let da = match op {
                        Binary::Add | Binary::Sub => dy.clone(),
                        Binary::Mul => dy.mul(bv)?,
                        Binary::Div => dy.div(bv)?,
                        Binary::Max | Binary::Min => {
                            return shape_err(
                                "backward",
                                "max and min are not differentiable ops of the graph",
                            )
                        }
                    };
                    out.push((*a, sum_to_shape(&da, av.shape())?));
                }
                if needs(*b) {
                    let db = match op {
                        Binary::Add => dy.clone(),
                        Binary::Sub => dy.scale(-1.0)?,
                        Binary::Mul => dy.mul(av)?,
                        // d(a/b)/db = -a / b^2 = -(a/b) / b
                        Binary::Div => dy.mul(&node.value)?.div(bv)?.scale(-1.0)?,
                        Binary::Max | Binary::Min => {
                            return shape_err(
                                "backward",
                                "max and min are not differentiable ops of the graph",
                            )
                        }
                    };
                    out.push((*b, sum_to_shape(&db, bv.shape())?));
                }
                out
            }
            Op::Unary { x, op } => vec![(*x, unary_backward(value(*x), &dy, *op)?)],
            Op::SumAxis { x, axis, keepdim } => vec![(
                *x,
                expand_axis(&dy, value(*x).shape(), *axis, *keepdim, 1.0)?,
            )],
            Op::MeanAxis { x, axis, keepdim } => {
                let len = value(*x).shape()[*axis].max(1) as f32;
                vec![(
                    *x,
                    expand_axis(&dy, value(*x).shape(), *axis, *keepdim, 1.0 / len)?,
                )]
            }
            Op::SumAll { x } => vec![(*x, broadcast_to(&dy, value(*x).shape())?)],
            Op::MeanAll { x } => {
                let n = value(*x).numel().max(1) as f32;
                vec![(*x, broadcast_to(&dy.scale(1.0 / n)?, value(*x).shape())?)]
            }
            Op::Softmax { x } => vec![(*x, softmax::softmax_backward(&node.value, &dy)?)],
            Op::Attention {
                q,
                k,
                v,
                heads,
                mask,
                weights,
            } => {
                // Queries scaled by a layer whose only reader this is (a GPT's attention) get
                // their gradient through the scale in attention's own pass over it; the layer
                // then takes it as its `x W + b`'s.
                let dq_times = match &nodes[q.0].op {
                    Op::Linear {
                        activation: Some(Unary::Affine { alpha, .. }),
                        ..
                    } if nodes[q.0].readers == 1 => {
                        through_activation[q.0] = true;
                        Some(*alpha)
                    }
                    _ => None,
                };
                let [dq, dk, dv] = attention::causal_attention_backward(
                    value(*q),
                    value(*k),
                    value(*v),
                    weights,
                    *heads,
                    mask.as_ref(),
                    &dy,
                    dq_times,
                )?;
                vec![(*q, dq), (*k, dk), (*v, dv)]
            }
            Op::CrossEntropy {
                logits,
                labels,
                probs,
            } => {
                vec![(
                    *logits,
                    softmax::cross_entropy_backward(probs, labels, &dy)?,
                )]
            }
            Op::LayerNorm {
                x,
                gamma,
                beta,
                stats,
            } => {
                let earlier = earlier_gradient(&mut grads, *x, [*gamma, *beta]);
                let (dx, dgamma, dbeta) = layernorm::layernorm_backward(
                    value(*x),
                    value(*gamma),
                    stats,
                    &dy,
                    earlier.as_ref(),
                )?;
                vec![(*x, dx), (*gamma, dgamma), (*beta, dbeta)]
            }
            Op::ImageNorm {
                x,
                gamma,
                beta,
                stats,
                eps,
            } => {
                let (dx, dgamma, dbeta) =
                    image_norm::image_norm_backward(value(*x), value(*gamma), stats, &dy, *eps)?;
                vec![(*x, dx), (*gamma, dgamma), (*beta, dbeta)]
            }
            Op::ImageNormMaxPool {
                x,
                gamma,
                beta,
                saved,
            } => {
                let (dx, dgamma, dbeta) =
                    norm_pool::backward(value(*x), value(*gamma), saved, &dy)?;
                vec![(*x, dx), (*gamma, dgamma), (*beta, dbeta)]
            }
            Op::Embedding { table, ids } => {
                let vocab = value(*table).shape()[0];
                vec![(*table, embedding::embedding_backward(ids, &dy, vocab)?)]
            }
            Op::Transpose { x } => vec![(*x, dy.t()?)],
            Op::Reshape { x } => vec![(*x, dy.reshape(value(*x).shape())?)],
            Op::Conv2d {
                x,
                weight,
                bias,
                geometry,
                cols,
            } => {
                // As the addition's and the product's rules give them: dy summed over the
                // rows for the bias, colsᵀ dy for the weight, and for the input col2im of dy
                // weightᵀ.
                let mut out = vec![];
                if let Some(b) = bias.filter(|b| needs(*b)) {
                    out.push((b, sum_to_shape(&dy, value(b).shape())?));
                }
                if needs(*weight) {
                    let dw = conv::weight_gradient(value(*x), cols.as_ref(), &dy, geometry)?;
                    out.push((*weight, dw));
                }
                if needs(*x) {
                    out.push((*x, conv::input_gradient(&dy, value(*weight), geometry)?));
                }
                out
            }
            Op::ConvMaxPool {
                x,
                weight,
                bias,
                geometry,
                saved,
            } => {
                let wanted = conv_pool::Wanted {
                    x: needs(*x),
                    weight: needs(*weight),
                    bias: bias.is_some_and(needs),
                };
                let (dx, dw, db) =
                    conv_pool::backward(value(*x), value(*weight), saved, &dy, geometry, wanted)?;
                [(Some(*x), dx), (Some(*weight), dw), (*bias, db)]
                    .into_iter()
                    .filter_map(|(v, g)| Some((v?, g?)))
                    .collect()
            }
            Op::Pool {
                x,
                geometry,
                kind,
                argmax,
            } => vec![(
                *x,
                pool::pool_backward(&dy, argmax.as_ref(), geometry, *kind)?,
            )],
            Op::Dropout { x, mask } => vec![(*x, dropout::dropout(&dy, mask)?)],
            Op::Permute { x, perm } => {
                vec![(*x, permute::permute(&dy, &permute::inverse(perm))?)]
            }
        };
        for (v, g) in contributions {
            if !needs(v) {
                continue;
            }
            grads[v.0] = Some(match grads[v.0].take() {
                Some(acc) => acc.add(&g)?,
                None => g,
            });
        }
    }

    let by_storage: HashMap<usize, Tensor> = params
        .into_iter()
        .filter_map(|(storage, v)| grads[v.0].take().map(|g| (storage, g)))
        .collect();
    Ok(Grads { by_storage })
}

/// The gradient `x` holds so far, taken out for the node being walked to add its own onto in
/// the pass that computes it (`onto` of `linear::input_gradient` and `layernorm_backward`),
/// where `x` is none of the node's `others` operands; `None` otherwise, and the node's
/// contributions are added in their order as every node's are.
fn earlier_gradient(
    grads: &mut [Option<Tensor>],
    x: Var,
    others: impl IntoIterator<Item = Var>,
) -> Option<Tensor> {
    if others.into_iter().any(|v| v == x) {
        None
    } else {
        grads[x.0].take()
    }
}

/// Gradients of `C = op(A) op(B)` for the operands that need one:
///   dA = dC op(B)^T (or its transpose when A was transposed), dB = op(A)^T dC (likewise),
/// summed over the batches an operand was broadcast across.
fn matmul_grads(
    a: &Tensor,
    b: &Tensor,
    ta: bool,
    tb: bool,
    dc: &Tensor,
    needed: [bool; 2],
) -> Result<[Option<Tensor>; 2]> {
    let (dims, _) = MatmulDims::infer(a.shape(), b.shape(), ta, tb)?;
    let da = if !needed[0] {
        None
    } else {
        let da = if ta {
            matmul(b, dc, tb, true)?
        } else {
            matmul(dc, b, false, !tb)?
        };
        Some(sum_to_shape(&da, a.shape())?)
    };
    let db = if !needed[1] {
        None
    } else if !dims.b_batched && dims.a_batched && !ta {
        // A shared B (a Linear layer over [batch, time, features]): sum_z A_z^T dC_z is one
        // product with the batch folded into the rows.
        let rows = dims.batch * dims.m;
        let (a2, dc2) = (a.reshape(&[rows, dims.k])?, dc.reshape(&[rows, dims.n])?);
        Some(if tb {
            matmul(&dc2, &a2, true, false)?
        } else {
            matmul(&a2, &dc2, true, false)?
        })
    } else {
        let db = if tb {
            matmul(dc, a, true, ta)?
        } else {
            matmul(a, dc, !ta, false)?
        };
        Some(sum_to_shape(&db, b.shape())?)
    };
    Ok([da, db])
}

/// The gradient of a sum or mean over `axis`: `dy` repeated along it, times `scale`.
fn expand_axis(
    dy: &Tensor,
    x_shape: &[usize],
    axis: usize,
    keepdim: bool,
    scale: f32,
) -> Result<Tensor> {
    let mut kept = x_shape.to_vec();
    kept[axis] = 1;
    let dy = if keepdim {
        dy.clone()
    } else {
        dy.reshape(&kept)?
    };
    let dy = if scale == 1.0 {
        dy
    } else {
        unary(
            &dy,
            Unary::Affine {
                alpha: scale,
                beta: 0.0,
            },
        )?
    };
    broadcast_to(&dy, x_shape)
}
