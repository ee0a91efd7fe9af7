//! murmur-engine: the GPU runtime, WGSL kernels with their CPU references, autodiff, models,
//! optimizers, codecs and data loading that a murmur node trains with.
//!
//! The engine knows nothing of sockets: distributed algorithms talk to the `Collective` and
//! `StageLink` traits, which `murmur-net` implements over QUIC.

#![warn(missing_docs)]

pub mod algo;
pub mod autograd;
pub mod checkpoint;
pub mod comm;
pub mod compress;
pub mod cpu;
pub mod data;
pub mod error;
pub mod feedback;
pub mod gpu;
pub mod kernels;
pub mod nn;
pub mod optim;
pub mod pipeline;
pub mod rng;
pub mod saved_bytes;
pub mod shaders;
pub mod stats;
pub mod tensor;
pub mod train;

pub use autograd::{Grads, Graph, Var};
pub use error::{Error, Result};
pub use tensor::{DType, Device, Tensor};
