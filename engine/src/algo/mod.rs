//! The data-parallel algorithms of the papers, each written once against
//! [`Collective`](crate::comm::Collective) through an [`Exchange`], so that each runs
//! in-process and over QUIC unchanged.
//!
//! - LIEC-SGD and its baselines (liec-sgd.md): P-SGD, MEM-SGD, DoubleSqueeze, CSER, Neolithic,
//!   EF21-P and LIEC-SGD itself, with the paper's plain SGD step `x ← x − η(u + λx)`.
//! - CLAN (byteps-clan.md): Algorithms 3 (`two-way`) and 4 (`double-squeeze`'s shape) with the
//!   LANS optimizer, and the same rounds with Nesterov momentum (the NAG suite).
//! - LoCo (loco.md): `loco` and its baselines (`direct`, `mem-sgd`, 16-bit codecs) with SGD or
//!   AdamW, the replicated path (the servers return the integer sum of the 4-bit codes).
//!
//! Each keeps its worker-side state here; what the servers do (the codecs both ways, their
//! error feedback, sync rounds) is the [`Wire`] it registers. Models are flat f32 vectors on
//! the host, gradients come from a [`Replica`], and the updates ([`optimizer`]) run on the CPU
//! in a fixed order so that every peer gets the same bits.

pub mod blocks;
pub mod calibrate;
pub mod cost;
mod cser;
mod ef;
mod ef21p;
pub mod exchange;
mod liec;
pub mod replica;
pub mod sim;
pub mod worker;

use std::fmt;
use std::str::FromStr;

/// The host optimizers live in [`crate::optim::host`], below both the algorithms and the
/// parameter servers that own blocks (`comm::owner`); their paths here stay as they were.
pub use crate::optim::host as optimizer;
pub use blocks::{Block, Blocking};
pub use ef::downlink_for;
pub use exchange::{Exchange, Own, Traffic, Wire};
pub use optimizer::{HostOptimizer, Hyper, OptimizerSpec};
pub use replica::{ClassifierReplica, Replica};
pub use worker::Worker;

use crate::error::{Error, Result};
use crate::feedback::Memory;

/// One worker's side of an algorithm.
pub trait Method: Send {
    /// What the servers do with every block.
    fn wire(&self) -> Wire;

    /// Runs before the first gradient, with the model `x` every worker starts from: where the
    /// servers own the parameters, the parameter round that hands them over (and `x` becomes
    /// what the workers compute with).
    fn start(&mut self, _ex: &mut Exchange, _x: &mut [f32]) -> Result<()> {
        Ok(())
    }

    /// One iteration: `g` is this worker's gradient at its model `x` (without weight decay);
    /// communicates through `ex` and updates `x`.
    fn step(&mut self, ex: &mut Exchange, x: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()>;

    /// The error this worker carries from step to step, in gradient units (MEM-SGD's `e_i`,
    /// CSER's `s_i`), for the error-norm diagnostic `|avg_i e_i + e_server|`; `None` where it
    /// keeps none (LoCo's: the compensation its int8 memory will add next).
    fn worker_error(&self) -> Option<Vec<f32>> {
        None
    }

    /// The model to evaluate, given the average of the workers' models and the servers'
    /// error: the average itself, except where the true iterate lives on the servers.
    fn evaluated_model(&self, average: &[f32], _server_error: Option<&[f32]>) -> Vec<f32> {
        average.to_vec()
    }
}

/// The algorithms, as users name them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MethodSpec {
    /// Full precision both ways.
    PSgd,
    /// Compressed pushes, the exact mean back, no memory (loco.md's naive low-bit baseline);
    /// `sharded`: the servers own the parameters instead (loco.md §2.6's sharded path: they
    /// step the optimizer and send bf16 parameters back; with bf16 pushes, the paper's 16-bit
    /// FSDP baseline).
    Direct {
        /// Whether the servers own the parameters (the sharded path) instead of the workers.
        sharded: bool,
    },
    /// Worker error feedback, exact downlink (Stich et al.).
    MemSgd,
    /// Compressed both ways, no memory (byteps-clan.md Algorithm 3, for unbiased codecs).
    TwoWay,
    /// Error feedback on both sides (Tang et al.; byteps-clan.md Algorithm 4).
    DoubleSqueeze,
    /// Immediate local compensation, residuals reset every `period` steps (Xie et al.).
    Cser {
        /// Steps between resets of the residuals.
        period: u64,
    },
    /// Recursive compression of `rounds` rounds, error feedback on both sides (Huang et al.).
    Neolithic {
        /// Compression rounds per step, each compressing what the previous ones left.
        rounds: u32,
    },
    /// Compressed gradients at a shared point, primal compression of the model (Gruntkowska
    /// et al.).
    Ef21P,
    /// Local immediate error compensation, server error, averaging every `period` steps.
    Liec {
        /// Steps between averaging rounds of the models.
        period: u64,
    },
    /// LoCo (loco.md Algorithm 1): the moving average of residuals with weight `beta`, kept as
    /// int8 at scale 2^log2se (or in f32 too: `reference`, mode A), reset every `reset` steps
    /// (0: never); exact downlink. `log2se` defaults to the LoCo codec's log2 s + 2 (s_e = 4s).
    /// `sharded`: the sharded path, as for [`MethodSpec::Direct`]; otherwise the replicated
    /// path (the integer sum of the codes comes back and every worker steps its optimizer).
    Loco {
        /// Weight of the newest residual in the moving average, in (0, 1].
        beta: f32,
        /// Steps between resets of the residual average (0: never).
        reset: u32,
        /// Whether to keep the residual average in f32 as well (mode A, the reference), rather than
        /// only as int8.
        reference: bool,
        /// Log2 of the int8 scale of the residual average, or `None` for the codec's log2 s + 2.
        log2se: Option<i32>,
        /// Whether the servers own the parameters (the sharded path) instead of every worker
        /// stepping its optimizer.
        sharded: bool,
    },
}

