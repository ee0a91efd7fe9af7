//! Error-feedback memories that wrap any codec, on the CPU or the GPU (state lives on the
//! device of the gradients it compensates).
//!
//! - [`Memory::None`]: send `C(g)`.
//! - [`Memory::Residual`] (Seide et al.; EF-SGD): `q = clean(g + e)`, send `C(q)`,
//!   `e = q - D(C(q))`.
//! - [`Memory::LocoEma`] (LoCo, loco.md §2.3): the error is stored as int8 codes `e_q` with
//!   scale `s_e`; `h = g + e_q / s_e`, send `C(h)`, then with `r = clean(h) - D(C(h))` the
//!   moving average `et = prev * (1 - beta) + r * beta` (prev = `e_q / s_e`, or in the f32
//!   reference mode the f32 `et` itself) is re-quantized, `e_q = clamp(rne(et * s_e))`. Every
//!   `reset_every` calls, starting with the first, the error is reset to zero instead.
//!
//! The residual update is fused into the encoding pass (`Codec::encode_residual`); `1 / s_e`
//! is applied as a multiplication, exact when `s_e` is a power of two.

mod saved;

use bytemuck::{Pod, Zeroable};

pub use saved::SavedMemory;

use crate::compress::support::{clean, rne};
use crate::compress::{Codec, CodecContext, DecodeMode};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuf, Override, Shader};
use crate::kernels::{grid_1d, CODEC_COMMON, GRID};
use crate::tensor::Device;
use crate::wgsl;

pub(crate) static FEEDBACK: Shader = wgsl!("feedback.wgsl", includes: [GRID, CODEC_COMMON], overrides: [Override::codes("REFERENCE", 2)]);

/// Which memory, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Memory {
    /// No memory: send `C(g)`.
    None,
    /// Error feedback (EF-SGD): keep the residual `e = q - D(C(q))` in f32 and add it to the next
    /// gradient.
    Residual,
    /// LoCo's memory: a moving average of the residuals, kept as int8 codes at scale `se`.
    LocoEma {
        /// Weight of the new residual (the paper's beta; DeepSpeed's err_beta = 1 - beta).
        beta: f32,
        /// T_c: reset period in calls; 0 never resets.
        reset_every: u32,
        /// s_e, the error quantization scale (4 * s or 6 * s in the paper).
        se: f32,
        /// Keep the moving average in f32 (the paper-literal mode A) instead of only int8.
        reference: bool,
    },
}

impl std::str::FromStr for Memory {
    type Err = Error;

    /// `none`, `ef`, or `loco-ema[:beta=0.2][:reset=512][:se=2097152][:f32]`.
    fn from_str(text: &str) -> Result<Self> {
        let mut parts = text.split(':');
        let bad = |m: String| {
            Error::Config(format!("error feedback {text:?}: {m}; use none, ef or loco-ema[:beta=B][:reset=T][:se=S][:f32]"))
        };
        match parts.next().unwrap_or("") {
            "none" => Ok(Memory::None),
            "ef" | "residual" => Ok(Memory::Residual),
            "loco-ema" | "loco" => {
                let (mut beta, mut reset_every, mut se, mut reference) =
                    (0.2f32, 512u32, 2_097_152.0f32, false);
                for p in parts {
                    match p.split_once('=') {
                        Some(("beta", v)) => {
                            beta = v
                                .parse()
                                .ok()
                                .filter(|b: &f32| (0.0..=1.0).contains(b))
                                .ok_or_else(|| bad(format!("beta={v}")))?
                        }
                        Some(("reset", v)) => {
                            reset_every = v.parse().map_err(|_| bad(format!("reset={v}")))?
                        }
                        Some(("se", v)) => {
                            se = v
                                .parse()
                                .ok()
                                .filter(|s: &f32| s.is_finite() && *s > 0.0)
                                .ok_or_else(|| bad(format!("se={v}")))?
                        }
                        None if p == "f32" => reference = true,
                        _ => return Err(bad(format!("unknown option {p:?}"))),
                    }
                }
                Ok(Memory::LocoEma {
                    beta,
                    reset_every,
                    se,
                    reference,
                })
            }
            other => Err(bad(format!("unknown memory {other:?}"))),
        }
    }
}

