//! Causal self-attention over heads side by side: for each head of `[batch, time, heads *
//! width]` queries, keys and values (the layout the projections give), the causal softmax of
//! `q kᵀ` times `v`, with dropout on the attention weights when a mask is given.
//!
//! Its definition is [`composed`]: the existing kernels in sequence (permute into `[batch,
//! heads, time, width]`, matmul, causal softmax, dropout, matmul, permute back). The GPU runs
//! that composition. The CPU path (`cpu::attention`) computes the same values in the same
//! arithmetic without the permutations and with each head's scores in cache; a test holds
//! the two to the same bits, forward and backward.

use super::dropout::{self, DropoutMask};
use super::matmul::matmul;
use super::permute::permute;
use super::softmax::{causal_softmax, softmax_backward};
use super::unary::{unary_backward, Unary};
use crate::cpu::attention::{self as cpu, HeadShape};
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// The shape of `q`, `k` and `v`, checked: the same `[batch, time, features]` on one device,
/// `features` a multiple of `heads`.
fn head_shape(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<HeadShape> {
    for (name, x) in [("queries", q), ("keys", k), ("values", v)] {
        x.expect_dtype("attention", DType::F32)?;
        q.same_device("attention", x)?;
        if x.shape() != q.shape() {
            return shape_err(
                "attention",
                format!("{name} {:?} differ from queries {:?}", x.shape(), q.shape()),
            );
        }
    }
    match *q.shape() {
        [batch, time, features] if heads > 0 && features % heads == 0 => Ok(HeadShape {
            batch,
            time,
            heads,
            width: features / heads,
        }),
        ref other => shape_err(
            "attention",
            format!("needs [batch, time, features] with features a multiple of {heads} heads, is {other:?}"),
        ),
    }
}

/// `[batch, time, heads * width]` as `[batch, heads, time, width]`.
fn split_heads(x: &Tensor, sh: HeadShape) -> Result<Tensor> {
    let x = x.reshape(&[sh.batch, sh.time, sh.heads, sh.width])?;
    permute(&x, &[0, 2, 1, 3])
}

/// `[batch, heads, time, width]` as `[batch, time, heads * width]`.
fn merge_heads(x: &Tensor, sh: HeadShape) -> Result<Tensor> {
    permute(x, &[0, 2, 1, 3])?.reshape(&[sh.batch, sh.time, sh.features()])
}

/// A CPU tensor's values.
fn values_of(x: &Tensor) -> &[f32] {
    x.cpu_f32().expect("cpu")
}

/// The CPU path's dropout on the weights: the mask, checked, and where the weights start in
/// the step's global batch, as the dropout kernel finds them.
fn weights_dropout(mask: Option<&DropoutMask>, sh: HeadShape) -> Result<cpu::WeightsDropout<'_>> {
    mask.map(|mask| {
        mask.check()?;
        Ok((mask, mask.offset(sh.weights_numel())?))
    })
    .transpose()
}

/// The weights after dropout, as the product with the values sees them.
fn dropped(weights: &Tensor, mask: Option<&DropoutMask>) -> Result<Tensor> {
    match mask {
        Some(mask) => dropout::dropout(weights, mask),
        None => Ok(weights.clone()),
    }
}

/// The attention's output `[batch, time, heads * width]` and its weights `[batch, heads,
/// time, time]` before dropout (kept for the backward pass).
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    mask: Option<&DropoutMask>,
) -> Result<(Tensor, Tensor)> {
    let sh = head_shape(q, k, v, heads)?;
    match q.device() {
        Device::Cpu => {
            let values = (values_of(q), values_of(k), values_of(v));
            let (y, weights) =
                cpu::forward(values.0, values.1, values.2, sh, weights_dropout(mask, sh)?);
            let weights_shape = [sh.batch, sh.heads, sh.time, sh.time];
            Ok((
                Tensor::from_vec(q.device(), q.shape(), y)?,
                Tensor::from_vec(q.device(), &weights_shape, weights)?,
            ))
        }
        Device::Gpu(_) => composed::forward(q, k, v, sh, mask),
    }
}

