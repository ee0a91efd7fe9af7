//! The part of C that one task of a product writes: whole rows (a row panel), or a block of
//! columns of a row panel when a product with few rows splits its columns between tasks.
//! A column block's rows are not contiguous, and its neighbours' tasks write between them,
//! so the tasks hold pointers into C rather than slices of it.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// C while its tasks write it: hands out disjoint [`Block`]s.
#[derive(Clone, Copy)]
pub(super) struct SharedOutput<'c> {
    first: *mut MaybeUninit<f32>,
    rows: usize,
    n: usize,
    _c: PhantomData<&'c mut [MaybeUninit<f32>]>,
}

// SAFETY: a `SharedOutput` only hands out blocks, and its callers promise that the blocks
// that are alive at once are disjoint (`SharedOutput::block`).
unsafe impl Send for SharedOutput<'_> {}
// SAFETY: as above.
unsafe impl Sync for SharedOutput<'_> {}

impl<'c> SharedOutput<'c> {
    /// All of `c`, rows of `n` values.
    pub(super) fn new(c: &'c mut [MaybeUninit<f32>], n: usize) -> SharedOutput<'c> {
        assert!(
            n > 0 && c.len().is_multiple_of(n),
            "C is not whole rows of {n}"
        );
        SharedOutput {
            first: c.as_mut_ptr(),
            rows: c.len() / n,
            n,
            _c: PhantomData,
        }
    }

    /// Rows `rows` of C, columns `cols` of each (panics past C's edges).
    ///
    /// # Safety
    /// No other block alive at the same time may share a value with this one.
    pub(super) unsafe fn block(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
    ) -> Block<'c> {
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "rows past C"
        );
        assert!(
            cols.start < cols.end && cols.end <= self.n,
            "columns past C"
        );
        Block {
            // SAFETY: the asserts keep the first value inside C.
            first: unsafe { self.first.add(rows.start * self.n + cols.start) },
            stride: self.n,
            rows: rows.len(),
            cols: cols.len(),
            _c: PhantomData,
        }
    }
}

/// A rectangle of C that one task writes alone: `rows` rows `stride` values apart, the
/// first `cols` values of each.
pub(super) struct Block<'c> {
    first: *mut MaybeUninit<f32>,
    stride: usize,
    rows: usize,
    cols: usize,
    _c: PhantomData<&'c mut [MaybeUninit<f32>]>,
}

impl<'c> Block<'c> {
    /// Whole rows of `n` values: a row panel that its task holds as a slice.
    pub(super) fn rows_of(c: &'c mut [MaybeUninit<f32>], n: usize) -> Block<'c> {
        let whole = SharedOutput::new(c, n);
        // SAFETY: the block is all of `c`, which the caller lends to it alone.
        unsafe { whole.block(0..whole.rows, 0..n) }
    }

    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    pub(super) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i`'s `cols` values (panics past the last row).
    #[inline(always)]
    pub(super) fn row(&mut self, i: usize) -> &mut [MaybeUninit<f32>] {
        assert!(i < self.rows, "row {i} past the block's {}", self.rows);
        // SAFETY: the block's rows lie inside C (`SharedOutput::block`), and no other block
        // shares a value with this one.
        unsafe { std::slice::from_raw_parts_mut(self.first.add(i * self.stride), self.cols) }
    }
}
