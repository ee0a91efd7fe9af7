//! murmur: train neural networks together over the internet on ordinary GPUs.
//!
//! This facade re-exports the two crates a program embeds: [`engine`] (GPU runtime, autodiff,
//! models, codecs, algorithms) and [`net`] (QUIC transport and parameter servers).

pub use murmur_engine as engine;
pub use murmur_net as net;
