//! A CPU memory's state as plain values, so that a parameter server can write it to disk
//! each round and take it back after a restart with the same bits.

use serde::{Deserialize, Serialize};

use super::{Feedback, State};
use crate::error::{Error, Result};

/// What a CPU error-feedback memory holds between calls. The scale `s_e` of a LoCo memory is
/// not part of it: it follows the codec (see [`Feedback::rescale`]), which the owner restores
/// first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedMemory {
    /// Calls so far (LoCo's reset period counts them).
    pub calls: u64,
    /// The f32 residual of an EF memory; empty otherwise.
    #[serde(with = "crate::saved_bytes::f32s")]
    pub residual: Vec<f32>,
    /// The int8 codes of a LoCo memory; empty otherwise.
    #[serde(with = "crate::saved_bytes::i8s")]
    pub codes: Vec<i8>,
    /// The f32 moving average of a LoCo memory in reference mode.
    #[serde(with = "crate::saved_bytes::opt_f32s")]
    pub average: Option<Vec<f32>>,
}

impl Feedback {
    /// The memory's state. Memories on the GPU are refused: the servers and the data-parallel
    /// workers keep theirs on the CPU.
    pub fn saved(&self) -> Result<SavedMemory> {
        let mut saved = SavedMemory {
            calls: self.calls,
            ..SavedMemory::default()
        };
        match &self.state {
            State::None => {}
            State::Residual(e) => saved.residual = e.clone(),
            State::Ema(eq, et) => {
                saved.codes = eq.clone();
                saved.average = et.clone();
            }
            State::ResidualGpu(_) | State::EmaGpu(..) => {
                return Err(Error::Config(
                    "saving a memory that lives on the GPU is not supported".into(),
                ))
            }
        }
        Ok(saved)
    }

    /// Takes back a state from [`Feedback::saved`] of a memory of the same kind and size;
    /// anything else (a file from another job, a damaged one) is an error and changes nothing.
    pub fn restore(&mut self, saved: SavedMemory) -> Result<()> {
        let n = self.n;
        let bad = |what: &str| {
            Err(Error::Data(format!(
                "a saved error-feedback memory does not fit this one ({what}, {n} elements)"
            )))
        };
        let SavedMemory {
            calls,
            residual,
            codes,
            average,
        } = saved;
        match &mut self.state {
            State::None if residual.is_empty() && codes.is_empty() && average.is_none() => {}
            State::Residual(e) if residual.len() == n && codes.is_empty() && average.is_none() => {
                *e = residual
            }
            State::Ema(eq, et)
                if residual.is_empty()
                    && codes.len() == n
                    && average.as_ref().map(Vec::len) == et.as_ref().map(Vec::len) =>
            {
                *eq = codes;
                *et = average;
            }
            State::ResidualGpu(_) | State::EmaGpu(..) => return bad("it lives on the GPU"),
            _ => return bad("another kind or size"),
        }
        self.calls = calls;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::codec_context;
    use crate::compress::parse;
    use crate::feedback::Memory;
    use crate::tensor::Device;

    fn memory(kind: &str, n: usize) -> Feedback {
        Feedback::new(
            parse("topk:0.25").unwrap(),
            kind.parse::<Memory>().unwrap(),
            n,
            &Device::Cpu,
        )
        .unwrap()
    }

    #[test]
    fn a_restored_memory_encodes_the_next_gradient_as_the_original_does() {
        for kind in ["none", "ef", "loco-ema:se=64", "loco-ema:se=64:f32:reset=3"] {
            let mut a = memory(kind, 7);
            let g: Vec<f32> = (0..7).map(|i| (i as f32 - 3.1) * 0.37).collect();
            for step in 0..2 {
                a.encode(&g, &codec_context(1, step, 9)).unwrap();
            }
            let mut b = memory(kind, 7);
            b.restore(a.saved().unwrap()).unwrap();
            let ctx = codec_context(1, 2, 9);
            assert_eq!(
                a.encode(&g, &ctx).unwrap(),
                b.encode(&g, &ctx).unwrap(),
                "{kind}"
            );
            assert_eq!(a.saved().unwrap(), b.saved().unwrap(), "{kind}");
        }
    }

    #[test]
    fn a_state_of_another_kind_or_size_is_refused_and_changes_nothing() {
        let mut ef = memory("ef", 4);
        ef.encode(&[1.0, -2.0, 3.0, 0.5], &codec_context(1, 0, 9))
            .unwrap();
        let before = ef.saved().unwrap();
        assert!(ef.restore(memory("ef", 5).saved().unwrap()).is_err());
        assert!(ef.restore(memory("loco-ema", 4).saved().unwrap()).is_err());
        assert!(ef.restore(memory("none", 4).saved().unwrap()).is_err());
        assert_eq!(ef.saved().unwrap(), before);
        let mut loco = memory("loco-ema:f32", 4);
        assert!(loco
            .restore(memory("loco-ema", 4).saved().unwrap())
            .is_err());
    }
}
