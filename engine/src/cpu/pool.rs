//! Where a training step's parallel loops start from, and the pool's other threads kept awake
//! for them.
//!
//! A rayon loop started from a thread outside rayon's pool hands the whole loop to the pool
//! and puts the calling thread to sleep until the pool is done: two wake-ups through the
//! kernel per loop, and a GPT step on the CPU path runs hundreds of loops (every product,
//! every elementwise pass, every optimizer update). Started from a thread of the pool, the
//! loop runs its first half where it is and the other threads steal the rest, with no one
//! put to sleep. [`on_pool`] moves a whole step's work onto the pool, once.
//!
//! Between two loops the step runs serial code (the graph's bookkeeping, small operations),
//! and an idle rayon thread yields to the system about 32 times and then sleeps: each loop
//! after a gap of a few tens of µs paid a wake-up through the kernel before its other half
//! could start (a futex wake, and in a virtual machine an interrupt to a halted virtual CPU).
//! So for the length of a step the other threads stay awake: each runs a job that takes the
//! step's work as soon as it is there. Within a loop, the thread that started it waits for
//! the others' last tasks awake too: most of the CPU kernels' loops run through
//! [`for_each_index`].

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

thread_local! {
    /// The step this thread is running ([`on_pool`]), perhaps beneath the job it is running
    /// now.
    static STEP: RefCell<Option<Arc<StepState>>> = const { RefCell::new(None) };
}

/// What a step shares with the threads it keeps awake.
#[derive(Default)]
struct StepState {
    /// Cleared when the step's work returns.
    running: AtomicBool,
    /// Threads in [`stay_awake`] for the step.
    awake: AtomicUsize,
}

/// Runs `work` on a thread of rayon's global pool (where it is, if this is one) and returns
/// what it returns, so that the parallel loops inside it start from the pool. With
/// `cpu_work` (a step on the CPU path), the pool's other threads wait for those loops' work
/// awake, not asleep, until `work` returns; a step on a GPU waits on the GPU instead, and the
/// threads would spin for nothing.
///
/// Measured on the 2-core Xeon (docs/benchmarks.md, session 13): a parallel pass over 16384
/// floats took 13.4 µs a loop from the main thread and 6.1 from a pool thread; whole
/// training steps, timed in alternating blocks of eight in one process, ran 0.4-8% faster.
/// The threads kept awake: the GPT's step on the 2-core EPYC, `murmur bench train`
/// alternating, 0.444–0.459 of the matmul rate asleep and 0.462–0.476 awake (session 22).
///
/// For work that neither waits on another thread nor calls back into code that might: a
/// pool thread blocked on a lock or a channel is a thread the pool's other work cannot use,
/// and a wait on work queued behind it would never end. So a backward pass that hands each
/// gradient to a caller's callback (which pushes it to the network) stays on the caller's
/// thread.
pub fn on_pool<R: Send>(cpu_work: bool, work: impl FnOnce() -> R + Send) -> R {
    // `rayon::scope` runs its body on a pool thread, unlike `rayon::in_place_scope`.
    rayon::scope(|_| {
        if !cpu_work || STEP.with_borrow(Option::is_some) {
            // A step inside a step: its threads are awake already.
            return work();
        }
        let _step = Step::start();
        work()
    })
}

/// A step running on this thread: while it lives, the pool's other threads stay awake.
struct Step(Arc<StepState>);

impl Step {
    fn start() -> Step {
        let state = Arc::new(StepState {
            running: AtomicBool::new(true),
            ..StepState::default()
        });
        STEP.set(Some(state.clone()));
        if rayon::current_num_threads() > 1 {
            let (shared, here) = (state.clone(), rayon::current_thread_index());
            rayon::spawn_broadcast(move |context| {
                if Some(context.index()) != here {
                    stay_awake(&shared);
                }
            });
        }
        Step(state)
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        STEP.set(None);
    }
}

