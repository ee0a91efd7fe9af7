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

/// Has glibc's allocator hand every block of 1 MiB or more straight back to the system when
/// it is freed. A parameter-server shard receives a model-sized snapshot every few rounds
/// and decodes partition-sized pushes every round; by default glibc raises its mmap
/// threshold to the largest block freed (up to 32 MiB), after which such blocks come from
/// its arenas, and the memory they leave behind stays with the process. Measured on the
/// churn benchmark's calm arm (8 workers, 2 shards, 40 epochs, docs/benchmarks.md): with
/// glibc's default shard 0 grew 148 → 190 MB and shard 1 106 → 114 MB over three minutes;
/// with 1 MiB they held 32–35 MB and 74 → 54 MB, at the same round time; with 4 MiB (the
/// largest partition kept in the arenas) shard 1 still grew, 74 → 89 MB. Process-wide, so it
/// is the program's choice: `murmur server` makes it; a program that embeds a shard may call
/// it first thing. Elsewhere than glibc it does nothing.
pub fn return_large_frees_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it refuses a value it cannot take.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}
