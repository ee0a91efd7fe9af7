//! What a shard remembers of each worker's pushes under a robust rule: a decayed sum of the
//! pushes of each rank, per key, and how that history points against the others'.
//!
//! Why: a push that is flipped in sign, or replayed from rounds before, has the norm of an
//! honest push, so no rule that looks at one round singles it out. Under top-k the honest
//! pushes of one round are far apart from each other too (each keeps the largest entries of
//! its own residual), so the robust rules cannot tell them from the honest spread
//! (docs/results/robustness.md). Over rounds, though, error feedback makes each honest
//! worker's pushes add up to its gradients, and the gradients of workers training one model on
//! one data set point the same way: the honest histories align with each other, and a
//! sign-flipped worker's points against theirs. This is the server-side reading of
//! "learning from history" (Karimireddy, He and Jaggi 2021): the decayed sum of a rank's
//! pushes is the momentum of what it sent.
//!
//! A rank whose history, summed over a shard's keys, has a negative cosine with the sum of
//! the other ranks' histories gets a strike, as an outlier does (net/src/ps/state.rs evicts
//! after a few). The result of a round is not changed: the histories only judge.

use std::collections::BTreeMap;

use super::push::Push;

/// How much of its past a rank's history keeps each round: its memory spans about ten
/// rounds, enough for top-1% error feedback to have sent most of the gradient.
pub const HISTORY_DECAY: f32 = 0.9;

/// Rounds a rank must have pushed before its history is judged.
pub const HISTORY_ROUNDS: u32 = 10;

/// How one rank's history points against the others', on some keys: sums over the keys, so
/// that a shard adds its keys up before judging.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Alignment {
    /// Σ ⟨own history, sum of the other ranks' histories⟩.
    pub dot: f64,
    /// Σ ‖own history‖².
    pub own: f64,
    /// Σ ‖sum of the other ranks' histories‖².
    pub others: f64,
    /// The fewest rounds the rank's history holds on any of the keys.
    pub rounds: u32,
}

impl Alignment {
    /// The terms of another key added to these.
    pub fn and(self, other: Alignment) -> Alignment {
        Alignment {
            dot: self.dot + other.dot,
            own: self.own + other.own,
            others: self.others + other.others,
            rounds: self.rounds.min(other.rounds),
        }
    }

    /// The cosine between the rank's history and the others', where both are non-zero and
    /// the rank has pushed [`HISTORY_ROUNDS`] rounds.
    pub fn judged_cosine(&self) -> Option<f64> {
        (self.rounds >= HISTORY_ROUNDS && self.own > 0.0 && self.others > 0.0)
            .then(|| self.dot / (self.own.sqrt() * self.others.sqrt()))
    }
}

/// The decayed sums of one key's pushes, by rank.
#[derive(Debug, Default)]
pub struct PushHistory {
    ranks: BTreeMap<usize, (Vec<f32>, u32)>,
    /// The round's sum of unit histories, kept to be reused (a key's size, every round).
    total: Vec<f64>,
}

