//! Output vectors that the kernels' own tasks initialise, instead of `vec![0.0; n]`.
//!
//! A large `vec![0.0; n]` is a `calloc` whose memory comes back from glibc's heap (the
//! trainer keeps its large blocks, docs/benchmarks.md), so glibc zero-fills it with one
//! `memset` on the calling thread while the other threads wait, and the kernel then writes
//! every element again, after the zeros have left the caches. In the CPU path's GPT step
//! that `memset` was 6% of all samples (`perf record`, 2026-11-29). Here each task
//! zero-fills (or simply writes) its own part just before computing it: in parallel, and
//! in cache when the results land.

use std::mem::MaybeUninit;

use bytemuck::Zeroable;

use super::chunks::{for_each_chunk_pair_with, for_each_chunk_with, ChunksMut};
use super::pool::for_each_index_with;

/// `len` values not yet initialised: the kernel hands [`Unwritten::slots`] to its tasks,
/// which write every slot (directly, or through [`zeroed`]), then takes the vector with
/// [`Unwritten::assume_init`].
pub struct Unwritten<T = f32> {
    v: Vec<T>,
    len: usize,
}

impl<T> Unwritten<T> {
    /// Room for `len` values, none written.
    pub fn new(len: usize) -> Unwritten<T> {
        Unwritten {
            v: Vec::with_capacity(len),
            len,
        }
    }

    /// The `len` slots to write.
    pub fn slots(&mut self) -> &mut [MaybeUninit<T>] {
        &mut self.v.spare_capacity_mut()[..self.len]
    }

    /// The vector of the written values.
    ///
    /// # Safety
    /// Every one of the [`Unwritten::slots`] must have been written.
    pub unsafe fn assume_init(mut self) -> Vec<T> {
        // SAFETY: the capacity is at least `len` (`with_capacity`), and the caller wrote
        // every slot below it.
        unsafe { self.v.set_len(self.len) };
        self.v
    }
}

/// Zero-fills `slots` and gives them back as the initialised values they now are: for the
/// kernels that write only part of their output (a causal row's weights past its span) or
/// add into it (a product's tiles).
#[inline(always)]
pub fn zeroed<T: Zeroable + Copy>(slots: &mut [MaybeUninit<T>]) -> &mut [T] {
    slots.fill(MaybeUninit::new(T::zeroed()));
    // SAFETY: every slot was just written.
    unsafe { assume_written(slots) }
}

