//! Process set-up a program that embeds a node may want before it starts any thread.

/// Mesa's window-system layer prints "XDG_RUNTIME_DIR is invalid or not set" whenever a
/// Vulkan instance is created on a headless machine; murmur never presents to a window, so
/// give it a private runtime folder instead of letting the message bury murmur's own output.
/// Call it first thing in `main`, before any thread exists (it sets an environment variable).
pub fn quiet_mesa_wsi() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // One folder per user, reused by every run (a folder per process would pile up).
        let dir = std::env::temp_dir().join(format!("murmur-runtime-{}", user_id()));
        if std::fs::create_dir_all(&dir).is_ok() {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}

#[cfg(unix)]
fn user_id() -> String {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or_else(|_| "user".into(), |m| m.uid().to_string())
}

#[cfg(not(unix))]
fn user_id() -> String {
    "user".into()
}

/// Has glibc's allocator map every block over 4 MiB on its own and unmap it when freed, keep
/// up to 256 MiB free at the top of its heap, and keep at most two arenas. A parameter-server
/// shard receives a model-sized snapshot every few rounds. By default glibc raises its mmap threshold to the
/// largest block freed (up to 32 MiB), after which such blocks come from its arenas and the
/// memory they leave behind stays with the process. 4 MiB is above BytePS's partitions
/// (4,096,000 bytes, the job's default), so the buffers of every round still come from the
/// arenas and are reused.
///
/// Fixing the mmap threshold also fixes the trim threshold at 128 KiB, which shrinks and
/// regrows the heap every round; hence a high one (64 MiB when these were measured, 256 MiB
/// since: below). Measured on the churn benchmark's calm arm (8 workers, 2 shards, MNIST
/// MLP, 20 epochs, docs/benchmarks.md):
/// - glibc's default: shard 0 at 113–153 MB after a minute, 119–184 MB at the end; 95–98 s.
/// - these settings: shard 0 flat at 36–38 MB, shard 1 at 138–142 MB; 95–97 s.
/// - a 1 MiB threshold alone: 33–36 MB, but rounds 10% slower (104–108 s). Every
///   partition-sized buffer was mapped, faulted in and unmapped each round, and the heap
///   trimmed.
///
/// Two arenas: glibc gives each thread that meets contention an arena of its own (up to 8 per
/// core), and a shard's threads (the runtime's, the blocking pool's that decode pushes) came
/// to 16 arenas, each holding on to its own peak. Calm arm, 30 epochs (malloc_stats from a
/// debugger, resident memory by churn.py): shard 1 held 55 MB in use in 166 MB of arenas,
/// 140–145 MB resident; a malloc_trim called then returned 8 MB of it. With two arenas:
/// 83–84 MB resident (shard 0 35–37 MB, as before), in the same time (134.7 s against
/// 135.4 s).
///
/// Training gains too: the engine allocates a fresh tensor per op, and with glibc's default
/// trim threshold the heap shrank and regrew around the CPU path's megabyte-sized tensors,
/// every block paid in page faults again. 30 GPT steps on the CPU path (`murmur train --model
/// gpt --device cpu --batch 32 --max-steps 30`, 2-core Intel Xeon, alternating): 9.5 and 8.7 s
/// with glibc's defaults, 7.8 and 6.8 s with a 64 MiB trim threshold, the same peak resident
/// memory (116 MB). Once the CPU path's kernels got faster, 64 MiB trimmed too: a GPT step
/// frees more than that at the top of the heap, and the next step faulted it in again.
/// `murmur bench train --models cnn,gpt` (same machine, two rounds): GPT 9.06 and 8.78
/// steps/s with 64 MiB, 11.39 and 11.70 with 256 MiB; the CNN 17.2 and 18.4, 19.1 and 18.3;
/// peak resident memory 113 MB in every run. (A 32 MiB mmap threshold beside the 256 MiB
/// gave the CNN another 3–5% then, and more since: [`keep_large_blocks_for_reuse`], the
/// choice for training processes; it would take model-sized snapshots back into a shard's
/// arenas, above.) A shard also runs [`trim_free_memory_every`], which hands
/// free pages back whatever the threshold.
///
/// Process-wide, so it is the program's choice: `murmur server` makes it; a program that
/// embeds a shard may call it first thing. Elsewhere than glibc it does nothing.
pub fn return_large_frees_to_the_system() {
    set_glibc_thresholds(4 << 20);
}

/// The choice for a process that trains: as [`return_large_frees_to_the_system`], but blocks
/// up to 32 MiB (glibc's largest mmap threshold) come from the arenas and are reused. The
/// engine allocates a fresh tensor per op, and a CPU step of the CNN frees and allocates again
/// blocks of 6.4 MB (the first convolution's output, the first pooling's gradient) and 14 MB
/// (the second convolution's im2col). Mapped on their own, each was unmapped when freed and
/// faulted in again, zero-filled a page at a time, in the next step: about 1,900 faults a
/// step, and the first pooling's gradient took 10 ms instead of 2.3 (a throwaway per-op
/// timer). `murmur bench train --device cpu --models cnn --min-seconds 2` under `perf stat -e
/// minor-faults`, alternating with the 4 MiB threshold (2-core Intel Xeon, four rounds): 24.8,
/// 26.0, 23.4, 27.3 steps/s and 457,000–576,000 faults a run with 4 MiB; 30.7, 29.9, 30.2,
/// 33.8 and 17,200 with 32 MiB. The GPT's blocks are all below 4 MiB: 15.1 and 16.0 steps/s
/// (means of six rounds), the host's noise. docs/benchmarks.md has the rest.
///
/// `murmur` makes it for every command but `server`; a program that embeds a training node
/// may call it first thing. Elsewhere than glibc it does nothing.
pub fn keep_large_blocks_for_reuse() {
    set_glibc_thresholds(32 << 20);
}

fn set_glibc_thresholds(mmap_threshold: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it refuses a value it cannot take.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, mmap_threshold);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = mmap_threshold;
}

/// Starts a thread that hands the allocator's free pages back to the system every `period`
/// (glibc's `malloc_trim`, which releases the free pages inside its arenas too, not only at the
/// top of its heap). A shard's arenas fragment: over 2.5 minutes of the churn benchmark's calm
/// swarm, shard 0 held a flat 15 MB in use while its arenas grew from 25 to 28 MB, and its
/// resident memory from 35 to 38.5 MB. Trimming every 5 s kept its arenas at 23–25 MB, at no
/// cost in round time (154.8 s against 156.2 s for the same job); docs/benchmarks.md.
///
/// Process-wide like [`return_large_frees_to_the_system`], so the program's choice; elsewhere
/// than glibc the thread is not started.
pub fn trim_free_memory_every(period: std::time::Duration) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let spawned = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(move || loop {
                std::thread::sleep(period);
                // SAFETY: malloc_trim only returns free pages; it touches no live block.
                unsafe {
                    libc::malloc_trim(0);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "could not start the thread that trims the allocator's free memory: {e}"
            );
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = period;
}
