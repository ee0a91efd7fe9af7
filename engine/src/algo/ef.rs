//! The error-feedback family of liec-sgd.md §3: P-SGD (nothing compressed), MEM-SGD (worker
//! error feedback, full-precision downlink), DoubleSqueeze (error feedback on both sides) and
//! Neolithic (DoubleSqueeze with the recursive compressor). All workers hold the same model.
//!
//! ```text
//! worker: a := g + e ; c := C(a) ; e := a − D(c) ; send c      (without memory: c := C(g))
//! server: v := mean_i D(c_i) + e_s ; p := C'(v) ; e_s := v − D(p) ; send p   (C' may be f32)
//! worker: x := x − η(D(p) + λx)
//! ```

use super::{sgd_step, Exchange, Hyper, Method, Own, Wire};
use crate::compress::support::clean;
use crate::error::Result;

pub(super) struct ErrorFeedback {
    codec: String,
    worker_memory: bool,
    compressed_downlink: bool,
    /// The worker's error `e_i` (empty until the first step, or without memory).
    error: Vec<f32>,
}

impl ErrorFeedback {
    pub fn new(codec: &str, worker_memory: bool, compressed_downlink: bool) -> Self {
        ErrorFeedback {
            codec: codec.to_string(),
            worker_memory,
            compressed_downlink,
            error: Vec::new(),
        }
    }
}

impl Method for ErrorFeedback {
    fn wire(&self) -> Wire {
        let (pull, server_memory) = if self.compressed_downlink {
            (self.codec.clone(), "ef")
        } else {
            ("f32".to_string(), "none")
        };
        Wire {
            push: self.codec.clone(),
            pull,
            server_memory: server_memory.into(),
            sync_every: 0,
        }
    }

    fn step(&mut self, ex: &mut Exchange, x: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()> {
        let u = if self.worker_memory {
            if self.error.len() != g.len() {
                self.error = vec![0.0; g.len()];
            }
            let a: Vec<f32> = g
                .iter()
                .zip(&self.error)
                .map(|(g, e)| clean(g + e))
                .collect();
            ex.exchange(&a, Own::Residual(&mut self.error))?
        } else {
            ex.exchange(g, Own::Nothing)?
        };
        sgd_step(x, &u, hyper);
        Ok(())
    }

    fn worker_error(&self) -> Option<&[f32]> {
        self.worker_memory.then_some(self.error.as_slice())
    }
}
