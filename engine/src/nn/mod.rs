//! Neural-network building blocks. A module owns its parameter tensors and records its
//! forward pass on a [`Graph`](crate::Graph); initialisation is seeded and done on the CPU,
//! so the same seed gives the same bits on every device.

mod attention;
mod cnn;
mod conv;
mod gpt;
mod init;
mod linear;
mod mlp;
mod norm;

pub use attention::{Block, CausalSelfAttention, DropoutPlan};
pub use cnn::{Cnn, CnnConfig};
pub use conv::Conv2d;
pub use gpt::{Gpt, GptConfig};
pub use init::{normal, uniform};
pub use linear::Linear;
pub use mlp::{Activation, Mlp};
pub use norm::LayerNorm;

use crate::tensor::Tensor;

/// Something with trainable parameters, listed in a fixed order.
pub trait Module {
    /// The parameters, in the module's fixed order (the order checkpoints and optimizers rely on).
    fn parameters(&self) -> Vec<&Tensor>;
    /// The same parameters as [`Module::parameters`], in the same order, mutably.
    fn parameters_mut(&mut self) -> Vec<&mut Tensor>;

    /// Total number of trainable scalars.
    fn parameter_count(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }

    /// Every parameter's bits in order, read back at once: what determinism tests compare.
    fn parameter_bits(&self) -> crate::Result<Vec<u32>> {
        Ok(Tensor::read_many(&self.parameters())?
            .into_iter()
            .flatten()
            .map(f32::to_bits)
            .collect())
    }
}
