//! The error-feedback state of one cut in one direction, held identically by the sender and
//! the receiver (clapping.md invariant 5): both run [`Mirror`]'s code, the sender on the exact
//! values and the receiver on the payload, and both reconstruct with `reference +
//! decode(payload)`, never with the difference the sender computed.
//!
//! The variants differ only in the reference a row's difference is taken against and in what
//! is remembered afterwards ([`Policy`]).

use std::collections::HashMap;

use rayon::prelude::*;

use super::message::{self, Part, RowCodec};
use super::sampler::Draw;
use crate::compress::DecodeMode;
use crate::error::{Error, Result};

/// What a fresh sample does to a carried buffer (clapping.md §3.9 and §3.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFresh {
    /// Clapping-FC: compress the difference from the previous sample's reconstruction.
    Compress,
    /// FC with the cache reset on resample: compress the value itself.
    Reset,
    /// Clapping-FU: send the value raw and store it exactly.
    Raw,
}

/// What the buffer of a cut does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every row raw: the uncompressed pipeline.
    Uncompressed,
    /// `C(y)` with no memory: direct compression.
    Direct,
    /// One buffer per batch slot, carried across samples (Clapping, EF21).
    Carried(OnFresh),
    /// One buffer per sample id, a first visit raw (AQ-SGD's forward pass, §3.3).
    PerSample,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reference {
    Zero,
    Carried,
    Sample,
}

/// The error-feedback buffers of one cut in one direction, run identically by the sender and the
/// receiver so that both hold the same reconstruction.
pub struct Mirror {
    policy: Policy,
    codec: RowCodec,
    rows: usize,
    cols: usize,
    seed: u64,
    /// Names this cut and direction in the codecs' random streams.
    channel: u32,
    /// `rows × cols`, for [`Policy::Carried`]; starts at zero (Algorithm 4's init).
    carried: Vec<f32>,
    per_sample: HashMap<usize, Vec<f32>>,
}

impl Mirror {
    /// The state of a cut whose payload carries `rows` rows of `cols` values, coded with `codec`
    /// under `policy`; `seed` and `channel` key the codec's randomness.
    pub fn new(
        policy: Policy,
        codec: RowCodec,
        rows: usize,
        cols: usize,
        seed: u64,
        channel: u32,
    ) -> Self {
        let carried = match policy {
            Policy::Carried(_) => vec![0.0; rows * cols],
            _ => Vec::new(),
        };
        Mirror {
            policy,
            codec,
            rows,
            cols,
            seed,
            channel,
            carried,
            per_sample: HashMap::new(),
        }
    }

    /// How every row of this step travels. `compress` is false during the compression
    /// warm-up, when rows travel raw and buffers store them exactly (§3.12).
    fn plan(&self, draw: &Draw, compress: bool) -> Vec<(Part, Reference)> {
        (0..self.rows)
            .map(|r| {
                let coded = |reference| {
                    if self.codec.is_identity() {
                        (Part::Raw, reference)
                    } else {
                        (Part::Coded, reference)
                    }
                };
                if !compress {
                    return (Part::Raw, Reference::Zero);
                }
                match self.policy {
                    Policy::Uncompressed => (Part::Raw, Reference::Zero),
                    Policy::Direct => coded(Reference::Zero),
                    Policy::Carried(on_fresh) => match (draw.fresh[r], on_fresh) {
                        (true, OnFresh::Raw) => (Part::Raw, Reference::Zero),
                        (true, OnFresh::Reset) => coded(Reference::Zero),
                        _ => coded(Reference::Carried),
                    },
                    Policy::PerSample if self.per_sample.contains_key(&draw.ids[r]) => {
                        coded(Reference::Sample)
                    }
                    Policy::PerSample => (Part::Raw, Reference::Zero),
                }
            })
            .collect()
    }

    fn reference(&self, r: usize, id: usize, which: Reference) -> Vec<f32> {
        match which {
            Reference::Zero => vec![0.0; self.cols],
            Reference::Carried => self.carried[r * self.cols..(r + 1) * self.cols].to_vec(),
            Reference::Sample => self.per_sample[&id].clone(),
        }
    }