impl PushHistory {
    /// Adds a round's pushes (those standing for samples) to their ranks' histories, and says
    /// how each of those ranks' histories now points against the others' of the round. A
    /// rank that did not push this round keeps its history as it was, out of the others'
    /// reference (an evicted or departed rank's must not stand for the direction the others
    /// are judged against; one that skips a round must not start over and escape judgment).
    /// Each history counts as a unit vector among the others, so that no rank, however
    /// large its pushes, sets that direction.
    pub fn record(&mut self, pushes: &BTreeMap<usize, Push>) -> Vec<(usize, Alignment)> {
        let mut judged = Vec::new();
        for (&rank, push) in pushes.iter().filter(|(_, p)| p.samples > 0) {
            let (history, rounds) = self
                .ranks
                .entry(rank)
                .or_insert_with(|| (vec![0.0; push.values.len()], 0));
            if history.len() != push.values.len() {
                continue;
            }
            for (h, v) in history.iter_mut().zip(&push.values) {
                *h = HISTORY_DECAY * *h + v;
            }
            *rounds = rounds.saturating_add(1);
            judged.push(rank);
        }
        let Some(numel) = judged.first().map(|r| self.ranks[r].0.len()) else {
            return Vec::new();
        };
        let norm = |h: &[f32]| h.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        let unit: BTreeMap<usize, f64> = judged
            .iter()
            .map(|r| {
                let n = norm(&self.ranks[r].0);
                (*r, if n > 0.0 { 1.0 / n } else { 0.0 })
            })
            .collect();
        // The sum of the judged ranks' unit histories; each one's "others" is that less its own.
        let total = &mut self.total;
        total.clear();
        total.resize(numel, 0.0);
        for rank in &judged {
            for (t, h) in total.iter_mut().zip(&self.ranks[rank].0) {
                *t += f64::from(*h) * unit[rank];
            }
        }
        judged
            .into_iter()
            .map(|rank| {
                let (history, rounds) = &self.ranks[&rank];
                let mut a = Alignment {
                    rounds: *rounds,
                    ..Alignment::default()
                };
                for (h, t) in history.iter().zip(total.iter()) {
                    let h = f64::from(*h);
                    let others = t - h * unit[&rank];
                    a.dot += h * others;
                    a.own += h * h;
                    a.others += others * others;
                }
                (rank, a)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(values: Vec<f32>) -> Push {
        Push {
            values,
            header: None,
            log2s: None,
            samples: 8,
        }
    }

    /// Four ranks push sparse pieces of one direction (each its own coordinates, as top-k
    /// does); the fourth pushes its pieces negated. After enough rounds the honest histories
    /// point with each other and the flipped one against them, though no single round
    /// tells them apart by norm.
    #[test]
    fn a_flipped_history_points_against_the_others() {
        let numel = 64;
        let mut history = PushHistory::default();
        let mut last = Vec::new();
        for round in 0..12usize {
            let pushes: BTreeMap<usize, Push> = (0..4)
                .map(|rank| {
                    let mut v = vec![0.0; numel];
                    // Each rank sends a different slice of the common gradient each round.
                    for i in 0..8 {
                        let at = (round * 8 + rank * 16 + i) % numel;
                        v[at] = if rank == 3 { -1.0 } else { 1.0 };
                    }
                    (rank, push(v))
                })
                .collect();
            last = history.record(&pushes);
            if round + 1 < HISTORY_ROUNDS as usize {
                assert!(last.iter().all(|(_, a)| a.judged_cosine().is_none()));
            }
        }
        let cosines: BTreeMap<usize, f64> = last
            .iter()
            .map(|(rank, a)| (*rank, a.judged_cosine().unwrap()))
            .collect();
        for rank in 0..3 {
            assert!(cosines[&rank] > 0.0, "{cosines:?}");
        }
        assert!(cosines[&3] < 0.0, "{cosines:?}");
        // Rank 3 turns to pushing the right way a million times too hard: a unit among the
        // others, it does not turn the honest ranks' reference.
        for round in 12..24usize {
            let pushes: BTreeMap<usize, Push> = (0..4)
                .map(|rank| {
                    let mut v = vec![0.0; numel];
                    for i in 0..8 {
                        v[(round * 8 + rank * 16 + i) % numel] = if rank == 3 { 1e6 } else { 1.0 };
                    }
                    (rank, push(v))
                })
                .collect();
            last = history.record(&pushes);
        }
        for (rank, a) in &last {
            assert!(a.judged_cosine().unwrap() > 0.0, "rank {rank}: {a:?}");
        }
        // A push of no samples is not recorded, and the ranks that did not push keep their
        // histories (rank 3's holds its 24 rounds) out of the round's reference.
        let mut idle = BTreeMap::new();
        idle.insert(
            0,
            Push {
                samples: 0,
                ..push(vec![5.0; numel])
            },
        );
        assert!(history.record(&idle).is_empty());
        assert_eq!(history.ranks[&3].1, 24);
    }
}
