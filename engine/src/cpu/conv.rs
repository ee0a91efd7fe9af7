//! Convolution lowering on the CPU path: the values of `im2col_ref` and the sums of
//! `col2im_ref`, in their order, without a bounds decision and a call per window element.
//!
//! im2col copies, for each output pixel and window row, the window's in-bounds run of input
//! pixels at once (`kw * c` floats when none is padding); the references copy one pixel at a
//! time. col2im adds each input pixel's `c` channels side by side (one accumulator per
//! channel, the terms in (kh, kw) order as the reference adds them), where the reference
//! walks the window for each channel on its own and divides by the stride for every term.

use rayon::prelude::*;

use super::elementwise::zeroed_rows;
use super::output::zeroed_par_chunks_with;
use super::padded_image::{PaddedBatch, PaddedImage};
use super::strided_product::{product, Strided};
use super::vector_unit::widest;
use crate::kernels::conv_geometry::{window_reading, ConvGeometry};

/// The window offsets `k` in `0..len` whose input coordinate `o * stride + k - pad` falls
/// inside `0..size`, as a range.
fn inside(o: usize, g: &ConvGeometry, len: usize, size: usize) -> std::ops::Range<usize> {
    let start = o * g.stride;
    let low = g.pad.saturating_sub(start);
    let high = (size + g.pad).saturating_sub(start).min(len);
    low..high.max(low)
}

/// `[n, oh, ow, kh*kw*c]`, as `im2col_ref`: padding reads as 0.
pub fn im2col(x: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let (out_h, out_w, c, patch) = (g.out_h(), g.out_w(), g.c, g.patch());
    // By output rows (an image's row of output pixels), each zero-filled first: padding.
    zeroed_rows(g.n * out_h * out_w * patch, out_w * patch, |r, row| {
        let (n, oh) = (r / out_h, r % out_h);
        let rows_inside = inside(oh, g, g.kh, g.h);
        for (ow, window) in row.chunks_exact_mut(patch).enumerate() {
            let cols_inside = inside(ow, g, g.kw, g.w);
            let run = cols_inside.len() * c;
            if run == 0 {
                continue;
            }
            let iw = ow * g.stride + cols_inside.start - g.pad;
            for kh in rows_inside.clone() {
                let ih = oh * g.stride + kh - g.pad;
                let from = ((n * g.h + ih) * g.w + iw) * c;
                let to = (kh * g.kw + cols_inside.start) * c;
                window[to..][..run].copy_from_slice(&x[from..][..run]);
            }
        }
    })
}

/// `[n, h, w, c]`, as `col2im_ref`: each input element sums, from 0 and in (kh, kw) order,
/// the columns that read it.
pub fn col2im(cols: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let image_cols = g.out_h() * g.out_w() * g.patch();
    let readers = Readers::new(g);
    // By input rows; the accumulators are the output pixel itself.
    zeroed_rows(
        g.n * g.h * g.w * g.c,
        g.w * g.c,
        #[inline(always)]
        |r, row| {
            let (n, ih) = (r / g.h, r % g.h);
            col2im_row(&cols[n * image_cols..][..image_cols], g, &readers, ih, row)
        },
    )
}

/// For each input row and column, where the columns that read it lie in an image's columns
/// (`[oh, ow, kh*kw*c]`), from the windows that read it ([`window_reading`]): a term's
/// columns start at a row's offset plus a column's, and the terms go in (kh, kw) order,
/// rows outermost. Looked up, where col2im divided by the stride twelve times a pixel (3 x 3
/// windows), and then built each term's place from two options a term (a third of the
/// CNN's input gradient, `ig` probe, session 20).
struct Readers {
    /// `[h]`: for input row `ih`, `oh * out_w * patch + kh * kw * c` for each window row
    /// `kh` whose output row `oh` reads it, in `kh` order.
    rows: Vec<Vec<usize>>,
    /// `[w]`: for input column `iw`, `ow * patch + kw * c` likewise.
    columns: Vec<Vec<usize>>,
}

impl Readers {
    fn new(g: &ConvGeometry) -> Self {
        let (out_w, patch) = (g.out_w(), g.patch());
        let terms =
            |size: usize, len: usize, windows: usize, place: &dyn Fn(usize, usize) -> usize| {
                (0..size)
                    .map(|i| {
                        (0..len)
                            .filter_map(|k| {
                                Some(place(window_reading(i + g.pad, k, g.stride, windows)?, k))
                            })
                            .collect()
                    })
                    .collect()
            };
        Readers {
            rows: terms(g.h, g.kh, g.out_h(), &|oh, kh| {
                oh * out_w * patch + kh * g.kw * g.c
            }),
            columns: terms(g.w, g.kw, out_w, &|ow, kw| ow * patch + kw * g.c),
        }
    }
}