/// One round of waiting awake: runs one of the pool's jobs if there is one (true), or else
/// yields the core to whoever else wants it (false): on a machine with more threads than
/// cores (a node's network threads, other programs) a thread that only spins would take the
/// core from the thread it waits for.
fn look_for_work() -> bool {
    if rayon::yield_now() == Some(rayon::Yield::Executed) {
        return true;
    }
    std::thread::yield_now();
    false
}

/// Threads kept awake for the step this thread runs (0 outside one): for tests.
#[cfg(test)]
fn awake_threads() -> usize {
    STEP.with_borrow(|s| s.as_ref().map_or(0, |s| s.awake.load(Ordering::Acquire)))
}

/// How long a thread kept awake goes on looking for work that does not come: past this, it
/// returns to rayon's own idling (a wait on something else than the pool's work, or a
/// serial stretch this long, gains nothing from it).
const IDLE_LIMIT: Duration = Duration::from_millis(1);

/// Looks for the pool's work and runs it while the step runs (`running`), until there has
/// been none for [`IDLE_LIMIT`].
///
/// A thread that is running a step of its own (beneath this job: it picked this one up while
/// waiting inside its step) returns at once: kept here, its step could not go on until the
/// other step ended, and the other might be waiting for it. The idle limit bounds every other
/// wait: if the step waits on a job this thread holds beneath this one, the step makes no
/// work, and this job returns.
fn stay_awake(step: &StepState) {
    if STEP.with_borrow(Option::is_some) {
        return;
    }
    // The clock is read once every this many idle rounds: a round is a look through the
    // pool's queues and a yield to the system, about a µs.
    const ROUNDS_PER_READING: u32 = 64;
    step.awake.fetch_add(1, Ordering::AcqRel);
    let mut idle_since = Instant::now();
    let mut idle_rounds = 0u32;
    while step.running.load(Ordering::Acquire) {
        if look_for_work() {
            idle_rounds = 0;
            continue;
        }
        if idle_rounds == 0 {
            idle_since = Instant::now();
        }
        idle_rounds += 1;
        if idle_rounds.is_multiple_of(ROUNDS_PER_READING) && idle_since.elapsed() > IDLE_LIMIT {
            break;
        }
    }
    step.awake.fetch_sub(1, Ordering::AcqRel);
}

/// Runs `task(i)` for every `i` in `0..tasks` on the pool's threads and returns when all
/// have run: the threads take runs of indices as they finish the last (`Indices`), and the
/// calling thread, once none are left, waits for the others' last tasks awake. The products,
/// layer norm, the elementwise loops and `cpu::output`'s helpers (attention, convolutions)
/// run their loops here, through `cpu::chunks`. The reductions, the rows' softmax and
/// cross-entropy and AdamW's chunks stay rayon loops: moved here they measured 0.99 (GPT, 10
/// pairs), 0.99 (MLP, 8) and 0.99 (CNN, 6) of the build without them, within the noise
/// either way.
///
/// A rayon loop's calling thread waits for the halves other threads took as rayon waits: it
/// looks for work about 32 times and then sleeps in the kernel, and whoever finishes the last
/// half wakes it (a futex wake on that thread's time, and in a virtual machine an interrupt to
/// a halted virtual CPU before the caller goes on). A GPT step's loops end a few tens of µs
/// apart on its two threads often enough for that to count: its weight gradients' loops
/// alone were a third of the sleeps in a profile, and a rayon that idled 2048 rounds before
/// sleeping ran the step 1.5% faster. Taken a run at a time, indices also even out two
/// threads that run at different speeds (a virtual CPU whose host core is busy elsewhere),
/// where rayon's halves are fixed once stolen. Measured as the median ratio of alternating
/// `murmur train` runs on the 2-core Zen 5 (docs/benchmarks.md, session 25): the GPT +1.4%
/// (12 pairs), the MLP +2.2% and the CNN +0.6% (8 pairs each).
///
/// From outside the pool the loop runs on it (`rayon::scope`), the caller asleep until it
/// ends, as a rayon loop would.
pub fn for_each_index(tasks: usize, task: impl Fn(usize) + Sync) {
    for_each_index_with(tasks, || (), |_, i| task(i));
}

