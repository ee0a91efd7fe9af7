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

use std::ops::Range;

/// The left operand: row `r`'s term `s` is `values[first + r * row_stride + s * step]` (a
/// matrix stored row-major has `step` 1, its transpose `row_stride` 1), or, folded into
/// lines of rows and segments of steps, `values[first + (r / line) * line_stride + (r %
/// line) * row_stride + (s / segment) * segment_stride + (s % segment) * step]`: a
/// convolution's im2col rows read from a padded image where they lie (`cpu::conv`), an
/// output row of pixels a line and a window row a segment.
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a> {
    /// The values the rows are read from.
    pub values: &'a [f32],
    /// Where row 0's term 0 lies.
    pub first: usize,
    /// From one row's term to the next row's, within a line.
    pub row_stride: usize,
    /// From one term of a row to its next, within a segment.
    pub step: usize,
    /// Rows per line (`usize::MAX`: one line).
    line: usize,
    /// From one line's first row to the next line's.
    line_stride: usize,
    /// Steps per segment (`usize::MAX`: one segment).
    segment: usize,
    /// From one segment's first step to the next segment's.
    segment_stride: usize,
}

impl<'a> Strided<'a> {
    /// A row-major matrix whose row `r` starts at `first + r * row_stride`.
    pub fn rows(values: &'a [f32], first: usize, row_stride: usize) -> Self {
        Strided::new(values, first, row_stride, 1)
    }

    /// The transpose of a row-major matrix of `columns` columns from `first`.
    pub fn columns(values: &'a [f32], first: usize, columns: usize) -> Self {
        Strided::new(values, first, 1, columns)
    }

    /// Row `r`'s term `s` at `values[first + r * row_stride + s * step]`.
    pub fn new(values: &'a [f32], first: usize, row_stride: usize, step: usize) -> Self {
        Strided {
            values,
            first,
            row_stride,
            step,
            line: usize::MAX,
            line_stride: 0,
            segment: usize::MAX,
            segment_stride: 0,
        }
    }

    /// The rows in lines of `line`, each `line_stride` on from the last. Panics unless a
    /// line starts past the one before ends (`line * row_stride <= line_stride`), which
    /// keeps the last row's last term the furthest value read.
    pub fn in_lines(self, line: usize, line_stride: usize) -> Self {
        assert!(line > 0 && line.saturating_mul(self.row_stride) <= line_stride);
        Strided {
            line,
            line_stride,
            ..self
        }
    }

    /// The steps in segments of `segment`, each `segment_stride` on from the last; panics
    /// unless `segment * step <= segment_stride` (as for [`Strided::in_lines`]).
    pub fn in_segments(self, segment: usize, segment_stride: usize) -> Self {
        assert!(segment > 0 && segment.saturating_mul(self.step) <= segment_stride);
        Strided {
            segment,
            segment_stride,
            ..self
        }
    }

    #[inline(always)]
    fn at(&self, r: usize, s: usize) -> usize {
        self.first + self.row_offset(r) + self.step_offset(s)
    }

    /// Where row `r` starts, from `first`.
    #[inline(always)]
    fn row_offset(&self, r: usize) -> usize {
        folded(r, self.row_stride, self.line, self.line_stride)
    }

    /// Where a row's term `s` lies, from the row's start.
    #[inline(always)]
    fn step_offset(&self, s: usize) -> usize {
        folded(s, self.step, self.segment, self.segment_stride)
    }

    /// The end of the steps from `s` on, to `end`, that lie `step` apart: the end of `s`'s
    /// segment, or `end` if that comes first.
    #[inline(always)]
    fn run_from(&self, s: usize, end: usize) -> usize {
        if self.segment == usize::MAX {
            end
        } else {
            end.min((s / self.segment + 1) * self.segment)
        }
    }
}

/// Where item `i` lies when items are `stride` apart in groups of `per`, each group
/// `group_stride` on from the last (`per` `usize::MAX`: one group): rows in lines, steps in
/// segments.
#[inline(always)]
fn folded(i: usize, stride: usize, per: usize, group_stride: usize) -> usize {
    if per == usize::MAX {
        i * stride
    } else {
        i / per * group_stride + i % per * stride
    }
}

