//! Lazy sampling (clapping.md Algorithm 1 and its batch forms, Algorithm 6): at every step
//! after the first, each slot keeps its sample with probability `1 − p_t` or draws a fresh one.
//!
//! Every stage runs its own copy from the same seed and gets the same decisions (invariant 4),
//! so no sample ids or labels need to cross the wire. Fresh samples come from an ordinary
//! seeded epoch shuffle, continued across epochs: with `p = 1` the sampler is exactly that
//! ordinary stream.

use crate::rng::Rng;

/// How the keep-or-draw decision is taken (clapping.md §3.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// One decision per step for the whole batch, which keeps its samples in the same slots
    /// (what the paper's GPT-2 pre-training used).
    Batch,
    /// One decision per slot.
    Sample,
}

/// `p_t`: the probability of a fresh draw at step `t` (steps count from 0; step 0 is always
/// fresh).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PSchedule {
    /// The same `p` at every step.
    Constant(f32),
    /// From `from` at step 0 to `to` at step `over`, by half a cosine, then `to` (the LLaMA-2
    /// 1B run went from 0.5 to 1.0).
    Cosine {
        /// `p` at step 0.
        from: f32,
        /// `p` from step `over` on.
        to: f32,
        /// Steps of the cosine transition (0: `to` from the start).
        over: u64,
    },
}

impl PSchedule {
    /// `p_t` at step `step`.
    pub fn at(self, step: u64) -> f32 {
        match self {
            PSchedule::Constant(p) => p,
            PSchedule::Cosine { from, to, over } => {
                if step >= over || over == 0 {
                    return to;
                }
                let progress = step as f64 / over as f64;
                let w = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                (to as f64 + (from as f64 - to as f64) * w) as f32
            }
        }
    }
}

/// The samples of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    /// The step drawn for, counting from 0.
    pub step: u64,
    /// Sample ids, one per slot.
    pub ids: Vec<usize>,
    /// Whether each slot's sample was freshly drawn at this step (`f_FU`).
    pub fresh: Vec<bool>,
}

impl Draw {
    /// Whether any slot drew a fresh sample at this step.
    pub fn any_fresh(&self) -> bool {
        self.fresh.iter().any(|&f| f)
    }
}

/// Salt of the keep-or-draw decisions' random stream (the shuffle uses `data::epoch_batches`'s).
const DECISIONS: u64 = 0xC1A9_9E5A_3F1A_2F00;

/// Lazy sampling of a batch: every stage runs its own copy from the same seed and draws the same
/// sample ids.
pub struct LazySampler {
    samples: usize,
    batch: usize,
    rule: Rule,
    p: PSchedule,
    seed: u64,
    step: u64,
    /// This epoch's shuffled order and the position of the next fresh sample in it.
    order: Vec<usize>,
    epoch: u32,
    cursor: usize,
    current: Vec<usize>,
}

impl LazySampler {
    /// Panics on an empty dataset or batch; callers check their configuration first.
    pub fn new(samples: usize, batch: usize, rule: Rule, p: PSchedule, seed: u64) -> Self {
        assert!(samples > 0 && batch > 0, "lazy sampling needs samples");
        LazySampler {
            samples,
            batch,
            rule,
            p,
            seed,
            step: 0,
            order: shuffled(samples, seed, 0),
            epoch: 0,
            cursor: 0,
            current: Vec::new(),
        }
    }

    /// Fresh samples drawn so far, in epochs (what "equal samples" comparisons count).
    pub fn epochs_drawn(&self) -> f64 {
        self.epoch as f64 + self.cursor as f64 / self.samples as f64
    }

    fn fresh_id(&mut self) -> usize {
        if self.cursor == self.order.len() {
            self.epoch += 1;
            self.order = shuffled(self.samples, self.seed, self.epoch);
            self.cursor = 0;
        }
        self.cursor += 1;
        self.order[self.cursor - 1]
    }

    /// The next step's samples.
    pub fn next_draw(&mut self) -> Draw {
        let step = self.step;
        self.step += 1;
        let p = self.p.at(step);
        let mut coin = Rng::new(self.seed ^ DECISIONS, step as u32);
        let fresh: Vec<bool> = if step == 0 {
            vec![true; self.batch]
        } else {
            match self.rule {
                Rule::Batch => vec![coin.uniform() < p; self.batch],
                Rule::Sample => (0..self.batch).map(|_| coin.uniform() < p).collect(),
            }
        };
        if self.current.is_empty() {
            self.current = vec![0; self.batch];
        }
        for (slot, &is_fresh) in fresh.iter().enumerate() {
            if is_fresh {
                self.current[slot] = self.fresh_id();
            }
        }
        Draw {
            step,
            ids: self.current.clone(),
            fresh,
        }
    }
}

