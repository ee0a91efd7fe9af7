//! A worker that attacks the swarm, as `murmur repro attack` needs one: what a peer with a
//! valid worker certificate could do to the servers' aggregate. It pushes well-formed
//! payloads of the job's codecs; only what it encodes is malicious.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use murmur_engine::train::{ClassifierConfig, Tamper};

use crate::error::{NodeError, Result};

/// How an attacking worker misbehaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attack {
    /// Its gradients times this factor (`scale:1e30`, `scale:100`).
    Scaled(f32),
    /// Its gradients negated (`sign-flip`).
    SignFlip,
    /// Gaussian noise with each tensor's norm instead of its gradients (`noise`).
    Noise,
    /// Its own optimizer steps at this many times the job's learning rate, so that its
    /// replica, and the gradients it computes there, run away (`lr:1000`).
    DivergingLr(f32),
    /// The gradients it computed this many rounds earlier, pushed again (`replay:10`);
    /// honest ones until it has that many.
    Replay(u64),
}

impl FromStr for Attack {
    type Err = NodeError;

    fn from_str(text: &str) -> Result<Attack> {
        let bad = || {
            NodeError::Config(format!(
                "attack {text:?}: scale:F, sign-flip, noise, lr:F or replay:N"
            ))
        };
        let number = |s: &str| s.parse::<f32>().ok().filter(|f| f.is_finite());
        match text.split_once(':') {
            None if text == "sign-flip" => Ok(Attack::SignFlip),
            None if text == "noise" => Ok(Attack::Noise),
            Some(("scale", f)) => number(f).map(Attack::Scaled).ok_or_else(bad),
            Some(("lr", f)) => number(f)
                .filter(|f| *f > 0.0)
                .map(Attack::DivergingLr)
                .ok_or_else(bad),
            Some(("replay", n)) => n
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .map(Attack::Replay)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Attack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attack::Scaled(x) => write!(f, "scale:{x:e}"),
            Attack::SignFlip => f.write_str("sign-flip"),
            Attack::Noise => f.write_str("noise"),
            Attack::DivergingLr(x) => write!(f, "lr:{x}"),
            Attack::Replay(n) => write!(f, "replay:{n}"),
        }
    }
}

impl Attack {
    /// Sets the attacker's own optimizer as the attack says: under `lr:F`, F times the
    /// learning rate, and F times the schedule's peak, which sets the rate every step where
    /// there is one (scaling `lr` alone left a scheduled attacker honest).
    pub fn configure(&self, config: &mut ClassifierConfig) {
        if let Attack::DivergingLr(factor) = *self {
            config.lr *= factor;
            if let Some(schedule) = &mut config.schedule {
                schedule.peak *= factor;
            }
        }
    }

    /// What the attacker does to its gradients before encoding them (none for an attack on
    /// its learning rate). `seed` seeds the noise.
    pub fn tamper(&self, seed: u64) -> Option<Tamper> {
        match *self {
            Attack::Scaled(factor) => Some(Box::new(move |_, grads: &mut [Vec<f32>]| {
                grads.iter_mut().flatten().for_each(|g| *g *= factor)
            })),
            Attack::SignFlip => Some(Box::new(|_, grads: &mut [Vec<f32>]| {
                grads.iter_mut().flatten().for_each(|g| *g = -*g)
            })),
            Attack::Noise => {
                let mut state = seed | 1;
                Some(Box::new(move |_, grads: &mut [Vec<f32>]| {
                    for tensor in grads.iter_mut() {
                        let norm = tensor.iter().map(|g| g * g).sum::<f32>().sqrt();
                        let noise: Vec<f32> = tensor.iter().map(|_| gaussian(&mut state)).collect();
                        let scale =
                            norm / noise.iter().map(|n| n * n).sum::<f32>().sqrt().max(1e-30);
                        for (g, n) in tensor.iter_mut().zip(noise) {
                            *g = n * scale;
                        }
                    }
                }))
            }
            Attack::DivergingLr(_) => None,
            Attack::Replay(back) => {
                let mut kept: VecDeque<Vec<Vec<f32>>> = VecDeque::new();
                Some(Box::new(move |_, grads: &mut [Vec<f32>]| {
                    kept.push_back(grads.to_vec());
                    if kept.len() as u64 > back {
                        let old = kept.pop_front().expect("kept");
                        for (g, o) in grads.iter_mut().zip(old) {
                            *g = o;
                        }
                    }
                }))
            }
        }
    }
}

/// A standard normal draw (Box-Muller over xorshift64).
fn gaussian(state: &mut u64) -> f32 {
    let mut uniform = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        ((*state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (u, v) = (uniform(), uniform());
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diverging_learning_rate_scales_the_schedule_too() {
        use murmur_engine::train::WarmupCosine;
        let honest = ClassifierConfig {
            lr: 2e-3,
            schedule: Some(WarmupCosine {
                peak: 2e-3,
                warmup: 10,
                total: 100,
                min_ratio: 0.1,
            }),
            ..ClassifierConfig::default()
        };
        let mut attacker = honest.clone();
        Attack::DivergingLr(1000.0).configure(&mut attacker);
        let (h, a) = (honest.schedule.unwrap(), attacker.schedule.unwrap());
        for step in [0, 9, 50, 99] {
            let ratio = a.lr(step) / h.lr(step);
            assert!((ratio - 1000.0).abs() < 0.01, "step {step}: {ratio}");
        }
        assert_eq!(attacker.lr, honest.lr * 1000.0);
        let mut untouched = honest.clone();
        Attack::SignFlip.configure(&mut untouched);
        assert_eq!(untouched.lr, honest.lr);
    }

    #[test]
    fn attacks_parse_print_and_do_what_they_say() {
        for text in [
            "scale:1e30",
            "scale:1e2",
            "sign-flip",
            "noise",
            "lr:1000",
            "replay:3",
        ] {
            assert_eq!(text.parse::<Attack>().unwrap().to_string(), text);
        }
        for bad in ["", "scale", "scale:x", "lr:0", "replay:0", "flip"] {
            assert!(bad.parse::<Attack>().is_err(), "{bad:?}");
        }
        let apply = |attack: &str, rounds: u64| {
            let mut tamper = attack.parse::<Attack>().unwrap().tamper(7).unwrap();
            let mut last = Vec::new();
            for round in 0..rounds {
                let mut grads = vec![vec![round as f32 + 1.0, -2.0, 3.0]];
                tamper(round, &mut grads);
                last = grads.remove(0);
            }
            last
        };
        assert_eq!(apply("scale:100", 1), [100.0, -200.0, 300.0]);
        assert_eq!(apply("sign-flip", 1), [-1.0, 2.0, -3.0]);
        assert_eq!(
            apply("replay:2", 5),
            [3.0, -2.0, 3.0],
            "round 4 pushes round 2's"
        );
        let noise = apply("noise", 1);
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm(&noise) - norm(&[1.0, -2.0, 3.0])).abs() < 1e-4);
        assert_ne!(noise, [1.0, -2.0, 3.0]);
        assert!("lr:10".parse::<Attack>().unwrap().tamper(0).is_none());
    }
}
