//! Command batching: dispatches are recorded into one open compute pass and submitted together.
//!
//! One submit per op costs a driver round trip each (tens of microseconds on real drivers, far
//! more through lavapipe); a training step instead becomes a handful of submits. Kernel
//! parameters go into a uniform "arena": each dispatch gets a 256-byte slot, written to the GPU
//! with one `write_buffer` just before the batch is submitted (queue writes are ordered before
//! the command buffers of the same submit).

/// Bytes reserved per dispatch for its parameter block.
pub const PARAM_SLOT: u64 = 256;
/// Dispatches per batch before the recorder flushes on its own.
pub const SLOTS: u64 = 1024;

pub struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<u8>,
    pub(super) params_buffer: wgpu::Buffer,
    /// Command buffers submitted so far, and dispatches recorded so far.
    pub(super) submits: u64,
    pub(super) dispatches: u64,
}

impl Recorder {
    pub fn new(device: &wgpu::Device) -> Self {
        let params_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("murmur kernel params"),
            size: PARAM_SLOT * SLOTS,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Self {
            encoder: None,
            pass: None,
            params: Vec::new(),
            params_buffer,
            submits: 0,
            dispatches: 0,
        }
    }

    /// True when the parameter arena has no slot left for another dispatch.
    pub fn params_full(&self) -> bool {
        self.params.len() as u64 >= PARAM_SLOT * SLOTS
    }

    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("murmur batch"),
            })
        })
    }

    /// Stores a parameter block and returns its byte offset in the arena.
    pub fn push_params(&mut self, bytes: &[u8]) -> u64 {
        assert!(
            bytes.len() as u64 <= PARAM_SLOT,
            "kernel parameter block over {PARAM_SLOT} bytes"
        );
        let offset = self.params.len() as u64;
        self.params.extend_from_slice(bytes);
        self.params.resize((offset + PARAM_SLOT) as usize, 0);
        offset
    }

    /// The open compute pass, beginning one if needed.
    pub fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.dispatches += 1;
        self.pass.as_mut().expect("pass just opened")
    }

    /// The encoder for a transfer command (copy, clear): closes the open compute pass first.
    pub fn transfer(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder(device)
    }

    /// Submits everything recorded so far.
    pub fn flush(&mut self, queue: &wgpu::Queue) {
        self.pass = None;
        if let Some(encoder) = self.encoder.take() {
            if !self.params.is_empty() {
                queue.write_buffer(&self.params_buffer, 0, &self.params);
            }
            queue.submit([encoder.finish()]);
            self.submits += 1;
        }
        self.params.clear();
    }
}
