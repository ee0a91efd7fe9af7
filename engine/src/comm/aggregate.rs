//! How a shard combines one key's decoded pushes of a round: the sample-weighted mean, or a
//! rule that bounds what a minority of bad pushes can do to the result.
//!
//! - `mean`: every push weighted by the samples it stands for (the papers' rule, and the
//!   default). One push scaled by 10^30 moves the result by as much.
//! - `trimmed-mean[:β]`: per coordinate, the ⌊βn⌋ largest and smallest values are dropped
//!   and the rest averaged (Yin et al. 2018); β = 0.25 by default, at least one value kept.
//! - `median`: per coordinate, the median (the mean of the middle two for even n).
//! - `centered-clip[:L]`: Karimireddy, He and Jaggi (2021), "Learning from History for
//!   Byzantine Robust Optimization": from a center v, L times (3 by default)
//!   `v ← v + Σ wᵢ · clip_τ(xᵢ − v)`, where `clip_τ(z) = z · min(1, τ/‖z‖)` and wᵢ are the
//!   pushes' sample weights. murmur keeps the rule free of state and of a tuned radius: the
//!   center starts at the coordinate-wise median and τ is, each iteration, the median of the
//!   pushes' distances to the center, so a push's pull on the result is bounded by the
//!   typical push's, whatever its size.
//!
//! Every rule sees only the pushes of workers that had samples in the round (a push standing
//! for none carries zeros, which would drag a median toward 0), runs in rank order with
//! fixed arithmetic, and so gives the same bits on every shard and in process. The robust
//! rules also say which pushes stood far out ([`Aggregated::outliers`]): the servers log
//! them and evict a worker whose pushes keep standing out.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::push::Push;
use crate::error::{Error, Result};

/// A push whose distance to the result is more than this many times the median push's is
/// an outlier.
pub const OUTLIER_RATIO: f32 = 4.0;

/// How a shard combines a key's pushes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Aggregate {
    /// The sample-weighted mean.
    #[default]
    Mean,
    /// The coordinate-wise mean of what is left after dropping the `trim` fraction of values
    /// at each end.
    TrimmedMean {
        /// The fraction of the pushes dropped at each end, below 0.5.
        trim: f32,
    },
    /// The coordinate-wise median.
    Median,
    /// Centered clipping from the coordinate-wise median, with the median distance as radius.
    CenteredClip {
        /// Clipping iterations, 1 to 10.
        iterations: u32,
    },
}

impl FromStr for Aggregate {
    type Err = Error;

    fn from_str(text: &str) -> Result<Aggregate> {
        let bad = |why: &str| {
            Error::Config(format!(
                "aggregation {text:?}: {why} (mean, trimmed-mean[:β], median, centered-clip[:L])"
            ))
        };
        let (name, arg) = match text.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (text, None),
        };
        match (name, arg) {
            ("mean", None) => Ok(Aggregate::Mean),
            ("median", None) => Ok(Aggregate::Median),
            ("trimmed-mean", arg) => {
                let trim = arg
                    .map_or(Ok(0.25), str::parse::<f32>)
                    .map_err(|_| bad("β"))?;
                if !(0.0..0.5).contains(&trim) {
                    return Err(bad("β is a fraction below 0.5"));
                }
                Ok(Aggregate::TrimmedMean { trim })
            }
            ("centered-clip", arg) => {
                let iterations = arg.map_or(Ok(3), str::parse::<u32>).map_err(|_| bad("L"))?;
                if !(1..=10).contains(&iterations) {
                    return Err(bad("L is 1 to 10 iterations"));
                }
                Ok(Aggregate::CenteredClip { iterations })
            }
            _ => Err(bad("unknown rule")),
        }
    }
}

impl fmt::Display for Aggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Aggregate::Mean => f.write_str("mean"),
            Aggregate::TrimmedMean { trim } => write!(f, "trimmed-mean:{trim}"),
            Aggregate::Median => f.write_str("median"),
            Aggregate::CenteredClip { iterations } => write!(f, "centered-clip:{iterations}"),
        }
    }
}

