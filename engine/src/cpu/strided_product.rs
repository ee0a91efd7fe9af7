//! Small products whose operands are read where they lie, with strides: one attention head's
//! `time x time` weights times its values, its scores' gradient times its keys, and the
//! transposed forms, a few thousand multiply-adds each, for which `cpu::gemm`'s packing and
//! hand-off to threads would cost more than the arithmetic.
//!
//! Each element is a sum from 0 over ascending steps, a separately rounded multiply and add
//! per term: what every product of the CPU path and its reference computes, so the bits are
//! those of `cpu::gemm`. The AVX-512 block is written in intrinsics because the compiler
//! keeps the unfused portable block's accumulators on the stack (seen in the disassembly of a
//! throwaway probe; `cpu::gemm` notes the same of its micro-kernel).

/// The left operand: row `r`'s term `s` is `values[first + r * row_stride + s * step]` (a
/// matrix stored row-major has `step` 1, its transpose `row_stride` 1).
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a> {
    /// The values the rows are read from.
    pub values: &'a [f32],
    /// Where row 0's term 0 lies.
    pub first: usize,
    /// From one row's term to the next row's.
    pub row_stride: usize,
    /// From one term of a row to its next.
    pub step: usize,
}

impl<'a> Strided<'a> {
    /// A row-major matrix whose row `r` starts at `first + r * row_stride`.
    pub fn rows(values: &'a [f32], first: usize, row_stride: usize) -> Self {
        Strided {
            values,
            first,
            row_stride,
            step: 1,
        }
    }

    /// The transpose of a row-major matrix of `columns` columns from `first`.
    pub fn columns(values: &'a [f32], first: usize, columns: usize) -> Self {
        Strided {
            values,
            first,
            row_stride: 1,
            step: columns,
        }
    }

    #[inline(always)]
    fn at(&self, r: usize, s: usize) -> usize {
        self.first + r * self.row_stride + s * self.step
    }
}

/// Rows of a block held in registers at once: eight independent sums hide the add's latency.
const BLOCK_ROWS: usize = 8;
/// Lanes of a block: one AVX-512 vector.
const BLOCK_LANES: usize = 16;

/// `out[r * out_stride + x] = sum over s < steps of a(r, s) * b[s * b_stride + x]` for
/// `r < rows` and `x < width`. Panics when an operand is too short for the shape.
#[allow(clippy::too_many_arguments)]
pub fn product(
    rows: usize,
    width: usize,
    steps: usize,
    a: Strided,
    b: &[f32],
    b_stride: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    if rows == 0 || width == 0 {
        return;
    }
    assert!(
        (rows - 1) * out_stride + width <= out.len(),
        "output too short"
    );
    if steps == 0 {
        for r in 0..rows {
            out[r * out_stride..][..width].fill(0.0);
        }
        return;
    }
    assert!(
        a.at(rows - 1, steps - 1) < a.values.len(),
        "left operand too short"
    );
    assert!(
        (steps - 1) * b_stride + width <= b.len(),
        "right operand too short"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: this CPU has AVX-512F, and the asserts above bound every read and write.
        unsafe { x86::product(rows, width, steps, a, b, b_stride, out, out_stride) };
        return;
    }
    portable(rows, width, steps, a, b, b_stride, out, out_stride);
}

