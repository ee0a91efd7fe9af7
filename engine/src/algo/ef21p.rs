//! EF21-P + DCGD (liec-sgd.md §3, the [std] definition: not in the LIEC code). Workers send the
//! compressed gradient at the shared point w, without error feedback; the server moves the
//! true iterate x and sends the compressed difference `C(x − w)`, which everyone adds to w.
//!
//! It is a server error-feedback rule on model steps: workers push `c_i = C(η(g_i + λw))`;
//! with the server's memory `M = w − x`, `v := mean_i D(c_i) + M`, `p := C(v)`, `M := v − D(p)`,
//! and everyone steps `w := w − D(p)`. This is the primal form exactly, for any learning-rate
//! schedule, with a codec that commutes with sign and positive scale (`C(−v) = −C(v)`,
//! `C(ηv) = ηC(v)`: scaled sign, top-k; sign(0) aside): `x − w = −v` before the reply, so
//! `C(x − w) = −C(v)`. Weight decay enters the gradient at w (the spec's choice), and the model
//! evaluated is the true iterate `x = w − M`.

use super::{Exchange, Hyper, Method, Own, Wire};
use crate::error::Result;

pub(super) struct Ef21P {
    codec: String,
}

impl Ef21P {
    pub fn new(codec: &str) -> Self {
        Ef21P {
            codec: codec.to_string(),
        }
    }
}

impl Method for Ef21P {
    fn wire(&self) -> Wire {
        Wire {
            push: self.codec.clone(),
            pull: self.codec.clone(),
            server_memory: "ef".into(),
            sync_every: 0,
            owner: String::new(),
        }
    }

    fn step(&mut self, ex: &mut Exchange, w: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()> {
        let q: Vec<f32> = g
            .iter()
            .zip(w.iter())
            .map(|(g, w)| hyper.lr * (g + hyper.weight_decay * w))
            .collect();
        let p = ex.exchange(&q, Own::Nothing)?;
        w.iter_mut().zip(&p).for_each(|(w, p)| *w -= p);
        Ok(())
    }

    fn evaluated_model(&self, average: &[f32], server_error: Option<&[f32]>) -> Vec<f32> {
        match server_error {
            Some(m) => average.iter().zip(m).map(|(w, m)| w - m).collect(),
            None => average.to_vec(),
        }
    }
}
