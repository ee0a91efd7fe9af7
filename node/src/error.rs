//! The node library's error type.

use thiserror::Error;

/// What can go wrong in a node. Every message says what happened and, where it can, what to do.
#[derive(Debug, Error)]
pub enum NodeError {
    /// The job cannot be run as described (a bad field, or this build cannot run it).
    #[error("job: {0}")]
    Job(String),
    /// An address that does not parse or resolve.
    #[error("address {0}")]
    Address(String),
    /// A config field out of its range.
    #[error("config: {0}")]
    Config(String),
    /// Reading or writing a file.
    #[error("{0}")]
    Io(String),
    /// The GPU runtime, the model or a codec.
    #[error(transparent)]
    Engine(#[from] murmur_engine::Error),
    /// The network: connections, the protocol, time-outs.
    #[error(transparent)]
    Net(#[from] murmur_net::NetError),
    /// A failure at a known place of a run (which stage, which step). The message holds
    /// what happened, so it is not also given as the error's source (a chain printed in full
    /// would say it twice).
    #[error("{at}: {what}")]
    At {
        /// Where it happened, in words.
        at: String,
        /// What happened.
        what: Box<NodeError>,
    },
    /// This worker's replica differs from the one most of the swarm's workers hold: a fault
    /// of this machine or of murmur. The worker stops rather than send the swarm a wrong
    /// model (its snapshots, its evaluations).
    #[error("this worker's replica differs from the swarm's as it enters round {step} (digest {digest:016x}, {majority}): a fault of this machine (memory, GPU driver) or of murmur, so it stops rather than hand the swarm a wrong model; start it again without its state file to rejoin from a snapshot")]
    Diverged {
        /// The round it entered with the differing replica.
        step: u64,
        /// Its replica's digest.
        digest: u64,
        /// The majority's digest, in words (or that there was none).
        majority: String,
    },
    /// A stop came before the worker had joined its job.
    #[error("stopped before joining the job")]
    Stopped,
    /// The node's thread ended without a result (it panicked).
    #[error("the node's thread ended abnormally: {0}")]
    Thread(String),
}

impl NodeError {
    /// This error, said to have happened `at` a place of a run.
    pub fn at(self, at: impl Into<String>) -> NodeError {
        NodeError::At {
            at: at.into(),
            what: Box::new(self),
        }
    }

    pub(crate) fn io(what: impl std::fmt::Display, e: std::io::Error) -> NodeError {
        NodeError::Io(format!("{what}: {e}"))
    }
}

/// The node library's result.
pub type Result<T> = std::result::Result<T, NodeError>;
