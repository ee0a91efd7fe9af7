//! The error-feedback family: one push per step, the servers' mean back, then an optimizer.
//!
//! ```text
//! worker: a := g + e ; c := C(a) ; e := a − D(c) ; send c      (without memory: c := C(g))
//! server: v := mean_i D(c_i) + e_s ; p := C'(v) ; e_s := v − D(p) ; send p
//! worker: x := optimizer(x, D(p))
//! ```
//!
//! Which members of the papers it covers, by worker memory × downlink:
//! - liec-sgd.md §3: P-SGD (nothing compressed), MEM-SGD (residual memory, exact downlink),
//!   DoubleSqueeze (residual memory on both sides) and Neolithic (DoubleSqueeze with the
//!   recursive compressor), all with plain SGD.
//! - byteps-clan.md: Algorithm 3 (`two-way`: compressed both ways, no memory) and Algorithm 4
//!   (DoubleSqueeze's shape: memory on both sides), with LANS (CLAN) or Nesterov momentum.
//! - loco.md: naive low-bit (`direct`: compressed up, exact down), error feedback with an f32
//!   error (MEM-SGD's shape) and LoCo's moving-average int8 error, with SGD or AdamW. The
//!   exact downlink of LoCo's 4-bit codes is their integer sum ([`downlink_for`]) on the
//!   replicated path; on the sharded path the servers own the parameters
//!   ([`owner`](crate::comm::owner)): they average in f32, step the optimizer and send bf16
//!   parameters back, which the workers compute with.

use super::{Exchange, HostOptimizer, Hyper, Method, OptimizerSpec, Own, Wire};
use crate::comm::owner::StepHeader;
use crate::compress::support::clean;
use crate::compress::{parse, CodecSpec};
use crate::error::Result;
use crate::feedback::{Feedback, Memory};
use crate::tensor::Device;

/// What a worker carries from step to step.
pub(super) enum WorkerMemory {
    None,
    /// `e_i`, f32 (classic error feedback); empty until the first step.
    Residual(Vec<f32>),
    /// A [`Feedback`] per block with this memory (LoCo's int8 moving average); built at the
    /// first step, when the blocks are known.
    Feedback(Memory, Vec<Feedback>),
}

/// What the servers send back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Downlink {
    /// The mean, as exactly as [`downlink_for`] allows; no server memory.
    Exact,
    /// The mean re-compressed with the workers' codec, no server memory (CLAN Algorithm 3).
    Compressed,
    /// The mean plus the server's error, re-compressed; the rest kept (Algorithm 4).
    CompressedEf,
    /// The parameters, in bf16 (f32 for blocks that travel plain), of servers that own them
    /// and step them with this optimizer on the f32 mean (loco.md §2.6's sharded path).
    Owner(OptimizerSpec),
}

/// The codec of the parameter all-gather on the sharded path (loco.md Table 1: b_w = 16).
const OWNED_PARAMS: &str = "bf16";

pub(super) struct ErrorFeedback {
    /// The workers' codec is `wire.push`.
    wire: Wire,
    memory: WorkerMemory,
    optimizer: HostOptimizer,
}

impl ErrorFeedback {
    /// `world` workers push with `codec`; the exact downlink depends on their number.
    pub fn new(
        codec: &str,
        memory: WorkerMemory,
        downlink: Downlink,
        world: usize,
        optimizer: HostOptimizer,
    ) -> Result<Self> {
        let (pull, server_memory) = match downlink {
            Downlink::Exact => (downlink_for(codec, world)?, "none"),
            Downlink::Compressed => (codec.to_string(), "none"),
            Downlink::CompressedEf => (codec.to_string(), "ef"),
            Downlink::Owner(_) => (OWNED_PARAMS.to_string(), "none"),
        };
        let owner = match downlink {
            Downlink::Owner(spec) => spec.to_string(),
            _ => String::new(),
        };
        let wire = Wire {
            push: codec.to_string(),
            pull,
            server_memory: server_memory.into(),
            sync_every: 0,
            owner,
        };
        Ok(ErrorFeedback {
            wire,
            memory,
            optimizer,
        })
    }
}