/// The gradients of `q`, `k` and `v` from the output's gradient `dy`, given the weights
/// [`causal_attention`] returned; with `dq_times`, `q`'s gradient times it, element by
/// element: carried on through the scale that made `q` (`dq * alpha`, as the scale's own
/// gradient multiplies), in the pass that computes it on the CPU path and after the
/// composition on the GPU (test). A GPT step's queries' scale took a pass of its own over
/// their gradient in every layer.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    weights: &Tensor,
    heads: usize,
    mask: Option<&DropoutMask>,
    dy: &Tensor,
    dq_times: Option<f32>,
) -> Result<[Tensor; 3]> {
    let sh = head_shape(q, k, v, heads)?;
    q.same_device("attention backward", dy)?;
    q.same_device("attention backward", weights)?;
    if dy.shape() != q.shape() || weights.shape() != [sh.batch, sh.heads, sh.time, sh.time] {
        return shape_err(
            "attention backward",
            format!(
                "dy {:?} and weights {:?} for queries {:?} over {heads} heads",
                dy.shape(),
                weights.shape(),
                q.shape()
            ),
        );
    }
    match q.device() {
        Device::Cpu => {
            let [dq, dk, dv] = cpu::backward(
                values_of(weights),
                (values_of(q), values_of(k), values_of(v)),
                values_of(dy),
                sh,
                weights_dropout(mask, sh)?,
                dq_times,
            );
            let out = |x: Vec<f32>| Tensor::from_vec(q.device(), q.shape(), x);
            Ok([out(dq)?, out(dk)?, out(dv)?])
        }
        Device::Gpu(_) => {
            let [dq, dk, dv] = composed::backward(q, k, v, weights, sh, mask, dy)?;
            let dq = match dq_times {
                Some(alpha) => unary_backward(q, &dq, Unary::Affine { alpha, beta: 0.0 })?,
                None => dq,
            };
            Ok([dq, dk, dv])
        }
    }
}

/// The definition: attention as the composition of the existing kernels, on whichever device
/// the operands live. The GPU runs it; on the CPU it is the reference of `cpu::attention`.
pub mod composed {
    use super::*;

