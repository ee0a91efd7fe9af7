//! Image normalization: each NHWC image normalized over all its pixels and channels, then
//! scaled and shifted per channel (GroupNorm with one group), as one operation.
//!
//! Its definition is a composition of existing kernels: a layer norm over each flattened
//! image with a gamma of ones and a beta of zeros, then a product with the channels' gamma
//! and a sum with their beta, both broadcast. The GPU runs that composition. The CPU path
//! scales and shifts in the layer norm's last pass over the row, and its gradient skips the
//! layer norm's gamma and beta sums that the composition computed and threw away; the same
//! bits (test).

use super::binary::{binary, Binary};
use super::layernorm::{layernorm, layernorm_backward};
use super::reduce::sum_to_shape;
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// What [`image_norm`] gives: the output, and what its gradient needs besides the input.
pub struct ImageNorm {
    /// Each image normalized, times its channels' gamma, plus their beta: `[n, h, w, c]`.
    pub y: Tensor,
    /// Each image's mean and 1/std, `[n, 2]`.
    pub stats: Tensor,
}

/// `(n, h * w * c, c)`, checked: NHWC `x` and `[c]` gamma and beta on one device.
fn dims(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<(usize, usize, usize)> {
    let &[n, h, w, c] = x.shape() else {
        return shape_err(
            "image_norm",
            format!("needs NHWC input, shape is {:?}", x.shape()),
        );
    };
    for (name, t) in [("gamma", gamma), ("beta", beta)] {
        t.expect_dtype("image_norm", DType::F32)?;
        x.same_device("image_norm", t)?;
        if t.shape() != [c] {
            return shape_err(
                "image_norm",
                format!("{name} {:?} must be [{c}] for {:?}", t.shape(), x.shape()),
            );
        }
    }
    x.expect_dtype("image_norm", DType::F32)?;
    Ok((n, h * w * c, c))
}

/// Normalizes each image of `x [n, h, w, c]` over its `h * w * c` values, then scales and
/// shifts channel `c` by `gamma[c]` and `beta[c]`.
pub fn image_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<ImageNorm> {
    let (n, cols, _) = dims(x, gamma, beta)?;
    match x.device() {
        Device::Cpu => {
            let (y, stats) = crate::cpu::layernorm::image_forward(
                x.cpu_f32().expect("cpu"),
                gamma.cpu_f32().expect("cpu"),
                beta.cpu_f32().expect("cpu"),
                cols,
                eps,
            );
            let d = x.device();
            Ok(ImageNorm {
                y: Tensor::from_vec(d, x.shape(), y)?,
                stats: Tensor::from_vec(d, &[n, 2], stats)?,
            })
        }
        Device::Gpu(_) => composed::forward(x, gamma, beta, eps),
    }
}

/// Gradients `(dx, dgamma, dbeta)` of [`image_norm`] from its input, gamma, the `stats` it
/// gave, `dy`, and the forward pass's `eps`: the rules of the composition, in its order. The
/// normalized images that dgamma's sums need are recomputed with the forward pass's bits: on
/// the CPU from `x` and `stats` as the sums read them, on a GPU by the layer norm kernel
/// again (hence `eps`).
pub fn image_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    stats: &Tensor,
    dy: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    // The backward pass has no beta: gamma is checked in both places.
    let (n, cols, _) = dims(x, gamma, gamma)?;
    if dy.shape() != x.shape() || stats.shape() != [n, 2] {
        return shape_err(
            "image_norm_backward",
            format!(
                "x {:?}, dy {:?}, stats {:?}",
                x.shape(),
                dy.shape(),
                stats.shape()
            ),
        );
    }
    if let Device::Cpu = x.device() {
        use crate::cpu::layernorm::{image_channel_sums, image_input_gradient, DenseGradients};
        let (x_values, stats) = (x.cpu_f32().expect("cpu"), stats.cpu_f32().expect("cpu"));
        let (gamma_values, channels) = (gamma.cpu_f32().expect("cpu"), gamma.numel());
        let gradients = DenseGradients {
            dy: dy.cpu_f32().expect("cpu"),
            channels,
        };
        let (dgamma, dbeta) = image_channel_sums(x_values, stats, channels, cols, &gradients);
        let dx = image_input_gradient(x_values, gamma_values, stats, cols, &gradients);
        let on = |v| Tensor::from_vec(x.device(), gamma.shape(), v);
        return Ok((
            Tensor::from_vec(x.device(), x.shape(), dx)?,
            on(dgamma)?,
            on(dbeta)?,
        ));
    }
    let (dgamma, dbeta) = composed::channel_sums(dy, &composed::normed(x, eps)?, gamma)?;
    let dx = composed::input_gradient(x, gamma, stats, dy)?;
    Ok((dx, dgamma, dbeta))
}

/// The definition: the composition of kernels the GPU runs.
mod composed {
    use super::*;