/// [`for_each_index`] with a scratch value that `init` makes once on each thread that takes
/// an index, and `task(scratch, i)` reuses for the indices that thread takes (as rayon's
/// `for_each_init`).
pub fn for_each_index_with<S>(
    tasks: usize,
    init: impl Fn() -> S + Sync,
    task: impl Fn(&mut S, usize) + Sync,
) {
    // The indices left are two 32-bit halves of one word: longer loops run in stretches.
    let most = u32::MAX as usize;
    for start in (0..tasks).step_by(most) {
        stretch(start, (tasks - start).min(most), &init, &task);
    }
}

/// [`for_each_index_with`] over indices `start..start + tasks`, `tasks` at most `u32::MAX`.
fn stretch<S>(
    start: usize,
    tasks: usize,
    init: &(impl Fn() -> S + Sync),
    task: &(impl Fn(&mut S, usize) + Sync),
) {
    let helpers = rayon::current_num_threads().min(tasks).saturating_sub(1);
    if helpers == 0 {
        if tasks > 0 {
            let mut scratch = init();
            (start..start + tasks).for_each(|i| task(&mut scratch, i));
        }
        return;
    }
    let left = Indices::new(tasks as u32);
    let threads = helpers + 1;
    let run = |from_front: bool| {
        let mut scratch = None;
        while let Some(taken) = left.take(from_front, threads) {
            let scratch = scratch.get_or_insert_with(init);
            taken.for_each(|i| task(scratch, start + i));
        }
    };
    let finished = AtomicUsize::new(0);
    rayon::scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| {
                // Counted as finished even when a task panics (the scope passes the panic
                // on), so that the wait below ends.
                let _finished = Finished(&finished);
                run(false);
            });
        }
        run(true);
        // A helper nobody took is still in this thread's queue: `yield_now` runs it here.
        while finished.load(Ordering::Acquire) < helpers {
            look_for_work();
        }
    });
}

/// Counts a helper of [`for_each_index_with`] as finished when dropped.
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// The indices of [`for_each_index_with`] not taken yet, `first..end` in one word. The
/// calling thread takes them from the front and the helpers from the back, so that the
/// caller runs the first stretch of a loop and a helper the last, as a rayon loop's halves
/// fall, and a step's next loop over the same rows finds most of them in the cache of the
/// core that wrote them. Each take is a run of a quarter of what is left per thread (at
/// least one index): few takes of the word both cores write, small ones at the end, where
/// they even the threads out. One index a take, the GPT's products of 171 row panels each
/// paid a take per panel, and its step ran 0.9% slower than with rayon's loops.
struct Indices(AtomicU64);

impl Indices {
    fn new(tasks: u32) -> Indices {
        Indices(AtomicU64::new(u64::from(tasks) << 32))
    }

