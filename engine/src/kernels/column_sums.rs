//! Column sums of a `[len, inner]` matrix fed a row at a time, with the bits of
//! `sum_to_shape(x, [inner])` (the reduction's plan for that shape): for a backward pass that
//! produces a gradient's rows in cache and never holds the whole matrix (the fused
//! convolution and pooling's bias gradient, the image norm's dgamma and dbeta).

use rayon::prelude::*;

use super::reduce::{combine_lanes_as_tree, plan, reduce_ref, Plan, Reduce, CHUNK, LANES};
use crate::cpu::vector_unit::widest;

/// Lanes that one task of [`ColumnSums::par_add`] owns: a chunk's 256 lanes make eight tasks,
/// and each task reads runs of 32 neighbouring rows.
const TASK_LANES: usize = 32;

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
        Self::side_by_side(len, inner, 1)
    }

    /// Sums for `copies` matrices of `len` rows of `inner` columns at once, their rows side
    /// by side (`copies * inner` columns): each matrix's columns sum as [`ColumnSums::new`]
    /// sums them, in one pass over rows that yield all of them.
    pub(crate) fn side_by_side(len: usize, inner: usize, copies: usize) -> Self {
        let plan = plan(inner, len);
        let inner = inner * copies;
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

    /// Every row of `0..len` at once, in parallel: `add(j, sums)` adds row `j` to the running
    /// sums it is given (as [`ColumnSums::lane_of`] gives them). Rows reach each lane in
    /// ascending order, and the lanes are shared out among rayon's threads, each reading its
    /// own rows; with one lane (the short plan) the rows run in order on this thread.
    /// `add` runs on the widest vector unit; write it `#[inline(always)]`.
    pub(crate) fn par_add(&mut self, add: impl Fn(usize, &mut [f32]) + Sync) {
        let (len, inner) = (self.len, self.inner);
        if inner == 0 {
            return;
        }
        if self.plan == Plan::PerThread {
            let sums = &mut self.lanes[..inner];
            return widest(
                #[inline(always)]
                || (0..len).for_each(|j| add(j, sums)),
            );
        }
        // Task `t` owns lanes `t * TASK_LANES ..` of chunk `t / tasks_per_chunk`: its rows are
        // that chunk's rows whose lane (`j % LANES`, as CHUNK is a whole number of LANES) is
        // one of them.
        let tasks_per_chunk = LANES / TASK_LANES;
        self.lanes
            .par_chunks_mut(TASK_LANES * inner)
            .enumerate()
            .for_each(|(t, lanes)| {
                let chunk = t / tasks_per_chunk;
                let first_lane = t % tasks_per_chunk * TASK_LANES;
                let end = len.min((chunk + 1) * CHUNK);
                widest(
                    #[inline(always)]
                    || {
                        for round in (chunk * CHUNK..end).step_by(LANES) {
                            let rows = round + first_lane..end.min(round + first_lane + TASK_LANES);
                            for (j, sums) in rows.zip(lanes.chunks_exact_mut(inner)) {
                                add(j, sums);
                            }
                        }
                    },
                )
            });
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
                    sums.lane_of(j)
                        .iter_mut()
                        .zip(row)
                        .for_each(|(s, &v)| *s += v);
                }
            }
            let got = sums.finish();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "[{len}, {inner}]");
            // The same rows in parallel, next to their negations and doubles: three matrices
            // side by side, each with its own sums' bits.
            let mut sums = ColumnSums::side_by_side(len, inner, 3);
            sums.par_add(|j, s| {
                if j % 5 == 2 {
                    return;
                }
                let row = &x[j * inner..][..inner];
                let (first, rest) = s.split_at_mut(inner);
                let (second, third) = rest.split_at_mut(inner);
                for (((a, b), c), &v) in first.iter_mut().zip(second).zip(third).zip(row) {
                    (*a, *b, *c) = (*a + v, *b + -v, *c + 2.0 * v);
                }
            });
            let got = sums.finish();
            let (negated, doubled): (Vec<f32>, Vec<f32>) =
                want.iter().map(|&v| (-v, 2.0 * v)).unzip();
            let want: Vec<f32> = [want, negated, doubled].concat();
            assert_eq!(bits(&got), bits(&want), "[{len}, {inner}] in parallel");
        }
    }
}
