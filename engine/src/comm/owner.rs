//! A server that owns its key's parameters: the sharded path of loco.md §2.6 (FSDP / ZeRO).
//!
//! Each block of the model has one owner, the server shard of its key. Workers push their
//! compressed gradients of the block (the all-to-all's traffic: every worker sends block j to
//! its owner), the owner decodes them and averages in f32 without re-quantizing partial sums,
//! steps its optimizer on its f32 master copy of the block and replies with the parameters in
//! the pull codec (bf16: the parameter all-gather). Workers keep no optimizer state and compute
//! with the 16-bit parameters, as FSDP's mixed precision does.
//!
//! Two things travel that other keys do not carry:
//! - round 0 is the parameter round: every rank pushes its initial parameters of the block in
//!   f32 and the owner adopts them (replicas must start from the same bits);
//! - every later push starts with the step's learning rate and weight decay ([`StepHeader`]),
//!   which the workers' schedule sets.
//!
//! The pushes of a round must agree on those (the shard checks each as it arrives: a push that
//! disagrees is refused, and costs its sender, never the round).
//!
//! Only element-wise optimizers can own a block: LANS's per-tensor norms need whole tensors.
//! An owner's master copy and optimizer state live only on its server: owned keys have no
//! snapshot, so a worker cannot rejoin them and a restarted server cannot resume them.

use crate::error::{Error, Result};
use crate::optim::host::{HostOptimizer, Hyper, OptimizerSpec};

/// The learning rate and weight decay a push carries to its owner, 8 bytes before the codec's
/// payload: two little-endian f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepHeader {
    /// The step's learning rate.
    pub lr: f32,
    /// The step's decoupled weight decay.
    pub weight_decay: f32,
}

impl StepHeader {
    /// Size of the encoded header in bytes.
    pub const LEN: usize = 8;

    /// The header as it precedes the payload: `lr` then `weight_decay`, little-endian f32.
    pub fn to_bytes(self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&self.lr.to_le_bytes());
        out[4..].copy_from_slice(&self.weight_decay.to_le_bytes());
        out
    }

    /// Splits a push into its header and the codec's payload; a short push or a header that is
    /// not finite is an error.
    pub fn split(payload: &[u8]) -> Result<(StepHeader, &[u8])> {
        if payload.len() < Self::LEN {
            return Err(Error::Data(format!(
                "a push to an owner starts with an {}-byte step header; this one has {} bytes",
                Self::LEN,
                payload.len()
            )));
        }
        let f = |i: usize| f32::from_le_bytes(payload[i..i + 4].try_into().expect("4 bytes"));
        let header = StepHeader {
            lr: f(0),
            weight_decay: f(4),
        };
        if !header.lr.is_finite() || !header.weight_decay.is_finite() {
            return Err(Error::Data(format!(
                "step header with learning rate {} and weight decay {}",
                header.lr, header.weight_decay
            )));
        }
        Ok((header, &payload[Self::LEN..]))
    }
}

/// What an owner keeps of its block between rounds.
pub struct Owner {
    optimizer: HostOptimizer,
    /// The f32 master parameters; `None` before the parameter round.
    master: Option<Vec<f32>>,
    /// Optimizer steps taken (the bias correction's t).
    steps: u64,
}

impl Owner {
    /// An owner of `numel` parameters that updates them with `spec` (sgd, nag or adamw).
    pub fn new(spec: &str, numel: usize) -> Result<Self> {
        let spec: OptimizerSpec = spec.parse()?;
        if let OptimizerSpec::Lans { .. } = spec {
            return Err(Error::Config(
                "lans cannot own a block of a sharded model: its trust ratios need each \
                 tensor's norms; use sgd, nag or adamw"
                    .into(),
            ));
        }
        Ok(Owner {
            optimizer: spec.build(&[numel]),
            master: None,
            steps: 0,
        })
    }

    /// The parameter round: adopts the initial parameters (the shard checked that the ranks
    /// agree on them).
    pub fn adopt(&mut self, params: Vec<f32>) -> &[f32] {
        self.master.insert(params)
    }

    /// One optimizer step of the master parameters with the averaged gradient `mean`.
    pub fn step(&mut self, mean: &[f32], header: StepHeader) -> Result<&[f32]> {
        let master = self.master.as_mut().ok_or_else(|| {
            Error::Data("an owner got gradients before the parameter round".into())
        })?;
        let hyper = Hyper {
            step: self.steps,
            lr: header.lr,
            weight_decay: header.weight_decay,
        };
        self.optimizer.step(master, mean, hyper)?;
        self.steps += 1;
        Ok(master)
    }

    /// The f32 master parameters (after the parameter round).
    pub fn master(&self) -> Option<&[f32]> {
        self.master.as_deref()
    }

    /// Everything the owner keeps, for a server that writes its state to disk.
    pub fn saved(&self) -> SavedOwner {
        let (m, v) = self.optimizer.moments();
        SavedOwner {
            master: self.master.clone(),
            steps: self.steps,
            m: m.to_vec(),
            v: v.to_vec(),
        }
    }

    /// Takes back what [`Owner::saved`] gave, checking its sizes against this owner's.
    pub fn restore(&mut self, saved: SavedOwner) -> Result<()> {
        let numel = self.optimizer.moments_len();
        if saved.master.as_ref().is_some_and(|p| p.len() != numel) {
            return Err(Error::Data(format!(
                "saved master parameters do not fit a block of {numel} elements"
            )));
        }
        self.optimizer.set_moments(saved.m, saved.v)?;
        self.master = saved.master;
        self.steps = saved.steps;
        Ok(())
    }
}

/// What an [`Owner`] keeps between rounds, as plain values.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedOwner {
    /// The master parameters, once adopted.
    #[serde(with = "crate::saved_bytes::opt_f32s")]
    pub master: Option<Vec<f32>>,
    /// Optimizer steps taken.
    pub steps: u64,
    /// The optimizer's first moment (or momentum).
    #[serde(with = "crate::saved_bytes::f32s")]
    pub m: Vec<f32>,
    /// The optimizer's second moment.
    #[serde(with = "crate::saved_bytes::f32s")]
    pub v: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_errors() {
        let h = StepHeader {
            lr: 1e-3,
            weight_decay: 0.01,
        };
        let mut push = h.to_bytes().to_vec();
        push.extend([1, 2, 3]);
        let (back, rest) = StepHeader::split(&push).unwrap();
        assert_eq!((back, rest), (h, &[1u8, 2, 3][..]));
        assert!(StepHeader::split(&push[..7]).is_err());
        let mut nan = push.clone();
        nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(StepHeader::split(&nan).is_err());
    }

    #[test]
    fn an_owner_steps_only_after_adopting() {
        let mut owner = Owner::new("sgd", 2).unwrap();
        let header = StepHeader {
            lr: 0.5,
            weight_decay: 0.0,
        };
        assert!(
            owner.step(&[1.0, 1.0], header).is_err(),
            "no parameters yet"
        );
        assert_eq!(owner.adopt(vec![1.0, 2.0]), [1.0, 2.0]);
        assert_eq!(owner.step(&[1.0, -2.0], header).unwrap(), [0.5, 3.0]);
        assert!(Owner::new("lans", 2).is_err());
    }
}
