//! How `murmur` ends: one exit code per kind of ending, so that scripts can tell a mistake
//! in the command line from a job that failed and from an interruption.
//!
//! - 0: the command did what was asked.
//! - 1: the job failed (a peer, the GPU, the data, the disk).
//! - 2: the command line (or a job file) asked for something murmur refuses, found before
//!   any work began; clap's own refusals use the same code.
//! - 128 + N: stopped by signal N (130 for SIGINT, 143 for SIGTERM), after stopping
//!   gracefully.

use std::fmt;

/// Exit code of a failed job.
pub const FAILED: i32 = 1;
/// Exit code of a refused command line.
pub const USAGE: i32 = 2;

/// A refusal of what the command line asks, found before any work began.
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A refusal of the command line, as an error to return.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Usage(message.into()).into()
}

/// The command stopped early because a signal asked it to.
#[derive(Debug)]
pub struct Interrupted {
    /// The signal's number.
    pub signal: i32,
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "interrupted by {}", signal_name(self.signal))
    }
}

impl std::error::Error for Interrupted {}

/// A signal's usual name.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// The exit code for an error: anything in its chain that says what kind of ending it is.
pub fn code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(i) = cause.downcast_ref::<Interrupted>() {
            return 128 + i.signal;
        }
        if cause.is::<Usage>() {
            return USAGE;
        }
        // The node's engine errors are transparent: their cause is not a link of the chain.
        if let Some(
            murmur_node::NodeError::Job(_)
            | murmur_node::NodeError::Config(_)
            | murmur_node::NodeError::Engine(murmur_engine::Error::Config(_)),
        ) = cause.downcast_ref::<murmur_node::NodeError>()
        {
            return USAGE;
        }
        if let Some(murmur_engine::Error::Config(_)) = cause.downcast_ref::<murmur_engine::Error>()
        {
            return USAGE;
        }
    }
    FAILED
}