    /// A run of indices from the front or the back, for one of `threads` threads; `None` when
    /// none are left.
    fn take(&self, from_front: bool, threads: usize) -> Option<std::ops::Range<usize>> {
        let mut now = self.0.load(Ordering::Relaxed);
        loop {
            let (first, end) = (now & 0xffff_ffff, now >> 32);
            if first >= end {
                return None;
            }
            let run = ((end - first) / (2 * threads as u64)).max(1);
            let (taken, next) = if from_front {
                (first..first + run, now + run)
            } else {
                (end - run..end, now - (run << 32))
            };
            match self
                .0
                .compare_exchange_weak(now, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(taken.start as usize..taken.end as usize),
                Err(seen) => now = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::on_pool;
    use rayon::prelude::*;
    use std::time::{Duration, Instant};

    #[test]
    fn work_runs_on_a_pool_thread_and_its_value_comes_back() {
        assert!(rayon::current_thread_index().is_none());
        let (index, sum) = on_pool(true, || {
            let sum: u64 = (0..1000u64).into_par_iter().sum();
            (rayon::current_thread_index(), sum)
        });
        assert!(index.is_some(), "the work ran outside the pool");
        assert_eq!(sum, 499_500);
        // From a pool thread it runs where it is.
        let (outer, inner) = on_pool(true, || {
            let outer = std::thread::current().id();
            (outer, on_pool(true, || std::thread::current().id()))
        });
        assert_eq!(outer, inner);
    }

    /// The other threads stay awake through serial stretches longer than rayon's own idling
    /// (a few tens of µs) and take the next loop's work; they let go when the step ends.
    #[test]
    fn the_other_threads_stay_awake_for_the_step_and_let_go_after_it() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (awake_after_gaps, threads) = pool.install(|| {
            on_pool(true, || {
                let (mut awake, mut threads) = (0, std::collections::HashSet::new());
                // A loaded machine may keep this thread from running for longer than the
                // idle limit; the other thread must be found awake after some of the gaps.
                for _ in 0..20 {
                    threads.extend(
                        (0..64)
                            .into_par_iter()
                            .map(|_| {
                                let t = Instant::now();
                                while t.elapsed() < Duration::from_micros(10) {}
                                rayon::current_thread_index()
                            })
                            .collect::<Vec<_>>(),
                    );
                    let gap = Instant::now();
                    while gap.elapsed() < Duration::from_micros(200) {
                        std::hint::spin_loop();
                    }
                    awake += usize::from(super::awake_threads() == 1);
                }
                (awake, threads.len())
            })
        });
        assert!(
            awake_after_gaps > 0,
            "the other thread slept through every gap"
        );
        assert_eq!(threads, 2, "one thread ran every loop");
        // Both threads are back in the pool: a job on each of them runs.
        assert_eq!(pool.broadcast(|context| context.index()), vec![0, 1]);
        // Without `cpu_work` nobody is kept awake.
        assert_eq!(pool.install(|| on_pool(false, super::awake_threads)), 0);
    }

    /// Every index runs once, from inside the pool and from outside it, whoever takes it.
    #[test]
    fn every_index_runs_once() {
        use super::for_each_index;
        use std::sync::atomic::{AtomicU32, Ordering};
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for tasks in [0, 1, 2, 3, 17, 1000] {
            let runs: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
            let count = |i: usize| {
                runs[i].fetch_add(1, Ordering::Relaxed);
            };
            pool.install(|| for_each_index(tasks, count));
            for_each_index(tasks, count);
            assert!(
                runs.iter().all(|r| r.load(Ordering::Relaxed) == 2),
                "{tasks} tasks"
            );
        }
    }

    /// A task that panics, on the calling thread or a helper, ends the loop with its panic
    /// instead of leaving the caller waiting; the pool goes on working.
    #[test]
    fn a_panicking_task_passes_its_panic_on() {
        use super::for_each_index;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for bad in [0, 63] {
            let caught = pool.install(|| {
                std::panic::catch_unwind(|| {
                    for_each_index(64, |i| {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(20) {}
                        assert_ne!(i, bad, "task {i} fails");
                    })
                })
            });
            assert!(caught.is_err(), "task {bad}'s panic was lost");
        }
        let sum: u64 = pool.install(|| (0..1000u64).into_par_iter().sum());
        assert_eq!(sum, 499_500);
    }

    /// Two steps at once on two threads of one pool (tests, or a node's two models) finish:
    /// neither thread stays awake for the other's step beneath its own.
    #[test]
    fn two_steps_at_once_both_finish() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let sums = pool.install(|| {
            rayon::join(
                || {
                    on_pool(true, || {
                        (0..200_000u64).into_par_iter().map(|x| x % 7).sum::<u64>()
                    })
                },
                || {
                    on_pool(true, || {
                        (0..200_000u64).into_par_iter().map(|x| x % 5).sum::<u64>()
                    })
                },
            )
        });
        assert_eq!(sums, (599_994, 400_000));
    }
}
