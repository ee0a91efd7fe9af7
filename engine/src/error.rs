//! The engine's error type. Every fallible public function returns [`Result`].

use std::fmt;

/// Everything that can go wrong inside the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable GPU adapter: the message says how to get one.
    #[error("{0}")]
    NoAdapter(String),
    /// The adapter refused to give us a device.
    #[error("could not open the GPU device: {0}")]
    RequestDevice(String),
    /// A GPU-side failure: validation error, device loss, map failure.
    #[error("GPU error: {0}")]
    Gpu(String),
    /// Operands whose shapes do not fit the operation.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// The operation that failed.
        op: &'static str,
        /// The shapes involved and why they do not fit.
        detail: String,
    },
    /// An operand of the wrong element type.
    #[error("{op} expects {expected} elements, got {got}")]
    DType {
        /// The operation that failed.
        op: &'static str,
        /// The element type it expects.
        expected: DTypeName,
        /// The element type it was given.
        got: DTypeName,
    },
    /// Operands that live on different devices.
    #[error("{op}: operands live on different devices ({a} and {b}); move them with Tensor::to")]
    DeviceMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The device of the first operand.
        a: String,
        /// The device of the second operand.
        b: String,
    },
    /// Bad or missing data files.
    #[error("{0}")]
    Data(String),
    /// A compressed payload that does not decode: wrong length, bad header, values out of range.
    #[error("bad {codec} payload: {detail}")]
    Payload {
        /// The codec whose payload it is.
        codec: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A gradient holding NaN or infinite values. It is a local fault (a learning rate too
    /// high, bad input data, a faulty device), so it is reported, never sent: a peer cannot
    /// tell a fault from an update, and one non-finite value would poison every replica.
    #[error(
        "round {round}: the gradient holds {count} non-finite values (NaN or infinity), the \
         first in parameter {tensor}; this is a fault of this node (a learning rate too high, \
         bad input data or a faulty device), so it is not sent"
    )]
    NonFinite {
        /// The round whose gradient it is.
        round: u64,
        /// How many values are not finite.
        count: usize,
        /// The first parameter tensor holding one.
        tensor: usize,
    },
    /// A configuration value that cannot work.
    #[error("{0}")]
    Config(String),
    /// An I/O error reading data files or checkpoints.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Element type name used in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DTypeName(pub &'static str);

impl fmt::Display for DTypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The result type of the engine, with [`Error`] as its default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for a shape error.
pub(crate) fn shape_err<T>(op: &'static str, detail: impl Into<String>) -> Result<T> {
    Err(Error::Shape {
        op,
        detail: detail.into(),
    })
}
