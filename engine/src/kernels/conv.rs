//! Convolution lowering (conv.wgsl): im2col and its adjoint col2im for NHWC images. A conv2d
//! is `im2col(x) [N, OH, OW, KH*KW*C] x W [KH*KW*C, OC]`, so the heavy lifting is the matmul
//! kernel, and both backward passes come from the matmul's (dW = cols^T dY) and col2im's
//! (dX = col2im(dY W^T)).

use bytemuck::{Pod, Zeroable};
use rayon::prelude::*;

use super::conv_geometry::ConvGeometry;
use super::{grid_1d, CONV};
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    kh: u32,
    kw: u32,
    stride: u32,
    pad: u32,
    oh: u32,
    ow: u32,
    _pad: [u32; 2],
}

/// The kernel's uniform block for geometry `g`.
fn params(g: &ConvGeometry) -> Params {
    Params {
        n: g.n as u32,
        h: g.h as u32,
        w: g.w as u32,
        c: g.c as u32,
        kh: g.kh as u32,
        kw: g.kw as u32,
        stride: g.stride as u32,
        pad: g.pad as u32,
        oh: g.out_h() as u32,
        ow: g.out_w() as u32,
        _pad: [0; 2],
    }
}

/// CPU reference of im2col.
pub fn im2col_ref(x: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let mut cols = vec![0.0f32; g.cols_shape().iter().product()];
    let per_image = g.out_h() * g.out_w() * g.kh * g.kw * g.c;
    if per_image == 0 {
        return cols;
    }
    // One image per task on the CPU path: a copy, so any split gives the same bits.
    cols.par_chunks_mut(per_image)
        .enumerate()
        .for_each(|(n, image)| {
            let mut windows = image.chunks_exact_mut(g.c);
            for oh in 0..g.out_h() {
                for ow in 0..g.out_w() {
                    for kh in 0..g.kh {
                        for kw in 0..g.kw {
                            let dst = windows.next().expect("sized from the geometry");
                            if let Some((ih, iw)) = g.source(oh, ow, kh, kw) {
                                let at = ((n * g.h + ih) * g.w + iw) * g.c;
                                dst.copy_from_slice(&x[at..at + g.c]);
                            }
                        }
                    }
                }
            }
        });
    cols
}

/// CPU reference of col2im, summing in the kernel's order: for each input element, over
/// (kh, kw) ascending.
pub fn col2im_ref(cols: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let (oh_n, ow_n) = (g.out_h(), g.out_w());
    let mut dx = vec![0.0; g.n * g.h * g.w * g.c];
    let per_image = g.h * g.w * g.c;
    if per_image == 0 {
        return dx;
    }
    // One image per task on the CPU path: each sum is over its own image's columns.
    dx.par_chunks_mut(per_image)
        .enumerate()
        .for_each(|(n, image)| {
            for ih in 0..g.h {
                for iw in 0..g.w {
                    for c in 0..g.c {
                        let mut acc = 0.0f32;
                        for kh in 0..g.kh {
                            let Some(yh) = (ih + g.pad).checked_sub(kh) else {
                                continue;
                            };
                            if yh % g.stride != 0 || yh / g.stride >= oh_n {
                                continue;
                            }
                            for kw in 0..g.kw {
                                let Some(yw) = (iw + g.pad).checked_sub(kw) else {
                                    continue;
                                };
                                if yw % g.stride != 0 || yw / g.stride >= ow_n {
                                    continue;
                                }
                                let row = (n * oh_n + yh / g.stride) * ow_n + yw / g.stride;
                                acc += cols[(row * g.kh + kh) * g.kw * g.c + kw * g.c + c];
                            }
                        }
                        image[(ih * g.w + iw) * g.c + c] = acc;
                    }
                }
            }
        });
    dx
}

