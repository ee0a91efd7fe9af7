//! Process set-up that belongs to the binary, not the library.

use tracing_subscriber::EnvFilter;

pub use murmur_node::platform::quiet_mesa_wsi;

/// Logs to stderr at the level in `RUST_LOG` (tracing's env-filter syntax, as in any Rust
/// program: `RUST_LOG=debug`, `RUST_LOG=murmur_net=trace`), else at the command's default.
/// A `RUST_LOG` that does not parse is said, not silently ignored.
pub fn init_logging(default_filter: &str) {
    let filter = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("murmur: warning: ignoring RUST_LOG={spec:?}: {e}");
            EnvFilter::new(default_filter)
        }),
        Err(_) => EnvFilter::new(default_filter),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