/// A round's result for one key.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregated {
    /// The combined update, `numel` values.
    pub values: Vec<f32>,
    /// The ranks whose pushes lay more than [`OUTLIER_RATIO`] times the median push's
    /// distance from the result, with that multiple (robust rules only).
    pub outliers: Vec<(usize, f32)>,
}

impl Aggregate {
    /// Combines the round's `pending` pushes (by rank) of a key of `numel` elements.
    pub fn combine(&self, pending: BTreeMap<usize, Push>, numel: usize) -> Aggregated {
        if *self == Aggregate::Mean {
            return Aggregated {
                values: sample_weighted_mean(pending, numel),
                outliers: Vec::new(),
            };
        }
        let pushes: Vec<(usize, Push)> =
            pending.into_iter().filter(|(_, p)| p.samples > 0).collect();
        if pushes.is_empty() {
            return Aggregated {
                values: vec![0.0; numel],
                outliers: Vec::new(),
            };
        }
        let values = match *self {
            Aggregate::Mean => unreachable!("handled above"),
            Aggregate::TrimmedMean { trim } => {
                let drop = ((pushes.len() as f32 * trim) as usize).min((pushes.len() - 1) / 2);
                coordinate_wise(&pushes, numel, |sorted| {
                    let kept = &sorted[drop..sorted.len() - drop];
                    let sum = kept.iter().fold(0.0f32, |s, v| s + v);
                    sum * (1.0 / kept.len() as f32)
                })
            }
            Aggregate::Median => coordinate_wise(&pushes, numel, median_of_sorted),
            Aggregate::CenteredClip { iterations } => centered_clip(&pushes, numel, iterations),
        };
        let outliers = outliers(&pushes, &values);
        Aggregated { values, outliers }
    }
}

/// The mean of the pushes weighted by the samples each stands for, summed in rank order
/// whatever the arrival order.
///
/// Pushes that stand for equal numbers of samples (every round of a fixed world with equal
/// shares) take the plain mean, which every run before sample weights used: the sum starting
/// from the first push itself (so that one rank's push comes back bit for bit, signed zeros
/// included), scaled by 1/count. Otherwise each push is scaled by its part of the round's
/// samples, `n_i / Σn` rounded to f32, and the scaled pushes are added in rank order from
/// zero: each product and sum rounded on its own (Rust never fuses them), the same bits on
/// every machine. A push of no samples adds nothing.
fn sample_weighted_mean(pending: BTreeMap<usize, Push>, numel: usize) -> Vec<f32> {
    let mut weights = pending.values().map(|p| p.samples);
    let first = weights.next();
    if weights.any(|n| Some(n) != first) {
        let total: u64 = pending.values().map(|p| u64::from(p.samples)).sum();
        let mut mean = vec![0.0f32; numel];
        for push in pending.into_values().filter(|p| p.samples > 0) {
            let weight = (f64::from(push.samples) / total as f64) as f32;
            mean.iter_mut()
                .zip(&push.values)
                .for_each(|(m, v)| *m += weight * v);
        }
        return mean;
    }
    let count = pending.len();
    let mut ranks = pending.into_values().map(|p| p.values);
    let mut mean = ranks.next().unwrap_or_else(|| vec![0.0f32; numel]);
    for values in ranks {
        mean.iter_mut().zip(&values).for_each(|(m, v)| *m += v);
    }
    if count > 1 {
        let scale = 1.0 / count as f32;
        mean.iter_mut().for_each(|m| *m *= scale);
    }
    mean
}