/// A direct convolution (no lowering) in f64, to check the lowered path against:
/// `x [n, h, w, c]`, `weight [kh*kw*c, oc]` in im2col's (kh, kw, c) order, output
/// `[n, oh, ow, oc]`.
pub fn conv2d_direct_ref(x: &[f32], weight: &[f32], g: &ConvGeometry, oc: usize) -> Vec<f64> {
    let mut y = vec![0.0f64; g.n * g.out_h() * g.out_w() * oc];
    for n in 0..g.n {
        for oh in 0..g.out_h() {
            for ow in 0..g.out_w() {
                let out = ((n * g.out_h() + oh) * g.out_w() + ow) * oc;
                for kh in 0..g.kh {
                    for kw in 0..g.kw {
                        let Some((ih, iw)) = g.source(oh, ow, kh, kw) else {
                            continue;
                        };
                        for c in 0..g.c {
                            let xv = x[((n * g.h + ih) * g.w + iw) * g.c + c] as f64;
                            let wrow = ((kh * g.kw + kw) * g.c + c) * oc;
                            for o in 0..oc {
                                y[out + o] += xv * weight[wrow + o] as f64;
                            }
                        }
                    }
                }
            }
        }
    }
    y
}

/// The im2col matrix of `x [n, h, w, c]`: `[n, oh, ow, kh*kw*c]`.
pub fn im2col(x: &Tensor, g: &ConvGeometry) -> Result<Tensor> {
    x.expect_dtype("im2col", DType::F32)?;
    if x.shape() != [g.n, g.h, g.w, g.c] {
        return shape_err(
            "im2col",
            format!("input {:?} does not match {g:?}", x.shape()),
        );
    }
    let shape = g.cols_shape();
    match x.device() {
        Device::Cpu => {
            let cols = crate::cpu::conv::im2col(x.cpu_f32().expect("cpu"), g);
            Tensor::from_vec(x.device(), &shape, cols)
        }
        Device::Gpu(gpu) => {
            let n: usize = shape.iter().product();
            let out = gpu.alloc(4 * n as u64)?;
            let pipeline = gpu.pipeline(&CONV, "im2col", &[]);
            gpu.launch(
                &pipeline,
                &params(g),
                &[x.gpu_buf().expect("gpu"), &out],
                grid_1d(n),
            );
            Ok(Tensor::from_gpu(gpu, &shape, DType::F32, out))
        }
    }
}

/// The adjoint of [`im2col`]: gradient columns `[n, oh, ow, kh*kw*c]` summed back onto the
/// image `[n, h, w, c]`.
pub fn col2im(cols: &Tensor, g: &ConvGeometry) -> Result<Tensor> {
    cols.expect_dtype("col2im", DType::F32)?;
    if cols.shape() != g.cols_shape() {
        return shape_err(
            "col2im",
            format!("columns {:?} do not match {g:?}", cols.shape()),
        );
    }
    let shape = [g.n, g.h, g.w, g.c];
    match cols.device() {
        Device::Cpu => {
            let dx = crate::cpu::conv::col2im(cols.cpu_f32().expect("cpu"), g);
            Tensor::from_vec(cols.device(), &shape, dx)
        }
        Device::Gpu(gpu) => {
            let n: usize = shape.iter().product();
            let out = gpu.alloc(4 * n as u64)?;
            let pipeline = gpu.pipeline(&CONV, "col2im", &[]);
            gpu.launch(
                &pipeline,
                &params(g),
                &[cols.gpu_buf().expect("gpu"), &out],
                grid_1d(n),
            );
            Ok(Tensor::from_gpu(gpu, &shape, DType::F32, out))
        }
    }
}