    /// `(dgamma, dbeta)`: the sums of `dy * normed` and of `dy` down to gamma's shape.
    pub(super) fn channel_sums(
        dy: &Tensor,
        normed: &Tensor,
        gamma: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let dgamma = sum_to_shape(&binary(dy, normed, Binary::Mul)?, gamma.shape())?;
        Ok((dgamma, sum_to_shape(dy, gamma.shape())?))
    }

    /// `x`'s images as rows `[n, h * w * c]`, and the layer norm's gamma of ones and beta of
    /// zeros for them.
    fn rows(x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (n, cols) = (x.shape()[0], x.shape()[1..].iter().product());
        let d = x.device();
        Ok((
            x.reshape(&[n, cols])?,
            Tensor::full(d, &[cols], 1.0)?,
            Tensor::zeros(d, &[cols])?,
        ))
    }

    pub(super) fn forward(
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<ImageNorm> {
        let (flat, ones, zeros) = rows(x)?;
        let (normed, stats) = layernorm(&flat, &ones, &zeros, eps)?;
        let normed = normed.reshape(x.shape())?;
        let y = binary(&binary(&normed, gamma, Binary::Mul)?, beta, Binary::Add)?;
        Ok(ImageNorm { y, stats })
    }

    /// The layer norm's output in [`forward`] again, by the same kernel on the same input:
    /// the same bits.
    pub(super) fn normed(x: &Tensor, eps: f32) -> Result<Tensor> {
        let (flat, ones, zeros) = rows(x)?;
        layernorm(&flat, &ones, &zeros, eps)?.0.reshape(x.shape())
    }

    pub(super) fn input_gradient(
        x: &Tensor,
        gamma: &Tensor,
        stats: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let (flat, ones, _) = rows(x)?;
        let dnormed = binary(dy, gamma, Binary::Mul)?.reshape(flat.shape())?;
        layernorm_backward(&flat, &ones, stats, &dnormed, None)?
            .0
            .reshape(x.shape())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn tensor(shape: &[usize], seed: u64, scale: f32, shift: f32) -> Tensor {
        let mut rng = Rng::new(seed, 2);
        let n = shape.iter().product();
        let v = (0..n).map(|_| shift + scale * rng.normal()).collect();
        Tensor::from_vec(&Device::Cpu, shape, v).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn the_cpu_path_gives_the_compositions_bits() {
        // One pixel of one channel, odd sizes, rows past the 64 lanes of a row's sums, and
        // the CNN's [.., 14, 14, 32], and more pixels than one chunk of the channels' sums
        // (65536); values off zero mean.
        let shapes = [
            [1, 1, 1, 1],
            [2, 3, 5, 3],
            [3, 7, 6, 5],
            [2, 14, 14, 32],
            [1, 300, 250, 1],
        ];
        for (seed, shape) in shapes.into_iter().enumerate() {
            let seed = seed as u64;
            let c = shape[3];
            let x = tensor(&shape, seed, 2.0, 0.5);
            let gamma = tensor(&[c], seed + 1, 1.0, 1.0);
            let beta = tensor(&[c], seed + 2, 0.5, 0.0);
            let dy = tensor(&shape, seed + 3, 1.0, 0.0);
            let got = image_norm(&x, &gamma, &beta, 1e-5).unwrap();
            let want = composed::forward(&x, &gamma, &beta, 1e-5).unwrap();
            assert_eq!(bits(&got.y), bits(&want.y), "{shape:?} y");
            assert_eq!(bits(&got.stats), bits(&want.stats), "{shape:?} stats");
            let (dx, dgamma, dbeta) =
                image_norm_backward(&x, &gamma, &got.stats, &dy, 1e-5).unwrap();
            let want_dx = composed::input_gradient(&x, &gamma, &want.stats, &dy).unwrap();
            assert_eq!(bits(&dx), bits(&want_dx), "{shape:?} dx");
            let want_normed = composed::normed(&x, 1e-5).unwrap();
            let (want_dgamma, want_dbeta) =
                composed::channel_sums(&dy, &want_normed, &gamma).unwrap();
            assert_eq!(bits(&dgamma), bits(&want_dgamma), "{shape:?} dgamma");
            assert_eq!(bits(&dbeta), bits(&want_dbeta), "{shape:?} dbeta");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = tensor(&[2, 3, 3, 4], 1, 1.0, 0.0);
        let c = tensor(&[4], 2, 1.0, 0.0);
        assert!(image_norm(&x, &tensor(&[3], 3, 1.0, 0.0), &c, 1e-5).is_err());
        assert!(image_norm(&tensor(&[2, 36], 4, 1.0, 0.0), &c, &c, 1e-5).is_err());
        let out = image_norm(&x, &c, &c, 1e-5).unwrap();
        let short = tensor(&[2, 3, 3, 3], 5, 1.0, 0.0);
        assert!(image_norm_backward(&x, &c, &out.stats, &short, 1e-5).is_err());
        assert!(image_norm_backward(&x, &c, &x, &x, 1e-5).is_err());
    }
}
