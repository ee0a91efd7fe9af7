//! Milliseconds per op of the CNN's training step at batch 128, each op timed alone on the
//! default adapter (10 calls after a warm-up): the table in docs/models.md.
//!
//!     cargo run --release --example profile_cnn_ops

use std::time::Instant;

use murmur_engine::kernels::conv::{col2im, im2col};
use murmur_engine::kernels::conv_geometry::ConvGeometry;
use murmur_engine::kernels::pool::{pool, pool_backward, Pool, PoolGeometry};
use murmur_engine::{Device, Result, Tensor};

/// A tensor of arbitrary but fixed values.
fn filled(device: &Device, shape: &[usize]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
        .collect();
    Tensor::from_vec(device, shape, values)
}

fn time(device: &Device, name: &str, mut op: impl FnMut() -> Result<Tensor>) -> Result<()> {
    op()?;
    device.sync()?;
    let calls = 10;
    let start = Instant::now();
    for _ in 0..calls {
        op()?;
    }
    device.sync()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / calls as f64;
    println!("| {name} | {ms:.1} |");
    Ok(())
}

fn main() -> Result<()> {
    let d = Device::gpu()?;
    eprintln!("device: {d}");
    println!("| op | ms |\n|---|---:|");
    // conv1: 28x28x1 -> 16 channels; conv2: 14x14x16 -> 32 channels (3x3, padding 1).
    let x1 = filled(&d, &[128, 28, 28, 1])?;
    let g1 = ConvGeometry::of(x1.shape(), 3, 3, 1, 1)?;
    let cols1 = im2col(&x1, &g1)?.reshape(&[100_352, 9])?;
    let (w1, dy1) = (filled(&d, &[9, 16])?, filled(&d, &[100_352, 16])?);
    time(
        &d,
        "weight gradient of conv1, colsᵀ·dY, [9, 100352]·[100352, 16]",
        || cols1.matmul_t(&dy1, true, false),
    )?;
    let x2 = filled(&d, &[128, 14, 14, 16])?;
    let g2 = ConvGeometry::of(x2.shape(), 3, 3, 1, 1)?;
    let cols2 = im2col(&x2, &g2)?.reshape(&[25_088, 144])?;
    let (w2, dy2) = (filled(&d, &[144, 32])?, filled(&d, &[25_088, 32])?);
    time(
        &d,
        "weight gradient of conv2, colsᵀ·dY, [144, 25088]·[25088, 32]",
        || cols2.matmul_t(&dy2, true, false),
    )?;
    let p = filled(&d, &[128, 28, 28, 16])?;
    let pg = PoolGeometry::of(p.shape(), 2, 2)?;
    let (py, argmax) = pool(&p, &pg, Pool::Max)?;
    time(&d, "max-pool backward, [128, 28, 28, 16]", || {
        pool_backward(&py, argmax.as_ref(), &pg, Pool::Max)
    })?;
    time(&d, "conv2 forward matmul, [25088, 144]·[144, 32]", || {
        cols2.matmul(&w2)
    })?;
    time(&d, "im2col of conv2", || im2col(&x2, &g2))?;
    time(&d, "conv1 forward matmul, [100352, 9]·[9, 16]", || {
        cols1.matmul(&w1)
    })?;
    time(&d, "conv2 input gradient dY·Wᵀ", || {
        dy2.matmul_t(&w2, false, true)
    })?;
    let dcols2 = filled(&d, &[128, 14, 14, 144])?;
    time(&d, "col2im of conv2", || col2im(&dcols2, &g2))?;
    time(&d, "max-pool forward, [128, 28, 28, 16]", || {
        Ok(pool(&p, &pg, Pool::Max)?.0)
    })?;
    Ok(())
}