/// Channels [`col2im_row`] sums at once: one AVX-512 vector, in an array the compiler keeps
/// in a register across the window's terms.
const CHANNELS: usize = 16;

/// Row `ih` of one image's [`col2im`] from that image's columns `[oh, ow, kh*kw*c]`, into
/// `row` (`w * c` floats). Each pixel's channels sum in registers, a block of [`CHANNELS`]
/// at a time, and are stored once: summed in place, every term waited on the store of the
/// one before (a quarter of a CNN input gradient's time, `perf annotate`, session 17).
#[inline(always)]
fn col2im_row(cols: &[f32], g: &ConvGeometry, readers: &Readers, ih: usize, row: &mut [f32]) {
    let c = g.c;
    let reading_rows = &readers.rows[ih];
    for (iw, pixel) in row.chunks_exact_mut(c).enumerate() {
        let reading_columns = &readers.columns[iw];
        for c0 in (0..c).step_by(CHANNELS) {
            let terms = reading_rows
                .iter()
                .flat_map(|&r| reading_columns.iter().map(move |&col| r + col + c0));
            let lanes = CHANNELS.min(c - c0);
            let mut acc = [0.0f32; CHANNELS];
            // A whole block's loads and store as fixed-size arrays: with the width known only
            // at run time, a loop of single lanes and a `memcpy` call a pixel.
            if lanes == CHANNELS {
                for at in terms {
                    let v: &[f32; CHANNELS] = cols[at..][..CHANNELS].try_into().expect("a block");
                    acc = std::array::from_fn(|l| acc[l] + v[l]);
                }
                let out: &mut [f32; CHANNELS] =
                    (&mut pixel[c0..c0 + CHANNELS]).try_into().expect("a block");
                *out = acc;
            } else {
                for at in terms {
                    for (a, &v) in acc.iter_mut().zip(&cols[at..][..lanes]) {
                        *a += v;
                    }
                }
                pixel[c0..c0 + lanes].copy_from_slice(&acc[..lanes]);
            }
        }
    }
}

/// The gradient of a convolution's input `[n, h, w, c]` from its output's gradient `dy`
/// (`[n * oh * ow, oc]`) and its weight (`[kh*kw*c, oc]`): `col2im(dy weightᵀ)` with the
/// values and sums of the two steps, one image at a time, so that an image's columns (the
/// CNN's second layer: 196 x 144 floats) stay in cache between the product and col2im
/// instead of going through memory for the whole batch.
///
/// A convolution of stride 1 with a finite weight takes one pass over its padded output
/// gradient instead, with the same bits (`cpu::transposed_conv`).
pub fn input_gradient(dy: &[f32], weight: &[f32], oc: usize, g: &ConvGeometry) -> Vec<f32> {
    let (pixels, patch) = (g.out_h() * g.out_w(), g.patch());
    assert!(dy.len() == g.n * pixels * oc && weight.len() == patch * oc);
    if super::transposed_conv::applies(g, weight) {
        return super::transposed_conv::input_gradient(dy, weight, oc, g);
    }
    // weightᵀ, [oc, patch]: the product's right operand, rows of `patch` columns.
    let mut weight_t = vec![0.0f32; oc * patch];
    for (col, w_row) in weight.chunks_exact(oc).enumerate() {
        for (co, &w) in w_row.iter().enumerate() {
            weight_t[co * patch + col] = w;
        }
    }
    let readers = Readers::new(g);
    // An image's input gradient per task, zero-filled for col2im's sums.
    zeroed_par_chunks_with(
        g.n * g.h * g.w * g.c,
        g.h * g.w * g.c,
        || vec![0.0f32; pixels * patch],
        |cols, n, dx_n| {
            // Every column is written: the buffer's earlier contents never show.
            let dy_n = Strided::rows(&dy[n * pixels * oc..][..pixels * oc], 0, oc);
            product(pixels, patch, oc, dy_n, &weight_t, patch, cols, patch);
            widest(
                #[inline(always)]
                || {
                    for (ih, row) in dx_n.chunks_exact_mut(g.w * g.c).enumerate() {
                        col2im_row(cols, g, &readers, ih, row);
                    }
                },
            )
        },
    )
}

