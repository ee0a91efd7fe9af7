//! Element-wise work on the CPU path: the references' arithmetic for each element, in inner
//! loops the compiler can vectorise, split over rayon in chunks. Splitting an element-wise
//! operation never changes a bit: each output depends on its own inputs only.

use std::mem::MaybeUninit;

use super::chunks::{for_each_chunk, for_each_chunk_pair_with};
use super::output::{write_slice, zeroed, Unwritten};
use super::vector_unit::widest;

/// The largest magnitude in `values` as f32 bits without the sign: below `f32::INFINITY`'s
/// bits when every value is finite, and then the largest finite magnitude's. An integer
/// maximum, so that the loop runs whole vectors (a loop that stops at the first non-finite
/// value runs one value a step).
#[inline(always)]
pub(crate) fn largest_bits(values: &[f32]) -> u32 {
    values
        .iter()
        .fold(0, |m, x| m.max(x.to_bits() & 0x7fff_ffff))
}

/// Every value finite: a masked term `±0 * x` is then ±0.
#[inline(always)]
pub(crate) fn finite(values: &[f32]) -> bool {
    largest_bits(values) < f32::INFINITY.to_bits()
}

/// Whether every value is finite, on the widest vector unit: the check before a kernel that
/// leaves out terms a non-finite value would make NaN. `iter().all(f32::is_finite)` stops
/// at the first non-finite value and so runs one value a step: 24 µs for the CNN's first
/// layer's input (100,352 values) on a 2-core AVX-512 EPYC (session 21).
pub fn all_finite(values: &[f32]) -> bool {
    widest(
        #[inline(always)]
        || finite(values),
    )
}

/// Elements per task: below this, handing work to another thread costs more than it
/// saves.
pub const CHUNK: usize = 1 << 14;

/// Runs `f(start, chunk)` over `out` in chunks of [`CHUNK`] (`start` is the chunk's first
/// index), in parallel when there is more than one: the one way the element-wise kernels
/// below split their work. `f` runs on the widest vector unit only if it is inlined there:
/// write it `#[inline(always)]`. A closure the compiler chose not to inline is compiled for
/// the baseline's SSE2 and called from there (dropout's mask of [128, 128]: 264 µs that way,
/// 94–98 µs inlined; docs/benchmarks.md, session 12).
pub fn for_chunks<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() <= CHUNK {
        widest(
            #[inline(always)]
            || f(0, out),
        );
    } else {
        for_each_chunk(out, CHUNK, |c, chunk| {
            widest(
                #[inline(always)]
                || f(c * CHUNK, chunk),
            )
        });
    }
}

/// Runs `f(row index, row)` over the `cols`-long rows of `out`, in parallel tasks of about
/// [`CHUNK`] elements when there is more than one, each on the widest vector unit (write `f`
/// `#[inline(always)]`, as for [`for_chunks`]).
pub fn for_rows<T: Send>(out: &mut [T], cols: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let rows_per_task = (CHUNK / cols).max(1);
    if out.len() <= CHUNK {
        widest(
            #[inline(always)]
            || out.chunks_mut(cols).enumerate().for_each(|(r, o)| f(r, o)),
        );
    } else {
        for_each_chunk(out, rows_per_task * cols, |t, rows| {
            widest(
                #[inline(always)]
                || {
                    for (i, o) in rows.chunks_mut(cols).enumerate() {
                        f(t * rows_per_task + i, o);
                    }
                },
            )
        });
    }
}

/// `len` values in rows of `cols`: [`for_rows`] over them, each row zero-filled by its task
/// just before `write(row index, row)` runs on it.
pub fn zeroed_rows(len: usize, cols: usize, write: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    if len == 0 {
        return vec![];
    }
    let mut out = Unwritten::new(len);
    for_rows(
        out.slots(),
        cols,
        #[inline(always)]
        |r, row| write(r, zeroed(row)),
    );
    // SAFETY: `for_rows` hands every row to the closure, and `zeroed` wrote each one.
    unsafe { out.assume_init() }
}