    /// Encodes this step's exact values `y` (`rows × cols`); returns the payload and the
    /// reconstruction `ỹ` the receiver will compute, which is also what this side remembers.
    pub fn send(&mut self, y: &[f32], draw: &Draw, compress: bool) -> (Vec<u8>, Vec<f32>) {
        assert_eq!(y.len(), self.rows * self.cols, "values of the cut's shape");
        let plan = self.plan(draw, compress);
        let cols = self.cols;
        let rows: Vec<(Vec<u8>, Vec<f32>)> = plan
            .par_iter()
            .enumerate()
            .map(|(r, &(part, which))| {
                let exact = &y[r * cols..(r + 1) * cols];
                match part {
                    Part::Raw => {
                        let mut bytes = Vec::with_capacity(4 * cols);
                        message::write_raw(exact, &mut bytes);
                        (bytes, exact.to_vec())
                    }
                    Part::Coded => {
                        let ctx = message::row_context(self.seed, draw.step, self.channel, r);
                        let mut recon = self.reference(r, draw.ids[r], which);
                        let diff: Vec<f32> = exact.iter().zip(&recon).map(|(a, b)| a - b).collect();
                        let bytes = self.codec.encode(&diff, &ctx);
                        self.codec
                            .decode_into(&bytes, &mut recon, &ctx, DecodeMode::Add)
                            .expect("a codec decodes its own payloads");
                        (bytes, recon)
                    }
                }
            })
            .collect();
        let payload = rows.iter().flat_map(|(b, _)| b.iter().copied()).collect();
        let recon: Vec<f32> = rows.into_iter().flat_map(|(_, v)| v).collect();
        self.remember(draw, &recon);
        (payload, recon)
    }

    /// Decodes the sender's payload into the same reconstruction; on error nothing changes.
    pub fn receive(&mut self, payload: &[u8], draw: &Draw, compress: bool) -> Result<Vec<f32>> {
        let plan = self.plan(draw, compress);
        let parts: Vec<Part> = plan.iter().map(|&(p, _)| p).collect();
        let pieces = message::split(&self.codec, payload, &parts, self.cols)?;
        let rows: Vec<Vec<f32>> = plan
            .par_iter()
            .zip(pieces.par_iter())
            .enumerate()
            .map(|(r, (&(part, which), piece))| {
                let mut recon = self.reference(r, draw.ids[r], which);
                match part {
                    Part::Raw => message::read_raw(piece, &mut recon)?,
                    Part::Coded => {
                        let ctx = message::row_context(self.seed, draw.step, self.channel, r);
                        self.codec
                            .decode_into(piece, &mut recon, &ctx, DecodeMode::Add)?
                    }
                }
                Ok(recon)
            })
            .collect::<Result<_>>()?;
        let recon: Vec<f32> = rows.concat();
        // Finite differences can still add up to infinity on a buffer a peer has pushed far.
        if let Some(v) = recon.iter().find(|v| !v.is_finite()) {
            return Err(Error::Payload {
                codec: format!("stage message ({})", self.codec),
                detail: format!("the reconstruction holds {v}"),
            });
        }
        self.remember(draw, &recon);
        Ok(recon)
    }

    fn remember(&mut self, draw: &Draw, recon: &[f32]) {
        match self.policy {
            Policy::Uncompressed | Policy::Direct => {}
            Policy::Carried(_) => self.carried.copy_from_slice(recon),
            Policy::PerSample => {
                for (r, &id) in draw.ids.iter().enumerate() {
                    let row = recon[r * self.cols..(r + 1) * self.cols].to_vec();
                    self.per_sample.insert(id, row);
                }
            }
        }
    }

    /// Bytes of this step's payload.
    pub fn payload_len(&self, draw: &Draw, compress: bool) -> usize {
        let parts: Vec<Part> = self.plan(draw, compress).iter().map(|&(p, _)| p).collect();
        message::payload_len(&self.codec, &parts, self.cols)
    }

    /// f32 values of state this side holds (clapping.md invariant 9).
    pub fn memory_floats(&self) -> usize {
        self.carried.len() + self.per_sample.len() * self.cols
    }