/// `per` applied to each coordinate's values, sorted ascending (by `total_cmp`: pushes are
/// finite, checked as they were decoded).
fn coordinate_wise(
    pushes: &[(usize, Push)],
    numel: usize,
    per: impl Fn(&[f32]) -> f32,
) -> Vec<f32> {
    let mut column = vec![0.0f32; pushes.len()];
    (0..numel)
        .map(|i| {
            for (slot, (_, push)) in column.iter_mut().zip(pushes) {
                *slot = push.values[i];
            }
            column.sort_unstable_by(f32::total_cmp);
            per(&column)
        })
        .collect()
}

/// The median of sorted values: the middle one, or halfway between the middle two (each
/// halved first, so that it cannot overflow).
fn median_of_sorted(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        sorted[n / 2 - 1] * 0.5 + sorted[n / 2] * 0.5
    }
}

/// Each push's Euclidean distance to `center`, accumulated in f64 in coordinate order.
fn distances(pushes: &[(usize, Push)], center: &[f32]) -> Vec<f64> {
    pushes
        .iter()
        .map(|(_, p)| {
            p.values
                .iter()
                .zip(center)
                .map(|(x, v)| {
                    let d = f64::from(*x) - f64::from(*v);
                    d * d
                })
                .sum::<f64>()
                .sqrt()
        })
        .collect()
}

