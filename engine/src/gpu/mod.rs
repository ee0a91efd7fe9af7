//! The GPU runtime: one device and queue, compiled pipelines, pooled buffers, batched commands.

mod adapter;
mod needs;
mod pipelines;
mod pool;
mod recorder;
mod shader;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use adapter::{parse_backend, AdapterPreference, NO_ADAPTER_HELP};
pub use needs::{KernelNeeds, KERNEL_NEEDS, WORKGROUPS_PER_DIMENSION};
pub use pipelines::Pipeline;
pub use pool::PoolStats;
pub use shader::{Override, Shader};

use crate::error::{Error, Result};
use pipelines::PipelineCache;
use pool::{BufferPool, PooledBuffer};
use recorder::{Recorder, PARAM_SLOT};

/// Usage of every tensor buffer: kernels read and write it, uploads and readbacks copy it.
const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);
const READBACK: wgpu::BufferUsages =
    wgpu::BufferUsages::MAP_READ.union(wgpu::BufferUsages::COPY_DST);

/// A region of GPU memory holding `bytes` bytes of tensor data (shared, reference counted).
#[derive(Clone)]
pub struct GpuBuf {
    inner: Arc<PooledBuffer>,
    bytes: u64,
}

impl GpuBuf {
    /// Size of the tensor data in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The wgpu buffer holding the data, for binding and copies; it may be larger than
    /// [`GpuBuf::bytes`] (pooled buffers are rounded up to a size class).
    pub fn raw(&self) -> &wgpu::Buffer {
        self.inner.raw()
    }

    /// Bytes bound to a kernel: never zero, which wgpu rejects.
    fn binding_size(&self) -> u64 {
        self.bytes.max(4)
    }

    /// Identifies the allocation while any handle to it lives.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// True when no other handle shares this buffer, so it may be written in place.
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
    }
}

/// What `murmur info` prints about the adapter.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    /// The adapter's name, vendor, backend and driver.
    pub adapter: wgpu::AdapterInfo,
    /// The limits the device was opened with.
    pub limits: wgpu::Limits,
    /// The optional features the device was opened with.
    pub features: wgpu::Features,
}

