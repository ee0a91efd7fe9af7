//! An image norm and the max pooling that follows it, as one operation: its definition is the
//! composition (`image_norm::image_norm`, then `pool::pool` over its output, and their
//! backward passes), which the GPU runs. The CPU path normalizes and pools each image while
//! it is in cache, and builds the normalized images' gradient from the pooled gradient's
//! winners as it reads it (`cpu::norm_pool`), with the composition's bits (test).

use super::image_norm::{image_norm, image_norm_backward};
use super::pool::{self, Pool, PoolGeometry};
use crate::cpu::norm_pool::windows_apart;
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Tensor};

/// What [`forward`] gives: the pooled output `[n, ph, pw, c]`, and what the backward pass
/// needs.
pub struct NormPooled {
    /// The pooled output.
    pub y: Tensor,
    /// What [`backward`] reads.
    pub saved: Saved,
}

impl NormPooled {
    fn new(y: Tensor, stats: Tensor, argmax: Tensor, pool: PoolGeometry, eps: f32) -> Self {
        let saved = Saved {
            stats,
            argmax,
            pool,
            eps,
        };
        NormPooled { y, saved }
    }
}

/// What [`backward`] needs of the forward pass besides its input and gamma.
#[derive(Debug, Clone)]
pub struct Saved {
    /// Each image's mean and 1/std, `[n, 2]`.
    pub stats: Tensor,
    /// Each pooled value's winner: the flat index of the normalized element (`[n, h, w, c]`)
    /// it came from, u32, the output's shape.
    pub argmax: Tensor,
    /// The pooling's geometry, over the normalized images.
    pub pool: PoolGeometry,
    /// The norm's epsilon (the GPU's backward pass normalizes again).
    pub eps: f32,
}

/// `max_pool(image_norm(x, gamma, beta, eps), k, k)` for NHWC `x`: windows of `k x k` every
/// `k` pixels over the normalized images.
pub fn forward(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    k: usize,
) -> Result<NormPooled> {
    let pool = PoolGeometry::of(x.shape(), k, k)?;
    let channels = [pool.c];
    if let (Some(xv), Some(g), Some(b)) = (x.cpu_f32(), gamma.cpu_f32(), beta.cpu_f32()) {
        if gamma.shape() == channels && beta.shape() == channels && windows_apart(&pool) {
            let (y, argmax, stats) = crate::cpu::norm_pool::forward(xv, g, b, eps, &pool);
            let (d, shape) = (x.device(), pool.out_shape());
            let y = Tensor::from_vec(d, &shape, y)?;
            let stats = Tensor::from_vec(d, &[pool.n, 2], stats)?;
            let argmax = Tensor::from_u32(d, &shape, argmax)?;
            return Ok(NormPooled::new(y, stats, argmax, pool, eps));
        }
    }
    // The GPU, and operands whose shapes or dtypes the composition reports.
    composed_forward(x, gamma, beta, eps, k)
}

/// [`forward`] as its two operations, on whichever device the operands live: the GPU's
/// implementation, and the CPU path's reference.
pub fn composed_forward(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    k: usize,
) -> Result<NormPooled> {
    let normed = image_norm(x, gamma, beta, eps)?;
    let pool = PoolGeometry::of(normed.y.shape(), k, k)?;
    let (y, argmax) = pool::pool(&normed.y, &pool, Pool::Max)?;
    let argmax = argmax.expect("max pooling has winners");
    Ok(NormPooled::new(y, normed.stats, argmax, pool, eps))
}

/// Gradients `(dx, dgamma, dbeta)` of [`forward`] from its input, gamma, what it saved and
/// the pooled output's gradient `dy`.
pub fn backward(
    x: &Tensor,
    gamma: &Tensor,
    saved: &Saved,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    dy.expect_dtype("image_norm_max_pool backward", DType::F32)?;
    let pool = &saved.pool;
    let c = pool.c;
    if dy.shape() != pool.out_shape()
        || x.shape() != [pool.n, pool.h, pool.w, c]
        || gamma.shape() != [c]
        || saved.stats.shape() != [pool.n, 2]
    {
        return shape_err(
            "image_norm_max_pool backward",
            format!(
                "x {:?}, gamma {:?}, dy {:?} and stats {:?} do not match {pool:?}",
                x.shape(),
                gamma.shape(),
                dy.shape(),
                saved.stats.shape()
            ),
        );
    }
    let values = (
        x.cpu_f32(),
        gamma.cpu_f32(),
        saved.stats.cpu_f32(),
        saved.argmax.cpu_u32(),
        dy.cpu_f32(),
    );
    if let (Some(xv), Some(g), Some(stats), Some(argmax), Some(dyv)) = values {
        if windows_apart(pool) {
            let (dx, dgamma, dbeta) =
                crate::cpu::norm_pool::backward(xv, g, stats, argmax, dyv, pool);
            let d = x.device();
            return Ok((
                Tensor::from_vec(d, x.shape(), dx)?,
                Tensor::from_vec(d, &[c], dgamma)?,
                Tensor::from_vec(d, &[c], dbeta)?,
            ));
        }
    }
    composed_backward(x, gamma, saved, dy)
}

