//! Nodes as child processes (what the launchers do when they are given a binary to run):
//! children that die with the launcher, each logging to a file whose end is shown when it
//! fails.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::error::{NodeError, Result};

/// Child processes by name, killed if the launcher stops early.
pub struct Children(pub Vec<(String, Child)>);

impl Children {
    /// Waits for every child whose name starts with `prefix`; the first failure is an error.
    pub fn wait_for(&mut self, prefix: &str) -> Result<()> {
        for (name, child) in self.0.iter_mut().filter(|(n, _)| n.starts_with(prefix)) {
            let status = child
                .wait()
                .map_err(|e| NodeError::io(format!("waiting for {name}"), e))?;
            if !status.success() {
                return Err(NodeError::Thread(format!("{name} failed with {status}")));
            }
        }
        Ok(())
    }
}

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
pub fn spawn_logged(exe: &Path, args: &[String], log: &Path) -> Result<Child> {
    let log_file = std::fs::File::create(log)
        .map_err(|e| NodeError::io(format!("creating {}", log.display()), e))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .map_err(|e| NodeError::io(format!("starting {}", exe.display()), e))
}
