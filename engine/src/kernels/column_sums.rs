//! Column sums of a `[len, inner]` matrix fed a row at a time, with the bits of
//! `sum_to_shape(x, [inner])` (the reduction's plan for that shape): for a backward pass that
//! produces a gradient's rows in cache and never holds the whole matrix (the fused
//! convolution and pooling's bias gradient, the image norm's dgamma and dbeta).

use super::reduce::{combine_lanes_as_tree, plan, reduce_ref, Plan, Reduce, CHUNK, LANES};

/// Running sums of the columns; rows must come in ascending order, and every row of `0..len`
/// that is not given counts as a row of zeros (adding +0 changes none of the sums: each starts
/// at +0, so none is ever -0, and `s + 0` is `s` for every other `s`).
pub(crate) struct ColumnSums {
    len: usize,
    inner: usize,
    plan: Plan,
    /// `[groups, LANES or 1, inner]`: a lane's running sum per column, per chunk of the
    /// two-pass plan (one group otherwise).
    lanes: Vec<f32>,
}

impl ColumnSums {
    /// Sums for `len` rows of `inner` columns.
    pub(crate) fn new(len: usize, inner: usize) -> Self {
        let plan = plan(inner, len);
        let lane_rows = match plan {
            Plan::PerThread => 1,
            Plan::PerWorkgroup => LANES,
            Plan::TwoPass { chunks } => chunks * LANES,
        };
        ColumnSums {
            len,
            inner,
            plan,
            lanes: vec![0.0; lane_rows * inner],
        }
    }

    /// The running sums that row `j` adds to (`inner` of them), in the plan's order: the
    /// caller adds the row's values to them, `sum = sum + value`.
    #[inline(always)]
    pub(crate) fn lane_of(&mut self, j: usize) -> &mut [f32] {
        debug_assert!(j < self.len);
        let lane = match self.plan {
            Plan::PerThread => 0,
            // A chunk is a whole number of lanes' rounds: row j of chunk c is lane j % LANES.
            Plan::PerWorkgroup => j % LANES,
            Plan::TwoPass { .. } => (j / CHUNK) * LANES + j % LANES,
        };
        &mut self.lanes[lane * self.inner..][..self.inner]
    }

    /// Rows whose indices differ by a multiple of this, and only those, can share a running
    /// sum (when they lie in the same chunk of the two-pass plan): so tasks that each take
    /// the rows of some residues modulo this can sum their rows on their own, every sum
    /// still in its order, and [`ColumnSums::take_lanes`] then puts their sums together.
    pub(crate) fn round(&self) -> usize {
        match self.plan {
            Plan::PerThread => 1,
            Plan::PerWorkgroup | Plan::TwoPass { .. } => LANES,
        }
    }

    /// Takes over `other`'s running sums for the rows whose index modulo
    /// [`ColumnSums::round`] lies in `residues`: those another task summed.
    pub(crate) fn take_lanes(&mut self, other: &ColumnSums, residues: std::ops::Range<usize>) {
        assert!(other.len == self.len && other.inner == self.inner);
        let (round, inner) = (self.round(), self.inner);
        for (lane, (mine, theirs)) in self
            .lanes
            .chunks_exact_mut(inner)
            .zip(other.lanes.chunks_exact(inner))
            .enumerate()
        {
            if residues.contains(&(lane % round)) {
                mine.copy_from_slice(theirs);
            }
        }
    }

    /// Adds row `j`.
    #[inline(always)]
    pub(crate) fn add(&mut self, j: usize, row: &[f32]) {
        for (s, &v) in self.lane_of(j).iter_mut().zip(row) {
            *s += v;
        }
    }

    /// The `inner` sums.
    pub(crate) fn finish(self) -> Vec<f32> {
        let inner = self.inner;
        let chunk_sums = |lanes: &mut [f32]| {
            combine_lanes_as_tree(lanes, inner, |a, b| a + b);
            lanes[..inner].to_vec()
        };
        let mut lanes = self.lanes;
        match self.plan {
            // The reduction scales by 1 at the end, which changes no bit.
            Plan::PerThread => lanes,
            Plan::PerWorkgroup => chunk_sums(&mut lanes),
            Plan::TwoPass { chunks } => {
                let partial: Vec<f32> = lanes
                    .chunks_mut(LANES * inner)
                    .flat_map(chunk_sums)
                    .collect();
                reduce_ref(&partial, 1, chunks, inner, Reduce::Sum, 1.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_given_one_at_a_time_sum_as_sum_to_shape_does() {
        // Every plan: a short axis, one workgroup, two chunks with the second cut short, and
        // column counts around a vector's width; rows left out count as zeros.
        for &(len, inner) in &[
            (1usize, 1usize),
            (200, 3),
            (257, 16),
            (4097, 17),
            (65536, 2),
            (65537, 1),
            (140000, 16),
        ] {
            let x: Vec<f32> = (0..len * inner)
                .map(|i| {
                    let hole = (i / inner) % 5 == 2;
                    let v = ((i * 7919 % 1013) as f32 - 500.0) * 1.37f32.powi((i % 23) as i32 - 11);
                    if hole {
                        0.0
                    } else {
                        v
                    }
                })
                .collect();
            let want = reduce_ref(&x, 1, len, inner, Reduce::Sum, 1.0);
            let mut sums = ColumnSums::new(len, inner);
            for (j, row) in x.chunks(inner).enumerate() {
                if j % 5 != 2 {
                    sums.add(j, row);
                }
            }
            let got = sums.finish();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "[{len}, {inner}]");
        }
    }
}