/// `[f(0), f(1), .., f(n - 1)]`, in parallel chunks when large.
pub fn collect_indexed<T: Send + Clone + Default>(
    n: usize,
    f: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); n];
    for_chunks(
        &mut out,
        #[inline(always)]
        |start, chunk| {
            for (j, o) in chunk.iter_mut().enumerate() {
                *o = f(start + j);
            }
        },
    );
    out
}

/// `f(x)` for every element, in parallel when large.
pub fn map(x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    let mut out = Unwritten::new(x.len());
    for_chunks(
        out.slots(),
        #[inline(always)]
        |start, chunk| {
            for (o, &v) in chunk.iter_mut().zip(&x[start..]) {
                o.write(f(v));
            }
        },
    );
    // SAFETY: `for_chunks` hands every slot to the closure, which writes each one (`x` is
    // as long as the output).
    unsafe { out.assume_init() }
}

/// Two values for every element of `x`, into two vectors, in parallel when large, a block of
/// `B` elements at a time: `f(x, firsts, seconds)` fills both blocks from `x`'s, for
/// functions computed a stage at a time over a block (`kernels::math::exp_block`; GELU and
/// its derivative). A last short block is padded with zeros, whose values are dropped.
pub fn map_pair_in_blocks<const B: usize>(
    x: &[f32],
    f: impl Fn(&[f32; B], &mut [f32; B], &mut [f32; B]) + Sync,
) -> (Vec<f32>, Vec<f32>) {
    #[inline(always)]
    fn fill<const B: usize>(
        x: &[f32],
        firsts: &mut [MaybeUninit<f32>],
        seconds: &mut [MaybeUninit<f32>],
        f: &impl Fn(&[f32; B], &mut [f32; B], &mut [f32; B]),
    ) {
        let (mut a, mut b) = ([0.0f32; B], [0.0f32; B]);
        let whole = firsts.len() / B * B;
        for ((xs, fs), ss) in x[..whole]
            .chunks_exact(B)
            .zip(firsts.chunks_exact_mut(B))
            .zip(seconds.chunks_exact_mut(B))
        {
            f(xs.try_into().unwrap(), &mut a, &mut b);
            write_slice(fs, &a);
            write_slice(ss, &b);
        }
        let rest = firsts.len() - whole;
        if rest > 0 {
            let mut padded = [0.0f32; B];
            padded[..rest].copy_from_slice(&x[whole..][..rest]);
            f(&padded, &mut a, &mut b);
            write_slice(&mut firsts[whole..], &a[..rest]);
            write_slice(&mut seconds[whole..], &b[..rest]);
        }
    }
    let (mut first, mut second) = (Unwritten::new(x.len()), Unwritten::new(x.len()));
    if x.len() <= CHUNK {
        widest(
            #[inline(always)]
            || fill(x, first.slots(), second.slots(), &f),
        );
    } else {
        for_each_chunk_pair_with(
            (first.slots(), CHUNK),
            (second.slots(), CHUNK),
            || (),
            |_, c, firsts, seconds| {
                widest(
                    #[inline(always)]
                    || fill(&x[c * CHUNK..], firsts, seconds, &f),
                )
            },
        );
    }
    // SAFETY: the chunks of both outputs pair up and cover them, and `fill` writes each
    // slot of both, whole blocks and the rest.
    unsafe { (first.assume_init(), second.assume_init()) }
}

/// `f(x, y)` for every pair of elements of two equally long slices, in parallel when large.
pub fn zip_map(x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    assert_eq!(x.len(), y.len(), "zip_map operands differ in length");
    let mut out = Unwritten::new(x.len());
    for_chunks(
        out.slots(),
        #[inline(always)]
        |start, chunk| {
            for ((o, &a), &b) in chunk.iter_mut().zip(&x[start..]).zip(&y[start..]) {
                o.write(f(a, b));
            }
        },
    );
    // SAFETY: `for_chunks` hands every slot to the closure, which writes each one (`x` and
    // `y` are as long as the output).
    unsafe { out.assume_init() }
}

