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
//! step's work as soon as it is there.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
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
        // Whoever else wants this core gets it: on a machine with more threads than cores
        // (a node's network threads, other programs) a thread that only spins would take
        // the core from the step's own thread.
        std::thread::yield_now();
    }
    step.awake.fetch_sub(1, Ordering::AcqRel);
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
