//! What the launchers (`murmur swarm`, `murmur pipeline`) share: child processes that die with
//! the launcher, each logging to a file whose end is shown when it fails.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// Child processes by name, killed if the launcher stops early.
pub struct Children(pub Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The last lines of a log, to show with a failure.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Starts `exe args` with stdout piped to the launcher and stderr to `log`.
pub fn spawn_logged(exe: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))
}
