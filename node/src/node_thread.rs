//! The thread a long-running node (a server shard, a rendezvous) serves on, joined once: by
//! its handle's `join`, or when the handle is dropped.

use std::thread::JoinHandle;

use crate::error::{NodeError, Result};
use crate::worker::panic_message;

/// A node's serving thread, until it is joined.
pub(crate) struct NodeThread(Option<JoinHandle<Result<()>>>);

impl NodeThread {
    pub(crate) fn new(handle: JoinHandle<Result<()>>) -> NodeThread {
        NodeThread(Some(handle))
    }

    /// Waits for the thread to end and gives its result (a panic as an error); `Ok` once
    /// joined already.
    pub(crate) fn join(&mut self) -> Result<()> {
        match self.0.take() {
            None => Ok(()),
            Some(t) => t.join().map_err(|p| NodeError::Thread(panic_message(&p)))?,
        }
    }
}