/// The GPU: device, queue and everything that makes launching kernels cheap.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: GpuInfo,
    pipelines: PipelineCache,
    pool: Arc<BufferPool>,
    recorder: Mutex<Recorder>,
    first_error: Arc<Mutex<Option<String>>>,
    id: u64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Gpu {
    /// Opens the adapter chosen by `MURMUR_ADAPTER` / `MURMUR_BACKEND`, or the best one.
    pub fn new() -> Result<Arc<Self>> {
        Self::with_preference(&AdapterPreference::from_env()?)
    }

    /// Opens the adapter that `pref` selects.
    pub fn with_preference(pref: &AdapterPreference) -> Result<Arc<Self>> {
        let instance = new_instance(pref.backends());
        let adapter = adapter::select(&instance, pref)?;
        Self::from_adapter(adapter)
    }

    /// Opens the selected adapter when it is faster than murmur's CPU path; otherwise says
    /// why the CPU path is the better device (`Ok(Err(reason))`). Software adapters
    /// (lavapipe/llvmpipe, WARP, SwiftShader: wgpu reports them as device type `Cpu`) run
    /// the WGSL kernels several times slower than the CPU path computes the same bits
    /// (docs/benchmarks.md), so they lose unless `MURMUR_ADAPTER` names one. No adapter at
    /// all is not an error here unless the environment asked for one.
    pub fn open_if_faster_than_cpu() -> Result<std::result::Result<Arc<Self>, String>> {
        let pref = AdapterPreference::from_env()?;
        let instance = new_instance(pref.backends());
        let adapter = match adapter::select(&instance, &pref) {
            Ok(adapter) => adapter,
            Err(Error::NoAdapter(_)) if pref == AdapterPreference::default() => {
                return Ok(Err("no GPU adapter with compute shaders was found".into()))
            }
            Err(e) => return Err(e),
        };
        let info = adapter.get_info();
        if info.device_type == wgpu::DeviceType::Cpu && pref.name.is_none() {
            return Ok(Err(format!(
                "the best adapter here, {} ({:?}), is a software rasteriser, slower than the CPU \
                 path at the same bits (MURMUR_ADAPTER or --device gpu still picks it)",
                info.name, info.backend
            )));
        }
        Self::from_adapter(adapter).map(Ok)
    }

    fn from_adapter(adapter: wgpu::Adapter) -> Result<Arc<Self>> {
        let info = adapter.get_info();
        let wanted = wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16;
        let features = adapter.features() & wanted;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("murmur"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::RequestDevice(format!("{} ({:?}): {e}", info.name, info.backend)))?;

        let first_error: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = first_error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!("wgpu: {e}");
            sink.lock()
                .expect("error sink")
                .get_or_insert_with(|| e.to_string());
        }));
        let sink = first_error.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if reason != wgpu::DeviceLostReason::Destroyed {
                sink.lock()
                    .expect("error sink")
                    .get_or_insert(format!("device lost ({reason:?}): {msg}"));
            }
        });
        tracing::info!(adapter = %info.name, backend = ?info.backend, "GPU opened");
        Ok(Arc::new(Self {
            pipelines: PipelineCache::new(device.clone(), cfg!(debug_assertions)),
            pool: BufferPool::new(device.clone()),
            recorder: Mutex::new(Recorder::new(&device)),
            info: GpuInfo {
                adapter: info,
                limits,
                features,
            },
            device,
            queue,
            first_error,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }))
    }

    /// What the adapter is and the limits and features in use, as `murmur info` prints them.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// A process-unique number, to tell devices apart.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Short human description, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?})",
            self.info.adapter.name, self.info.adapter.backend
        )
    }

    /// Bytes of GPU memory the buffer pool holds, handed out and cached for reuse.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Command buffers submitted and kernel dispatches recorded since the device opened.
    pub fn command_stats(&self) -> (u64, u64) {
        let rec = self.recorder.lock().expect("recorder lock");
        (rec.submits, rec.dispatches)
    }

    /// Returns cached (free) buffers to the driver, e.g. after evaluation on a larger batch.
    pub fn trim_pool(&self) {
        self.pool.trim();
    }

    /// The shaders compiled so far, by file name (`optim.wgsl`, ...), sorted: the kinds of work
    /// the device has been given.
    pub fn shaders_compiled(&self) -> Vec<&'static str> {
        self.pipelines.shaders()
    }

    /// Number of pipelines compiled so far.
    pub fn pipelines_compiled(&self) -> usize {
        self.pipelines.len()
    }

    /// Fails if the device reported a validation error or was lost.
    pub fn check(&self) -> Result<()> {
        match self.first_error.lock().expect("error sink").clone() {
            Some(e) => Err(Error::Gpu(e)),
            None => Ok(()),
        }
    }

    /// The compiled pipeline for an entry point with override constants.
    pub fn pipeline(
        &self,
        shader: &'static Shader,
        entry: &'static str,
        constants: &[(&'static str, f64)],
    ) -> Arc<Pipeline> {
        self.pipelines.get(shader, entry, constants)
    }

    /// An uninitialised buffer for `bytes` bytes of tensor data. Fails when kernels could not
    /// bind that much on this adapter.
    pub fn alloc(&self, bytes: u64) -> Result<GpuBuf> {
        let limits = &self.info.limits;
        let limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if bytes > limit {
            return Err(Error::Gpu(format!(
                "a tensor of {} MiB exceeds this adapter's largest storage binding ({} MiB); \
                 use smaller tensors or partitions",
                bytes >> 20,
                limit >> 20
            )));
        }
        let inner = Arc::new(self.pool.get(bytes.max(4), STORAGE));
        Ok(GpuBuf { inner, bytes })
    }

    /// A buffer holding `data`.
    pub fn upload(&self, data: &[u8]) -> Result<GpuBuf> {
        assert!(
            data.len().is_multiple_of(4),
            "tensor data is made of 4-byte elements"
        );
        let buf = self.alloc(data.len() as u64)?;
        if !data.is_empty() {
            // Queue writes run before any command recorded but not yet submitted; submit those
            // first so that a pooled buffer they still read is not overwritten under them.
            self.flush();
            self.queue.write_buffer(buf.raw(), 0, data);
        }
        Ok(buf)
    }

    /// A buffer of `bytes` zero bytes.
    pub fn zeros(&self, bytes: u64) -> Result<GpuBuf> {
        let buf = self.alloc(bytes)?;
        if bytes > 0 {
            let mut rec = self.recorder.lock().expect("recorder lock");
            rec.transfer(&self.device)
                .clear_buffer(buf.raw(), 0, Some(bytes.next_multiple_of(4)));
        }
        Ok(buf)
    }

    /// Records zeroing a whole buffer.
    pub fn clear(&self, buf: &GpuBuf) {
        if buf.bytes() > 0 {
            let mut rec = self.recorder.lock().expect("recorder lock");
            rec.transfer(&self.device).clear_buffer(
                buf.raw(),
                0,
                Some(buf.bytes().next_multiple_of(4)),
            );
        }
    }

    /// Records a copy of `bytes` bytes between buffers.
    pub fn copy(&self, src: &GpuBuf, src_offset: u64, dst: &GpuBuf, dst_offset: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut rec = self.recorder.lock().expect("recorder lock");
        rec.transfer(&self.device).copy_buffer_to_buffer(
            src.raw(),
            src_offset,
            dst.raw(),
            dst_offset,
            bytes,
        );
    }

    /// Records one kernel dispatch. Binding 0 of the kernel is its uniform parameter block
    /// `params`; bindings 1.. are `buffers`, in order.
    pub fn launch<P: bytemuck::Pod>(
        &self,
        pipeline: &Pipeline,
        params: &P,
        buffers: &[&GpuBuf],
        workgroups: [u32; 3],
    ) {
        if workgroups.contains(&0) {
            return;
        }
        let max = self.info.limits.max_compute_workgroups_per_dimension;
        assert!(
            workgroups.iter().all(|&w| w <= max),
            "dispatch {workgroups:?} exceeds the adapter's {max} workgroups per dimension"
        );
        let mut rec = self.recorder.lock().expect("recorder lock");
        if rec.params_full() {
            rec.flush(&self.queue);
        }
        let offset = rec.push_params(bytemuck::bytes_of(params));
        let mut entries = Vec::with_capacity(buffers.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &rec.params_buffer,
                offset,
                size: wgpu::BufferSize::new(std::mem::size_of::<P>().max(4) as u64),
            }),
        });
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.raw(),
                    offset: 0,
                    size: wgpu::BufferSize::new(b.binding_size()),
                }),
            });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&pipeline.label),
            layout: &pipeline.layout,
            entries: &entries,
        });
        let pass = rec.pass(&self.device);
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        debug_assert!(PARAM_SLOT >= std::mem::size_of::<P>() as u64);
    }

    /// Submits all recorded work.
    pub fn flush(&self) {
        self.recorder
            .lock()
            .expect("recorder lock")
            .flush(&self.queue);
    }

    /// Waits until the GPU has finished everything submitted.
    pub fn sync(&self) -> Result<()> {
        self.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))?;
        self.check()
    }

    /// Reads the contents of several buffers back with one submit and one wait.
    pub fn read_many(&self, bufs: &[&GpuBuf]) -> Result<Vec<Vec<u8>>> {
        let staging: Vec<Option<PooledBuffer>> = {
            let mut rec = self.recorder.lock().expect("recorder lock");
            let staging = bufs
                .iter()
                .map(|b| {
                    (b.bytes > 0).then(|| {
                        let s = self.pool.get(b.bytes, READBACK);
                        rec.transfer(&self.device).copy_buffer_to_buffer(
                            b.raw(),
                            0,
                            s.raw(),
                            0,
                            b.bytes,
                        );
                        s
                    })
                })
                .collect();
            rec.flush(&self.queue);
            staging
        };
        let pending = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        for (s, b) in staging.iter().zip(bufs) {
            if let Some(s) = s {
                pending.fetch_add(1, Ordering::SeqCst);
                let (p, f) = (pending.clone(), failed.clone());
                s.raw()
                    .map_async(wgpu::MapMode::Read, 0..b.bytes, move |r| {
                        if r.is_err() {
                            f.fetch_add(1, Ordering::SeqCst);
                        }
                        p.fetch_sub(1, Ordering::SeqCst);
                    });
            }
        }
        // Another thread's poll may be the one that runs our callbacks, and may still be running
        // them when our own poll returns: wait until they have all been called.
        let started = std::time::Instant::now();
        while pending.load(Ordering::SeqCst) > 0 {
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("waiting for a readback: {e}")))?;
            if pending.load(Ordering::SeqCst) > 0 {
                if started.elapsed() > std::time::Duration::from_secs(600) {
                    return Err(Error::Gpu(
                        "a readback did not complete in 10 minutes".into(),
                    ));
                }
                std::thread::yield_now();
            }
        }
        // Mapped buffers are unmapped on every path below, so none goes back to the pool mapped.
        let mapped = || {
            if failed.load(Ordering::SeqCst) > 0 {
                return Err(Error::Gpu("mapping a readback buffer failed".into()));
            }
            self.check()
        };
        if let Err(e) = mapped() {
            staging.iter().flatten().for_each(|s| {
                if failed.load(Ordering::SeqCst) == 0 {
                    s.raw().unmap();
                }
            });
            return Err(e);
        }
        let out = staging
            .iter()
            .zip(bufs)
            .map(|(s, b)| match s {
                Some(s) => {
                    let view = s
                        .raw()
                        .get_mapped_range(0..b.bytes)
                        .map_err(|e| Error::Gpu(e.to_string()));
                    let bytes = view.map(|v| v.to_vec());
                    s.raw().unmap();
                    bytes
                }
                None => Ok(Vec::new()),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(out)
    }

    /// Reads one buffer back.
    pub fn read(&self, buf: &GpuBuf) -> Result<Vec<u8>> {
        Ok(self
            .read_many(&[buf])?
            .pop()
            .expect("one buffer in, one out"))
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.describe())
    }
}

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    // Validation layers are for wgpu developers; ours run on the default flags.
    desc.flags = wgpu::InstanceFlags::empty();
    wgpu::Instance::new(desc)
}

/// Every compute-capable adapter, for `murmur info`.
pub fn list_adapters(pref: &AdapterPreference) -> Vec<GpuInfo> {
    let instance = new_instance(pref.backends());
    adapter::enumerate(&instance, pref.backends())
        .into_iter()
        .map(|a| GpuInfo {
            adapter: a.get_info(),
            limits: a.limits(),
            features: a.features(),
        })
        .collect()
}
