//! Printing what a command produces on stdout so that a reader that stops early (`| head`)
//! ends the command quietly, as it ends any Unix tool, instead of a panic or an error.

use std::io::Write;

/// Writes `bytes` to stdout; a closed pipe counts as done.
pub fn print(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
