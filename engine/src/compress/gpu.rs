//! The GPU halves of the codecs: launching the kernels of shaders/compress/ in the order that
//! reproduces the CPU implementation's bytes.

use bytemuck::{Pod, Zeroable};

use super::codec::{CodecContext, DecodeMode};
use super::spec::{CodecSpec, Levels, Norm, Rounding};
use super::support::CHUNK;
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf, Override, Shader};
use crate::kernels::{grid_1d, grid_groups, CODEC_COMMON, GRID};
use crate::wgsl;

pub(crate) static REDUCE: Shader = wgsl!("compress/reduce.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("FINISH", 2), Override::codes("LEVEL", 2)]);
pub(crate) static PLAIN: Shader = wgsl!("compress/plain.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("KIND", 3), Override::codes("MODE", 3)]);
pub(crate) static SIGN: Shader = wgsl!("compress/sign.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("MODE", 3)]);
pub(crate) static DENSE: Shader = wgsl!("compress/dense.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("OP", 6), Override::codes("STOCHASTIC", 2), Override::codes("MODE", 3)]);
pub(crate) static SELECT: Shader = wgsl!("compress/select.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("KEY", 3)]);
pub(crate) static SPARSE: Shader = wgsl!("compress/sparse.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("KIND", 5), Override::codes("MODE", 3)]);

/// Every codec shader, for validation tests.
pub fn shaders() -> Vec<&'static Shader> {
    vec![
        &CODEC_COMMON,
        &REDUCE,
        &PLAIN,
        &SIGN,
        &DENSE,
        &SELECT,
        &SPARSE,
    ]
}

fn mode_code(mode: DecodeMode) -> f64 {
    match mode {
        DecodeMode::Set => 0.0,
        DecodeMode::Add => 1.0,
        DecodeMode::Subtract => 2.0,
    }
}

fn seed_words(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// A zeroed buffer for a payload of `len` bytes (rounded up to whole words).
fn payload_buffer(gpu: &Gpu, len: usize) -> Result<GpuBuf> {
    gpu.zeros(len.next_multiple_of(4) as u64)
}

// ---------------------------------------------------------------------------------------------
// Reductions (reduce.wgsl)

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ReduceParams {
    n: u32,
    dst: u32,
    group: u32,
    bits: u32,
}

/// The largest `|clean(x)|` of `x[..n]`, reduced level by level into a one-element buffer.
fn max_abs(gpu: &Gpu, x: &GpuBuf, n: usize) -> Result<GpuBuf> {
    levels(gpu, x, n, "max_abs", 4, |level| ("LEVEL", level.min(1)))
}

/// The l2 norm's two canonical sums of squares, plain and of the values scaled by 2^-64, in
/// one pass over `x[..n]`: a two-element buffer for the finish, which takes the plain one
/// unless it overflowed (support::l2_norm).
fn l2_twins(gpu: &Gpu, x: &GpuBuf, n: usize) -> Result<GpuBuf> {
    levels(gpu, x, n, "twins", 8, |level| ("LEVEL", level.min(1)))
}

/// Reduces `x[..n]` level by level with `entry` (each chunk of CHUNK inputs to one result
/// of `width` bytes) until one result is left; `override_at(level)` names the pipeline
/// override that tells the first level (raw values) from later ones (chunk results).
fn levels(
    gpu: &Gpu,
    x: &GpuBuf,
    n: usize,
    entry: &'static str,
    width: u64,
    override_at: impl Fn(u32) -> (&'static str, u32),
) -> Result<GpuBuf> {
    let (mut len, mut level, mut input) = (n, 0, x.clone());
    loop {
        let chunks = len.div_ceil(CHUNK).max(1);
        let out = gpu.alloc(width * chunks as u64)?;
        let (name, value) = override_at(level);
        let pipeline = gpu.pipeline(&REDUCE, entry, &[(name, value as f64)]);
        gpu.launch(
            &pipeline,
            &ReduceParams {
                n: len as u32,
                dst: 0,
                group: 0,
                bits: 0,
            },
            &[&input, &out],
            grid_groups(chunks),
        );
        if chunks == 1 {
            return Ok(out);
        }
        (level, input, len) = (level + 1, out, chunks);
    }
}

#[derive(Clone, Copy)]
enum Finish {
    Copy = 0,
    Sqrt = 1,
}

/// Writes `f(value)` into word `dst` of `payload`.
fn finish(gpu: &Gpu, value: &GpuBuf, payload: &GpuBuf, dst: usize, how: Finish, n: usize) {
    let pipeline = gpu.pipeline(&REDUCE, "finish", &[("FINISH", how as u32 as f64)]);
    gpu.launch(
        &pipeline,
        &ReduceParams {
            n: n as u32,
            dst: dst as u32,
            group: 0,
            bits: 0,
        },
        &[value, payload],
        [1, 1, 1],
    );
}

// ---------------------------------------------------------------------------------------------
// f32, f16, bf16 (plain.wgsl)

pub(super) mod plain_gpu {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Pod, Zeroable)]
    struct Params {
        n: u32,
        _pad: [u32; 3],
    }

    fn kind(spec: CodecSpec) -> f64 {
        match spec {
            CodecSpec::F32 => 0.0,
            CodecSpec::F16 => 1.0,
            _ => 2.0,
        }
    }

    pub fn encode(spec: CodecSpec, gpu: &Gpu, x: &GpuBuf, n: usize) -> Result<GpuBuf> {
        let width = if spec == CodecSpec::F32 { 4 } else { 2 };
        let payload = payload_buffer(gpu, width * n)?;
        let words = if spec == CodecSpec::F32 {
            n
        } else {
            n.div_ceil(2)
        };
        let pipeline = gpu.pipeline(&PLAIN, "encode", &[("KIND", kind(spec))]);
        gpu.launch(
            &pipeline,
            &Params {
                n: n as u32,
                _pad: [0; 3],
            },
            &[x, &payload],
            grid_1d(words),
        );
        Ok(payload)
    }

    pub fn decode(
        spec: CodecSpec,
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        mode: DecodeMode,
    ) -> Result<()> {
        let pipeline = gpu.pipeline(
            &PLAIN,
            "decode",
            &[("KIND", kind(spec)), ("MODE", mode_code(mode))],
        );
        gpu.launch(
            &pipeline,
            &Params {
                n: n as u32,
                _pad: [0; 3],
            },
            &[payload, out],
            grid_1d(n),
        );
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Scaled sign (sign.wgsl)

pub(super) mod sign_gpu {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Pod, Zeroable)]
    struct Params {
        n: u32,
        scale_word: u32,
        _pad: [u32; 2],
    }

    pub fn encode(gpu: &Gpu, x: &GpuBuf, n: usize) -> Result<GpuBuf> {
        let scale_word = 2 * n.div_ceil(64);
        let payload = payload_buffer(gpu, 4 * scale_word + 4)?;
        let params = Params {
            n: n as u32,
            scale_word: scale_word as u32,
            _pad: [0; 2],
        };
        gpu.launch(
            &gpu.pipeline(&SIGN, "encode", &[]),
            &params,
            &[x, &payload],
            grid_1d(scale_word),
        );
        write_mean_abs(gpu, x, n, &payload, scale_word)?;
        Ok(payload)
    }

    /// Writes mean `|clean(x[..n])|`, rounded once, into word `scale_word` of `payload`:
    /// the frame from the largest magnitude, chunk sums level by level (five words each), then
    /// the division (compress::mean_abs, sign.wgsl).
    fn write_mean_abs(
        gpu: &Gpu,
        x: &GpuBuf,
        n: usize,
        payload: &GpuBuf,
        scale_word: usize,
    ) -> Result<()> {
        const SUM_BYTES: u64 = 20;
        let top = max_abs(gpu, x, n)?;
        let params = |len: usize| Params {
            n: len as u32,
            scale_word: scale_word as u32,
            _pad: [0; 2],
        };
        let mut chunks = n.div_ceil(CHUNK).max(1);
        let mut sums = gpu.alloc(SUM_BYTES * chunks as u64)?;
        gpu.launch(
            &gpu.pipeline(&SIGN, "magnitudes", &[]),
            &params(n),
            &[x, &sums, &top],
            grid_groups(chunks),
        );
        while chunks > 1 {
            let next = chunks.div_ceil(CHUNK);
            let out = gpu.alloc(SUM_BYTES * next as u64)?;
            gpu.launch(
                &gpu.pipeline(&SIGN, "add_sums", &[]),
                &params(chunks),
                &[&sums, &out],
                grid_groups(next),
            );
            (sums, chunks) = (out, next);
        }
        gpu.launch(
            &gpu.pipeline(&SIGN, "mean", &[]),
            &params(n),
            &[&sums, payload, &top],
            [1, 1, 1],
        );
        Ok(())
    }

    pub fn decode(
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        mode: DecodeMode,
    ) -> Result<()> {
        let params = Params {
            n: n as u32,
            scale_word: 2 * n.div_ceil(64) as u32,
            _pad: [0; 2],
        };
        let pipeline = gpu.pipeline(&SIGN, "decode", &[("MODE", mode_code(mode))]);
        gpu.launch(&pipeline, &params, &[payload, out], grid_1d(n));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Dense quantizers (dense.wgsl)

/// What the dense kernels need to know of a dense codec for `n` elements.
pub(super) struct DenseLayout {
    pub spec: CodecSpec,
    /// Bits per code.
    pub bits: u32,
    /// f32 scales in front of the codes.
    pub header: usize,
    /// Payload bytes.
    pub payload_len: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct DenseParams {
    n: u32,
    bits: u32,
    header: u32,
    s: u32,
    group: u32,
    log2s: i32,
    step: u32,
    key: u32,
    seed: [u32; 2],
    _pad: [u32; 2],
}

fn dense_op(spec: CodecSpec) -> (f64, bool) {
    match spec {
        CodecSpec::Dither {
            levels: Levels::Linear,
            ..
        } => (0.0, false),
        CodecSpec::Dither {
            levels: Levels::Natural,
            ..
        } => (1.0, false),
        CodecSpec::Natural => (2.0, false),
        CodecSpec::Qsgd { rounding, .. } => (3.0, rounding == Rounding::Stochastic),
        CodecSpec::Loco { .. } => (4.0, false),
        CodecSpec::BlockQ { .. } => (5.0, false),
        other => unreachable!("{other} is not dense"),
    }
}

fn dense_params(layout: &DenseLayout, n: usize, ctx: &CodecContext) -> DenseParams {
    let (s, group, log2s) = match layout.spec {
        CodecSpec::Dither { s, .. } => (s, 1, 0),
        CodecSpec::BlockQ { group, .. } => (0, group as u32, 0),
        CodecSpec::Loco { log2s, .. } => (0, 1, log2s),
        _ => (0, 1, 0),
    };
    DenseParams {
        n: n as u32,
        bits: layout.bits,
        header: layout.header as u32,
        s,
        group,
        log2s,
        step: ctx.step,
        key: ctx.key,
        seed: seed_words(ctx.rounding_seed()),
        _pad: [0; 2],
    }
}

pub(super) fn dense_encode_gpu(
    layout: &DenseLayout,
    gpu: &Gpu,
    x: &GpuBuf,
    n: usize,
    ctx: &CodecContext,
) -> Result<GpuBuf> {
    let payload = payload_buffer(gpu, layout.payload_len)?;
    match layout.spec {
        CodecSpec::Dither {
            norm: Norm::Max, ..
        }
        | CodecSpec::Qsgd { .. } => finish(gpu, &max_abs(gpu, x, n)?, &payload, 0, Finish::Copy, n),
        CodecSpec::Dither { norm: Norm::L2, .. } => {
            finish(gpu, &l2_twins(gpu, x, n)?, &payload, 0, Finish::Sqrt, n)
        }
        CodecSpec::BlockQ { bits, group } => {
            let params = ReduceParams {
                n: n as u32,
                dst: 0,
                group: group as u32,
                bits,
            };
            gpu.launch(
                &gpu.pipeline(&REDUCE, "group_max", &[]),
                &params,
                &[x, &payload],
                grid_1d(n.div_ceil(group)),
            );
        }
        _ => {}
    }
    let (op, stochastic) = dense_op(layout.spec);
    let pipeline = gpu.pipeline(
        &DENSE,
        "encode",
        &[("OP", op), ("STOCHASTIC", stochastic as u8 as f64)],
    );
    gpu.launch(
        &pipeline,
        &dense_params(layout, n, ctx),
        &[x, &payload],
        // At least one group: a rescalable LoCo payload gets its header even for n = 0.
        grid_groups(n.div_ceil(32).div_ceil(64).max(1)),
    );
    Ok(payload)
}

pub(super) fn dense_decode_gpu(
    layout: &DenseLayout,
    gpu: &Gpu,
    payload: &GpuBuf,
    out: &GpuBuf,
    n: usize,
    mode: DecodeMode,
) -> Result<()> {
    let (op, stochastic) = dense_op(layout.spec);
    let constants = [
        ("OP", op),
        ("STOCHASTIC", stochastic as u8 as f64),
        ("MODE", mode_code(mode)),
    ];
    let params = dense_params(layout, n, &CodecContext::default());
    gpu.launch(
        &gpu.pipeline(&DENSE, "decode", &constants),
        &params,
        &[payload, out],
        grid_1d(n),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Selection and sparse payloads (select.wgsl, sparse.wgsl)

pub(super) mod sparse_gpu {
    use super::*;
    use crate::compress::support::randk_factor;

    /// What the sparse kernels need to know of a sparsifier for `n` elements.
    pub struct SparseLayout {
        pub spec: CodecSpec,
        /// Elements kept.
        pub k: usize,
        /// Payload bytes.
        pub payload_len: usize,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Pod, Zeroable)]
    struct SelectParams {
        n: u32,
        k: u32,
        step: u32,
        key: u32,
        seed: [u32; 2],
        mask_offset: u32,
        _pad: u32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Pod, Zeroable)]
    struct SparseParams {
        n: u32,
        k: u32,
        bits: u32,
        mask_offset: u32,
        codes_offset: u32,
        factor: f32,
        limit: f32,
        _pad: u32,
    }

    const BLOCK: usize = 4096;

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Key {
        Magnitude = 0,
        Random = 1,
        Mask = 2,
    }

    /// Indices of the k selected elements, increasing, as select.rs defines them.
    fn select(
        gpu: &Gpu,
        src: &GpuBuf,
        key: Key,
        n: usize,
        k: usize,
        ctx: &CodecContext,
        mask_offset: usize,
    ) -> Result<GpuBuf> {
        let hist = gpu.zeros(4 << 16)?;
        let state = if key == Key::Mask {
            // The mask's set bits are the selection: threshold 1, take all k of them.
            gpu.upload(bytemuck::cast_slice(&[0u32, 0, 1, k as u32]))?
        } else {
            gpu.zeros(16)?
        };
        let blocks = n.div_ceil(BLOCK).max(1);
        let block_info = gpu.alloc(16 * blocks as u64)?;
        let out = gpu.alloc(4 * k as u64)?;
        let params = SelectParams {
            n: n as u32,
            k: k as u32,
            step: ctx.step,
            key: ctx.key,
            seed: seed_words(ctx.seed),
            mask_offset: mask_offset as u32,
            _pad: 0,
        };
        let bufs = [src, &state, &hist, &block_info, &out];
        let run = |entry: &'static str, grid: [u32; 3]| {
            gpu.launch(
                &gpu.pipeline(&SELECT, entry, &[("KEY", key as u32 as f64)]),
                &params,
                &bufs,
                grid,
            );
        };
        if key != Key::Mask {
            run("hist_high", grid_1d(n));
            run("find_high", [1, 1, 1]);
            gpu.clear(&hist);
            run("hist_low", grid_1d(n));
            run("find_low", [1, 1, 1]);
        }
        run("block_counts", grid_groups(blocks));
        run("block_offsets", [1, 1, 1]);
        run("compact", grid_groups(blocks));
        Ok(out)
    }

    fn kind(spec: CodecSpec) -> f64 {
        match spec {
            CodecSpec::TopK {
                f16_values: false, ..
            } => 0.0,
            CodecSpec::TopK {
                f16_values: true, ..
            } => 1.0,
            CodecSpec::RandK {
                shared_seed: true, ..
            } => 2.0,
            CodecSpec::RandK {
                shared_seed: false, ..
            } => 3.0,
            _ => 4.0,
        }
    }

    fn params(s: &SparseLayout, n: usize) -> SparseParams {
        let k = s.k;
        let (bits, (factor, limit)) = match s.spec {
            CodecSpec::Hybrid { bits, .. } => (bits, (1.0, f32::MAX)),
            CodecSpec::RandK { scaled: true, .. } if k > 0 => (0, randk_factor(n, k)),
            _ => (0, (1.0, f32::MAX)),
        };
        let mask_offset = 1;
        SparseParams {
            n: n as u32,
            k: k as u32,
            bits,
            mask_offset,
            codes_offset: mask_offset + n.div_ceil(32) as u32,
            factor,
            limit,
            _pad: 0,
        }
    }

    pub fn encode(
        s: &SparseLayout,
        gpu: &Gpu,
        x: &GpuBuf,
        n: usize,
        ctx: &CodecContext,
    ) -> Result<GpuBuf> {
        let k = s.k;
        let payload = payload_buffer(gpu, s.payload_len)?;
        if k == 0 {
            return Ok(payload);
        }
        let key = if matches!(s.spec, CodecSpec::RandK { .. }) {
            Key::Random
        } else {
            Key::Magnitude
        };
        let idx = select(gpu, x, key, n, k, ctx, 0)?;
        let p = params(s, n);
        let tmp = gpu.alloc(4 * k as u64)?;
        let pipeline = |entry: &'static str| {
            gpu.pipeline(&SPARSE, entry, &[("KIND", kind(s.spec)), ("MODE", 0.0)])
        };
        let bufs = [x, &idx, &payload, &tmp];
        if let CodecSpec::Hybrid { .. } = s.spec {
            // The top-k always holds the largest |v|, so the payload's scale is the global max.
            finish(gpu, &max_abs(gpu, x, n)?, &payload, 0, Finish::Copy, n);
            gpu.launch(&pipeline("mark_mask"), &p, &bufs, grid_1d(k));
        }
        gpu.launch(&pipeline("gather"), &p, &bufs, grid_1d(k));
        match s.spec {
            CodecSpec::TopK {
                f16_values: true, ..
            } => gpu.launch(&pipeline("pack_halves"), &p, &bufs, grid_1d(k.div_ceil(2))),
            CodecSpec::Hybrid { .. } => gpu.launch(
                &pipeline("pack_codes"),
                &p,
                &bufs,
                grid_groups(k.div_ceil(32).div_ceil(64)),
            ),
            _ => {}
        }
        Ok(payload)
    }

    pub fn decode(
        s: &SparseLayout,
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        let k = s.k;
        if mode == DecodeMode::Set {
            gpu.clear(out);
        }
        if k == 0 {
            return Ok(());
        }
        let p = params(s, n);
        let kept = match s.spec {
            CodecSpec::RandK {
                shared_seed: true, ..
            } => select(gpu, payload, Key::Random, n, k, ctx, 0)?,
            CodecSpec::Hybrid { .. } => {
                select(gpu, payload, Key::Mask, n, k, ctx, p.mask_offset as usize)?
            }
            _ => gpu.alloc(4)?,
        };
        let pipeline = gpu.pipeline(
            &SPARSE,
            "scatter",
            &[("KIND", kind(s.spec)), ("MODE", mode_code(mode))],
        );
        gpu.launch(&pipeline, &p, &[payload, &kept, out], grid_1d(k));
        Ok(())
    }
}
