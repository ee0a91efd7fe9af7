//! murmur-engine: the GPU runtime, WGSL kernels with their CPU references, autodiff, models,
//! optimizers, codecs and data loading that a murmur node trains with.
//!
//! The engine knows nothing of sockets: distributed algorithms talk to the `Collective` and
//! `StageLink` traits, which `murmur-net` implements over QUIC.

pub mod error;
pub mod gpu;
pub mod rng;

pub use error::{Error, Result};
pub mod kernels;
pub mod tensor;

pub use tensor::{DType, Device, Tensor};