/// What a method is built for besides its codec.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// Workers in the run.
    pub world: usize,
    /// Element counts of the model's parameter tensors, in order.
    pub sizes: Vec<usize>,
    /// The update applied to the averaged gradient.
    pub optimizer: OptimizerSpec,
}

impl MethodSpec {
    /// LoCo with the defaults of loco.md §2.9 (β = 0.2, T_c = 512, mode B).
    pub const LOCO: MethodSpec = MethodSpec::Loco {
        beta: 0.2,
        reset: 512,
        reference: false,
        log2se: None,
        sharded: false,
    };

    /// Naive compression on the replicated path.
    pub const DIRECT: MethodSpec = MethodSpec::Direct { sharded: false };

    /// Builds the worker side of the algorithm with codec `codec` (a codec spec).
    pub fn build(self, codec: &str, setup: &Setup) -> Result<Box<dyn Method>> {
        use ef::{Downlink, ErrorFeedback, WorkerMemory};
        crate::compress::parse(codec)?;
        let sgd_only = matches!(
            self,
            MethodSpec::Cser { .. } | MethodSpec::Ef21P | MethodSpec::Liec { .. }
        );
        if sgd_only && setup.optimizer != OptimizerSpec::Sgd {
            return Err(Error::Config(format!(
                "{self} is defined with plain SGD steps, not with {}",
                setup.optimizer
            )));
        }
        let sharded = matches!(
            self,
            MethodSpec::Direct { sharded: true } | MethodSpec::Loco { sharded: true, .. }
        );
        if sharded && matches!(setup.optimizer, OptimizerSpec::Lans { .. }) {
            return Err(Error::Config(
                "the sharded path steps each block on its own server, and lans's trust ratios \
                 need whole tensors: use sgd, nag or adamw"
                    .into(),
            ));
        }
        // The owners rebuild the optimizer from its name: constants the name does not carry
        // would silently be the defaults there.
        if sharded && setup.optimizer.to_string().parse::<OptimizerSpec>()? != setup.optimizer {
            return Err(Error::Config(format!(
                "the sharded path runs {} on the servers with its default constants only",
                setup.optimizer
            )));
        }
        let exact = if sharded {
            Downlink::Owner(setup.optimizer)
        } else {
            Downlink::Exact
        };
        let family = |codec: &str, memory, downlink| -> Result<Box<dyn Method>> {
            Ok(Box::new(ErrorFeedback::new(
                codec,
                memory,
                downlink,
                setup.world,
                setup.optimizer.build(&setup.sizes),
            )?))
        };
        let residual = || WorkerMemory::Residual(Vec::new());
        Ok(match self {
            MethodSpec::PSgd => family("f32", WorkerMemory::None, Downlink::Exact)?,
            MethodSpec::Direct { .. } => family(codec, WorkerMemory::None, exact)?,
            MethodSpec::MemSgd => family(codec, residual(), Downlink::Exact)?,
            MethodSpec::TwoWay => family(codec, WorkerMemory::None, Downlink::Compressed)?,
            MethodSpec::DoubleSqueeze => family(codec, residual(), Downlink::CompressedEf)?,
            MethodSpec::Neolithic { rounds } => {
                let fcc = match codec {
                    "f32" => "f32".to_string(),
                    "sign" => format!("sign:rounds={rounds}"),
                    other => {
                        return Err(Error::Config(format!(
                            "neolithic compresses recursively with the scaled sign (codec sign) \
                             or not at all (f32), not with {other}"
                        )))
                    }
                };
                family(&fcc, residual(), Downlink::CompressedEf)?
            }
            MethodSpec::Loco {
                beta,
                reset,
                reference,
                log2se,
                ..
            } => {
                let log2se = match (log2se, codec.parse::<crate::compress::CodecSpec>()?) {
                    (Some(l), _) => l,
                    (None, crate::compress::CodecSpec::Loco { log2s, .. }) => log2s + 2,
                    (None, _) => {
                        return Err(Error::Config(format!(
                            "loco with codec {codec}: give the error scale (log2se=N), which \
                             defaults to 4 s only for the loco codec"
                        )))
                    }
                };
                let memory = Memory::LocoEma {
                    beta,
                    reset_every: reset,
                    se: 2f32.powi(log2se),
                    reference,
                };
                family(codec, WorkerMemory::Feedback(memory, Vec::new()), exact)?
            }
            MethodSpec::Cser { period } => Box::new(cser::Cser::new(codec, period)),
            MethodSpec::Ef21P => Box::new(ef21p::Ef21P::new(codec)),
            MethodSpec::Liec { period } => Box::new(liec::Liec::new(codec, period)),
        })
    }

