//! Nodes as child processes (what the launchers do when they are given a binary to run):
//! children that die with the launcher, each logging to a file whose end is shown when it
//! fails.
//!
//! Children run in a process group of their own, so that a Ctrl-C at the terminal reaches
//! only the launcher, which stops them in order ([`Children::terminate`]). On Linux each
//! child also asks the kernel for SIGTERM when the launcher dies, so that not even a
//! `kill -9` of the launcher leaves nodes running.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

impl Children {
    /// How the child named `name` ended, if it has (it is reaped, not forgotten).
    pub fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let (_, child) = self.0.iter_mut().find(|(n, _)| n == name)?;
        child.try_wait().ok().flatten()
    }

    /// Kills the child named `name` with SIGKILL (if it still runs), reaps it and forgets it.
    pub fn kill(&mut self, name: &str) {
        self.0.retain_mut(|(n, child)| {
            if n != name {
                return true;
            }
            let _ = child.kill();
            let _ = child.wait();
            false
        });
    }

    /// Stops the children whose names start with `prefix`: SIGTERM (a graceful stop: a
    /// worker finishes its round and writes its checkpoint), then SIGKILL for any still
    /// running after `grace`. Returns how many had to be killed.
    pub fn terminate(&mut self, prefix: &str, grace: Duration) -> usize {
        let mut chosen: Vec<&mut Child> = (self.0.iter_mut())
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, child)| child)
            .collect();
        for child in chosen.iter_mut() {
            ask_to_stop(child);
        }
        let deadline = Instant::now() + grace;
        let mut killed = 0;
        for child in chosen {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        killed += 1;
                        break;
                    }
                }
            }
        }
        killed
    }
}

/// Sends SIGTERM (where there are signals; elsewhere the child is killed).
fn ask_to_stop(child: &mut Child) {
    #[cfg(unix)]
    {
        // A child already reaped is not signalled: its pid may belong to another process.
        if let (Ok(None), Ok(pid)) = (child.try_wait(), libc::pid_t::try_from(child.id())) {
            // SAFETY: kill(2) with a pid this process spawned and has not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    #[cfg(not(unix))]
    {
        let _ = child.kill();
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

/// Starts `exe args` with stdout piped to the launcher and stderr to `log`, which it starts
/// afresh, or goes on with when `again` (a node started again after it died).
pub fn spawn_logged(exe: &Path, args: &[String], log: &Path, again: bool) -> Result<Child> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(again)
        .truncate(!again)
        .open(log)
        .map_err(|e| NodeError::io(format!("opening {}", log.display()), e))?;
    let mut command = Command::new(exe);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file);
    die_with_launcher(&mut command);
    command
        .spawn()
        .map_err(|e| NodeError::io(format!("starting {}", exe.display()), e))
}

/// Puts the child in a process group of its own and, on Linux, has the kernel send it
/// SIGTERM when the launcher's thread that started it ends (launchers start children from
/// the thread that waits for them).
fn die_with_launcher(command: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (getpid, getppid, prctl, _exit).
        let launcher = unsafe { libc::getpid() };
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died before the request was made.
                if libc::getppid() != launcher {
                    libc::_exit(143);
                }
                Ok(())
            });
        }
    }
}