/// A convolution's output `[n * oh * ow, oc]` from `x [n, h, w, c]`, `weight [kh*kw*c, oc]`
/// and `bias [oc]`: `im2col(x) weight + bias` with the values and sums of the product and the
/// addition, one image at a time, the product reading im2col's rows where they lie in the
/// image with its padding (`cpu::padded_image`): no columns built at all. Building an
/// image's columns in cache (196 x 144 floats for the CNN's second layer) took a quarter of
/// this function's time on a 2-core AVX-512 EPYC (perf: `im2col_part` and its `memmove`
/// 26% of the samples of a throwaway probe, the product 65%).
pub fn forward(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    oc: usize,
    g: &ConvGeometry,
) -> Vec<f32> {
    if super::planar_conv::applies(g) {
        return super::planar_conv::forward(x, weight, bias, oc, g);
    }
    let (pixels, patch) = (g.out_h() * g.out_w(), g.patch());
    assert!(x.len() == g.n * g.h * g.w * g.c && weight.len() == patch * oc);
    assert!(bias.is_none_or(|b| b.len() == oc));
    // An image's output per task, its padded input in the task's scratch.
    zeroed_par_chunks_with(
        g.n * pixels * oc,
        pixels * oc,
        || PaddedImage::new(g),
        |image, n, y_n| {
            image.load(x, g, n);
            product(pixels, oc, patch, image.columns(g), weight, oc, y_n, oc);
            if let Some(bias) = bias {
                widest(
                    #[inline(always)]
                    || {
                        for row in y_n.chunks_exact_mut(oc) {
                            row.iter_mut().zip(bias).for_each(|(v, &b)| *v += b);
                        }
                    },
                )
            }
        },
    )
}