    /// See [`causal_attention`].
    pub fn forward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        sh: HeadShape,
        mask: Option<&DropoutMask>,
    ) -> Result<(Tensor, Tensor)> {
        let (qh, kh, vh) = (
            split_heads(q, sh)?,
            split_heads(k, sh)?,
            split_heads(v, sh)?,
        );
        let weights = causal_softmax(&matmul(&qh, &kh, false, true)?)?;
        let y = matmul(&dropped(&weights, mask)?, &vh, false, false)?;
        Ok((merge_heads(&y, sh)?, weights))
    }

    /// See [`causal_attention_backward`]: the backward rules of the composition's steps
    /// (a product's, dropout's, the softmax's), in reverse.
    pub fn backward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        weights: &Tensor,
        sh: HeadShape,
        mask: Option<&DropoutMask>,
        dy: &Tensor,
    ) -> Result<[Tensor; 3]> {
        let (qh, kh, vh) = (
            split_heads(q, sh)?,
            split_heads(k, sh)?,
            split_heads(v, sh)?,
        );
        let dyh = split_heads(dy, sh)?;
        let d_dropped = matmul(&dyh, &vh, false, true)?;
        let dv = matmul(&dropped(weights, mask)?, &dyh, true, false)?;
        let d_scores = softmax_backward(weights, &dropped(&d_dropped, mask)?)?;
        let dq = matmul(&d_scores, &kh, false, false)?;
        let dk = matmul(&d_scores, &qh, true, false)?;
        Ok([
            merge_heads(&dq, sh)?,
            merge_heads(&dk, sh)?,
            merge_heads(&dv, sh)?,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], seed: usize, scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let values = (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0)
            .map(|x| x * scale)
            .collect();
        Tensor::from_vec(&Device::Cpu, shape, values).unwrap()
    }

    fn bits(x: &Tensor) -> Vec<u32> {
        x.to_vec().unwrap().into_iter().map(f32::to_bits).collect()
    }

    /// The shape and the queries, keys, values and output gradient the tests start from.
    fn operands(batch: usize, time: usize, heads: usize, width: usize) -> (HeadShape, [Tensor; 4]) {
        let sh = HeadShape {
            batch,
            time,
            heads,
            width,
        };
        let shape = [batch, time, heads * width];
        let tensors = [
            tensor(&shape, 1, 3.0),
            tensor(&shape, 2, 3.0),
            tensor(&shape, 3, 1.0),
            tensor(&shape, 4, 1.0),
        ];
        (sh, tensors)
    }

    /// Attention over scaled queries from layers of `x`, and the gradients of `sum(y * s)` for
    /// `x` and every weight and bias: the queries read by attention alone (so that its
    /// backward pass carries their gradient through the scale), or through a reshape (which
    /// leaves the scale's gradient to the layer).
    fn scaled_queries(params: &[&Tensor], s: &Tensor, heads: usize, alone: bool) -> Vec<Tensor> {
        use crate::autograd::Graph;
        let g = Graph::new(&Device::Cpu);
        let v: Vec<_> = params.iter().map(|p| g.param(p)).collect();
        let &[x, wq, bq, wk, wv] = v.as_slice() else {
            panic!("five parameters")
        };
        let scale = Unary::Affine {
            alpha: 0.37,
            beta: 0.0,
        };
        let mut q = g.linear(x, wq, Some(bq), Some(scale)).unwrap();
        if !alone {
            q = g.reshape(q, &g.shape(q)).unwrap();
        }
        let k = g.linear(x, wk, None, None).unwrap();
        let v = g.linear(x, wv, None, None).unwrap();
        let y = g.causal_attention(q, k, v, heads, None).unwrap();
        let loss = g.sum_all(g.mul(y, g.input(s)).unwrap()).unwrap();
        g.loss_and_grads(loss, params).unwrap().1
    }

    #[test]
    fn queries_scale_carried_through_attention_gives_the_layers_bits() {
        for (seed, (batch, time, heads, width)) in [(1, 1, 1, 1), (2, 9, 2, 3), (2, 20, 3, 16)]
            .into_iter()
            .enumerate()
        {
            let c = heads * width;
            let params = [
                tensor(&[batch, time, c], seed + 10, 1.0),
                tensor(&[c, c], seed + 11, 0.5),
                tensor(&[c], seed + 12, 0.5),
                tensor(&[c, c], seed + 13, 0.5),
                tensor(&[c, c], seed + 14, 0.5),
            ];
            let params: Vec<&Tensor> = params.iter().collect();
            let s = tensor(&[batch, time, c], seed + 15, 1.0);
            let got = scaled_queries(&params, &s, heads, true);
            let want = scaled_queries(&params, &s, heads, false);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    bits(g),
                    bits(w),
                    "gradient {i}, [{batch}, {time}, {heads} x {width}]"
                );
            }
        }
    }

    #[test]
    fn the_cpu_path_gives_the_compositions_bits() {
        // Times off the 8-row blocks and past softmax's 64 lanes, widths off the 16 lanes,
        // one head and several; with dropout and without.
        for (batch, time, heads, width) in
            [(1, 1, 1, 1), (2, 5, 2, 3), (3, 9, 3, 17), (2, 70, 2, 16)]
        {
            let (sh, [q, k, v, dy]) = operands(batch, time, heads, width);
            let mask = DropoutMask {
                rate: 0.25,
                seed: 9,
                step: 3,
                key: 2,
                first_sample: 1,
                samples: batch as u32,
            };
            for mask in [None, Some(&mask)] {
                let what = format!("{sh:?} dropout {}", mask.is_some());
                assert_the_compositions_bits([&q, &k, &v, &dy], sh, mask, &what);
            }
        }
    }

    /// The CPU path's weights, output and gradients against the composition's, bit for bit.
    fn assert_the_compositions_bits(
        [q, k, v, dy]: [&Tensor; 4],
        sh: HeadShape,
        mask: Option<&DropoutMask>,
        what: &str,
    ) {
        // The weights are written whole, never zero-filled first: hand them memory that
        // held NaNs (a block just freed, which the allocator gives back).
        drop(std::hint::black_box(vec![f32::NAN; sh.weights_numel()]));
        let (y, weights) = causal_attention(q, k, v, sh.heads, mask).unwrap();
        let (y_ref, weights_ref) = composed::forward(q, k, v, sh, mask).unwrap();
        assert_eq!(bits(&weights), bits(&weights_ref), "weights, {what}");
        assert_eq!(bits(&y), bits(&y_ref), "output, {what}");
        let got = causal_attention_backward(q, k, v, &weights, sh.heads, mask, dy, None).unwrap();
        let want = composed::backward(q, k, v, &weights, sh, mask, dy).unwrap();
        for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            assert_eq!(g.shape(), w.shape());
            assert_eq!(bits(g), bits(w), "{name}, {what}");
        }
        // Through a scale that rounds: the scale's gradient after the composition's.
        let scale = Unary::Affine {
            alpha: 0.37,
            beta: 0.0,
        };
        let [dq, ..] =
            causal_attention_backward(q, k, v, &weights, sh.heads, mask, dy, Some(0.37)).unwrap();
        let want_dq = unary_backward(&want[0], &want[0], scale).unwrap();
        assert_eq!(bits(&dq), bits(&want_dq), "dq through a scale, {what}");
    }

    /// `x` with `value` written at `(entry, position, feature)`.
    fn with(x: &Tensor, (z, i, f): (usize, usize, usize), value: f32) -> Tensor {
        let &[_, t, c] = x.shape() else { panic!() };
        let mut values = x.to_vec().unwrap();
        values[(z * t + i) * c + f] = value;
        Tensor::from_vec(&Device::Cpu, x.shape(), values).unwrap()
    }

    #[test]
    fn heads_of_no_width_still_have_the_compositions_weights() {
        // No output, but a causal softmax of zero scores per head: written whole, never
        // zero-filled first, so hand them memory that held NaNs.
        let (sh, [q, ..]) = operands(2, 21, 3, 0);
        drop(std::hint::black_box(vec![f32::NAN; sh.weights_numel()]));
        let (y, weights) = causal_attention(&q, &q, &q, sh.heads, None).unwrap();
        let (y_ref, weights_ref) = composed::forward(&q, &q, &q, sh, None).unwrap();
        assert_eq!(y.numel(), 0);
        assert_eq!(y.shape(), y_ref.shape());
        assert_eq!(bits(&weights), bits(&weights_ref));
    }

    #[test]
    fn a_row_of_nan_scores_weighs_the_keys_past_its_own_zero() {
        // An early query of NaN: its row's scores, exps and sum are NaN, and the keys past its
        // own still weigh +0, as the composition's causal softmax leaves them. The NaNs' sign
        // bits are not the composition's (they were not before the CPU path wrote a block of
        // 16 rows' weights at once either): compared as one NaN.
        let (sh, [q, k, v, _]) = operands(2, 40, 2, 3);
        let q = with(&q, (0, 2, 1), f32::NAN);
        let (_, weights) = causal_attention(&q, &k, &v, sh.heads, None).unwrap();
        let (_, want) = composed::forward(&q, &k, &v, sh, None).unwrap();
        let one_nan = |x: &Tensor| -> Vec<u32> {
            let values = x.to_vec().unwrap();
            values
                .into_iter()
                .map(|w| if w.is_nan() { f32::NAN } else { w }.to_bits())
                .collect()
        };
        assert_eq!(one_nan(&weights), one_nan(&want));
        // Entry 0, head 0 (features 0..3), row 2.
        let row = &weights.to_vec().unwrap()[2 * sh.time..][..sh.time];
        assert!(row[..3].iter().all(|w| w.is_nan()), "{row:?}");
        assert!(row[3..].iter().all(|w| w.to_bits() == 0), "{row:?}");
    }

    #[test]
    fn masked_terms_count_where_they_would_not_vanish() {
        // The CPU path leaves out the terms under the causal mask only where they are ±0. An
        // infinite or NaN value late in an entry, or gradients whose masked products overflow,
        // reach the earlier rows through those terms in the composition (0 * inf is NaN): the
        // same bits here. Entry 1 is left ordinary, so both ways run in one call.
        let (sh, [q, k, v, dy]) = operands(2, 20, 2, 3);
        let (time, shape) = (sh.time, [sh.batch, sh.time, sh.features()]);
        let last = (0, time - 1, 4);
        let huge = |x: &Tensor| {
            Tensor::from_vec(
                &Device::Cpu,
                &shape,
                x.to_vec().unwrap().iter().map(|v| v * 3e19).collect(),
            )
            .unwrap()
        };
        let cases = [
            (
                "infinite value",
                q.clone(),
                k.clone(),
                with(&v, last, f32::INFINITY),
                dy.clone(),
            ),
            (
                "NaN value",
                q.clone(),
                k.clone(),
                with(&v, last, f32::NAN),
                dy.clone(),
            ),
            (
                "infinite key",
                q.clone(),
                with(&k, last, f32::INFINITY),
                v.clone(),
                dy.clone(),
            ),
            (
                "infinite query",
                with(&q, last, f32::NEG_INFINITY),
                k.clone(),
                v.clone(),
                dy.clone(),
            ),
            (
                "NaN gradient",
                q.clone(),
                k.clone(),
                v.clone(),
                with(&dy, last, f32::NAN),
            ),
            (
                "overflowing gradients",
                q.clone(),
                k.clone(),
                huge(&v),
                huge(&dy),
            ),
        ];
        for (what, q, k, v, dy) in cases {
            assert_the_compositions_bits([&q, &k, &v, &dy], sh, None, what);
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let q = tensor(&[2, 4, 6], 1, 1.0);
        assert!(causal_attention(&q, &q, &q, 4, None).is_err());
        assert!(causal_attention(&q, &q, &q, 0, None).is_err());
        assert!(causal_attention(&q, &tensor(&[2, 4, 3], 2, 1.0), &q, 3, None).is_err());
        assert!(causal_attention(&tensor(&[8, 6], 1, 1.0), &q, &q, 3, None).is_err());
        let (_, weights) = causal_attention(&q, &q, &q, 3, None).unwrap();
        assert!(causal_attention_backward(&q, &q, &q, &weights, 2, None, &q, None).is_err());
        assert!(causal_attention_backward(&q, &q, &q, &q, 3, None, &q, None).is_err());
    }
}