enum State {
    None,
    Residual(Vec<f32>),
    ResidualGpu(GpuBuf),
    /// int8 codes, and the f32 average in reference mode.
    Ema(Vec<i8>, Option<Vec<f32>>),
    /// int8 codes four per word, and the f32 average in reference mode.
    EmaGpu(GpuBuf, Option<GpuBuf>),
}

/// A codec with an error-feedback memory for one tensor (or partition) of `n` elements.
pub struct Feedback {
    codec: Box<dyn Codec>,
    device: Device,
    memory: Memory,
    n: usize,
    calls: u64,
    state: State,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    reset: u32,
    inv_se: f32,
    se: f32,
    keep: f32,
    beta: f32,
    _pad: [u32; 2],
}

/// LoCo's int8 requantization of the moving average: clamp(rne(et * s_e), -128, 127).
fn quantize_error(et: f32, se: f32) -> i8 {
    rne((et * se).clamp(-129.0, 128.0)).clamp(-128.0, 127.0) as i8
}

impl Feedback {
    /// A memory for `n` elements with its state on `device`.
    pub fn new(codec: Box<dyn Codec>, memory: Memory, n: usize, device: &Device) -> Result<Self> {
        let state = match (memory, device) {
            (Memory::None, _) => State::None,
            (Memory::Residual, Device::Cpu) => State::Residual(vec![0.0; n]),
            (Memory::Residual, Device::Gpu(g)) => State::ResidualGpu(g.zeros(4 * n as u64)?),
            (Memory::LocoEma { reference, .. }, Device::Cpu) => {
                State::Ema(vec![0; n], reference.then(|| vec![0.0; n]))
            }
            (Memory::LocoEma { reference, .. }, Device::Gpu(g)) => {
                let et = if reference {
                    Some(g.zeros(4 * n as u64)?)
                } else {
                    None
                };
                State::EmaGpu(g.zeros(4 * n.div_ceil(4) as u64)?, et)
            }
        };
        Ok(Feedback {
            codec,
            device: device.clone(),
            memory,
            n,
            calls: 0,
            state,
        })
    }

    /// The codec the memory wraps.
    pub fn codec(&self) -> &dyn Codec {
        self.codec.as_ref()
    }

    /// The memory and its parameters.
    pub fn memory(&self) -> Memory {
        self.memory
    }

    fn ema_params(&self) -> (f32, f32, f32, bool) {
        match self.memory {
            Memory::LocoEma {
                beta,
                reset_every,
                se,
                ..
            } => {
                let reset = reset_every != 0 && self.calls.is_multiple_of(reset_every as u64);
                (beta, se, 1.0 / se, reset)
            }
            _ => unreachable!("not an EMA memory"),
        }
    }

    /// Compresses the gradient `g` (on the CPU) and updates the memory.
    pub fn encode(&mut self, g: &[f32], ctx: &CodecContext) -> Result<Vec<u8>> {
        if g.len() != self.n {
            return Err(Error::Shape {
                op: "error feedback",
                detail: format!("memory holds {} elements, gradient has {}", self.n, g.len()),
            });
        }
        let payload = match &mut self.state {
            State::None => self.codec.encode(g, ctx),
            State::Residual(e) => {
                let q: Vec<f32> = g
                    .iter()
                    .zip(e.iter())
                    .map(|(&a, &b)| clean(a + b))
                    .collect();
                self.codec.encode_residual(&q, ctx, e)?
            }
            State::Ema(..) => {
                let (beta, se, inv_se, reset) = self.ema_params();
                let State::Ema(eq, et) = &mut self.state else {
                    unreachable!()
                };
                let h: Vec<f32> = g
                    .iter()
                    .zip(eq.iter())
                    .map(|(&a, &c)| a + c as f32 * inv_se)
                    .collect();
                let mut r = vec![0.0; self.n];
                let payload = self.codec.encode_residual(&h, ctx, &mut r)?;
                let keep = 1.0 - beta;
                for i in 0..self.n {
                    let prev = match et {
                        Some(et) => et[i],
                        None => eq[i] as f32 * inv_se,
                    };
                    let et_new = prev * keep + r[i] * beta;
                    if reset {
                        eq[i] = 0;
                        if let Some(et) = et {
                            et[i] = 0.0;
                        }
                    } else {
                        eq[i] = quantize_error(et_new, se);
                        if let Some(et) = et {
                            et[i] = et_new;
                        }
                    }
                }
                payload
            }
            _ => {
                return Err(Error::Config(
                    "this memory lives on the GPU: use encode_gpu".into(),
                ))
            }
        };
        self.calls += 1;
        Ok(payload)
    }