/// [`backward`] as the composition's backward passes: the pooling's, to the normalized
/// images, then the image norm's.
pub fn composed_backward(
    x: &Tensor,
    gamma: &Tensor,
    saved: &Saved,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dnormed = pool::pool_backward(dy, Some(&saved.argmax), &saved.pool, Pool::Max)?;
    image_norm_backward(x, gamma, &saved.stats, &dnormed, saved.eps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::tensor::Device;

    fn tensor(shape: &[usize], seed: u64, scale: f32, shift: f32) -> Tensor {
        let mut rng = Rng::new(seed, 5);
        let n = shape.iter().product();
        let v = (0..n).map(|_| shift + scale * rng.normal()).collect();
        Tensor::from_vec(&Device::Cpu, shape, v).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        match t.dtype() {
            DType::U32 => t.to_vec_u32().unwrap(),
            _ => t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect(),
        }
    }

    #[test]
    fn the_cpu_path_gives_the_compositions_bits() {
        // ([n, h, w, c], k): the CNN's [.., 14, 14, 32] by 2; odd sides that leave a row and a
        // column out of every window; windows of 3; channels off a vector's 16; one pixel;
        // more pixels than one chunk of the channels' sums (65536). Image 0 of the third
        // case is constant (every window a tie, the normalized values all 0), and the pooled
        // gradients hold zeros of both signs (a ReLU's), so the pooling's `0 + dy` shows.
        for (i, (shape, k)) in [
            ([2, 14, 14, 32], 2),
            ([3, 7, 9, 5], 2),
            ([2, 9, 8, 17], 3),
            ([1, 1, 1, 1], 1),
            ([1, 300, 250, 1], 2),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = i as u64 * 10;
            let c = shape[3];
            let mut x = tensor(&shape, seed, 2.0, 0.5);
            if i == 2 {
                let mut v = x.to_vec().unwrap();
                v[..9 * 8 * 17].fill(0.25);
                x = Tensor::from_vec(&Device::Cpu, &shape, v).unwrap();
            }
            let gamma = tensor(&[c], seed + 1, 1.0, 1.0);
            let beta = tensor(&[c], seed + 2, 0.5, 0.0);
            let got = forward(&x, &gamma, &beta, 1e-5, k).unwrap();
            let want = composed_forward(&x, &gamma, &beta, 1e-5, k).unwrap();
            assert_eq!(bits(&got.y), bits(&want.y), "{shape:?} y");
            assert_eq!(
                bits(&got.saved.argmax),
                bits(&want.saved.argmax),
                "{shape:?} argmax"
            );
            assert_eq!(
                bits(&got.saved.stats),
                bits(&want.saved.stats),
                "{shape:?} stats"
            );
            let pooled = got.y.shape().to_vec();
            let mut dy = tensor(&pooled, seed + 3, 1.0, 0.0).to_vec().unwrap();
            for (j, v) in dy.iter_mut().enumerate() {
                match j % 5 {
                    1 => *v = 0.0,
                    3 => *v = -0.0,
                    _ => {}
                }
            }
            let dy = Tensor::from_vec(&Device::Cpu, &pooled, dy).unwrap();
            let got = backward(&x, &gamma, &got.saved, &dy).unwrap();
            let want = composed_backward(&x, &gamma, &want.saved, &dy).unwrap();
            for (name, g, w) in [("dx", &got.0, &want.0), ("dgamma", &got.1, &want.1)] {
                assert_eq!(bits(g), bits(w), "{shape:?} {name}");
            }
            assert_eq!(bits(&got.2), bits(&want.2), "{shape:?} dbeta");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = tensor(&[2, 4, 4, 3], 1, 1.0, 0.0);
        let gamma = tensor(&[3], 2, 1.0, 1.0);
        let wrong = tensor(&[4], 3, 1.0, 0.0);
        assert!(forward(&x, &wrong, &gamma, 1e-5, 2).is_err());
        assert!(forward(&x, &gamma, &gamma, 1e-5, 5).is_err());
        assert!(forward(&tensor(&[2, 4, 3], 1, 1.0, 0.0), &gamma, &gamma, 1e-5, 2).is_err());
        let out = forward(&x, &gamma, &gamma, 1e-5, 2).unwrap();
        let dy = tensor(&[2, 2, 2, 4], 4, 1.0, 0.0);
        assert!(backward(&x, &gamma, &out.saved, &dy).is_err());
        let dy = tensor(&[2, 2, 2, 3], 4, 1.0, 0.0);
        assert!(backward(&x, &wrong, &out.saved, &dy).is_err());
        assert!(backward(&x, &gamma, &out.saved, &dy).is_ok());
    }
}