/// Which terms of each row a product sums, for the products of causal attention, whose
/// operands are square in the time axis (row `r` and step or column `r` are one position).
/// A band leaves terms out, and is the full product only where those terms are ±0: every sum
/// starts from +0, and a ±0 term never changes a sum from +0 (`cpu::attention` says when the
/// terms are ±0). Blocks of rows are computed whole, so a row may sum more than its band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Band {
    /// Every step and every column.
    Full,
    /// Row `r` sums steps `0..=r` (its later ones masked).
    StepsThroughRow,
    /// Row `r` sums steps `r..` (its earlier ones masked).
    StepsFromRow,
    /// Row `r` is written for columns `0..=r`; the later ones are left as they were.
    ColumnsThroughRow,
}

impl Band {
    /// The steps that the block of `rows` sums, of `steps`.
    #[inline(always)]
    fn steps(self, rows: &Range<usize>, steps: usize) -> Range<usize> {
        match self {
            Band::StepsThroughRow => 0..rows.end.min(steps),
            Band::StepsFromRow => rows.start.min(steps)..steps,
            Band::Full | Band::ColumnsThroughRow => 0..steps,
        }
    }

    /// The columns that the block of `rows` writes, of `width`.
    #[inline(always)]
    fn width(self, rows: &Range<usize>, width: usize) -> usize {
        match self {
            Band::ColumnsThroughRow => rows.end.min(width),
            _ => width,
        }
    }
}

/// Rows of a block held in registers at once: eight independent sums hide the add's latency.
const BLOCK_ROWS: usize = 8;
/// Rows of a block of two vectors of columns on AVX-512 (24 accumulators).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const WIDE_ROWS: usize = 12;
/// The fewest steps for which a product takes [`WIDE_ROWS`] blocks (see `x86::product`).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const WIDE_MIN_STEPS: usize = 32;
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
    banded_product(
        Band::Full,
        rows,
        width,
        steps,
        a,
        b,
        b_stride,
        out,
        out_stride,
    )
}

/// [`product`] over the terms of `band` only.
#[allow(clippy::too_many_arguments)]
pub fn banded_product(
    band: Band,
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
        unsafe { x86::product(band, rows, width, steps, a, b, b_stride, out, out_stride) };
        return;
    }
    portable(band, rows, width, steps, a, b, b_stride, out, out_stride);
}