/// The values of `slots`, all of which the caller has written.
///
/// # Safety
/// Every slot must have been written.
#[inline(always)]
pub unsafe fn assume_written<T>(slots: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: the caller wrote every slot, and `MaybeUninit<T>` has `T`'s layout.
    unsafe { &mut *(slots as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// Copies `src` into the equally long `dst` (`copy_from_slice` for slots).
#[inline(always)]
pub fn write_slice<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "write_slice lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}

/// `len` values, each chunk of `chunk` (the last one shorter) zero-filled by the
/// task that then runs `write(chunk index, chunk)` on it.
pub fn zeroed_par_chunks(
    len: usize,
    chunk: usize,
    write: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    zeroed_par_chunks_with(len, chunk, || (), |_, i, chunk| write(i, chunk))
}

/// [`zeroed_par_chunks`] with a scratch value that `init` makes once per thread that takes
/// chunks and `write(scratch, chunk index, chunk)` reuses across the chunks it runs (an image's
/// columns, a head's scores), as rayon's `for_each_init`.
pub fn zeroed_par_chunks_with<S>(
    len: usize,
    chunk: usize,
    init: impl Fn() -> S + Sync + Send,
    write: impl Fn(&mut S, usize, &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    // SAFETY: `zeroed` writes every slot of each chunk.
    unsafe { unwritten_par_chunks_with(len, chunk, init, |s, i, slots| write(s, i, zeroed(slots))) }
}

/// [`zeroed_par_chunks_with`] with the chunks handed to `write` unwritten, for it to write
/// every slot (a head's attention weights, which it writes whole).
///
/// # Safety
/// `write` must write every slot of each chunk it is handed.
pub unsafe fn unwritten_par_chunks_with<S>(
    len: usize,
    chunk: usize,
    init: impl Fn() -> S + Sync + Send,
    write: impl Fn(&mut S, usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    let mut out = Unwritten::new(len);
    for_each_chunk_with(out.slots(), chunk, init, write);
    // SAFETY: the chunks cover every slot, and the caller's `write` wrote each one.
    unsafe { out.assume_init() }
}

/// Three outputs of `len` values split into chunks of `chunk`, chunk `i` of each zero-filled
/// by one task that then runs `write(scratch, i, [chunk of each])`, with a scratch
/// value made once per thread as in [`zeroed_par_chunks_with`]: a batch entry's
/// gradients of three operands.
pub fn zeroed_par_chunk_triples<S>(
    (len, chunk): (usize, usize),
    init: impl Fn() -> S + Sync + Send,
    write: impl Fn(&mut S, usize, [&mut [f32]; 3]) + Sync + Send,
) -> [Vec<f32>; 3] {
    let mut outs = [
        Unwritten::new(len),
        Unwritten::new(len),
        Unwritten::new(len),
    ];
    let [a, b, c] = &mut outs;
    let (a, b, c) = (
        ChunksMut::new(a.slots(), chunk),
        ChunksMut::new(b.slots(), chunk),
        ChunksMut::new(c.slots(), chunk),
    );
    for_each_index_with(a.count(), init, |scratch, i| {
        // SAFETY: each index is taken once.
        let [a, b, c] = unsafe { [a.chunk(i), b.chunk(i), c.chunk(i)] };
        write(scratch, i, [zeroed(a), zeroed(b), zeroed(c)])
    });
    // SAFETY: the three split into the same chunks, each zero-filled by its task.
    outs.map(|out| unsafe { out.assume_init() })
}

/// Two outputs split into as many chunks each, chunk `i` of both zero-filled by one
/// task that then runs `write(scratch, i, chunk of a, chunk of b)`, with a scratch value
/// made once per thread as in [`zeroed_par_chunks_with`]: a batch entry's gradients of
/// two operands, a row of pooled values and their argmax. Panics when the counts differ.
pub fn zeroed_par_chunk_pairs<A, B, S>(
    a: (usize, usize),
    b: (usize, usize),
    init: impl Fn() -> S + Sync + Send,
    write: impl Fn(&mut S, usize, &mut [A], &mut [B]) + Sync + Send,
) -> (Vec<A>, Vec<B>)
where
    A: Zeroable + Copy + Send,
    B: Zeroable + Copy + Send,
{
    // SAFETY: `zeroed` writes every slot of each chunk of b.
    unsafe {
        zeroed_and_unwritten_par_chunk_pairs(a, b, init, |s, i, a, b| write(s, i, a, zeroed(b)))
    }
}

/// [`zeroed_par_chunk_pairs`] with only the first output's chunks zero-filled: chunk `i` of
/// the second is handed to `write` unwritten, for it to write every slot (a batch entry's
/// attention weights, which it writes whole). Panics when the counts differ.
///
/// # Safety
/// `write` must write every slot of each chunk of the second output it is handed.
pub unsafe fn zeroed_and_unwritten_par_chunk_pairs<A, B, S>(
    (len_a, chunk_a): (usize, usize),
    (len_b, chunk_b): (usize, usize),
    init: impl Fn() -> S + Sync + Send,
    write: impl Fn(&mut S, usize, &mut [A], &mut [MaybeUninit<B>]) + Sync + Send,
) -> (Vec<A>, Vec<B>)
where
    A: Zeroable + Copy + Send,
    B: Send,
{
    let (mut a, mut b) = (Unwritten::new(len_a), Unwritten::new(len_b));
    for_each_chunk_pair_with(
        (a.slots(), chunk_a),
        (b.slots(), chunk_b),
        init,
        |scratch, i, a, b| write(scratch, i, zeroed(a), b),
    );
    // SAFETY: as many chunks of each (asserted), each task zero-fills its chunk of a, and
    // the caller's `write` wrote every one of b.
    unsafe { (a.assume_init(), b.assume_init()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_zeroed_before_it_is_written() {
        // Chunks of 7 over 45 values, the last one short: each task writes one value of
        // its chunk and must find the rest zero, whatever the allocator handed back (a
        // block just freed holds old values; `black_box` keeps the compiler from leaving
        // out the block it is never read).
        let len = 45;
        drop(std::hint::black_box(vec![f32::NAN; len]));
        let got = zeroed_par_chunks(len, 7, |i, chunk| {
            assert!(
                chunk.iter().all(|&v| v.to_bits() == 0),
                "chunk {i} not zeroed"
            );
            chunk[0] = i as f32 + 1.0;
        });
        assert_eq!(got.len(), len);
        for (j, v) in got.iter().enumerate() {
            let want = if j % 7 == 0 {
                (j / 7) as f32 + 1.0
            } else {
                0.0
            };
            assert_eq!(v.to_bits(), want.to_bits(), "value {j}");
        }
        assert!(zeroed_par_chunks(0, 7, |_, _| unreachable!()).is_empty());
        // Pairs: 45 values in chunks of 7 beside 14 in chunks of 2, both zeroed.
        drop(std::hint::black_box(vec![u32::MAX; 14]));
        let (a, b) = zeroed_par_chunk_pairs(
            (len, 7),
            (14, 2),
            || (),
            |_, i, a: &mut [f32], b: &mut [u32]| {
                assert!(a.iter().all(|&v| v.to_bits() == 0) && b.iter().all(|&v| v == 0));
                a[0] = i as f32 + 1.0;
                b[0] = i as u32 + 1;
            },
        );
        assert_eq!(a, got);
        assert_eq!(
            b,
            (0..14)
                .map(|j| if j % 2 == 0 { j / 2 + 1 } else { 0 })
                .collect::<Vec<u32>>()
        );
    }
}