/// The median of unsorted values.
fn median_f64(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

fn centered_clip(pushes: &[(usize, Push)], numel: usize, iterations: u32) -> Vec<f32> {
    let total: u64 = pushes.iter().map(|(_, p)| u64::from(p.samples)).sum();
    let weights: Vec<f64> = pushes
        .iter()
        .map(|(_, p)| f64::from(p.samples) / total as f64)
        .collect();
    let mut center = coordinate_wise(pushes, numel, median_of_sorted);
    for _ in 0..iterations {
        let dist = distances(pushes, &center);
        let tau = median_f64(&dist);
        if tau <= 0.0 {
            break;
        }
        // Each push's step toward it, clipped to τ and weighted, summed in rank order.
        let scales: Vec<f64> = dist
            .iter()
            .zip(&weights)
            .map(|(d, w)| w * if *d > tau { tau / d } else { 1.0 })
            .collect();
        let mut step = vec![0.0f64; numel];
        for ((_, push), scale) in pushes.iter().zip(&scales) {
            for ((s, x), v) in step.iter_mut().zip(&push.values).zip(&center) {
                *s += scale * (f64::from(*x) - f64::from(*v));
            }
        }
        for (v, s) in center.iter_mut().zip(&step) {
            *v = (f64::from(*v) + s) as f32;
        }
    }
    center
}

/// The pushes that lie more than [`OUTLIER_RATIO`] times the median distance from `result`.
fn outliers(pushes: &[(usize, Push)], result: &[f32]) -> Vec<(usize, f32)> {
    let dist = distances(pushes, result);
    let typical = median_f64(&dist);
    pushes
        .iter()
        .zip(&dist)
        .filter_map(|((rank, _), d)| {
            let ratio = if typical > 0.0 {
                d / typical
            } else if *d > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            (ratio > f64::from(OUTLIER_RATIO))
                .then_some((*rank, ratio.min(f64::from(f32::MAX)) as f32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pushes(rows: &[&[f32]]) -> BTreeMap<usize, Push> {
        rows.iter()
            .enumerate()
            .map(|(rank, values)| {
                (
                    rank,
                    Push {
                        values: values.to_vec(),
                        header: None,
                        log2s: None,
                        samples: 8,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn rules_parse_and_print_back() {
        for text in ["mean", "median", "trimmed-mean:0.2", "centered-clip:2"] {
            assert_eq!(text.parse::<Aggregate>().unwrap().to_string(), text);
        }
        assert_eq!(
            "trimmed-mean".parse::<Aggregate>().unwrap(),
            Aggregate::TrimmedMean { trim: 0.25 }
        );
        for bad in [
            "",
            "avg",
            "trimmed-mean:0.5",
            "centered-clip:0",
            "median:1",
            "mean:2",
        ] {
            assert!(bad.parse::<Aggregate>().is_err(), "{bad:?}");
        }
    }

    /// Three honest pushes near (1, -1) and one scaled by 10^30: the mean is ruined, every
    /// robust rule stays with the honest ones and names the attacker.
    #[test]
    fn one_huge_push_in_four_moves_only_the_mean() {
        let honest: [&[f32]; 3] = [&[1.0, -1.0], &[1.2, -0.8], &[0.8, -1.2]];
        let rows = [honest[0], honest[1], &[1e30, -1e30], honest[2]];
        let mean = Aggregate::Mean.combine(pushes(&rows), 2);
        assert!(mean.values[0] > 1e29);
        for rule in ["trimmed-mean", "median", "centered-clip"] {
            let rule: Aggregate = rule.parse().unwrap();
            let got = rule.combine(pushes(&rows), 2);
            assert!(
                (got.values[0] - 1.0).abs() < 0.5 && (got.values[1] + 1.0).abs() < 0.5,
                "{rule}: {:?}",
                got.values
            );
            assert_eq!(got.outliers.len(), 1, "{rule}: {:?}", got.outliers);
            assert_eq!(got.outliers[0].0, 2, "{rule}");
        }
    }

    #[test]
    fn robust_rules_agree_with_the_mean_on_identical_pushes_and_ignore_empty_shares() {
        let same: [&[f32]; 3] = [&[0.5, 2.0, -3.0]; 3];
        for rule in ["mean", "trimmed-mean", "median", "centered-clip"] {
            let rule: Aggregate = rule.parse().unwrap();
            let got = rule.combine(pushes(&same), 3);
            assert_eq!(got.values, [0.5, 2.0, -3.0], "{rule}");
            assert!(got.outliers.is_empty(), "{rule}");
        }
        // A worker without a share pushes zeros standing for no samples: the median of
        // (4, 0, 0) would be 0, of the two real pushes it is 3.
        let mut with_empty = pushes(&[&[4.0], &[2.0], &[0.0]]);
        with_empty.get_mut(&2).unwrap().samples = 0;
        assert_eq!(Aggregate::Median.combine(with_empty, 1).values, [3.0]);
        assert_eq!(
            Aggregate::Median.combine(BTreeMap::new(), 2).values,
            [0.0, 0.0]
        );
    }

    #[test]
    fn trimmed_mean_and_median_by_hand() {
        let rows: [&[f32]; 5] = [&[1.0], &[9.0], &[3.0], &[-50.0], &[4.0]];
        // Sorted: -50 1 3 4 9; β = 0.25 of 5 drops one at each end: mean of 1, 3, 4.
        let trimmed = Aggregate::TrimmedMean { trim: 0.25 }.combine(pushes(&rows), 1);
        assert_eq!(trimmed.values, [(1.0f32 + 3.0 + 4.0) * (1.0 / 3.0)]);
        assert_eq!(Aggregate::Median.combine(pushes(&rows), 1).values, [3.0]);
        // Two pushes: nothing can be trimmed (one value at least is kept from each end).
        let two = Aggregate::TrimmedMean { trim: 0.4 }.combine(pushes(&[&[1.0], &[3.0]]), 1);
        assert_eq!(two.values, [2.0]);
    }

    /// Centered clipping bounds a push's pull by the median distance: moving the attacker
    /// ten times further away leaves the result where it was.
    #[test]
    fn centered_clipping_bounds_what_one_push_can_pull() {
        let rule = Aggregate::CenteredClip { iterations: 3 };
        let at = |far: f32| {
            rule.combine(
                pushes(&[&[1.0, 0.0], &[0.0, 1.0], &[1.0, 1.0], &[far, far]]),
                2,
            )
            .values
        };
        let (near, farther) = (at(100.0), at(1000.0));
        for (a, b) in near.iter().zip(&farther) {
            assert!((a - b).abs() < 1e-5, "{near:?} vs {farther:?}");
            assert!(*a < 2.0, "{near:?}");
        }
    }
}