/// The gradient of a convolution's input `[n, h, w, c]` from the gradient `dy` of its
/// output as the product gave it (`[n * oh * ow, oc]`) and its weight `[kh*kw*c, oc]`:
/// `col2im(dy weightᵀ)`. The GPU runs those two steps; the CPU path runs them an image at a
/// time with the same values (`cpu::conv::input_gradient`, tested against the two steps).
pub fn input_gradient(dy: &Tensor, weight: &Tensor, g: &ConvGeometry) -> Result<Tensor> {
    dy.expect_dtype("conv input gradient", DType::F32)?;
    weight.expect_dtype("conv input gradient", DType::F32)?;
    dy.same_device("conv input gradient", weight)?;
    let [n, oh, ow, patch] = g.cols_shape();
    let oc = match *weight.shape() {
        [rows, oc] if rows == patch && dy.shape() == [n * oh * ow, oc] => oc,
        _ => {
            return shape_err(
                "conv input gradient",
                format!(
                    "dy {:?} and weight {:?} do not match {g:?}",
                    dy.shape(),
                    weight.shape()
                ),
            )
        }
    };
    match dy.device() {
        Device::Cpu => {
            let (dy_values, w_values) =
                (dy.cpu_f32().expect("cpu"), weight.cpu_f32().expect("cpu"));
            let dx = crate::cpu::conv::input_gradient(dy_values, w_values, oc, g);
            Tensor::from_vec(dy.device(), &[g.n, g.h, g.w, g.c], dx)
        }
        Device::Gpu(_) => input_gradient_composed(dy, weight, g),
    }
}

/// [`input_gradient`] as its two steps, on whichever device the operands live: the GPU's
/// implementation, and the CPU path's reference.
pub fn input_gradient_composed(dy: &Tensor, weight: &Tensor, g: &ConvGeometry) -> Result<Tensor> {
    let cols = super::matmul::matmul(dy, weight, false, true)?;
    col2im(&cols.reshape(&g.cols_shape())?, g)
}

/// A convolution's output `[n * oh * ow, oc]`: `im2col(x) weight + bias`, and the columns
/// when the weight's gradient will want them ([`keeps_columns`]). Where it will not, the CPU
/// path never holds them all: it builds them an image at a time in cache
/// (`cpu::conv::forward`, with the product's and the addition's bits, tested against them).
pub fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeometry,
) -> Result<(Tensor, Option<Tensor>)> {
    let [n, oh, ow, patch] = g.cols_shape();
    if !keeps_columns(x.device(), g) {
        let oc = out_channels("conv2d", x, weight, bias, g)?;
        let y = crate::cpu::conv::forward(
            x.cpu_f32().expect("cpu"),
            weight.cpu_f32().expect("cpu"),
            bias.map(|b| b.cpu_f32().expect("cpu")),
            oc,
            g,
        );
        return Ok((Tensor::from_vec(x.device(), &[n * oh * ow, oc], y)?, None));
    }
    let cols = im2col(x, g)?.reshape(&[n * oh * ow, patch])?;
    let y = super::linear::forward(&cols, weight, bias, None)?.y;
    Ok((y, Some(cols)))
}

/// The output channels of `op`'s convolution, checked: `x [n, h, w, c]` as `g` says,
/// `weight [kh*kw*c, oc]` and `bias [oc]`, f32 on one device.
pub(super) fn out_channels(
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeometry,
) -> Result<usize> {
    x.expect_dtype(op, DType::F32)?;
    weight.expect_dtype(op, DType::F32)?;
    x.same_device(op, weight)?;
    let oc = match *weight.shape() {
        [rows, oc] if rows == g.patch() && x.shape() == [g.n, g.h, g.w, g.c] => oc,
        _ => {
            return shape_err(
                op,
                format!(
                    "x {:?} and weight {:?} do not match {g:?}",
                    x.shape(),
                    weight.shape()
                ),
            )
        }
    };
    if let Some(b) = bias {
        b.expect_dtype(op, DType::F32)?;
        x.same_device(op, b)?;
        if b.shape() != [oc] {
            return shape_err(op, format!("bias {:?} must be [{oc}]", b.shape()));
        }
    }
    Ok(oc)
}

