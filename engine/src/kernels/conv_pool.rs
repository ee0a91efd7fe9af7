//! A convolution and the max pooling that follows it, as one operation: its definition is the
//! composition (`conv::forward`, then `pool::pool` over the convolution's output, and their
//! backward passes), which the GPU runs. The CPU path pools each image's convolution while it
//! is in cache and sums the weight's and bias's gradients from the pooled gradient's winners
//! (`cpu::conv_pool`), with the composition's bits (test).

use super::conv;
use super::conv_geometry::ConvGeometry;
use super::pool::{self, Pool, PoolGeometry};
use super::reduce::sum_to_shape;
use crate::cpu::conv_pool::{parameter_gradients, sums_from_winners};
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// What [`forward`] gives: the pooled output `[n, ph, pw, oc]`, and what the backward pass
/// needs.
pub struct ConvPooled {
    /// The pooled output.
    pub y: Tensor,
    /// What [`backward`] reads.
    pub saved: Saved,
}

/// What [`backward`] needs of the forward pass.
#[derive(Debug, Clone)]
pub struct Saved {
    /// Each pooled value's winner: the flat index of the convolution's output element
    /// (`[n, oh, ow, oc]`) it came from, u32, `y`'s shape.
    pub argmax: Tensor,
    /// The convolution's im2col columns, where its weight's gradient will want them
    /// ([`conv::keeps_columns`]; never on the CPU path, which sums from the winners).
    pub cols: Option<Tensor>,
    /// The pooling's geometry, over the convolution's output.
    pub pool: PoolGeometry,
}

/// `max_pool(conv2d(x, weight, bias), k, k)` for `x [n, h, w, c]` and `weight [kh*kw*c, oc]`:
/// windows of `k x k` every `k` pixels over the convolution's output.
pub fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeometry,
    k: usize,
) -> Result<ConvPooled> {
    let oc = conv::out_channels("conv_max_pool", x, weight, bias, g)?;
    let pool = PoolGeometry::of(&[g.n, g.out_h(), g.out_w(), oc], k, k)?;
    match x.device() {
        Device::Cpu => {
            let (y, argmax) = crate::cpu::conv_pool::forward(
                x.cpu_f32().expect("cpu"),
                weight.cpu_f32().expect("cpu"),
                bias.map(|b| b.cpu_f32().expect("cpu")),
                g,
                &pool,
            );
            let shape = pool.out_shape();
            Ok(ConvPooled {
                y: Tensor::from_vec(x.device(), &shape, y)?,
                saved: Saved {
                    argmax: Tensor::from_u32(x.device(), &shape, argmax)?,
                    cols: None,
                    pool,
                },
            })
        }
        Device::Gpu(_) => composed_forward(x, weight, bias, g, k),
    }
}

/// [`forward`] as its two operations, on whichever device the operands live: the GPU's
/// implementation, and the CPU path's reference.
pub fn composed_forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeometry,
    k: usize,
) -> Result<ConvPooled> {
    let (conv, cols) = conv::forward(x, weight, bias, g)?;
    let oc = conv.shape()[1];
    let conv = conv.reshape(&[g.n, g.out_h(), g.out_w(), oc])?;
    let pool = PoolGeometry::of(conv.shape(), k, k)?;
    let (y, argmax) = pool::pool(&conv, &pool, Pool::Max)?;
    Ok(ConvPooled {
        y,
        saved: Saved {
            argmax: argmax.expect("max pooling has winners"),
            cols,
            pool,
        },
    })
}

/// Which gradients [`backward`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// The input's.
    pub x: bool,
    /// The weight's.
    pub weight: bool,
    /// The bias's.
    pub bias: bool,
}