    /// The state's bits, in a fixed order: what the mirror tests compare across the cut.
    pub fn state_bits(&self) -> Vec<u32> {
        let mut ids: Vec<&usize> = self.per_sample.keys().collect();
        ids.sort_unstable();
        self.carried
            .iter()
            .chain(ids.into_iter().flat_map(|id| &self.per_sample[id]))
            .map(|v| v.to_bits())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(step: u64, ids: &[usize], fresh: &[bool]) -> Draw {
        Draw {
            step,
            ids: ids.to_vec(),
            fresh: fresh.to_vec(),
        }
    }

    fn pair(policy: Policy, codec: &str) -> (Mirror, Mirror) {
        let make = || Mirror::new(policy, codec.parse().unwrap(), 2, 5, 9, 3);
        (make(), make())
    }

    #[test]
    fn both_sides_reconstruct_the_same_bits_under_every_policy() {
        let policies = [
            Policy::Uncompressed,
            Policy::Direct,
            Policy::Carried(OnFresh::Compress),
            Policy::Carried(OnFresh::Reset),
            Policy::Carried(OnFresh::Raw),
            Policy::PerSample,
        ];
        for policy in policies {
            for codec in ["topk:k=2", "natural", "qsgd:bits=4+natural"] {
                let (mut tx, mut rx) = pair(policy, codec);
                for step in 0..6u64 {
                    let d = draw(step, &[step as usize % 3, 7], &[step % 2 == 0, step == 0]);
                    let y: Vec<f32> = (0..10).map(|i| ((i + step) as f32 * 0.7).cos()).collect();
                    let expected_len = tx.payload_len(&d, step > 0);
                    let (payload, sent) = tx.send(&y, &d, step > 0);
                    assert_eq!(payload.len(), expected_len);
                    let got = rx.receive(&payload, &d, step > 0).unwrap();
                    assert_eq!(sent, got, "{policy:?} {codec} step {step}");
                    assert_eq!(tx.state_bits(), rx.state_bits());
                }
            }
        }
    }

    #[test]
    fn top_k_feedback_on_a_fixed_value_becomes_exact_in_ceil_d_over_k_steps() {
        let (mut tx, _) = pair(Policy::Carried(OnFresh::Compress), "topk:k=2");
        let y: Vec<f32> = (0..10).map(|i| (i as f32 - 4.5) * 1.3).collect();
        let mut errors = Vec::new();
        for step in 0..3 {
            let (_, recon) = tx.send(&y, &draw(step, &[0, 1], &[step == 0; 2]), true);
            let err: f32 = recon.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
            errors.push(err);
        }
        // 5 columns per row, 2 per step: exact after ceil(5/2) = 3 steps, not before.
        assert!(errors[1] > 0.0 && errors[0] > errors[1]);
        assert_eq!(errors[2], 0.0);
    }

    #[test]
    fn fu_stores_fresh_rows_exactly_and_aq_sgd_sends_first_visits_raw() {
        let (mut fu, _) = pair(Policy::Carried(OnFresh::Raw), "topk:k=1");
        let y = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        let (payload, recon) = fu.send(&y, &draw(1, &[0, 1], &[true, false]), true);
        assert_eq!(recon[..5], y[..5]);
        assert_eq!(recon[5..], [0.0, 0.0, 0.0, 0.0, 10.0]);
        assert_eq!(payload.len(), 20 + fu.codec.payload_len(5));
        let (mut aq, _) = pair(Policy::PerSample, "topk:k=1");
        let (payload, _) = aq.send(&y, &draw(0, &[4, 5], &[true, true]), true);
        assert_eq!(payload.len(), 40, "first visits travel raw");
        assert_eq!(aq.memory_floats(), 10);
        let (payload, _) = aq.send(&y, &draw(1, &[4, 6], &[true, true]), true);
        assert_eq!(payload.len(), 20 + aq.codec.payload_len(5));
        assert_eq!(
            aq.memory_floats(),
            15,
            "AQ-SGD's memory grows with the samples seen"
        );
    }

    #[test]
    fn a_bad_payload_costs_an_error_and_leaves_the_buffer_alone() {
        let (mut tx, mut rx) = pair(Policy::Carried(OnFresh::Raw), "qsgd:bits=4");
        let d = draw(0, &[0, 1], &[true, false]);
        let (payload, _) = tx.send(&[0.5; 10], &d, true);
        let before = rx.state_bits();
        assert!(rx.receive(&payload[1..], &d, true).is_err());
        let mut nan = payload.clone();
        nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(rx.receive(&nan, &d, true).is_err());
        assert_eq!(rx.state_bits(), before);
        assert!(rx.receive(&payload, &d, true).is_ok());
        // Deltas that are each finite but overflow the buffer are refused too.
        let (mut tx, mut rx) = pair(Policy::Carried(OnFresh::Compress), "topk:k=5");
        let d = draw(1, &[0, 1], &[false, false]);
        let (big, _) = tx.send(&[3e38; 10], &d, true);
        rx.receive(&big, &d, true).unwrap();
        let before = rx.state_bits();
        assert!(rx.receive(&big, &d, true).is_err(), "3e38 + 3e38 overflows");
        assert_eq!(rx.state_bits(), before);
    }

    #[test]
    fn random_bytes_of_the_right_length_cost_an_error_or_decode_to_finite_values() {
        // What the stage_decode fuzz target does at length, in a few thousand cases: payloads
        // of exactly the expected length get past the length check into the decoders.
        let mut rng = crate::rng::Rng::new(3, 0);
        let policies = [
            Policy::Direct,
            Policy::Carried(OnFresh::Raw),
            Policy::PerSample,
        ];
        for codec in [
            "topk:0.4",
            "qsgd:bits=4",
            "natural",
            "hybrid:bits=6:topk=0.3",
        ] {
            for policy in policies {
                let (_, mut rx) = pair(policy, codec);
                for step in 0..300u64 {
                    let d = draw(step, &[rng.below(3), 5], &[rng.below(2) == 0, false]);
                    let len = rx.payload_len(&d, true);
                    let payload: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                    let before = rx.state_bits();
                    match rx.receive(&payload, &d, true) {
                        Ok(v) => assert!(v.iter().all(|x| x.is_finite())),
                        Err(_) => assert_eq!(rx.state_bits(), before, "{codec} {policy:?}"),
                    }
                }
            }
        }
    }
}
