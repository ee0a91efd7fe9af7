//! A pool of GPU buffers reused across training steps.
//!
//! Allocating a wgpu buffer costs a driver call and often a page-table update; a training step
//! allocates the same activations every iteration. Buffers are rounded up to a size class
//! (powers of two split into quarters, so at most 25% is wasted) and returned to a free list
//! when their last handle drops.
//!
//! Reuse is safe without fences because every use of a pooled buffer is ordered on the one
//! queue: a buffer freed by a recorded-but-unsubmitted dispatch can be handed out again only to
//! later dispatches in the same or a later submission, and uploads flush pending work first
//! (see `Gpu::upload`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Smallest allocation; also keeps zero-length tensors bindable.
const MIN_BYTES: u64 = 256;

/// Rounds `bytes` up to its size class.
pub fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(MIN_BYTES);
    let pow = b.next_power_of_two();
    if pow <= 1024 {
        return pow;
    }
    // Quarter steps between pow/2 and pow.
    let quarter = pow / 8;
    b.div_ceil(quarter) * quarter
}

type Key = (u64, u32);

#[derive(Default)]
struct Free {
    lists: HashMap<Key, Vec<wgpu::Buffer>>,
    cached_bytes: u64,
    live_bytes: u64,
}

/// Shared state between the pool and the buffers it handed out.
pub struct BufferPool {
    device: wgpu::Device,
    free: Mutex<Free>,
}

/// A pooled buffer. Dropping it returns the allocation to the pool.
pub struct PooledBuffer {
    buffer: Option<wgpu::Buffer>,
    usage: wgpu::BufferUsages,
    pool: Weak<BufferPool>,
}

impl PooledBuffer {
    pub fn raw(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("buffer present until drop")
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else {
            return;
        };
        if let Some(pool) = self.pool.upgrade() {
            let mut free = pool.free.lock().expect("pool lock");
            let size = buffer.size();
            free.live_bytes -= size;
            free.cached_bytes += size;
            free.lists
                .entry((size, self.usage.bits()))
                .or_default()
                .push(buffer);
        }
    }
}

/// Memory held by the pool, for progress displays and leak checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes in buffers that are handed out.
    pub live_bytes: u64,
    /// Bytes in buffers waiting for reuse.
    pub cached_bytes: u64,
}

impl BufferPool {
    pub fn new(device: wgpu::Device) -> Arc<Self> {
        Arc::new(Self {
            device,
            free: Mutex::new(Free::default()),
        })
    }

    /// A buffer of at least `bytes` bytes with exactly `usage`.
    pub fn get(self: &Arc<Self>, bytes: u64, usage: wgpu::BufferUsages) -> PooledBuffer {
        let size = size_class(bytes);
        let reused = {
            let mut free = self.free.lock().expect("pool lock");
            let hit = free.lists.get_mut(&(size, usage.bits())).and_then(Vec::pop);
            if hit.is_some() {
                free.cached_bytes -= size;
            }
            free.live_bytes += size;
            hit
        };
        let buffer = reused.unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("murmur pooled"),
                size,
                usage,
                mapped_at_creation: false,
            })
        });
        PooledBuffer {
            buffer: Some(buffer),
            usage,
            pool: Arc::downgrade(self),
        }
    }

    pub fn stats(&self) -> PoolStats {
        let free = self.free.lock().expect("pool lock");
        PoolStats {
            live_bytes: free.live_bytes,
            cached_bytes: free.cached_bytes,
        }
    }

    /// Releases every cached buffer back to the driver.
    pub fn trim(&self) {
        let mut free = self.free.lock().expect("pool lock");
        free.lists.clear();
        free.cached_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
        assert_eq!(size_class(4096), 4096);
        for bytes in [1u64, 300, 1000, 5000, 123_457, 4_096_000, 47_040_016] {
            let c = size_class(bytes);
            assert!(c >= bytes, "{bytes} -> {c}");
            let bound = if bytes <= 1024 {
                (2 * bytes).max(256)
            } else {
                (bytes * 5).div_ceil(4)
            };
            assert!(
                c <= bound,
                "{bytes} -> {c} wastes more than the class spacing allows"
            );
            assert_eq!(c % 4, 0);
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }
}