    /// Every algorithm of liec-sgd.md's Table III, with the paper's periods.
    pub fn liec_table() -> Vec<MethodSpec> {
        vec![
            MethodSpec::PSgd,
            MethodSpec::MemSgd,
            MethodSpec::DoubleSqueeze,
            MethodSpec::Cser { period: 8 },
            MethodSpec::Neolithic { rounds: 2 },
            MethodSpec::Ef21P,
            MethodSpec::Liec { period: 32 },
            MethodSpec::Liec { period: 100 },
        ]
    }
}

impl fmt::Display for MethodSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MethodSpec::PSgd => write!(f, "psgd"),
            MethodSpec::Direct { sharded } => {
                write!(f, "direct{}", if *sharded { ":sharded" } else { "" })
            }
            MethodSpec::MemSgd => write!(f, "mem-sgd"),
            MethodSpec::TwoWay => write!(f, "two-way"),
            MethodSpec::DoubleSqueeze => write!(f, "double-squeeze"),
            MethodSpec::Cser { period } => write!(f, "cser:{period}"),
            MethodSpec::Neolithic { rounds } => write!(f, "neolithic:{rounds}"),
            MethodSpec::Ef21P => write!(f, "ef21p"),
            MethodSpec::Liec { period } => write!(f, "liec:{period}"),
            MethodSpec::Loco {
                beta,
                reset,
                reference,
                log2se,
                sharded,
            } => {
                write!(f, "loco:beta={beta}:reset={reset}")?;
                if *reference {
                    write!(f, ":f32")?;
                }
                if let Some(l) = log2se {
                    write!(f, ":log2se={l}")?;
                }
                if *sharded {
                    write!(f, ":sharded")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for MethodSpec {
    type Err = Error;

    /// `psgd`, `direct[:sharded]`, `mem-sgd`, `two-way`, `double-squeeze`, `cser[:H_c]`,
    /// `neolithic[:R]`, `ef21p`, `liec[:H]`,
    /// `loco[:beta=B][:reset=T][:f32][:log2se=N][:sharded]`.
    fn from_str(text: &str) -> Result<Self> {
        let (name, arg) = match text.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (text, None),
        };
        let bad = |why: &str| {
            Error::Config(format!(
                "algorithm {text:?}: {why}; use psgd, direct[:sharded], mem-sgd, two-way, \
                 double-squeeze, cser[:H], neolithic[:R], ef21p, liec[:H] or \
                 loco[:beta=B][:reset=T][:f32][:log2se=N][:sharded]"
            ))
        };
        let number = |default: u64| -> Result<u64> {
            match arg {
                None => Ok(default),
                Some(a) => a
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| bad("the parameter is a positive integer")),
            }
        };
        let no_arg = |spec: MethodSpec| match arg {
            None => Ok(spec),
            Some(_) => Err(bad("takes no parameter")),
        };
        match name {
            "psgd" | "p-sgd" => no_arg(MethodSpec::PSgd),
            "direct" => match arg {
                None => Ok(MethodSpec::DIRECT),
                Some("sharded") => Ok(MethodSpec::Direct { sharded: true }),
                Some(_) => Err(bad("direct takes only :sharded")),
            },
            "mem-sgd" | "mem" => no_arg(MethodSpec::MemSgd),
            "two-way" => no_arg(MethodSpec::TwoWay),
            "double-squeeze" | "ds" => no_arg(MethodSpec::DoubleSqueeze),
            "ef21p" | "ef21-p" => no_arg(MethodSpec::Ef21P),
            "cser" => Ok(MethodSpec::Cser { period: number(8)? }),
            "liec" | "liec-sgd" => Ok(MethodSpec::Liec {
                period: number(32)?,
            }),
            "neolithic" => {
                let rounds = number(2)?;
                if rounds > 8 {
                    return Err(bad("at most 8 rounds"));
                }
                Ok(MethodSpec::Neolithic {
                    rounds: rounds as u32,
                })
            }
            "loco" => {
                let MethodSpec::Loco {
                    mut beta,
                    mut reset,
                    mut reference,
                    mut log2se,
                    mut sharded,
                } = MethodSpec::LOCO
                else {
                    unreachable!()
                };
                for part in arg.into_iter().flat_map(|a| a.split(':')) {
                    match part.split_once('=') {
                        None if part == "f32" => reference = true,
                        None if part == "sharded" => sharded = true,
                        Some(("beta", v)) => {
                            beta = v
                                .parse()
                                .ok()
                                .filter(|b| (0.0..=1.0).contains(b))
                                .ok_or_else(|| bad("beta is a number from 0 to 1"))?
                        }
                        Some(("reset", v)) => {
                            reset = v.parse().map_err(|_| bad("reset is a step count"))?
                        }
                        Some(("log2se", v)) => {
                            log2se = Some(
                                v.parse()
                                    .ok()
                                    .filter(|l: &i32| l.abs() <= 100)
                                    .ok_or_else(|| bad("log2se is an integer from -100 to 100"))?,
                            )
                        }
                        _ => return Err(bad("unknown parameter")),
                    }
                }
                Ok(MethodSpec::Loco {
                    beta,
                    reset,
                    reference,
                    log2se,
                    sharded,
                })
            }
            _ => Err(bad("unknown algorithm")),
        }
    }
}

