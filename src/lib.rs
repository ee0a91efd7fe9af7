//! murmur: train neural networks together over the internet on ordinary GPUs.
//!
//! This facade re-exports the crates a program embeds: [`node`] (workers, servers and a local
//! swarm, started with one call and steered through a handle), [`engine`] (GPU runtime, autodiff,
//! models, codecs, algorithms) and [`net`] (QUIC transport and parameter servers).

pub use murmur_engine as engine;
pub use murmur_net as net;
pub use murmur_node as node;