fn shuffled(n: usize, seed: u64, epoch: u32) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    Rng::new(seed, 0x5EED_0000 ^ epoch).shuffle(&mut order);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rule: Rule, p: f32, steps: usize) -> Vec<Draw> {
        let mut s = LazySampler::new(1000, 4, rule, PSchedule::Constant(p), 7);
        (0..steps).map(|_| s.next_draw()).collect()
    }

    #[test]
    fn p_one_is_the_ordinary_shuffled_stream() {
        let draws = run(Rule::Sample, 1.0, 600);
        assert!(draws.iter().all(|d| d.fresh.iter().all(|&f| f)));
        let ids: Vec<usize> = draws.iter().flat_map(|d| d.ids.clone()).collect();
        let mut expected = shuffled(1000, 7, 0);
        expected.extend(shuffled(1000, 7, 1));
        expected.extend(shuffled(1000, 7, 2));
        assert_eq!(ids, expected[..2400]);
        assert_eq!(run(Rule::Batch, 1.0, 600), draws);
    }

    #[test]
    fn p_zero_keeps_the_first_samples_forever() {
        let draws = run(Rule::Sample, 0.0, 50);
        assert!(draws[0].fresh.iter().all(|&f| f), "step 0 draws");
        for d in &draws[1..] {
            assert_eq!(d.ids, draws[0].ids);
            assert!(!d.any_fresh());
        }
    }

    #[test]
    fn fresh_draws_happen_at_rate_p_in_geometric_runs_and_every_copy_agrees() {
        for rule in [Rule::Batch, Rule::Sample] {
            let draws = run(rule, 0.3, 20_000);
            assert_eq!(draws, run(rule, 0.3, 20_000), "same seed, same decisions");
            let slot0: Vec<bool> = draws[1..].iter().map(|d| d.fresh[0]).collect();
            let rate = slot0.iter().filter(|&&f| f).count() as f64 / slot0.len() as f64;
            assert!((rate - 0.3).abs() < 0.015, "{rule:?}: fresh rate {rate}");
            // Run lengths (steps between fresh draws) are Geometric(p): mean 1/p, and the
            // share of runs of length 1 is p.
            let fresh_steps: Vec<usize> = (0..slot0.len()).filter(|&i| slot0[i]).collect();
            let runs: Vec<usize> = fresh_steps.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
            assert!((mean - 1.0 / 0.3).abs() < 0.15, "{rule:?}: mean run {mean}");
            let ones = runs.iter().filter(|&&r| r == 1).count() as f64 / runs.len() as f64;
            assert!((ones - 0.3).abs() < 0.03, "{rule:?}: P(run = 1) {ones}");
            // A slot that keeps its sample keeps its id.
            for w in draws.windows(2) {
                for slot in 0..4 {
                    if !w[1].fresh[slot] {
                        assert_eq!(w[1].ids[slot], w[0].ids[slot]);
                    }
                }
            }
        }
    }

    #[test]
    fn the_batch_rule_keeps_whole_batches_in_order_and_the_sample_rule_mixes() {
        let batch = run(Rule::Batch, 0.5, 200);
        assert!(batch
            .iter()
            .all(|d| d.fresh.iter().all(|&f| f == d.fresh[0])));
        let sample = run(Rule::Sample, 0.5, 200);
        assert!(sample
            .iter()
            .any(|d| d.fresh.iter().any(|&f| f != d.fresh[0])));
    }

    #[test]
    fn the_cosine_schedule_runs_from_its_start_to_its_end() {
        let s = PSchedule::Cosine {
            from: 0.5,
            to: 1.0,
            over: 100,
        };
        assert_eq!(s.at(0), 0.5);
        assert!((s.at(50) - 0.75).abs() < 1e-6);
        assert_eq!(s.at(100), 1.0);
        assert_eq!(s.at(1000), 1.0);
        assert!((1..100).all(|t| s.at(t) >= s.at(t - 1)));
    }
}
