//! Where a training step's parallel loops start from.
//!
//! A rayon loop started from a thread outside rayon's pool hands the whole loop to the pool
//! and puts the calling thread to sleep until the pool is done: two wake-ups through the
//! kernel per loop, and a GPT step on the CPU path runs hundreds of loops (every product,
//! every elementwise pass, every optimizer update). Started from a thread of the pool, the
//! loop runs its first half where it is and the other threads steal the rest, with no one
//! put to sleep. [`on_pool`] moves a whole step's work onto the pool, once.

/// Runs `work` on a thread of rayon's global pool (where it is, if this is one) and returns
/// what it returns, so that the parallel loops inside it start from the pool.
///
/// Measured on the 2-core Xeon (docs/benchmarks.md, session 13): a parallel pass over 16384
/// floats took 13.4 µs a loop from the main thread and 6.1 from a pool thread; whole
/// training steps, timed in alternating blocks of eight in one process, ran 0.4-8% faster.
///
/// For work that neither waits on another thread nor calls back into code that might: a
/// pool thread blocked on a lock or a channel is a thread the pool's other work cannot use,
/// and a wait on work queued behind it would never end. So a backward pass that hands each
/// gradient to a caller's callback (which pushes it to the network) stays on the caller's
/// thread.
pub fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    // `rayon::scope` runs its body on a pool thread, unlike `rayon::in_place_scope`.
    rayon::scope(|_| work())
}

#[cfg(test)]
mod tests {
    use super::on_pool;

    #[test]
    fn work_runs_on_a_pool_thread_and_its_value_comes_back() {
        assert!(rayon::current_thread_index().is_none());
        let (index, sum) = on_pool(|| {
            use rayon::prelude::*;
            let sum: u64 = (0..1000u64).into_par_iter().sum();
            (rayon::current_thread_index(), sum)
        });
        assert!(index.is_some(), "the work ran outside the pool");
        assert_eq!(sum, 499_500);
        // From a pool thread it runs where it is.
        let (outer, inner) = on_pool(|| {
            let outer = std::thread::current().id();
            (outer, on_pool(|| std::thread::current().id()))
        });
        assert_eq!(outer, inner);
    }
}
