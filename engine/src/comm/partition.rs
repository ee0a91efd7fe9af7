//! Cutting parameter tensors into keyed partitions (byteps-clan.md §5.2).

use super::{Key, KeySpec, PLAIN};

/// How gradients are cut and compressed.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionPlan {
    /// Largest partition, in bytes of f32 (BytePS default 4,096,000).
    pub partition_bytes: usize,
    /// Tensors smaller than this travel as f32, without memory (BytePS default 1,024,000).
    pub min_compress_bytes: usize,
    /// Codec spec of worker pushes for compressed partitions.
    pub push: String,
    /// Codec spec of the servers' reply for compressed partitions.
    pub pull: String,
    /// The servers' error-feedback memory spec for compressed partitions.
    pub server_memory: String,
    /// Seed of the stochastic codecs.
    pub seed: u64,
}

impl Default for PartitionPlan {
    fn default() -> Self {
        PartitionPlan {
            partition_bytes: 4_096_000,
            min_compress_bytes: 1_024_000,
            push: PLAIN.into(),
            pull: PLAIN.into(),
            server_memory: "none".into(),
            seed: 0,
        }
    }
}

/// One partition of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The partition's collective key, from [`key_of`].
    pub key: Key,
    /// Index of the tensor among the model's parameters.
    pub tensor: usize,
    /// Index of the partition's first element within its tensor.
    pub offset: usize,
    /// Number of elements in the partition.
    pub len: usize,
    /// Whether it goes through the codecs (else f32, no memory).
    pub compressed: bool,
}

/// The key of partition `partition` of tensor `tensor`: `(tensor << 16) | partition`, so a tensor
/// may have at most 65,536 partitions.
pub fn key_of(tensor: usize, partition: usize) -> Key {
    ((tensor as u64) << 16) | partition as u64
}

impl PartitionPlan {
    /// Partitions of tensors with `sizes` elements each, in order.
    pub fn partitions(&self, sizes: &[usize]) -> Vec<Partition> {
        let per = (self.partition_bytes / 4).max(1);
        let mut out = vec![];
        for (t, &n) in sizes.iter().enumerate() {
            let compressed = 4 * n >= self.min_compress_bytes;
            let parts = n.div_ceil(per).max(1);
            for p in 0..parts {
                let offset = p * per;
                out.push(Partition {
                    key: key_of(t, p),
                    tensor: t,
                    offset,
                    len: per.min(n - offset),
                    compressed,
                });
            }
        }
        out
    }

    /// The key specs every rank registers.
    pub fn key_specs(&self, parts: &[Partition]) -> Vec<KeySpec> {
        parts
            .iter()
            .map(|p| {
                let spec = KeySpec {
                    key: p.key,
                    numel: p.len as u32,
                    push: self.push.clone(),
                    pull: self.pull.clone(),
                    server_memory: self.server_memory.clone(),
                    seed: self.seed,
                    sync_every: 0,
                    owner: String::new(),
                };
                if p.compressed {
                    spec
                } else {
                    spec.uncompressed()
                }
            })
            .collect()
    }
}

/// The server shard that owns `key`, by the djb2 hash BytePS uses.
pub fn shard_of(key: Key, shards: usize) -> usize {
    let mut h: u64 = 5381;
    for b in key.to_le_bytes() {
        h = h.wrapping_mul(33) ^ b as u64;
    }
    (h % shards.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_each_tensor_exactly_with_stable_unique_keys() {
        let plan = PartitionPlan {
            partition_bytes: 4000,
            min_compress_bytes: 2000,
            ..Default::default()
        };
        let parts = plan.partitions(&[2500, 100, 1000, 0]);
        // 2500 floats in partitions of 1000; 100 floats uncompressed; 1000 exactly one.
        let lens: Vec<_> = parts
            .iter()
            .map(|p| (p.tensor, p.offset, p.len, p.compressed))
            .collect();
        assert_eq!(
            lens,
            [
                (0, 0, 1000, true),
                (0, 1000, 1000, true),
                (0, 2000, 500, true),
                (1, 0, 100, false),
                (2, 0, 1000, true),
                (3, 0, 0, false)
            ]
        );
        let mut keys: Vec<_> = parts.iter().map(|p| p.key).collect();
        keys.dedup();
        assert_eq!(keys.len(), parts.len());
        assert_eq!(plan.partitions(&[2500, 100, 1000, 0]), parts, "stable");
        assert_eq!(key_of(2, 1), 0x2_0001);
        // Keys spread over shards.
        let used: std::collections::HashSet<_> =
            (0..64).map(|t| shard_of(key_of(t, 0), 4)).collect();
        assert_eq!(used.len(), 4);
    }
}