/// `|v|²`, summed in f64.
pub(crate) fn norm2(v: &[f32]) -> f64 {
    v.iter().map(|v| (*v as f64).powi(2)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_round_trip_and_bad_ones_explain() {
        for m in MethodSpec::liec_table() {
            assert_eq!(m.to_string().parse::<MethodSpec>().unwrap(), m);
        }
        assert_eq!(
            "liec".parse::<MethodSpec>().unwrap(),
            MethodSpec::Liec { period: 32 }
        );
        for bad in ["", "sgd", "liec:0", "liec:x", "psgd:3", "neolithic:9"] {
            let e = bad.parse::<MethodSpec>().unwrap_err().to_string();
            assert!(e.contains("algorithm"), "{bad}: {e}");
        }
        for m in [
            MethodSpec::DIRECT,
            MethodSpec::Direct { sharded: true },
            MethodSpec::TwoWay,
            MethodSpec::LOCO,
            "loco:beta=1:reset=0:f32:log2se=12:sharded".parse().unwrap(),
        ] {
            assert_eq!(m.to_string().parse::<MethodSpec>().unwrap(), m);
        }
        for bad in [
            "loco:beta=2",
            "loco:reset=x",
            "loco:zip",
            "two-way:1",
            "direct:zip",
        ] {
            assert!(bad.parse::<MethodSpec>().is_err(), "{bad}");
        }
        let setup = |optimizer| Setup {
            world: 4,
            sizes: vec![10],
            optimizer,
        };
        let sgd = setup(OptimizerSpec::Sgd);
        assert!(MethodSpec::Neolithic { rounds: 2 }
            .build("topk:0.1", &sgd)
            .is_err());
        assert!(MethodSpec::Liec { period: 4 }.build("zip", &sgd).is_err());
        // The SGD-defined methods refuse other optimizers; the family takes any.
        assert!(MethodSpec::Liec { period: 4 }
            .build("sign", &setup(OptimizerSpec::LANS))
            .is_err());
        assert!(MethodSpec::DoubleSqueeze
            .build("sign", &setup(OptimizerSpec::LANS))
            .is_ok());
        // Owners step blocks on their own: no per-tensor norms.
        assert!(MethodSpec::Direct { sharded: true }
            .build("bf16", &setup(OptimizerSpec::LANS))
            .is_err());
        let custom_adam = OptimizerSpec::AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
        };
        assert!(MethodSpec::Direct { sharded: true }
            .build("bf16", &setup(custom_adam))
            .is_err());
        assert!(MethodSpec::Direct { sharded: true }
            .build("bf16", &setup(OptimizerSpec::ADAMW))
            .is_ok());
        // LoCo's error scale defaults to 4 s only where the codec has an s.
        assert!(MethodSpec::LOCO.build("blockq:bits=4", &sgd).is_err());
        assert!("loco:log2se=12"
            .parse::<MethodSpec>()
            .unwrap()
            .build("blockq:bits=4", &sgd)
            .is_ok());
    }
}
