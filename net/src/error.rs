//! The networking crate's error type.

/// Everything that can go wrong in murmur-net.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Credentials missing, unreadable or not from this swarm.
    #[error("credentials: {0}")]
    Identity(String),
    /// A frame or control message that does not decode.
    #[error("bad frame: {0}")]
    Wire(String),
    /// The peer broke the protocol (unknown key, wrong size, old step, ...).
    #[error("protocol: {0}")]
    Protocol(String),
    /// QUIC or TLS failure, or a peer gone.
    #[error("connection: {0}")]
    Connection(String),
    /// A shard's state folder could not be written, or holds files that are damaged or
    /// belong to another shard or job.
    #[error("shard state: {0}")]
    State(String),
    /// A round did not complete in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// An error from the engine (a codec, a tensor or a collective), passed through unchanged.
    #[error(transparent)]
    Engine(#[from] murmur_engine::Error),
    /// An operating-system I/O error, such as binding a socket or reading a credential file.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The result type of this crate, with [`NetError`] as its default error.
pub type Result<T, E = NetError> = std::result::Result<T, E>;

impl From<NetError> for murmur_engine::Error {
    fn from(e: NetError) -> Self {
        match e {
            NetError::Engine(e) => e,
            other => murmur_engine::Error::Data(other.to_string()),
        }
    }
}