/// The gradient of a convolution's weight `[kh*kw*c, oc]` from its input `x [n, h, w, c]`
/// and its output's gradient `dy [n * oh * ow, oc]`: `im2col(x)ᵀ dy` with the product's bits,
/// without the im2col matrix in memory. The input is padded once, and each thread takes a
/// share of the weight's rows and sums them over every output pixel in ascending order,
/// reading each pixel's columns from its window in the padded input
/// ([`gemm::tall_gathered`](super::gemm::tall_gathered)).
///
/// The CNN's second layer kept 14 MB of columns from its forward pass to its backward, and the
/// product read them back at a third of its rate on columns in cache (5.7 ms a step against
/// 1.8 ms alone); its input is 1.6 MB. Building 256 pixels' columns at a time in cache
/// instead cost 1.03 ms against 0.60 for the product alone on a 2-core AVX-512 EPYC
/// (`convparts` probe, session 20). For few columns a pixel the convolution keeps its
/// columns instead: `kernels::conv::keeps_columns` decides.
pub fn weight_gradient(x: &[f32], dy: &[f32], oc: usize, g: &ConvGeometry) -> Vec<f32> {
    let (pixels, patch) = (g.n * g.out_h() * g.out_w(), g.patch());
    assert!(x.len() == g.n * g.h * g.w * g.c && dy.len() == pixels * oc);
    let mut dw = vec![0.0f32; patch * oc];
    if dw.is_empty() {
        return dw;
    }
    let padded = PaddedBatch::new(x, g);
    let columns = padded.columns();
    let tasks = rayon::current_num_threads().min(patch).max(1);
    let rows_per_task = patch.div_ceil(tasks);
    dw.par_chunks_mut(rows_per_task * oc)
        .enumerate()
        .for_each(|(t, dw_rows)| {
            let rows = t * rows_per_task..t * rows_per_task + dw_rows.len() / oc;
            super::gemm::tall_gathered(&columns, dy, oc, rows, dw_rows);
        });
    dw
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::{col2im_ref, im2col_ref};

    #[test]
    fn lowering_and_its_adjoint_are_the_references() {
        for (n, h, w, c, kh, kw, stride, pad) in [
            (2, 5, 4, 2, 3, 3, 1, 1),
            (1, 7, 7, 1, 3, 3, 2, 0),
            (3, 6, 5, 3, 2, 2, 2, 1),
            (1, 1, 1, 1, 1, 1, 1, 0),
            (2, 9, 8, 16, 3, 3, 1, 1),
            (1, 6, 7, 5, 5, 2, 3, 2),
            (2, 4, 4, 3, 3, 3, 1, 2),
            (1, 28, 28, 1, 3, 3, 1, 1),
            // A whole block of 16 channels and part of another.
            (2, 5, 6, 21, 3, 3, 1, 1),
        ] {
            let g = ConvGeometry::of(&[n, h, w, c], kh, kw, stride, pad).unwrap();
            let x: Vec<f32> = (0..n * h * w * c)
                .map(|i| ((i * 7 % 11) as f32) - 5.3)
                .collect();
            let got = im2col(&x, &g);
            let want = im2col_ref(&x, &g);
            assert_eq!(got, want, "im2col {g:?}");
            // Column values whose sums depend on their order.
            let y: Vec<f32> = (0..want.len())
                .map(|i| ((i * 5 % 13) as f32 - 6.0) * if i % 3 == 0 { 1e7 } else { 0.37 })
                .collect();
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(
                bits(col2im(&y, &g)),
                bits(col2im_ref(&y, &g)),
                "col2im {g:?}"
            );
        }
    }

    /// Geometries over and under a span of pixels, with windows split unevenly between
    /// threads, padding and strides, each with an input and a second operand (a weight or an
    /// output gradient, `rows` rows of `oc`) whose sums depend on their order.
    fn order_sensitive_cases(
        rows: impl Fn(&ConvGeometry) -> usize,
    ) -> Vec<(ConvGeometry, usize, Vec<f32>, Vec<f32>)> {
        [
            (2, 14, 14, 16, 3, 3, 1, 1, 32),
            (3, 11, 9, 5, 3, 3, 2, 1, 7),
            (1, 28, 28, 1, 3, 3, 1, 1, 16),
            (2, 5, 4, 2, 3, 3, 1, 1, 3),
            (1, 6, 7, 5, 5, 2, 3, 2, 40),
            (1, 1, 1, 1, 1, 1, 1, 0, 1),
            (4, 9, 8, 3, 2, 2, 2, 0, 17),
            // Stride 1 with three blocks of outputs, the last partial, and rows of 13 pixels.
            (2, 7, 13, 5, 3, 3, 1, 1, 40),
        ]
        .into_iter()
        .map(|(n, h, w, c, kh, kw, stride, pad, oc)| {
            let g = ConvGeometry::of(&[n, h, w, c], kh, kw, stride, pad).unwrap();
            let x = (0..n * h * w * c)
                .map(|i| ((i * 7 % 11) as f32 - 5.3) * if i % 5 == 0 { 1e6 } else { 0.71 })
                .collect();
            let other = (0..rows(&g) * oc)
                .map(|i| ((i * 5 % 13) as f32 - 6.0) * if i % 3 == 0 { 1e-3 } else { 0.37 })
                .collect();
            (g, oc, x, other)
        })
        .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn the_forward_pass_gives_the_product_and_additions_bits_an_image_at_a_time() {
        use crate::cpu::gemm;
        use crate::kernels::matmul_dims::MatmulDims;
        for (g, oc, x, weight) in order_sensitive_cases(|g| g.patch()) {
            let bias: Vec<f32> = (0..oc).map(|i| i as f32 * 0.3 - 2.0).collect();
            let pixels = g.n * g.out_h() * g.out_w();
            let dims = MatmulDims::infer(&[pixels, g.patch()], &[g.patch(), oc], false, false)
                .unwrap()
                .0;
            let product = gemm::matmul(&im2col(&x, &g), &weight, &dims);
            let with_bias: Vec<f32> = product
                .chunks(oc)
                .flat_map(|row| row.iter().zip(&bias).map(|(v, b)| v + b))
                .collect();
            assert_eq!(
                bits(&forward(&x, &weight, None, oc, &g)),
                bits(&product),
                "{g:?}, {oc} channels out"
            );
            assert_eq!(
                bits(&forward(&x, &weight, Some(&bias), oc, &g)),
                bits(&with_bias),
                "{g:?}, {oc} channels out, with a bias"
            );
        }
    }

    #[test]
    fn the_weight_gradient_gives_the_products_bits_without_the_columns() {
        use crate::cpu::gemm;
        use crate::kernels::matmul_dims::MatmulDims;
        for (g, oc, x, dy) in order_sensitive_cases(|g| g.n * g.out_h() * g.out_w()) {
            let pixels = g.n * g.out_h() * g.out_w();
            let dims = MatmulDims::infer(&[pixels, g.patch()], &[pixels, oc], true, false)
                .unwrap()
                .0;
            let want = gemm::matmul(&im2col(&x, &g), &dy, &dims);
            assert_eq!(
                bits(&weight_gradient(&x, &dy, oc, &g)),
                bits(&want),
                "{g:?}, {oc} channels out"
            );
            // Each micro-kernel, on shares of rows whose blocks lie side by side in the
            // padded input (16 channels: window rows of 48) or cross window rows (the plain
            // loop's), from C holding other values.
            let padded = PaddedBatch::new(&x, &g);
            let patch = g.patch();
            for isa in gemm::Isa::available() {
                for split in [patch, patch / 2, 7.min(patch)] {
                    for rows in [0..split, split..patch] {
                        let mut got = vec![f32::NAN; rows.len() * oc];
                        gemm::tall_gathered_on(
                            isa,
                            &padded.columns(),
                            &dy,
                            oc,
                            rows.clone(),
                            &mut got,
                        );
                        let want = &want[rows.start * oc..rows.end * oc];
                        assert_eq!(bits(&got), bits(want), "{isa} on {g:?}, rows {rows:?}");
                    }
                }
            }
        }
    }
}