/// The gradients wanted of `(x, weight, bias)` from the pooled output's gradient `dy`.
/// On the CPU path, when the input's is not wanted and `x` is finite, the weight's and the
/// bias's are summed from the winners; otherwise as the composition computes them.
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    saved: &Saved,
    dy: &Tensor,
    g: &ConvGeometry,
    wanted: Wanted,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    dy.expect_dtype("conv_max_pool backward", DType::F32)?;
    let pool = &saved.pool;
    if dy.shape() != pool.out_shape() {
        return shape_err(
            "conv_max_pool backward",
            format!("dy {:?} does not match {pool:?}", dy.shape()),
        );
    }
    let x_values = x.cpu_f32().filter(|_| !wanted.x && sums_from_winners(pool));
    if let Some(x_values) = x_values.filter(|x| crate::cpu::elementwise::all_finite(x)) {
        let (dw, db) = parameter_gradients(
            x_values,
            saved.argmax.cpu_u32().expect("cpu"),
            dy.cpu_f32().expect("cpu"),
            g,
            pool,
            wanted.bias,
        );
        let oc = pool.c;
        let dw = Tensor::from_vec(x.device(), &[g.patch(), oc], dw)?;
        let db = db
            .map(|db| Tensor::from_vec(x.device(), &[oc], db))
            .transpose()?;
        return Ok((None, wanted.weight.then_some(dw), db));
    }
    composed_backward(x, weight, saved, dy, g, wanted)
}