    /// Compresses the gradient `g` (`n` f32 on the GPU) and updates the memory on the GPU.
    pub fn encode_gpu(&mut self, gpu: &Gpu, g: &GpuBuf, ctx: &CodecContext) -> Result<GpuBuf> {
        let n = self.n;
        let payload = match &self.state {
            State::None => self.codec.encode_gpu(gpu, g, n, ctx)?,
            State::ResidualGpu(e) => {
                let q = gpu.alloc(4 * n as u64)?;
                let params = Params {
                    n: n as u32,
                    reset: 0,
                    inv_se: 0.0,
                    se: 0.0,
                    keep: 0.0,
                    beta: 0.0,
                    _pad: [0; 2],
                };
                gpu.launch(
                    &gpu.pipeline(&FEEDBACK, "residual_compensate", &[]),
                    &params,
                    &[g, e, &q],
                    grid_1d(n),
                );
                let payload = self.codec.encode_gpu(gpu, &q, n, ctx)?;
                // e = q - D(C(q)): q is already clean.
                gpu.copy(&q, 0, e, 0, 4 * n as u64);
                self.codec
                    .decode_gpu(gpu, &payload, e, n, ctx, DecodeMode::Subtract)?;
                payload
            }
            State::EmaGpu(eq, et) => {
                let (beta, se, inv_se, reset) = self.ema_params();
                let params = Params {
                    n: n as u32,
                    reset: reset as u32,
                    inv_se,
                    se,
                    keep: 1.0 - beta,
                    beta,
                    _pad: [0; 2],
                };
                let h = gpu.alloc(4 * n as u64)?;
                gpu.launch(
                    &gpu.pipeline(&FEEDBACK, "loco_compensate", &[]),
                    &params,
                    &[g, eq, &h],
                    grid_1d(n),
                );
                let payload = self.codec.encode_gpu(gpu, &h, n, ctx)?;
                // r = clean(h) - D(C(h)).
                let r = gpu.alloc(4 * n as u64)?;
                gpu.launch(
                    &gpu.pipeline(&FEEDBACK, "clean_copy", &[]),
                    &params,
                    &[&h, &r],
                    grid_1d(n),
                );
                self.codec
                    .decode_gpu(gpu, &payload, &r, n, ctx, DecodeMode::Subtract)?;
                let reference = et.is_some();
                let et_buf = match et {
                    Some(b) => b.clone(),
                    None => gpu.alloc(4)?,
                };
                let pipeline = gpu.pipeline(
                    &FEEDBACK,
                    "loco_update",
                    &[("REFERENCE", reference as u8 as f64)],
                );
                gpu.launch(
                    &pipeline,
                    &params,
                    &[&r, eq, &et_buf],
                    grid_1d(n.div_ceil(4)),
                );
                payload
            }
            _ => {
                return Err(Error::Config(
                    "this memory lives on the CPU: use encode".into(),
                ))
            }
        };
        self.calls += 1;
        Ok(payload)
    }

    fn gpu(&self) -> Result<&Gpu> {
        self.device
            .as_gpu()
            .map(|g| g.as_ref())
            .ok_or_else(|| Error::Config("memory is not on a GPU".into()))
    }

    /// Adds the whole memory to `x` (CPU) and resets it to zero: a round that sends `x` at full
    /// precision holds nothing back (LIEC-SGD's sync step).
    pub fn flush_into(&mut self, x: &mut [f32]) -> Result<()> {
        if x.len() != self.n {
            return Err(Error::Shape {
                op: "error feedback flush",
                detail: format!("memory holds {} elements, vector has {}", self.n, x.len()),
            });
        }
        let inv_se = match self.memory {
            Memory::LocoEma { se, .. } => 1.0 / se,
            _ => 1.0,
        };
        match &mut self.state {
            State::None => {}
            State::Residual(e) => {
                x.iter_mut().zip(e.iter_mut()).for_each(|(v, e)| {
                    *v += *e;
                    *e = 0.0;
                });
            }
            State::Ema(eq, et) => {
                x.iter_mut().zip(eq.iter_mut()).for_each(|(v, c)| {
                    *v += *c as f32 * inv_se;
                    *c = 0;
                });
                if let Some(et) = et {
                    et.fill(0.0);
                }
            }
            State::ResidualGpu(_) | State::EmaGpu(..) => {
                return Err(Error::Config(
                    "flushing a memory that lives on the GPU is not supported".into(),
                ))
            }
        }
        Ok(())
    }

