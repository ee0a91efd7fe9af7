//! EF21-P + DCGD (liec-sgd.md §3, the [std] definition: not in the LIEC code). Workers send the
//! compressed gradient at the shared point w, without error feedback; the server moves the
//! true iterate x and sends the compressed difference `C(x − w)`, which everyone adds to w.
//!
//! Written in gradient units, it is a server error-feedback rule: with `E := (w − x)/η`,
//! `v := mean_i D(c_i) + E`, `p := C(v)`, `E := v − D(p)`, and the workers step
//! `w := w − η D(p)`. This equals the primal form exactly for a constant η and a codec with
//! `C(−ηv) = −ηC(v)` (scaled sign, top-k; sign(0) aside); after a step change of η the error
//! the server carries is applied with the new rate, as every other method's error is
//! (liec-sgd.md §7). Weight decay enters the gradient at w, and w (what workers hold) is the
//! model evaluated; x = w − ηE differs from it by the server's error.

use super::{Exchange, Hyper, Method, Wire};
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
        }
    }

    fn step(&mut self, ex: &mut Exchange, w: &mut [f32], g: &[f32], hyper: Hyper) -> Result<()> {
        let q: Vec<f32> = g
            .iter()
            .zip(w.iter())
            .map(|(g, w)| g + hyper.weight_decay * w)
            .collect();
        let p = ex.exchange(&q, None)?;
        w.iter_mut().zip(&p).for_each(|(w, p)| *w -= hyper.lr * p);
        Ok(())
    }
}
