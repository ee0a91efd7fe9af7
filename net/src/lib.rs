//! murmur-net: nodes that find each other, prove they belong to the swarm, and move framed,
//! compressed tensors over QUIC. It knows nothing of autodiff: it implements the engine's
//! `Collective` over the parameter-server protocol, with the servers' arithmetic taken from
//! the engine so that a run over QUIC gives the bits of the same run in-process, and the
//! engine's `StageLink` between pipeline stages.

#![warn(missing_docs)]

pub mod error;
#[cfg(target_os = "linux")]
pub mod goodput;
pub mod identity;
pub mod log;
pub mod nat;
#[cfg(target_os = "linux")]
mod netns;
pub mod ps;
pub mod relay;
pub mod shape;
#[cfg(target_os = "linux")]
pub mod shaped_path;
pub mod signing;
pub mod socket_buffers;
pub mod stage;
pub mod state_file;
pub mod throughput;
pub mod ticket;
pub mod tls;
pub mod tolerant;
pub mod transport;
pub mod wire;
pub mod word;

pub use error::{NetError, Result};
pub use murmur_engine as engine;