/// The codec of a reply that carries the mean of pushes made with `push` from `world` workers
/// without a server memory:
/// - LoCo's fixed-scale 4-bit codes: their sum is an integer in [−8N, 7N], so with N a power
///   of two up to 16 the mean `Σq / (sN)` is exactly an 8-bit code at scale `sN` (loco.md
///   §2.6: the replicated path sums codes as integers; every peer gets the same bits).
/// - f16 and bf16: the mean rounded to the same 16 bits (a 16-bit all-reduce).
/// - otherwise the f32 mean.
pub fn downlink_for(push: &str, world: usize) -> Result<String> {
    Ok(match push.parse::<CodecSpec>()? {
        CodecSpec::Loco {
            bits: 4,
            log2s,
            rescalable,
        } if world.is_power_of_two() && world <= 16 => CodecSpec::Loco {
            bits: 8,
            log2s: log2s + world.trailing_zeros() as i32,
            rescalable,
        }
        .to_string(),
        CodecSpec::F16 | CodecSpec::Bf16 => push.to_string(),
        _ => "f32".to_string(),
    })
}

impl Method for ErrorFeedback {
    fn wire(&self) -> Wire {
        self.wire.clone()
    }

    fn start(&mut self, ex: &mut Exchange, x: &mut [f32]) -> Result<()> {
        if ex.is_param_round() {
            let owned = ex.exchange(x, Own::Nothing)?;
            x.copy_from_slice(&owned);
        }
        Ok(())
    }

    fn step(&mut self, ex: &mut Exchange, x: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()> {
        let owned = !self.wire.owner.is_empty();
        if let WorkerMemory::Feedback(memory, feedbacks) = &mut self.memory {
            if feedbacks.is_empty() {
                // One memory per block, with the codec the block travels in.
                *feedbacks = ex
                    .blocks()
                    .iter()
                    .zip(ex.key_specs())
                    .map(|(b, spec)| {
                        // Blocks that travel plain keep no error.
                        let memory = if b.plain { Memory::None } else { *memory };
                        Feedback::new(parse(&spec.push)?, memory, b.len, &Device::Cpu)
                    })
                    .collect::<Result<_>>()?;
            }
        }
        let header = StepHeader {
            lr: hyper.lr,
            weight_decay: hyper.weight_decay,
        };
        let mut round = |q: &[f32], own: Own| {
            if owned {
                ex.exchange_with_owners(q, own, header)
            } else {
                ex.exchange(q, own)
            }
        };
        let u = match &mut self.memory {
            WorkerMemory::None => round(g, Own::Nothing)?,
            WorkerMemory::Residual(error) => {
                if error.len() != g.len() {
                    *error = vec![0.0; g.len()];
                }
                let a: Vec<f32> = g
                    .iter()
                    .zip(error.iter())
                    .map(|(g, e)| clean(g + e))
                    .collect();
                round(&a, Own::Residual(error))?
            }
            WorkerMemory::Feedback(_, feedbacks) => round(g, Own::Feedback(feedbacks))?,
        };
        if owned {
            // The owners stepped; this is their parameters.
            x.copy_from_slice(&u);
            return Ok(());
        }
        self.optimizer.step(x, &u, hyper)
    }

    fn worker_error(&self) -> Option<Vec<f32>> {
        match &self.memory {
            WorkerMemory::None => None,
            WorkerMemory::Residual(e) => Some(e.clone()),
            WorkerMemory::Feedback(_, feedbacks) => {
                let mut out = Vec::new();
                for f in feedbacks {
                    out.extend(f.error().ok()?);
                }
                Some(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::CodecContext;

    #[test]
    fn the_downlink_of_four_bit_codes_is_their_exact_integer_sum() {
        let ctx = CodecContext::default();
        for world in [1usize, 2, 4, 8, 16] {
            let pull = downlink_for("loco:bits=4:log2s=5", world).unwrap();
            let pull = parse(&pull).unwrap();
            // Every combination of extreme and middle codes, as the servers average them:
            // summed in rank order, scaled by 1/N.
            let codes: Vec<Vec<i32>> = (0..world)
                .map(|r| (0..64).map(|i| ((i * 7 + r * 5) % 16) as i32 - 8).collect())
                .collect();
            let mut mean = vec![0.0f32; 64];
            for c in &codes {
                mean.iter_mut()
                    .zip(c)
                    .for_each(|(m, q)| *m += *q as f32 / 32.0);
            }
            mean.iter_mut().for_each(|m| *m *= 1.0 / world as f32);
            let back = pull.decode(&pull.encode(&mean, &ctx), 64, &ctx).unwrap();
            assert_eq!(back, mean, "N = {world}");
            assert_eq!(pull.payload_len(64), 64, "one byte per element");
        }
        assert_eq!(downlink_for("loco:bits=4:log2s=5", 3).unwrap(), "f32");
        assert_eq!(downlink_for("loco:bits=4:log2s=5", 32).unwrap(), "f32");
        assert_eq!(downlink_for("bf16", 3).unwrap(), "bf16");
        assert_eq!(downlink_for("sign", 4).unwrap(), "f32");
    }
}
