//! Mutable slices split into chunks that the pool's threads take by index
//! ([`for_each_index_with`]): the one way the CPU kernels hand parts of their outputs to
//! tasks.

use std::marker::PhantomData;

use super::pool::for_each_index_with;

/// `slice` as chunks of `len` values (the last one shorter), which tasks running at once take
/// by index.
pub struct ChunksMut<'a, T> {
    first: *mut T,
    total: usize,
    len: usize,
    _slice: PhantomData<&'a mut [T]>,
}

// SAFETY: a `ChunksMut` only hands out chunks, and `chunk`'s callers promise that each index
// is taken once; the values are `Send`, so a chunk may be written on another thread.
unsafe impl<T: Send> Sync for ChunksMut<'_, T> {}

impl<'a, T> ChunksMut<'a, T> {
    /// All of `slice`, in chunks of `len` (at least 1).
    pub fn new(slice: &'a mut [T], len: usize) -> ChunksMut<'a, T> {
        assert!(len > 0, "chunks of no values");
        ChunksMut {
            first: slice.as_mut_ptr(),
            total: slice.len(),
            len,
            _slice: PhantomData,
        }
    }

    /// How many chunks there are.
    pub fn count(&self) -> usize {
        self.total.div_ceil(self.len)
    }

    /// Chunk `i` (panics past the last).
    ///
    /// # Safety
    /// No other chunk `i` of this split may be alive at the same time.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn chunk(&self, i: usize) -> &'a mut [T] {
        assert!(i < self.count(), "chunk {i} past the last");
        let start = i * self.len;
        // SAFETY: `start..start + this` lies inside the slice borrowed for `'a`, and the
        // caller promises that nobody else holds this chunk.
        unsafe {
            std::slice::from_raw_parts_mut(self.first.add(start), self.len.min(self.total - start))
        }
    }
}

/// `task(i, chunk i)` for each chunk of `out`, `len` values long (the last one shorter), on
/// the pool's threads ([`for_each_index_with`]).
pub fn for_each_chunk<T: Send>(out: &mut [T], len: usize, task: impl Fn(usize, &mut [T]) + Sync) {
    for_each_chunk_with(out, len, || (), |_, i, chunk| task(i, chunk));
}

/// [`for_each_chunk`] with a scratch value made once per thread, as in
/// [`for_each_index_with`].
pub fn for_each_chunk_with<T: Send, S>(
    out: &mut [T],
    len: usize,
    init: impl Fn() -> S + Sync,
    task: impl Fn(&mut S, usize, &mut [T]) + Sync,
) {
    let chunks = ChunksMut::new(out, len);
    // SAFETY: `for_each_index_with` hands each index to one task.
    for_each_index_with(chunks.count(), init, |s, i| {
        task(s, i, unsafe { chunks.chunk(i) })
    });
}

/// `task(scratch, i, chunk i of a, chunk i of b)` for two outputs split into as many chunks
/// (`len_a` and `len_b` values each; panics when the counts differ), as
/// [`for_each_chunk_with`] runs its tasks: a kernel's two outputs by the same rows (values
/// and their statistics, a product's two halves).
pub fn for_each_chunk_pair_with<A: Send, B: Send, S>(
    (a, len_a): (&mut [A], usize),
    (b, len_b): (&mut [B], usize),
    init: impl Fn() -> S + Sync,
    task: impl Fn(&mut S, usize, &mut [A], &mut [B]) + Sync,
) {
    let (a, b) = (ChunksMut::new(a, len_a), ChunksMut::new(b, len_b));
    assert_eq!(
        a.count(),
        b.count(),
        "the two outputs split into different numbers of chunks"
    );
    for_each_index_with(a.count(), init, |s, i| {
        // SAFETY: `for_each_index_with` hands each index to one task.
        let (a, b) = unsafe { (a.chunk(i), b.chunk(i)) };
        task(s, i, a, b)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_handed_out_once_with_its_index() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (n, len) in [(0, 3), (1, 3), (45, 7), (49, 7), (1000, 1)] {
            let mut v = vec![0u32; n];
            pool.install(|| {
                for_each_chunk(&mut v, len, |i, chunk| {
                    assert!(
                        chunk.len() == len || (i + 1) * len >= n,
                        "a short chunk inside"
                    );
                    chunk
                        .iter_mut()
                        .enumerate()
                        .for_each(|(j, x)| *x += (i * len + j) as u32);
                })
            });
            assert_eq!(
                v,
                (0..n as u32).collect::<Vec<_>>(),
                "{n} in chunks of {len}"
            );
        }
    }

    #[test]
    fn pairs_of_chunks_go_together_and_must_be_as_many() {
        let (mut a, mut b) = (vec![0usize; 45], vec![0usize; 14]);
        for_each_chunk_pair_with(
            (&mut a, 7),
            (&mut b, 2),
            || (),
            |_, i, a, b| {
                a.fill(i);
                b.fill(i);
            },
        );
        assert_eq!(a, (0..45).map(|j| j / 7).collect::<Vec<_>>());
        assert_eq!(b, (0..14).map(|j| j / 2).collect::<Vec<_>>());
        let uneven = std::panic::catch_unwind(|| {
            let (mut a, mut b) = (vec![0u8; 10], vec![0u8; 10]);
            for_each_chunk_pair_with((&mut a, 5), (&mut b, 2), || (), |_, _, _, _| {});
        });
        assert!(uneven.is_err(), "2 chunks paired with 5");
    }

    /// Each thread that takes chunks makes its scratch once, however many it takes.
    #[test]
    fn each_thread_makes_its_scratch_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let made = AtomicUsize::new(0);
        let mut v = vec![0usize; 4096];
        pool.install(|| {
            for_each_chunk_with(
                &mut v,
                1,
                || made.fetch_add(1, Ordering::Relaxed),
                |_, _, chunk| {
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(2) {}
                    chunk[0] = rayon::current_thread_index().unwrap() + 1;
                },
            )
        });
        assert!(made.load(Ordering::Relaxed) <= 2);
        assert!(v.iter().all(|&t| t > 0), "a chunk nobody wrote");
    }
}
