//! Process set-up that belongs to the binary, not the library.

use tracing_subscriber::EnvFilter;

pub use murmur_node::platform::quiet_mesa_wsi;

/// Logs to stderr at the level in `MURMUR_LOG`, else at the command's default.
pub fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_env("MURMUR_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