/// [`banded_product`] in plain Rust, for CPUs without AVX-512 (and to test the other against).
#[allow(clippy::too_many_arguments)]
fn portable(
    band: Band,
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
        let block = r0..r0 + live;
        let width = band.width(&block, width);
        for x0 in (0..width).step_by(BLOCK_LANES) {
            let lanes = BLOCK_LANES.min(width - x0);
            let mut acc = [[0.0f32; BLOCK_LANES]; BLOCK_ROWS];
            for s in band.steps(&block, steps) {
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

    use crate::cpu::vector_unit::first_lanes;

    use std::ops::Range;

    use super::{Band, Strided, BLOCK_LANES, BLOCK_ROWS, WIDE_MIN_STEPS, WIDE_ROWS};

    /// # Safety
    /// The CPU must have AVX-512F, and the operands must hold the shape (as `product`
    /// asserts).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn product(
        band: Band,
        rows: usize,
        width: usize,
        steps: usize,
        a: Strided,
        b: &[f32],
        b_stride: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        // Blocks of 12 rows by two vectors (24 accumulators) where there are rows and steps
        // enough to use them: a convolution's columns times its weight (196 x 144 x 32 an
        // image for the CNN's second layer), and its output gradient times the weight's
        // transpose (196 x 32 x 144). Whole CNN steps, blocks alternating with and without in
        // one process: +1.0, +1.9 and 0.0% (16 rounds each), +3.4 and +3.7% (30 rounds, with
        // a throwaway prefetch in `cpu::gemm` toggled alongside, which did nothing for the
        // GPT). The attention's products, 16 steps long or 16 columns wide, ran slower in
        // larger blocks (throwaway probe: 0.63-0.66 -> 0.70-0.78 ms for its backward
        // products, 0.24 -> 0.31 ms in blocks of 16 rows by one vector): they keep 8 by 16.
        let wide_blocks = rows >= WIDE_ROWS && steps >= WIDE_MIN_STEPS;
        let mut x0 = 0;
        while x0 < width {
            let lanes = (width - x0).min(if wide_blocks {
                2 * BLOCK_LANES
            } else {
                BLOCK_LANES
            });
            let segmented = a.segment != usize::MAX;
            let (block_rows, block): (usize, Block) = match (lanes > BLOCK_LANES, segmented) {
                (true, false) => (WIDE_ROWS, block::<WIDE_ROWS, true, false>),
                (true, true) => (WIDE_ROWS, block::<WIDE_ROWS, true, true>),
                (false, false) => (BLOCK_ROWS, block::<BLOCK_ROWS, false, false>),
                (false, true) => (BLOCK_ROWS, block::<BLOCK_ROWS, false, true>),
            };
            for r0 in (0..rows).step_by(block_rows) {
                let these = r0..r0 + block_rows.min(rows - r0);
                let lanes = lanes.min(band.width(&these, width).saturating_sub(x0));
                if lanes == 0 {
                    continue;
                }
                let steps = band.steps(&these, steps);
                // SAFETY: the caller's promise, passed on.
                unsafe { block(these, x0, lanes, steps, a, b, b_stride, out, out_stride) };
            }
            x0 += lanes;
        }
    }

    /// A block kernel: `(rows, first column, lanes, steps, a, b, b_stride, out, out_stride)`.
    type Block = unsafe fn(
        Range<usize>,
        usize,
        usize,
        Range<usize>,
        Strided,
        &[f32],
        usize,
        &mut [f32],
        usize,
    );

    /// Rows `rows` (at most `R`) and `lanes` columns from `x0` (at most 16, or 32 when
    /// `TWO`) of the product over `steps`, in `R` (times two) accumulators held in registers
    /// for all the steps. Rows past the block's last repeat it; their sums are not stored.
    ///
    /// # Safety
    /// As for [`product`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const R: usize, const TWO: bool, const SEGMENTED: bool>(
        rows: Range<usize>,
        x0: usize,
        lanes: usize,
        steps: Range<usize>,
        a: Strided,
        b: &[f32],
        b_stride: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let live = rows.len();
        let starts: [usize; R] = std::array::from_fn(|i| a.at(rows.start + i.min(live - 1), 0));
        let (mask0, mask1) = (
            first_lanes(lanes),
            first_lanes(lanes.saturating_sub(BLOCK_LANES)),
        );
        // The sums continued over `steps`, row `i`'s term `s` at `a.values[starts[i] + s *
        // a.step]`: a closure, compiled for this function's vector unit and inlined.
        let steps_of = |mut acc: [[__m512; 2]; R], starts: &[usize; R], steps: Range<usize>| {
            for s in steps {
                // SAFETY (both reads): `product` asserted that B's row `s` holds `width`
                // floats from `s * b_stride` (masked lanes are not read) and that A's last
                // row and step, the furthest value read, are inside.
                let row = unsafe { b.as_ptr().add(s * b_stride + x0) };
                let b0 = unsafe { _mm512_maskz_loadu_ps(mask0, row) };
                let b1 = if TWO {
                    unsafe { _mm512_maskz_loadu_ps(mask1, row.add(BLOCK_LANES)) }
                } else {
                    _mm512_setzero_ps()
                };
                for (acc_i, &start) in acc.iter_mut().zip(starts) {
                    let av = _mm512_set1_ps(unsafe { *a.values.get_unchecked(start + s * a.step) });
                    acc_i[0] = _mm512_add_ps(acc_i[0], _mm512_mul_ps(av, b0));
                    if TWO {
                        acc_i[1] = _mm512_add_ps(acc_i[1], _mm512_mul_ps(av, b1));
                    }
                }
            }
            acc
        };
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        if !SEGMENTED {
            // A function of its own (`SEGMENTED` is a constant): with the loop below in the
            // same function, the compiler allocated the registers of both alike, and the
            // products of unsegmented operands (a convolution's input gradient, 196 x 32 x
            // 144 an image) ran 15-20% slower, or the segmented ones did (alternating runs of
            // a throwaway probe).
            acc = steps_of(acc, &starts, steps);
        } else {
            // A segment's steps lie `a.step` apart, as an unsegmented operand's do from rows
            // that start further on: each segment is the plain loop from shifted starts.
            let mut s = steps.start;
            while s < steps.end {
                let run = s..a.run_from(s, steps.end);
                let shift = a.step_offset(s) - s * a.step;
                acc = steps_of(acc, &starts.map(|start| start + shift), run.clone());
                s = run.end;
            }
        }
        for (i, acc_i) in acc.iter().enumerate().take(live) {
            // SAFETY: `product` asserted that output row `rows.start + i` holds `width`
            // floats; masked lanes are not written.
            unsafe {
                let to = out.as_mut_ptr().add((rows.start + i) * out_stride + x0);
                _mm512_mask_storeu_ps(to, mask0, acc_i[0]);
                if TWO {
                    _mm512_mask_storeu_ps(to.add(BLOCK_LANES), mask1, acc_i[1]);
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
            // Blocks of 12 rows by 32 columns and of 16 by 16, with rows and columns over.
            (25, 7, 40, true),
            (33, 40, 16, false),
            (14, 33, 50, true),
            (17, 32, 70, false),
            (64, 16, 64, true),
        ] {
            let values: Vec<f32> = (0..rows * steps + 3)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) * if i % 4 == 0 { 1e7 } else { 0.31 })
                .collect();
            let a = if transposed {
                Strided::new(&values, 3, 1, rows)
            } else {
                Strided::new(&values, 3, steps, 1)
            };
            let shape = format!("{rows}x{steps}x{width}, transposed {transposed}");
            assert_sums_in_ascending_order(a, rows, steps, width, &shape);
        }
    }

    #[test]
    fn rows_in_lines_and_steps_in_segments_are_read_where_they_lie() {
        // A convolution's im2col rows over a padded image (lines: output rows; segments:
        // window rows), with lines and segments cut across blocks of 8 and 12 rows, and
        // single rows and steps as lines and segments.
        for (rows, steps, width, line, segment) in [
            (196usize, 144usize, 32, 14, 48),
            (30, 45, 17, 7, 9),
            (25, 40, 40, 1, 40),
            (13, 33, 5, 13, 1),
            (9, 6, 16, 4, 5),
        ] {
            let (row_stride, step) = (3, 2);
            let (line_stride, segment_stride) = (line * row_stride + 5, segment * step + 7);
            let lines = rows.div_ceil(line);
            let segments = steps.div_ceil(segment);
            let len = 1 + lines * line_stride + segments * segment_stride;
            let values: Vec<f32> = (0..len)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) * if i % 4 == 0 { 1e7 } else { 0.31 })
                .collect();
            let a = Strided::new(&values, 1, row_stride, step)
                .in_lines(line, line_stride)
                .in_segments(segment, segment_stride);
            // The folded offsets, spelled out once more for the reference.
            for (r, s) in [(0, 0), (rows - 1, steps - 1), (line.min(rows - 1), 0)] {
                let at = 1
                    + r / line * line_stride
                    + r % line * row_stride
                    + s / segment * segment_stride
                    + s % segment * step;
                assert_eq!(a.at(r, s), at);
            }
            let shape = format!("{rows}x{steps}x{width}, lines of {line}, segments of {segment}");
            assert_sums_in_ascending_order(a, rows, steps, width, &shape);
        }
    }

    /// [`product`] and [`portable`] of `a` by a `steps x width` B, with strided B and output,
    /// have the bits of each element's terms summed in ascending order from 0.
    fn assert_sums_in_ascending_order(
        a: Strided,
        rows: usize,
        steps: usize,
        width: usize,
        shape: &str,
    ) {
        let (b_stride, out_stride) = (width + 2, width + 5);
        let b: Vec<f32> = (0..steps * b_stride)
            .map(|i| (i * 5 % 13) as f32 * 0.17 - 1.0)
            .collect();
        let mut want = vec![f32::NAN; rows * out_stride];
        for r in 0..rows {
            for x in 0..width {
                let mut acc = 0.0f32;
                for s in 0..steps {
                    acc += a.values[a.at(r, s)] * b[s * b_stride + x];
                }
                want[r * out_stride + x] = acc;
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut got = vec![f32::NAN; rows * out_stride];
        product(rows, width, steps, a, &b, b_stride, &mut got, out_stride);
        assert_eq!(bits(&got), bits(&want), "{shape}");
        let mut got = vec![f32::NAN; rows * out_stride];
        if steps > 0 {
            portable(
                Band::Full,
                rows,
                width,
                steps,
                a,
                &b,
                b_stride,
                &mut got,
                out_stride,
            );
            assert_eq!(bits(&got), bits(&want), "portable, {shape}");
        }
    }

    #[test]
    fn bands_give_the_full_products_bits_where_their_terms_vanish() {
        // Square products in the time axis (rows = steps), as attention's, with the terms
        // outside each band ±0 in A (the steps' bands) and every term present for the
        // columns' band: the band's rows and columns have the full product's bits, and the
        // columns past a block's last row are left as they were.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (time, width) in [(1, 1), (5, 3), (9, 16), (20, 17), (33, 40), (64, 16)] {
            for band in [
                Band::StepsThroughRow,
                Band::StepsFromRow,
                Band::ColumnsThroughRow,
            ] {
                let (b_stride, out_stride) = (width + 2, width.max(time) + 3);
                let a: Vec<f32> = (0..time * time)
                    .map(|i| {
                        let (r, s) = (i / time, i % time);
                        let masked = match band {
                            Band::StepsThroughRow => s > r,
                            Band::StepsFromRow => s < r,
                            _ => false,
                        };
                        let x = ((i * 7 % 11) as f32 - 5.0) * if i % 4 == 0 { 1e7 } else { 0.31 };
                        match (masked, i % 2) {
                            (true, 0) => 0.0,
                            (true, _) => -0.0,
                            _ => x,
                        }
                    })
                    .collect();
                let b: Vec<f32> = (0..time * b_stride)
                    .map(|i| (i * 5 % 13) as f32 * 0.17 - 1.0)
                    .collect();
                let width = if band == Band::ColumnsThroughRow {
                    time.min(width)
                } else {
                    width
                };
                let a = Strided::rows(&a, 0, time);
                let mut want = vec![f32::NAN; time * out_stride];
                product(time, width, time, a, &b, b_stride, &mut want, out_stride);
                let mut got = vec![f32::NAN; time * out_stride];
                banded_product(
                    band, time, width, time, a, &b, b_stride, &mut got, out_stride,
                );
                let mut portable_got = vec![f32::NAN; time * out_stride];
                portable(
                    band,
                    time,
                    width,
                    time,
                    a,
                    &b,
                    b_stride,
                    &mut portable_got,
                    out_stride,
                );
                for r in 0..time {
                    let written = if band == Band::ColumnsThroughRow {
                        width.min(r + 1)
                    } else {
                        width
                    };
                    let row = r * out_stride..r * out_stride + written;
                    let what = format!("{band:?}, time {time}, width {width}, row {r}");
                    assert_eq!(bits(&got[row.clone()]), bits(&want[row.clone()]), "{what}");
                    assert_eq!(
                        bits(&portable_got[row.clone()]),
                        bits(&want[row]),
                        "portable, {what}"
                    );
                    if band == Band::ColumnsThroughRow {
                        // A block (at most 12 rows) writes up to its last row's column.
                        let past =
                            r * out_stride + (r + WIDE_ROWS).min(width)..(r + 1) * out_stride;
                        assert!(
                            got[past].iter().all(|x| x.is_nan()),
                            "written past the band, {what}"
                        );
                    }
                }
            }
        }
    }
}