/// Whether a convolution's forward pass keeps its im2col columns for the weight's gradient:
/// on the GPU, and on the CPU path for windows of fewer than [`COLUMNS_BUILT_IN_CACHE_FROM`]
/// columns. Past that the CPU path keeps none and builds them again in cache
/// ([`weight_gradient`]).
pub fn keeps_columns(device: &Device, g: &ConvGeometry) -> bool {
    device.as_gpu().is_some() || g.patch() < COLUMNS_BUILT_IN_CACHE_FROM
}

/// The window size (`kh * kw * c`) from which the CPU path builds a weight gradient's columns
/// in cache rather than keeping them. Building them costs a little per output pixel and the
/// product's work per pixel grows with the window: the CNN's first layer (9 columns, 16
/// channels out) took 4.6-5.1 ms that way against 1.8-1.9 ms with its 3.6 MB of columns kept;
/// its second (144 columns, 32 out) 3.1-3.5 ms against 3.8-4.1, from a cold cache
/// (docs/benchmarks.md). Between the two, unmeasured: 64, a 3 x 3 window over 7 channels.
pub const COLUMNS_BUILT_IN_CACHE_FROM: usize = 64;

/// The gradient of a convolution's weight `[kh*kw*c, oc]` from its input `x [n, h, w, c]`
/// and the gradient `dy` of its output as the product gave it (`[n * oh * ow, oc]`):
/// `im2col(x)ᵀ dy`, from the columns the forward pass kept ([`keeps_columns`]) if it did.
/// Otherwise the CPU path builds them a span at a time in cache, with the product's bits
/// (`cpu::conv::weight_gradient`, tested against it), and the GPU builds them again.
pub fn weight_gradient(
    x: &Tensor,
    cols: Option<&Tensor>,
    dy: &Tensor,
    g: &ConvGeometry,
) -> Result<Tensor> {
    x.expect_dtype("conv weight gradient", DType::F32)?;
    dy.expect_dtype("conv weight gradient", DType::F32)?;
    x.same_device("conv weight gradient", dy)?;
    let [n, oh, ow, patch] = g.cols_shape();
    let oc = match *dy.shape() {
        [rows, oc] if rows == n * oh * ow && x.shape() == [g.n, g.h, g.w, g.c] => oc,
        _ => {
            return shape_err(
                "conv weight gradient",
                format!(
                    "x {:?} and dy {:?} do not match {g:?}",
                    x.shape(),
                    dy.shape()
                ),
            )
        }
    };
    if let Some(cols) = cols {
        return super::matmul::matmul(cols, dy, true, false);
    }
    match x.device() {
        Device::Cpu => {
            let (x_values, dy_values) = (x.cpu_f32().expect("cpu"), dy.cpu_f32().expect("cpu"));
            let dw = crate::cpu::conv::weight_gradient(x_values, dy_values, oc, g);
            Tensor::from_vec(x.device(), &[patch, oc], dw)
        }
        Device::Gpu(_) => {
            let cols = im2col(x, g)?.reshape(&[n * oh * ow, patch])?;
            super::matmul::matmul(&cols, dy, true, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), y> == <x, col2im(y)> for every geometry: the defining property of the
        // backward pass.
        for (h, w, c, k, stride, pad) in [
            (5, 4, 2, 3, 1, 1),
            (7, 7, 1, 3, 2, 0),
            (6, 5, 3, 2, 2, 1),
            (1, 1, 1, 1, 1, 0),
        ] {
            let g = ConvGeometry::of(&[2, h, w, c], k, k, stride, pad).unwrap();
            let x: Vec<f32> = (0..2 * h * w * c)
                .map(|i| ((i * 7 % 11) as f32) - 5.0)
                .collect();
            let y: Vec<f32> = (0..g.cols_shape().iter().product::<usize>())
                .map(|i| ((i * 5 % 13) as f32) - 6.0)
                .collect();
            let lhs: f64 = im2col_ref(&x, &g)
                .iter()
                .zip(&y)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum();
            let rhs: f64 = x
                .iter()
                .zip(col2im_ref(&y, &g))
                .map(|(a, b)| (*a as f64) * (b as f64))
                .sum();
            assert_eq!(lhs, rhs, "{g:?}");
        }
    }

    #[test]
    fn the_cpu_paths_input_gradient_gives_the_two_steps_bits() {
        // Strides, padding, channels off 16 and images whose columns span several 8-row
        // blocks; terms whose sums depend on their order.
        for (n, h, w, c, k, stride, pad, oc) in [
            (1, 1, 1, 1, 1, 1, 0, 1),
            (2, 5, 4, 2, 3, 1, 1, 3),
            (1, 7, 7, 3, 3, 2, 0, 5),
            (2, 6, 5, 17, 2, 2, 1, 4),
            (2, 14, 14, 16, 3, 1, 1, 32),
            // Stride 1 in one pass over the padded gradient (`cpu::transposed_conv`): rows
            // of 8 pixels and fewer, two blocks of channels with a partial one, no padding,
            // and padding of the window less one.
            (2, 6, 11, 17, 3, 1, 1, 5),
            (1, 9, 10, 3, 2, 1, 0, 7),
            (2, 5, 13, 20, 3, 1, 2, 6),
        ] {
            let g = ConvGeometry::of(&[n, h, w, c], k, k, stride, pad).unwrap();
            let rows = g.cols_shape()[..3].iter().product::<usize>();
            let values = |len: usize, seed: usize| -> Vec<f32> {
                (0..len)
                    .map(|i| ((i * 7 + seed) % 11) as f32 - 5.0)
                    .map(|x| x * if x as i32 % 3 == 0 { 1e6 } else { 0.37 })
                    .collect()
            };
            let dy = Tensor::from_vec(&Device::Cpu, &[rows, oc], values(rows * oc, 1)).unwrap();
            let mut weight_values = values(g.patch() * oc, 2);
            // NaN or not, and the bits of every number.
            let bits = |x: Tensor| -> Vec<Option<u32>> {
                let values = x.to_vec().unwrap().into_iter();
                values
                    .map(|v| (!v.is_nan()).then_some(v.to_bits()))
                    .collect()
            };
            for finite in [true, false] {
                if !finite {
                    // An infinite weight makes the padding's terms NaN in one pass: the two
                    // steps leave them out.
                    weight_values[oc / 2] = f32::INFINITY;
                }
                let weight =
                    Tensor::from_vec(&Device::Cpu, &[g.patch(), oc], weight_values.clone())
                        .unwrap();
                assert_eq!(
                    bits(input_gradient(&dy, &weight, &g).unwrap()),
                    bits(input_gradient_composed(&dy, &weight, &g).unwrap()),
                    "{g:?}, {oc} outputs, finite weight {finite}"
                );
            }
        }
        let g = ConvGeometry::of(&[1, 4, 4, 2], 3, 3, 1, 1).unwrap();
        let weight = Tensor::zeros(&Device::Cpu, &[18, 3]).unwrap();
        assert!(
            input_gradient(&Tensor::zeros(&Device::Cpu, &[16, 2]).unwrap(), &weight, &g).is_err()
        );
        assert!(
            input_gradient(&Tensor::zeros(&Device::Cpu, &[15, 3]).unwrap(), &weight, &g).is_err()
        );
    }

    #[test]
    fn geometry_refuses_windows_that_do_not_fit() {
        assert!(ConvGeometry::of(&[1, 2, 2, 1], 3, 3, 1, 0).is_err());
        assert!(ConvGeometry::of(&[1, 2, 2, 1], 3, 3, 0, 1).is_err());
        assert!(ConvGeometry::of(&[2, 2, 1], 1, 1, 1, 0).is_err());
        let g = ConvGeometry::of(&[1, 28, 28, 1], 3, 3, 1, 1).unwrap();
        assert_eq!((g.out_h(), g.out_w(), g.patch()), (28, 28, 9));
        let g = ConvGeometry::of(&[1, 7, 6, 2], 3, 2, 2, 0).unwrap();
        assert_eq!((g.out_h(), g.out_w()), (3, 3));
    }
}