/// `f(a, b)` with broadcasting, element for element as
/// [`binary_ref`](crate::kernels::binary::binary_ref) computes it: `dims` and the operands'
/// element strides come collapsed (no size-1 axes, contiguous neighbours merged), so the
/// innermost axis is the long one.
pub fn broadcast(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    dims: &[usize],
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Vec<f32> {
    let Some((&inner, outer)) = dims.split_last() else {
        return vec![f(a[0], b[0])];
    };
    let (ia, ib) = (sa[outer.len()], sb[outer.len()]);
    let n: usize = dims.iter().product();
    if n == 0 {
        return vec![];
    }
    let mut out = Unwritten::new(n);
    // Where row `r` (one run of the innermost axis) starts in each operand.
    let starts = |mut r: usize| {
        let (mut oa, mut ob) = (0, 0);
        for ax in (0..outer.len()).rev() {
            let c = r % outer[ax];
            r /= outer[ax];
            oa += c * sa[ax];
            ob += c * sb[ax];
        }
        (oa, ob)
    };
    for_rows(
        out.slots(),
        inner,
        #[inline(always)]
        |r, o| {
            let (oa, ob) = starts(r);
            match (ia, ib) {
                (1, 1) => {
                    for ((o, &x), &y) in o.iter_mut().zip(&a[oa..][..inner]).zip(&b[ob..][..inner])
                    {
                        o.write(f(x, y));
                    }
                }
                (1, 0) => {
                    let y = b[ob];
                    for (o, &x) in o.iter_mut().zip(&a[oa..][..inner]) {
                        o.write(f(x, y));
                    }
                }
                (0, 1) => {
                    let x = a[oa];
                    for (o, &y) in o.iter_mut().zip(&b[ob..][..inner]) {
                        o.write(f(x, y));
                    }
                }
                _ => {
                    for (j, o) in o.iter_mut().enumerate() {
                        o.write(f(a[oa + j * ia], b[ob + j * ib]));
                    }
                }
            }
        },
    );
    // SAFETY: `for_rows` hands every `inner`-long row of slots to the closure, and each arm
    // writes all `inner` of them (the operands hold every row they are indexed at).
    unsafe { out.assume_init() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_cover_every_element_across_chunks() {
        let x: Vec<f32> = (0..3 * CHUNK + 17).map(|i| i as f32 * 0.37 - 9.0).collect();
        let y: Vec<f32> = x.iter().rev().copied().collect();
        let doubled = map(&x, |v| 2.0 * v);
        assert!(doubled.iter().zip(&x).all(|(d, v)| *d == 2.0 * v));
        let sum = zip_map(&x, &y, |a, b| a + b);
        assert!(sum
            .iter()
            .zip(x.iter().zip(&y))
            .all(|(s, (a, b))| *s == a + b));
        let squares = collect_indexed(3 * CHUNK + 5, |i| i * i);
        assert!(squares.iter().enumerate().all(|(i, s)| *s == i * i));
    }

    #[test]
    fn zeroed_rows_hands_each_row_zeroed() {
        // Rows of 5 over more than one task's worth: each row writes one value and must
        // find the rest zero, whatever the allocator handed back (a block just freed holds
        // old values; `black_box` keeps the compiler from leaving out the block it is never
        // read: without the fill, this fails).
        let len = 5 * (CHUNK / 5 + 3);
        drop(std::hint::black_box(vec![f32::NAN; len]));
        let got = zeroed_rows(len, 5, |r, row| {
            assert!(row.iter().all(|&v| v.to_bits() == 0), "row {r} not zeroed");
            row[r % 5] = 1.0;
        });
        for (j, v) in got.iter().enumerate() {
            let want = if j % 5 == j / 5 % 5 { 1.0f32 } else { 0.0 };
            assert_eq!(v.to_bits(), want.to_bits(), "value {j}");
        }
    }
}
