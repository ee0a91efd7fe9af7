//! Network namespaces for the tests and benchmarks that build paths between them (the
//! shaped path, the NAT lab): running a closure inside one, and running the iproute2 and
//! nftables tools with errors that say what is missing. Linux only, as root.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

use crate::error::{NetError, Result};

/// Runs `program` (from the Debian package `package`) with `args`, and `input` on its stdin,
/// for `who` (as errors name it: "a shaped path", "a NAT lab"); fails with the tool's own
/// message.
pub(crate) fn run(
    who: &str,
    (program, package): (&str, &str),
    args: &[&str],
    input: Option<&str>,
) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            NetError::Connection(format!(
                "{who} needs {package} (apt-get install {package}): {e}"
            ))
        })?;
    let mut stdin = child.stdin.take().expect("piped");
    if let Some(input) = input {
        stdin.write_all(input.as_bytes())?;
    }
    drop(stdin);
    let out = child.wait_with_output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetError::Connection(format!(
        "{program} {}: {} ({who} needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Runs `f` on a thread inside the network namespace `ns` (made with `ip netns add`).
pub(crate) fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let handle = File::open(format!("/var/run/netns/{ns}"))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns on a handle of a network namespace moves only the calling thread,
            // which ends when `f` returns.
            if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(NetError::Connection(format!("a thread in {ns} panicked"))))
    })
}
