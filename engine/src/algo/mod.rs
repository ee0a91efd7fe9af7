//! The data-parallel algorithms of the papers, each written once against
//! [`Collective`](crate::comm::Collective) through an [`Exchange`], so that each runs
//! in-process and over QUIC unchanged.
//!
//! LIEC-SGD and its baselines (liec-sgd.md): P-SGD, MEM-SGD, DoubleSqueeze, CSER, Neolithic,
//! EF21-P and LIEC-SGD itself. Each keeps its worker-side state here; what the servers do (the
//! codecs both ways, their error feedback, sync rounds) is the [`Wire`] it registers. Models
//! are flat f32 vectors on the host, gradients come from a [`Replica`], and the update is the
//! paper's plain SGD step `x ← x − η(u + λx)` (momentum 0, liec-sgd.md §5), computed on the CPU
//! in a fixed order so that every peer gets the same bits.

pub mod blocks;
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

pub use blocks::{Block, Blocking};
pub use exchange::{Exchange, Own, Traffic, Wire};
pub use replica::{ClassifierReplica, Replica};
pub use worker::Worker;

use crate::error::{Error, Result};

/// The step's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// Global iteration t (never reset at epoch ends).
    pub step: u64,
    /// η_t.
    pub lr: f32,
    /// λ, applied locally and uncompressed except where an algorithm says otherwise.
    pub weight_decay: f32,
}

/// One worker's side of an algorithm.
pub trait Method: Send {
    /// What the servers do with every block.
    fn wire(&self) -> Wire;

    /// One iteration: `g` is this worker's gradient at its model `x` (without weight decay);
    /// communicates through `ex` and updates `x`.
    fn step(&mut self, ex: &mut Exchange, x: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()>;

    /// The error this worker carries from step to step, in gradient units (MEM-SGD's `e_i`,
    /// CSER's `s_i`), for the error-norm diagnostic `|avg_i e_i + e_server|`; `None` where it
    /// keeps none.
    fn worker_error(&self) -> Option<&[f32]> {
        None
    }

    /// The model to evaluate, given the average of the workers' models and the servers'
    /// error: the average itself, except where the true iterate lives on the servers.
    fn evaluated_model(&self, average: &[f32], _server_error: Option<&[f32]>) -> Vec<f32> {
        average.to_vec()
    }
}

/// The algorithms, as users name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodSpec {
    /// Full precision both ways.
    PSgd,
    /// Worker error feedback, full-precision downlink (Stich et al.).
    MemSgd,
    /// Error feedback on both sides (Tang et al.).
    DoubleSqueeze,
    /// Immediate local compensation, residuals reset every `period` steps (Xie et al.).
    Cser { period: u64 },
    /// Recursive compression of `rounds` rounds, error feedback on both sides (Huang et al.).
    Neolithic { rounds: u32 },
    /// Compressed gradients at a shared point, primal compression of the model (Gruntkowska
    /// et al.).
    Ef21P,
    /// Local immediate error compensation, server error, averaging every `period` steps.
    Liec { period: u64 },
}

impl MethodSpec {
    /// Builds the worker side of the algorithm with codec `codec` (a codec spec).
    pub fn build(self, codec: &str) -> Result<Box<dyn Method>> {
        crate::compress::parse(codec)?;
        Ok(match self {
            MethodSpec::PSgd => Box::new(ef::ErrorFeedback::new("f32", false, false)),
            MethodSpec::MemSgd => Box::new(ef::ErrorFeedback::new(codec, true, false)),
            MethodSpec::DoubleSqueeze => Box::new(ef::ErrorFeedback::new(codec, true, true)),
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
                Box::new(ef::ErrorFeedback::new(&fcc, true, true))
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
            MethodSpec::MemSgd => write!(f, "mem-sgd"),
            MethodSpec::DoubleSqueeze => write!(f, "double-squeeze"),
            MethodSpec::Cser { period } => write!(f, "cser:{period}"),
            MethodSpec::Neolithic { rounds } => write!(f, "neolithic:{rounds}"),
            MethodSpec::Ef21P => write!(f, "ef21p"),
            MethodSpec::Liec { period } => write!(f, "liec:{period}"),
        }
    }
}

impl FromStr for MethodSpec {
    type Err = Error;

    /// `psgd`, `mem-sgd`, `double-squeeze`, `cser[:H_c]`, `neolithic[:R]`, `ef21p`, `liec[:H]`.
    fn from_str(text: &str) -> Result<Self> {
        let (name, arg) = match text.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (text, None),
        };
        let bad = |why: &str| {
            Error::Config(format!(
                "algorithm {text:?}: {why}; use psgd, mem-sgd, double-squeeze, cser[:H], \
                 neolithic[:R], ef21p or liec[:H]"
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
            "mem-sgd" | "mem" => no_arg(MethodSpec::MemSgd),
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
            _ => Err(bad("unknown algorithm")),
        }
    }
}

/// `|v|²`, summed in f64.
pub(crate) fn norm2(v: &[f32]) -> f64 {
    v.iter().map(|v| (*v as f64).powi(2)).sum()
}

/// The local SGD step every method ends with: `x ← x − η(u + λx)`.
fn sgd_step(x: &mut [f32], u: &[f32], hyper: Hyper) {
    let (lr, wd) = (hyper.lr, hyper.weight_decay);
    x.iter_mut()
        .zip(u)
        .for_each(|(x, u)| *x -= lr * (u + wd * *x));
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
        assert!(MethodSpec::Neolithic { rounds: 2 }
            .build("topk:0.1")
            .is_err());
        assert!(MethodSpec::Liec { period: 4 }.build("zip").is_err());
    }
}
