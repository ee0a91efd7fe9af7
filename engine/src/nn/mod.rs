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
use linear::linear_count;
pub use linear::Linear;
pub use mlp::{Activation, Mlp};
pub use norm::LayerNorm;

use crate::tensor::Tensor;

/// Something with trainable parameters, listed in a fixed order under stable names.
///
/// The names are what checkpoints store the parameters under; each container builds its
/// children's names with [`prefixed`] (`layers.0.weight`, `blocks.1.attn.query.bias`), so the
/// names come from the module tree itself and cannot drift from the order.
pub trait Module {
    /// The parameters with their names, in the module's fixed order (the order optimizers,
    /// flat gradient vectors and data-parallel keys rely on).
    fn named_parameters(&self) -> Vec<(String, &Tensor)>;
    /// The same parameters as [`Module::named_parameters`], in the same order, mutably.
    fn parameters_mut(&mut self) -> Vec<&mut Tensor>;

    /// The parameters in [`Module::named_parameters`]' order, without their names.
    fn parameters(&self) -> Vec<&Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// The parameters' names, in order.
    fn parameter_names(&self) -> Vec<String> {
        self.named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

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

    /// The 64-bit XXH3 hash of every parameter's bits, in order, as little-endian f32: what
    /// the replicas of a swarm compare each round. A hash of the bytes, so that no pattern of
    /// differing bits cancels out; not a cryptographic one (a worker reports its own digest,
    /// so strength against forgery would buy nothing), and fast enough for every round.
    fn parameter_digest(&self) -> crate::Result<u64> {
        Ok(digest_of_values(Tensor::read_many(&self.parameters())?))
    }
}

/// [`Module::parameter_digest`] of parameters whose values are `tensors`, in order.
pub fn digest_of_values<V: AsRef<[f32]>>(tensors: impl IntoIterator<Item = V>) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for values in tensors {
        let values = values.as_ref();
        if cfg!(target_endian = "little") {
            hasher.update(bytemuck::cast_slice::<f32, u8>(values));
        } else {
            values.iter().for_each(|v| hasher.update(&v.to_le_bytes()));
        }
    }
    hasher.digest()
}

/// `child`'s named parameters under `prefix` (`prefix.name`): how a container names its
/// children's parameters.
pub fn prefixed<'a>(prefix: &str, child: &'a dyn Module) -> Vec<(String, &'a Tensor)> {
    child
        .named_parameters()
        .into_iter()
        .map(|(name, t)| (format!("{prefix}.{name}"), t))
        .collect()
}