/// [`product`] in plain Rust, for CPUs without AVX-512 (and to test the other against).
#[allow(clippy::too_many_arguments)]
fn portable(
    rows: usize,
    width: usize,
    steps: usize,
    a: Strided,
    b: &[f32],
    b_stride: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    for r0 in (0..rows).step_by(BLOCK_ROWS) {
        let live = BLOCK_ROWS.min(rows - r0);
        for x0 in (0..width).step_by(BLOCK_LANES) {
            let lanes = BLOCK_LANES.min(width - x0);
            let mut acc = [[0.0f32; BLOCK_LANES]; BLOCK_ROWS];
            for s in 0..steps {
                let b_row = &b[s * b_stride + x0..][..lanes];
                for (i, acc_i) in acc.iter_mut().enumerate().take(live) {
                    let av = a.values[a.at(r0 + i, s)];
                    for (o, &bx) in acc_i.iter_mut().zip(b_row) {
                        *o += av * bx;
                    }
                }
            }
            for (i, acc_i) in acc.iter().enumerate().take(live) {
                out[(r0 + i) * out_stride + x0..][..lanes].copy_from_slice(&acc_i[..lanes]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Strided, BLOCK_LANES, BLOCK_ROWS};

    /// # Safety
    /// The CPU must have AVX-512F, and the operands must hold the shape (as `product`
    /// asserts).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn product(
        rows: usize,
        width: usize,
        steps: usize,
        a: Strided,
        b: &[f32],
        b_stride: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        for r0 in (0..rows).step_by(BLOCK_ROWS) {
            let live = BLOCK_ROWS.min(rows - r0);
            // Rows past the block's last repeat it; their sums are not stored.
            let starts: [usize; BLOCK_ROWS] =
                std::array::from_fn(|i| a.at(r0 + i.min(live - 1), 0));
            for x0 in (0..width).step_by(BLOCK_LANES) {
                let lanes = BLOCK_LANES.min(width - x0);
                let mask = ((1u32 << lanes) - 1) as __mmask16;
                let mut acc = [_mm512_setzero_ps(); BLOCK_ROWS];
                for s in 0..steps {
                    // SAFETY (both reads): `product` asserted that B's row `s` holds `width`
                    // floats from `s * b_stride` and that A's last row and step are inside.
                    let bv =
                        unsafe { _mm512_maskz_loadu_ps(mask, b.as_ptr().add(s * b_stride + x0)) };
                    for (acc_i, &start) in acc.iter_mut().zip(&starts) {
                        let av =
                            _mm512_set1_ps(unsafe { *a.values.get_unchecked(start + s * a.step) });
                        *acc_i = _mm512_add_ps(*acc_i, _mm512_mul_ps(av, bv));
                    }
                }
                for (i, acc_i) in acc.iter().enumerate().take(live) {
                    // SAFETY: `product` asserted that output row `r0 + i` holds `width` floats.
                    unsafe {
                        let to = out.as_mut_ptr().add((r0 + i) * out_stride + x0);
                        _mm512_mask_storeu_ps(to, mask, *acc_i);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_sums_in_ascending_order_on_every_unit() {
        // Rows and widths off the 8 x 16 block, transposed A, strided B and output, and
        // terms whose sum depends on the order.
        for (rows, steps, width, transposed) in [
            (1, 1, 1, false),
            (7, 3, 15, true),
            (9, 17, 16, false),
            (20, 5, 33, true),
            (8, 64, 64, false),
            (3, 0, 5, false),
        ] {
            let values: Vec<f32> = (0..rows * steps + 3)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) * if i % 4 == 0 { 1e7 } else { 0.31 })
                .collect();
            let a = if transposed {
                Strided {
                    values: &values,
                    first: 3,
                    row_stride: 1,
                    step: rows,
                }
            } else {
                Strided {
                    values: &values,
                    first: 3,
                    row_stride: steps,
                    step: 1,
                }
            };
            let (b_stride, out_stride) = (width + 2, width + 5);
            let b: Vec<f32> = (0..steps * b_stride)
                .map(|i| (i * 5 % 13) as f32 * 0.17 - 1.0)
                .collect();
            let mut want = vec![f32::NAN; rows * out_stride];
            for r in 0..rows {
                for x in 0..width {
                    let mut acc = 0.0f32;
                    for s in 0..steps {
                        acc += values[a.at(r, s)] * b[s * b_stride + x];
                    }
                    want[r * out_stride + x] = acc;
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut got = vec![f32::NAN; rows * out_stride];
            product(rows, width, steps, a, &b, b_stride, &mut got, out_stride);
            let shape = format!("{rows}x{steps}x{width}, transposed {transposed}");
            assert_eq!(bits(&got), bits(&want), "{shape}");
            let mut got = vec![f32::NAN; rows * out_stride];
            if steps > 0 {
                portable(rows, width, steps, a, &b, b_stride, &mut got, out_stride);
                assert_eq!(bits(&got), bits(&want), "portable, {shape}");
            }
        }
    }
}
