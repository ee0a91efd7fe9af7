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