    /// Takes back a payload this memory encoded whose push the servers did not sum (it came
    /// after its round closed): adds what it decodes to, `sent`, to the residual, so that the
    /// memory holds the whole compensated gradient again, `q = D(C(q)) + e`, and the next push
    /// sends it (a late push folded into error feedback). Residual memories on the CPU only:
    /// LoCo's moving average has no such inverse, and data-parallel workers keep their memories
    /// on the CPU.
    pub fn take_back(&mut self, sent: &[f32]) -> Result<()> {
        if sent.len() != self.n {
            return Err(Error::Shape {
                op: "error feedback take-back",
                detail: format!(
                    "memory holds {} elements, payload has {}",
                    self.n,
                    sent.len()
                ),
            });
        }
        match &mut self.state {
            State::Residual(e) => {
                e.iter_mut()
                    .zip(sent)
                    .for_each(|(e, &v)| *e = clean(*e + v));
                Ok(())
            }
            _ => Err(Error::Config(format!(
                "only an error-feedback residual on the CPU can take a late push back, not {:?}",
                self.memory
            ))),
        }
    }

    /// Switches to `codec` after its quantizer's scale moved by `2^shift` (a LoCo scale
    /// recalibrated mid-job): a LoCo memory's `s_e` moves with it, keeping `s_e / s`, and its
    /// int8 error is requantized at the new `s_e`, `clamp(rne(e_q · 2^shift))`, so the error it
    /// stands for is kept up to the new grid. Other memories keep their state. CPU memories
    /// only (the data-parallel workers and the servers keep theirs there).
    pub fn rescale(&mut self, codec: Box<dyn Codec>, shift: i32) -> Result<()> {
        if let Memory::LocoEma { se, .. } = &mut self.memory {
            let factor = 2f32.powi(shift);
            let scaled = *se * factor;
            if !(scaled.is_finite() && scaled > 0.0) {
                return Err(Error::Config(format!(
                    "rescaling LoCo's error scale {se} by 2^{shift} leaves f32's range"
                )));
            }
            match &mut self.state {
                State::Ema(eq, _) => eq
                    .iter_mut()
                    .for_each(|c| *c = quantize_error(*c as f32, factor)),
                _ => {
                    return Err(Error::Config(
                        "rescaling a memory that lives on the GPU is not supported".into(),
                    ))
                }
            }
            *se = scaled;
        }
        self.codec = codec;
        Ok(())
    }

    /// The compensation the next call will add, as f32 (read back from the GPU if there).
    pub fn error(&self) -> Result<Vec<f32>> {
        let inv_se = match self.memory {
            Memory::LocoEma { se, .. } => 1.0 / se,
            _ => 1.0,
        };
        Ok(match &self.state {
            State::None => vec![0.0; self.n],
            State::Residual(e) => e.clone(),
            State::ResidualGpu(e) => bytemuck::pod_collect_to_vec(&self.gpu()?.read(e)?),
            State::Ema(eq, _) => eq.iter().map(|&c| c as f32 * inv_se).collect(),
            State::EmaGpu(eq, _) => {
                let bytes = self.gpu()?.read(eq)?;
                bytes[..self.n]
                    .iter()
                    .map(|&b| b as i8 as f32 * inv_se)
                    .collect()
            }
        })
    }

    /// Fraction of nonzero error entries: LoCo's diagnostic for an error stuck at zero
    /// (loco.md §7.2).
    pub fn nonzero_fraction(&self) -> Result<f64> {
        Ok(self.nonzero_entries()? as f64 / self.n.max(1) as f64)
    }

    /// Nonzero error entries, counted where the memory lives (a CPU memory is not copied: a
    /// data-parallel worker counts them every round).
    pub fn nonzero_entries(&self) -> Result<usize> {
        Ok(match &self.state {
            State::None => 0,
            State::Residual(e) => e.iter().filter(|v| **v != 0.0).count(),
            // A nonzero int8 code times 1/s_e is nonzero (1/s_e >= 2^-128 > 0).
            State::Ema(eq, _) => eq.iter().filter(|c| **c != 0).count(),
            State::ResidualGpu(_) | State::EmaGpu(..) => {
                self.error()?.iter().filter(|v| **v != 0.0).count()
            }
        })
    }
}
