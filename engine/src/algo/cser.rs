//! CSER (liec-sgd.md §3, from the LIEC code): immediate local compensation every step, and
//! every H_c steps a second round that replaces each worker's compressed drift by the average.
//!
//! ```text
//! every step:  send C(g_i), r_i := g_i − D(C(g_i)), s_i := s_i − r_i; the server replies the
//!              mean in f32; dir := u + r_i
//! every H_c:   send C(s_i), q_i := D(C(s_i)), s_i := s_i − q_i; the server replies mean q in
//!              f32; dir := dir + q_i − q
//! then         x_i := x_i − η(dir + λx_i)
//! ```
//! `η s_i` is worker i's drift from the average model; with the identity codec the reset round
//! makes every model equal.

use super::{Exchange, Hyper, Method, Own, Wire};
use crate::error::Result;
use crate::optim::host::sgd_step;

pub(super) struct Cser {
    codec: String,
    period: u64,
    /// s_i, the accumulated residuals.
    residuals: Vec<f32>,
}

impl Cser {
    pub fn new(codec: &str, period: u64) -> Self {
        Cser {
            codec: codec.to_string(),
            period,
            residuals: Vec::new(),
        }
    }
}

impl Method for Cser {
    fn wire(&self) -> Wire {
        Wire {
            push: self.codec.clone(),
            pull: "f32".into(),
            server_memory: "none".into(),
            sync_every: 0,
            owner: String::new(),
        }
    }

    fn step(&mut self, ex: &mut Exchange, x: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()> {
        let n = g.len();
        if self.residuals.len() != n {
            self.residuals = vec![0.0; n];
        }
        let mut r = vec![0.0f32; n];
        let mut dir = ex.exchange(g, Own::Residual(&mut r))?;
        for i in 0..n {
            self.residuals[i] -= r[i];
            dir[i] += r[i];
        }
        if (hyper.step + 1).is_multiple_of(self.period) {
            // q_i: exactly what the servers decode from this worker's push.
            let mut own = vec![0.0f32; n];
            let q = ex.exchange(&self.residuals, Own::Decoded(&mut own))?;
            for i in 0..n {
                self.residuals[i] -= own[i];
                dir[i] += own[i] - q[i];
            }
        }
        sgd_step(x, &dir, hyper);
        Ok(())
    }

    fn worker_error(&self) -> Option<Vec<f32>> {
        Some(self.residuals.clone())
    }
}