/// [`backward`] as the composition's backward passes: the pooling's, to the convolution's
/// output, then the convolution's.
pub fn composed_backward(
    x: &Tensor,
    weight: &Tensor,
    saved: &Saved,
    dy: &Tensor,
    g: &ConvGeometry,
    wanted: Wanted,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let pool = &saved.pool;
    let dh = pool::pool_backward(dy, Some(&saved.argmax), pool, Pool::Max)?
        .reshape(&[g.n * g.out_h() * g.out_w(), pool.c])?;
    let dx = wanted
        .x
        .then(|| conv::input_gradient(&dh, weight, g))
        .transpose()?;
    let dw = wanted
        .weight
        .then(|| conv::weight_gradient(x, saved.cols.as_ref(), &dh, g))
        .transpose()?;
    let db = wanted
        .bias
        .then(|| sum_to_shape(&dh, &[pool.c]))
        .transpose()?;
    Ok((dx, dw, db))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn tensor(shape: &[usize], seed: u64, scale: f32) -> Tensor {
        let mut rng = Rng::new(seed, 3);
        let n = shape.iter().product();
        let v = (0..n).map(|_| scale * rng.normal()).collect();
        Tensor::from_vec(&Device::Cpu, shape, v).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        match t.dtype() {
            DType::U32 => t.to_vec_u32().unwrap(),
            _ => t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect(),
        }
    }

    fn all_bits(grads: &(Option<Tensor>, Option<Tensor>, Option<Tensor>)) -> Vec<Option<Vec<u32>>> {
        [&grads.0, &grads.1, &grads.2]
            .iter()
            .map(|t| t.as_ref().map(bits))
            .collect()
    }

    #[test]
    fn the_cpu_path_gives_the_compositions_bits() {
        // (n, h, w, c, kernel, stride, pad, oc, pool k): the CNN's first layer; odd sides
        // that leave a row and a column out of every window; several channels in; a stride
        // and no padding; more pixels than one chunk of the bias's sums (65536); a pooled
        // gradient with zeros (a ReLU's) and exact ties in the convolution (an image of
        // zeros gives each window four equal values).
        for (i, &(n, h, w, c, kernel, stride, pad, oc, k)) in [
            (2, 28, 28, 1, 3, 1, 1, 16, 2),
            (3, 7, 9, 1, 3, 1, 1, 5, 2),
            (2, 8, 6, 3, 3, 1, 1, 17, 2),
            (2, 11, 10, 2, 3, 2, 0, 4, 2),
            (2, 9, 9, 2, 2, 1, 0, 3, 3),
            (90, 28, 28, 1, 3, 1, 1, 16, 2),
        ]
        .iter()
        .enumerate()
        {
            let seed = i as u64 * 10;
            let mut x = tensor(&[n, h, w, c], seed, 1.0);
            if i == 1 {
                x = Tensor::zeros(&Device::Cpu, &[n, h, w, c]).unwrap();
            }
            let g = ConvGeometry::of(x.shape(), kernel, kernel, stride, pad).unwrap();
            let weight = tensor(&[g.patch(), oc], seed + 1, 0.5);
            let bias = tensor(&[oc], seed + 2, 0.5);
            let fused = forward(&x, &weight, Some(&bias), &g, k).unwrap();
            let composed = composed_forward(&x, &weight, Some(&bias), &g, k).unwrap();
            let case = format!("case {i}: {g:?}, pool {k}");
            assert_eq!(bits(&fused.y), bits(&composed.y), "{case}: y");
            assert_eq!(
                bits(&fused.saved.argmax),
                bits(&composed.saved.argmax),
                "{case}: argmax"
            );
            let mut dy = tensor(fused.y.shape(), seed + 3, 1.0).to_vec().unwrap();
            dy.iter_mut().step_by(3).for_each(|v| *v = 0.0);
            let dy = Tensor::from_vec(&Device::Cpu, fused.y.shape(), dy).unwrap();
            let wanted = Wanted {
                x: false,
                weight: true,
                bias: true,
            };
            let got = backward(&x, &weight, &fused.saved, &dy, &g, wanted).unwrap();
            let want = composed_backward(&x, &weight, &composed.saved, &dy, &g, wanted).unwrap();
            assert!(got.1.is_some() && got.2.is_some(), "{case}");
            assert_eq!(all_bits(&got), all_bits(&want), "{case}: gradients");
        }
    }

    #[test]
    fn a_non_finite_input_takes_the_compositions_gradients() {
        // An infinity times a pixel's zero gradient is a NaN in the composition's weight
        // gradient; summing from the winners alone would skip it.
        let mut values = tensor(&[1, 6, 6, 1], 7, 1.0).to_vec().unwrap();
        values[7] = f32::INFINITY;
        let x = Tensor::from_vec(&Device::Cpu, &[1, 6, 6, 1], values).unwrap();
        let g = ConvGeometry::of(x.shape(), 3, 3, 1, 1).unwrap();
        let (weight, bias) = (tensor(&[9, 4], 8, 0.5), tensor(&[4], 9, 0.5));
        let fused = forward(&x, &weight, Some(&bias), &g, 2).unwrap();
        let composed = composed_forward(&x, &weight, Some(&bias), &g, 2).unwrap();
        let dy = tensor(fused.y.shape(), 10, 1.0);
        let wanted = Wanted {
            x: false,
            weight: true,
            bias: true,
        };
        let got = backward(&x, &weight, &fused.saved, &dy, &g, wanted).unwrap();
        let want = composed_backward(&x, &weight, &composed.saved, &dy, &g, wanted).unwrap();
        assert!(want
            .1
            .as_ref()
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .any(|v| v.is_nan()));
        assert_eq!(all_bits(&got), all_bits(&want));
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = tensor(&[1, 6, 6, 1], 1, 1.0);
        let g = ConvGeometry::of(x.shape(), 3, 3, 1, 1).unwrap();
        assert!(forward(&x, &tensor(&[8, 4], 2, 1.0), None, &g, 2).is_err());
        assert!(forward(
            &x,
            &tensor(&[9, 4], 2, 1.0),
            Some(&tensor(&[3], 3, 1.0)),
            &g,
            2
        )
        .is_err());
        assert!(forward(&x, &tensor(&[9, 4], 2, 1.0), None, &g, 7).is_err());
        let fused = forward(&x, &tensor(&[9, 4], 2, 1.0), None, &g, 2).unwrap();
        let wanted = Wanted {
            x: false,
            weight: true,
            bias: false,
        };
        let dy = tensor(&[1, 2, 2, 4], 4, 1.0);
        let weight = tensor(&[9, 4], 2, 1.0);
        assert!(backward(&x, &weight, &fused.saved, &dy, &g, wanted).is_err());
    }
}
