//! LIEC-SGD (liec-sgd.md §2, Algorithm 1). Workers compress their raw gradient and add the
//! local error back at once; only the server keeps an error; every H-th step is a sync round
//! that averages the models and flushes the server's error.
//!
//! ```text
//! ordinary step: send C(g_i), r_i := g_i − D(C(g_i)); the server replies C(v), v = e + mean,
//!                e := v − D(C(v)); x_i := x_i − η(p + r_i + λx_i)
//! sync step:     fused payload in gradient units, z_i := g_i − (1 − ηλ)x_i / η, sent in f32;
//!                the server replies mean_i z_i + e in f32 and resets e;
//!                x_i := −η · reply = (1 − ηλ)x̄ − η(mean_i g_i + e) = x̄ − η(p + λx̄)
//! ```
//! The spec's fused form sends `y_i = (1 − ηλ)x_i − ηg_i` and has the server return
//! `ȳ − ηe`; `z_i = −y_i / η` is the same message in gradient units, so the server's sync rule
//! (mean plus error, error reset) needs no learning rate and is the same for every algorithm.
//! Equal to Algorithm 1 in exact arithmetic; `tests/liec_sgd.rs` checks it against a literal,
//! unfused transcription to rounding.

use super::{Exchange, Hyper, Method, Own, Wire};
use crate::error::{Error, Result};

pub(super) struct Liec {
    codec: String,
    period: u64,
}

impl Liec {
    pub fn new(codec: &str, period: u64) -> Self {
        Liec {
            codec: codec.to_string(),
            period,
        }
    }
}

impl Method for Liec {
    fn wire(&self) -> Wire {
        Wire {
            push: self.codec.clone(),
            pull: self.codec.clone(),
            server_memory: "ef".into(),
            sync_every: self.period,
            owner: String::new(),
        }
    }

    fn step(&mut self, ex: &mut Exchange, x: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()> {
        let (lr, wd) = (hyper.lr, hyper.weight_decay);
        // The servers know sync rounds by round number; one round per step keeps that the
        // global step counter t of the spec (§6.12).
        if ex.round() != hyper.step {
            return Err(Error::Config(format!(
                "LIEC-SGD exchanges one round per step, but step {} meets round {}",
                hyper.step,
                ex.round()
            )));
        }
        if ex.is_sync() {
            if lr.is_nan() || lr <= 0.0 {
                return Err(Error::Config(format!(
                    "LIEC-SGD's sync step needs a positive learning rate, not {lr}"
                )));
            }
            let keep = 1.0 - lr * wd;
            let z: Vec<f32> = g
                .iter()
                .zip(x.iter())
                .map(|(g, x)| g - keep * x / lr)
                .collect();
            // The plain codec would send an overflow as zero, and the model with it.
            if z.iter().any(|v| !v.is_finite()) {
                return Err(Error::Data(format!(
                    "LIEC-SGD's sync payload overflows at learning rate {lr}: the model or \
                     its gradient is not finite, or the rate is too small"
                )));
            }
            let reply = ex.exchange(&z, Own::Nothing)?;
            x.iter_mut().zip(&reply).for_each(|(x, r)| *x = -lr * r);
        } else {
            // r_i lives only within this step.
            let mut r = vec![0.0f32; g.len()];
            let p = ex.exchange(g, Own::Residual(&mut r))?;
            x.iter_mut()
                .zip(p.iter().zip(&r))
                .for_each(|(x, (p, r))| *x -= lr * (p + r + wd * *x));
        }
        Ok(())
    }
}
