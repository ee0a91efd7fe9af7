//! The job's samples, handed out round by round: shard 0 keeps the queue, cuts each round's
//! global batch from it over the round's members, and settles it when the round closes.
//!
//! Positions, not samples: position `p` of epoch `e` is the `p`-th sample of that epoch's
//! seeded order, which every worker draws for itself (the node maps positions to images or to
//! text windows). A round takes at most `global` positions and at most `per_member` for each
//! member, all of one epoch: first the ones given back, then fresh ones; an epoch ends when
//! every position of it has been seen, and a round never reaches into the next. A position
//! counts as seen when a push that stood for it was summed into the round (its worker is
//! among shard 0's participants with the whole share); the share of a member that was late or
//! left goes back to the front of the queue, and the next round hands it to the members that
//! took part first (a member that keeps being late does not keep its own given-back share).
//! So over an epoch no sample is skipped and none counted twice, whatever the churn: the
//! other shards close each round over shard 0's participants ([`super::state`]), so a push
//! counts on every shard's keys or on none.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

pub use crate::wire::{Assignment, Share, Span};

/// What a queue hands out: `samples` positions per epoch, at most `global` per round and
/// `per_member` to each member of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSpec {
    /// Positions in one epoch (the training set's size, or a text job's windows in all).
    pub samples: u64,
    /// Positions in one round's global batch.
    pub global: u32,
    /// The most positions one member gets in a round (its batch: fewer members make a
    /// smaller round, not larger shares).
    pub per_member: u32,
    /// Whether rounds are cut by the members' measured speeds (where one is 1.5 times slower
    /// than the median or more, and 0.1 s a batch; [`SampleQueue::observe`]) rather than
    /// equally.
    pub by_speed: bool,
}

/// How much slower than the median a member must be before the cut follows its speed: a
/// factor of 1.5. Machines alike keep equal shares through the noise of a shared machine.
const UNEVEN: f64 = 1.5;

/// How much longer than the median member's a member's whole batch must take before the cut
/// follows its speed, in seconds: in rounds of a few milliseconds a factor of 1.5 is the
/// jitter of a shared machine or link, not a slower device, and a smaller share would gain
/// nothing.
const NOTICEABLE: f64 = 0.1;

/// The least weight a slow member keeps in the cut, as a share of the median speed: however
/// slow it was measured, it keeps a part of a round, and pushes that show it faster again.
const FLOOR: f64 = 1.0 / 8.0;

/// What one epoch of the queue came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochDone {
    /// Positions seen: the epoch's samples, each once.
    pub seen: u64,
    /// Rounds the epoch took.
    pub rounds: u64,
    /// Positions given back (by members late or gone) and handed out again.
    pub given_back: u64,
}

/// Shard 0's queue of the job's sample positions ([module docs](self)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleQueue {
    spec: QueueSpec,
    /// The epoch whose positions are handed out.
    epoch: u32,
    /// The next fresh position of `epoch`.
    next: u64,
    /// Positions of `epoch` given back, handed out before fresh ones.
    returned: VecDeque<Span>,
    /// The open round's assignment.
    open: Assignment,
    /// Positions of `epoch` seen so far.
    seen: u64,
    /// Rounds of `epoch` cut so far.
    rounds: u64,
    /// Positions of `epoch` given back so far.
    given_back: u64,
    /// The members whose shares the last settled round saw: the next round's cut starts
    /// with them.
    took_part: Vec<u16>,
    /// Samples per second each member pushed lately ([`SampleQueue::observe`]).
    speeds: std::collections::BTreeMap<u16, f64>,
    /// The epochs done, in order.
    done: Vec<EpochDone>,
    /// Shares of `epoch` whose late pushes their members are folding into their error
    /// feedback ([`SampleQueue::settle_folding`]): seen once the member's next push is summed
    /// (or the epoch ends), given back if the member leaves first.
    folding: Vec<Share>,
}

impl SampleQueue {
    /// A queue at the start of epoch 0, with no round cut yet.
    pub fn new(spec: QueueSpec) -> SampleQueue {
        SampleQueue {
            spec,
            epoch: 0,
            next: 0,
            returned: VecDeque::new(),
            open: Assignment::default(),
            seen: 0,
            rounds: 0,
            given_back: 0,
            took_part: Vec::new(),
            speeds: std::collections::BTreeMap::new(),
            done: Vec::new(),
            folding: Vec::new(),
        }
    }

    /// Checks that a queue read back from a file holds together: every position of the epoch
    /// is exactly one of seen, given back, in the open round's shares, being folded or not yet
    /// handed out;
    /// no span reaches past the epoch; the speeds are finite. Counts from such a queue then
    /// never overflow, and no round hands out a position the epoch does not have.
    pub fn check(&self) -> Result<(), String> {
        let spec = self.spec;
        if spec.samples == 0 || spec.global == 0 || spec.per_member == 0 {
            return Err(format!("its spec hands out nothing: {spec:?}"));
        }
        let within = |span: &Span| {
            span.start
                .checked_add(u64::from(span.len))
                .is_some_and(|end| end <= spec.samples)
        };
        let open = self.open.shares.iter().flat_map(|s| &s.spans);
        let folding = self.folding.iter().flat_map(|s| &s.spans);
        if !self
            .returned
            .iter()
            .chain(open.clone())
            .chain(folding.clone())
            .all(within)
        {
            return Err("a span reaches past the epoch".into());
        }
        let accounted = total(self.returned.iter())
            .zip(total(open))
            .and_then(|(returned, open)| returned.checked_add(open))
            .zip(total(folding))
            .and_then(|(held, folding)| held.checked_add(folding))
            .and_then(|held| held.checked_add(self.seen))
            .and_then(|held| held.checked_add(spec.samples.checked_sub(self.next)?));
        if accounted != Some(spec.samples) {
            return Err(format!(
                "its positions do not add up to the epoch's {}",
                spec.samples
            ));
        }
        if !self.speeds.values().all(|s| s.is_finite() && *s >= 0.0) {
            return Err("a speed is not a finite rate".into());
        }
        Ok(())
    }

    /// Notes how fast `rank` went on its share of the open round, `samples` positions: it
    /// finished them in `seconds` (the round's opening to its last push), or, `late`, had not
    /// finished them `seconds` in, when the round closed without it (at most that fast).
    /// Speeds are a running mean, halving the weight of the past each round.
    pub fn observe(&mut self, rank: u16, samples: u64, seconds: f64, late: bool) {
        if !self.spec.by_speed || samples == 0 || seconds <= 0.0 || !seconds.is_finite() {
            return;
        }
        let rate = samples as f64 / seconds;
        let speed = match (self.speeds.get(&rank), late) {
            (Some(&known), true) => known.min(rate),
            (Some(&known), false) => 0.5 * (known + rate),
            (None, _) => rate,
        };
        self.speeds.insert(rank, speed);
    }

    /// The epochs done, in order.
    pub fn epochs_done(&self) -> &[EpochDone] {
        &self.done
    }

    /// What the queue hands out.
    pub fn spec(&self) -> QueueSpec {
        self.spec
    }

    /// The open round's assignment.
    pub fn open(&self) -> &Assignment {
        &self.open
    }

    /// The epoch being handed out and how many of its positions have been seen.
    pub fn progress(&self) -> (u32, u64) {
        (self.epoch, self.seen)
    }

    /// Settles the open round: the shares of the `participants` whose pushes stood for their
    /// whole share are seen; every other share goes back to the front of the queue, in order.
    /// `samples_of(rank)` is what the participant's push stood for.
    pub fn settle(&mut self, participants: &[u16], samples_of: impl Fn(u16) -> u64) {
        self.settle_folding(participants, &[], samples_of);
    }

    /// Settles the open round as [`SampleQueue::settle`] does, except for the `folding`
    /// members (late but still members, in a job whose workers fold a late push into their
    /// error feedback): their shares are not computed again but held, and count as seen once
    /// the member's next push is summed (it carries the folded gradient), or when the epoch
    /// ends; a member that leaves first gives them back ([`SampleQueue::forget`]).
    pub fn settle_folding(
        &mut self,
        participants: &[u16],
        folding: &[u16],
        samples_of: impl Fn(u16) -> u64,
    ) {
        let open = std::mem::take(&mut self.open);
        let mut back = Vec::new();
        self.took_part.clear();
        // A summed push carries what its member folded before.
        let (carried, held): (Vec<Share>, Vec<Share>) = std::mem::take(&mut self.folding)
            .into_iter()
            .partition(|f| participants.contains(&f.rank));
        self.folding = held;
        self.seen += carried.iter().map(Share::samples).sum::<u64>();
        for share in open.shares {
            let whole = share.samples();
            if participants.contains(&share.rank) && samples_of(share.rank) == whole {
                self.seen += whole;
                self.took_part.push(share.rank);
            } else if folding.contains(&share.rank) {
                self.folding.push(share);
            } else {
                self.given_back = self.given_back.saturating_add(whole);
                back.extend(share.spans);
            }
        }
        for span in back.into_iter().rev() {
            self.returned.push_front(span);
        }
    }

    /// Cuts the next round over `members` (the open round must be settled): up to `global`
    /// positions of one epoch, at most `per_member` each, cut first for the members whose
    /// shares the last round saw, then for the others (each group by rank), the first members
    /// taking one more where they do not divide. Starts the next epoch when every position of
    /// this one has been seen. With no members the round gets no positions.
    pub fn assign(&mut self, members: &[u16]) -> &Assignment {
        debug_assert!(self.open.shares.is_empty(), "settle the open round first");
        if self.returned.is_empty() && self.next >= self.spec.samples {
            // The shares still being folded are in their members' memories: the epoch ends
            // with them.
            self.seen += self.folding.drain(..).map(|f| f.samples()).sum::<u64>();
            let done = EpochDone {
                seen: self.seen,
                rounds: self.rounds,
                given_back: self.given_back,
            };
            tracing::info!(
                "epoch {} of the job's samples done: {} of {} seen, in {} rounds, {} given back \
                 and handed out again",
                self.epoch + 1,
                done.seen,
                self.spec.samples,
                done.rounds,
                done.given_back
            );
            self.done.push(done);
            self.epoch += 1;
            (self.next, self.seen, self.rounds, self.given_back) = (0, 0, 0, 0);
        }
        let mut order: Vec<u16> = members.to_vec();
        order.sort_by_key(|r| (!self.took_part.contains(r), *r));
        order.dedup();
        let parts = self.parts(&order);
        let most = u64::from(self.spec.per_member.max(1)) * order.len() as u64;
        // A queue in use holds together (SampleQueue::check), so the sum stays below a u64.
        let available = total(self.returned.iter()).unwrap_or(u64::MAX)
            + self.spec.samples.saturating_sub(self.next);
        let total = most.min(u64::from(self.spec.global.max(1))).min(available);
        let counts = split(total, parts.as_deref(), order.len(), self.spec.per_member);
        let shares: Vec<Share> = order
            .iter()
            .zip(counts)
            .filter(|(_, count)| *count > 0)
            .map(|(&rank, count)| Share {
                rank,
                spans: self.take(count),
            })
            .collect();
        let round = self.rounds;
        self.rounds = self.rounds.saturating_add(u64::from(!shares.is_empty()));
        self.open = Assignment {
            epoch: self.epoch,
            round,
            shares,
        };
        &self.open
    }
}

impl SampleQueue {
    /// Takes `n` positions (at most those left in the epoch): the ones given back first, then
    /// fresh ones, as spans in order.
    fn take(&mut self, mut n: u64) -> Vec<Span> {
        let mut spans = Vec::new();
        while n > 0 {
            let span = if let Some(front) = self.returned.front_mut() {
                let len = u64::from(front.len).min(n);
                let span = Span {
                    start: front.start,
                    len: len as u32,
                };
                front.start += len;
                front.len -= len as u32;
                if front.len == 0 {
                    self.returned.pop_front();
                }
                span
            } else if self.next < self.spec.samples {
                // At most `n`, which a round's size (a u32) bounds.
                let len = (self.spec.samples - self.next).min(n);
                let span = Span {
                    start: self.next,
                    len: len as u32,
                };
                self.next += len;
                span
            } else {
                break;
            };
            n -= u64::from(span.len);
            spans.push(span);
        }
        spans
    }

    /// Forgets what was measured of `rank` (it left the job): if it comes back, it is
    /// measured afresh; the shares it was folding go back to the front of the queue.
    pub fn forget(&mut self, rank: u16) {
        self.speeds.remove(&rank);
        // What it was folding left with its memory: given back, to be trained again.
        let (gone, kept): (Vec<Share>, Vec<Share>) = std::mem::take(&mut self.folding)
            .into_iter()
            .partition(|f| f.rank == rank);
        self.folding = kept;
        for share in gone.into_iter().rev() {
            self.given_back = self.given_back.saturating_add(share.samples());
            for span in share.spans.into_iter().rev() {
                self.returned.push_front(span);
            }
        }
    }

    /// The part of a whole batch each member of `order` can do in the time the median member
    /// does its own, or `None` for equal shares (speeds off, none measured, or no member
    /// slow). A member is slow where it is at least [`UNEVEN`] times slower than the median
    /// and its whole batch would take it [`NOTICEABLE`] longer than the median member's; a
    /// slow member's part is its speed over the median's (at least [`FLOOR`]), every other
    /// member's 1, measured or not.
    fn parts(&self, order: &[u16]) -> Option<Vec<f64>> {
        if !self.spec.by_speed {
            return None;
        }
        let mut known: Vec<f64> = order
            .iter()
            .filter_map(|r| self.speeds.get(r).copied())
            .collect();
        if known.is_empty() {
            return None;
        }
        known.sort_by(f64::total_cmp);
        let median = known[known.len() / 2];
        if median <= 0.0 {
            return None;
        }
        let batch = f64::from(self.spec.per_member.max(1));
        let slow =
            |speed: f64| speed * UNEVEN < median && batch / speed - batch / median >= NOTICEABLE;
        let parts: Vec<f64> = order
            .iter()
            .map(|r| match self.speeds.get(r) {
                Some(&speed) if slow(speed) => speed.max(FLOOR * median) / median,
                _ => 1.0,
            })
            .collect();
        parts.iter().any(|p| *p < 1.0).then_some(parts)
    }
}

/// The positions `spans` hold, or `None` past a u64.
fn total<'a>(mut spans: impl Iterator<Item = &'a Span>) -> Option<u64> {
    spans.try_fold(0u64, |sum, s| sum.checked_add(u64::from(s.len)))
}

/// How many of `total` positions each of `members` members gets, at most `cap` each.
///
/// Equal counts without `parts`, the first members taking one more where they do not divide;
/// also where the positions are too few for every member's part by speed (an epoch's end).
/// With `parts` ([`SampleQueue::parts`]): a member whose part is 1 does its whole `cap`, a
/// slower one `⌊cap · part⌋`, and at least one position (so that its speed is measured
/// again). The round then ends about when the median member's does; what is not handed out
/// stays in the queue.
fn split(total: u64, parts: Option<&[f64]>, members: usize, cap: u32) -> Vec<u64> {
    let cap = u64::from(cap.max(1));
    let equal = || {
        let count = members.max(1) as u64;
        let (base, extra) = (total / count, total % count);
        (0..members as u64)
            .map(|i| (base + u64::from(i < extra)).min(cap))
            .collect::<Vec<u64>>()
    };
    let Some(parts) = parts else {
        return equal();
    };
    let counts: Vec<u64> = parts
        .iter()
        .map(|&part| ((cap as f64 * part).floor() as u64).clamp(1, cap))
        .collect();
    if counts.iter().sum::<u64>() > total {
        return equal();
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_engine::rng::Rng;

    fn spec(samples: u64, global: u32) -> QueueSpec {
        QueueSpec {
            samples,
            global,
            per_member: global,
            by_speed: false,
        }
    }

    #[test]
    fn a_calm_epoch_is_cut_in_order_and_its_last_round_is_short() {
        let mut queue = SampleQueue::new(spec(10, 4));
        let mut rounds = Vec::new();
        loop {
            let round = queue.assign(&[0, 1, 2]).clone();
            if round.epoch == 1 {
                break;
            }
            let all: Vec<u16> = round.shares.iter().map(|s| s.rank).collect();
            queue.settle(&all, |r| round.share_of(r).unwrap().0.samples());
            rounds.push(round);
        }
        let sizes: Vec<Vec<u64>> = rounds
            .iter()
            .map(|r| r.shares.iter().map(Share::samples).collect())
            .collect();
        assert_eq!(sizes, [vec![2, 1, 1], vec![2, 1, 1], vec![1, 1]]);
        let order: Vec<u64> = rounds
            .iter()
            .flat_map(|r| {
                r.shares
                    .iter()
                    .flat_map(|s| s.positions().collect::<Vec<_>>())
            })
            .collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
        assert_eq!(rounds[2].share_of(1).map(|(_, before)| before), Some(1));
        assert_eq!(
            rounds[2].share_of(2),
            None,
            "two positions for three members"
        );
    }

    /// Seeded churn: each round some members are late or gone (their shares come back) and
    /// some push none of their share; over three epochs every position is seen exactly once
    /// per epoch, counted from the shares that settled as seen.
    #[test]
    fn under_churn_every_position_is_seen_once_per_epoch() {
        let (samples, global) = (1000u64, 64u32);
        let mut queue = SampleQueue::new(spec(samples, global));
        let mut rng = Rng::new(7, 1);
        let mut seen: Vec<Vec<u32>> = vec![vec![0; samples as usize]; 3];
        let mut rounds = 0;
        loop {
            let members: Vec<u16> = (0..8u16)
                .filter(|_| !rng.next_u32().is_multiple_of(5))
                .collect();
            let round = queue.assign(&members).clone();
            // Every state a shard may save holds together.
            queue.check().unwrap();
            if round.epoch == 3 {
                break;
            }
            rounds += 1;
            let participants: Vec<u16> = members
                .iter()
                .copied()
                .filter(|_| !rng.next_u32().is_multiple_of(4))
                .collect();
            // One participant in ten pushed without its share (it did not know it).
            let empty: Vec<u16> = participants
                .iter()
                .copied()
                .filter(|_| rng.next_u32().is_multiple_of(10))
                .collect();
            let samples_of = |rank: u16| {
                if empty.contains(&rank) {
                    0
                } else {
                    round.share_of(rank).map_or(0, |(s, _)| s.samples())
                }
            };
            for share in &round.shares {
                if participants.contains(&share.rank) && samples_of(share.rank) > 0 {
                    for p in share.positions() {
                        seen[round.epoch as usize][p as usize] += 1;
                    }
                }
            }
            assert!(round.samples() <= u64::from(global));
            queue.settle(&participants, samples_of);
            queue.check().unwrap();
        }
        for (epoch, counts) in seen.iter().enumerate() {
            assert!(
                counts.iter().all(|&c| c == 1),
                "epoch {epoch}: positions seen {:?} times",
                counts.iter().filter(|&&c| c != 1).count()
            );
        }
        // Calm, three epochs take 3 × 16 rounds; churn adds the rounds it gave back.
        assert!(rounds > 48, "{rounds} rounds");
        let done = queue.epochs_done();
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|e| e.seen == samples && e.given_back > 0));
        assert_eq!(done.iter().map(|e| e.rounds).sum::<u64>(), rounds);
    }

    /// A job whose workers fold late pushes: a late member's share is held (not handed out
    /// again), seen once that member's next push is summed, given back if it leaves first,
    /// and seen at the epoch's end if it is still being folded then. Every position is
    /// accounted for at every step (the check a restored queue must pass).
    #[test]
    fn a_folded_share_is_seen_when_its_member_takes_part_again_or_given_back_if_it_leaves() {
        let mut queue = SampleQueue::new(spec(24, 6));
        let whole = |round: &Assignment| {
            let round = round.clone();
            move |r: u16| round.share_of(r).map_or(0, |(s, _)| s.samples())
        };
        // Round 0: rank 2 is late; it folds.
        let r0 = queue.assign(&[0, 1, 2]).clone();
        queue.settle_folding(&[0, 1], &[2], whole(&r0));
        queue.check().unwrap();
        assert_eq!(queue.progress(), (0, 4), "the folded share is not seen yet");
        let r1 = queue.assign(&[0, 1, 2]).clone();
        assert!(
            r1.shares.iter().all(|s| s.spans[0].start >= 6),
            "the folded share is not handed out again: {r1:?}"
        );
        // Round 1: rank 2 takes part: its push carried the fold.
        queue.settle_folding(&[0, 1, 2], &[], whole(&r1));
        queue.check().unwrap();
        assert_eq!(queue.progress(), (0, 12));
        // Round 2: rank 1 is late and folds, then leaves: its share comes back.
        let r2 = queue.assign(&[0, 1, 2]).clone();
        queue.settle_folding(&[0, 2], &[1], whole(&r2));
        queue.check().unwrap();
        queue.forget(1);
        queue.check().unwrap();
        assert_eq!(queue.progress(), (0, 16));
        let r3 = queue.assign(&[0, 2]).clone();
        let given_back = r2.share_of(1).unwrap().0.spans.clone();
        assert_eq!(
            r3.shares[0].spans[0], given_back[0],
            "handed out first: {r3:?}"
        );
        queue.settle_folding(&[0, 2], &[], whole(&r3));
        // Round 4 ends the epoch with rank 0 still folding its share.
        let mut last = queue.assign(&[0, 2]).clone();
        while last.epoch == 0 {
            queue.settle_folding(&[2], &[0], whole(&last));
            queue.check().unwrap();
            last = queue.assign(&[0, 2]).clone();
        }
        let done = queue.epochs_done()[0];
        assert_eq!(done.seen, 24, "{done:?}");
        assert_eq!(done.given_back, 2, "rank 1's folded share only: {done:?}");
        queue.check().unwrap();
    }

    /// A member that is late every round (it stays a member) never holds the positions it
    /// gave back: they go to the member that took part, and the epoch ends. Each member gets
    /// at most its batch, however few the members.
    #[test]
    fn a_member_late_every_round_does_not_hold_up_the_epoch() {
        let mut queue = SampleQueue::new(QueueSpec {
            samples: 10,
            global: 8,
            per_member: 2,
            by_speed: false,
        });
        let mut seen = vec![0; 10];
        for round in 0.. {
            assert!(round < 12, "the epoch does not end");
            let cut = queue.assign(&[0, 1]).clone();
            if cut.epoch == 1 {
                break;
            }
            assert_eq!(cut.round, round);
            assert!(cut.shares.iter().all(|s| s.samples() <= 2), "{cut:?}");
            if let Some((share, _)) = cut.share_of(1) {
                share.positions().for_each(|p| seen[p as usize] += 1);
            }
            let rank_1 = cut.share_of(1).map_or(0, |(s, _)| s.samples());
            queue.settle(&[1], |_| rank_1);
        }
        assert_eq!(seen, [1; 10]);
        assert_eq!(queue.epochs_done()[0].seen, 10);
    }

    /// Cut by speed: a member three times slower than the others gets a third of its batch,
    /// so that it finishes with them; the round is that much smaller. Speeds within half of
    /// one another keep equal shares.
    #[test]
    fn a_slow_member_gets_a_share_it_can_finish_in_time() {
        let mut queue = SampleQueue::new(QueueSpec {
            samples: 10_000,
            global: 128,
            per_member: 32,
            by_speed: true,
        });
        let sizes = |a: &Assignment| -> Vec<(u16, u64)> {
            a.shares.iter().map(|s| (s.rank, s.samples())).collect()
        };
        let members = [0, 1, 2, 3];
        assert_eq!(
            sizes(queue.assign(&members)),
            [(0, 32), (1, 32), (2, 32), (3, 32)]
        );
        for (rank, seconds) in [(0, 1.0), (1, 1.1), (2, 0.9), (3, 1.4)] {
            queue.observe(rank, 32, seconds, false);
        }
        queue.settle(&members, |_| 32);
        assert_eq!(
            sizes(queue.assign(&members)),
            [(0, 32), (1, 32), (2, 32), (3, 32)],
            "within half of one another: equal"
        );
        // Rank 3 goes three times slower; the running means follow within a few rounds.
        let mut cut = Assignment::default();
        for _ in 0..5 {
            for (rank, seconds) in [(0, 1.0), (1, 1.0), (2, 1.0), (3, 3.0)] {
                let samples = cut.share_of(rank).map_or(32, |(s, _)| s.samples());
                queue.observe(rank, samples, seconds * samples as f64 / 32.0, false);
            }
            queue.settle(&members, |r| {
                cut.share_of(r).map_or(32, |(s, _)| s.samples())
            });
            cut = queue.assign(&members).clone();
        }
        let slow = cut.share_of(3).unwrap().0.samples();
        assert!((9..=12).contains(&slow), "{:?}", sizes(&cut));
        assert!(
            cut.shares[..3].iter().all(|s| s.samples() >= 31),
            "{:?}",
            sizes(&cut)
        );
        // Late with its share: at most as fast as the round's close allowed.
        queue.observe(3, slow, 4.0 * slow as f64 / 32.0, true);
        queue.settle(&[0, 1, 2], |_| 32);
        let after = queue.assign(&members).clone();
        let slower = after.share_of(3).map_or(0, |(s, _)| s.samples());
        assert!(slower < slow, "{:?} after {:?}", sizes(&after), sizes(&cut));
        // The late share came back first, to members that took part.
        assert_eq!(after.shares[0].rank, 0);
    }

    /// A member three times slower, but by milliseconds a batch, keeps its whole batch (in
    /// rounds that short, the jitter of a shared machine); by seconds, it gets a third.
    #[test]
    fn a_member_slower_by_milliseconds_keeps_its_batch() {
        let cut = |per_member: u32| {
            let mut queue = SampleQueue::new(QueueSpec {
                samples: 100_000,
                global: 2 * per_member,
                per_member,
                by_speed: true,
            });
            let members = [0, 1];
            queue.assign(&members);
            // 3,200 and 1,067 samples a second.
            queue.observe(
                0,
                u64::from(per_member),
                f64::from(per_member) / 3200.0,
                false,
            );
            queue.observe(
                1,
                u64::from(per_member),
                f64::from(per_member) / 1067.0,
                false,
            );
            queue.settle(&members, |_| u64::from(per_member));
            let a = queue.assign(&members);
            a.shares.iter().map(|s| s.samples()).collect::<Vec<_>>()
        };
        assert_eq!(cut(32), [32, 32], "20 ms a batch apart: equal");
        assert_eq!(cut(3200), [3200, 1067], "2 s a batch apart: by speed");
    }

    /// A member as fast as the median does its whole batch (no rounding loses a position),
    /// every member keeps at least one position, and too few positions are cut equally.
    #[test]
    fn the_cut_by_speed_keeps_whole_batches_and_every_member() {
        assert_eq!(
            split(128, Some(&[1.0, 1.0, 1.0, 10.0 / 49.0]), 4, 32),
            [32, 32, 32, 6]
        );
        assert_eq!(split(128, Some(&[1.0, 1.0 / 49.0]), 2, 32), [32, 1]);
        assert_eq!(split(2, Some(&[1.0 / 9.0, 1.0]), 2, 1), [1, 1]);
        assert_eq!(split(3, Some(&[1.0, 1.0, 10.0 / 49.0]), 3, 32), [1, 1, 1]);
        assert_eq!(split(7, None, 3, 32), [3, 2, 2]);
    }

    /// A queue read back from a doctored state file is refused before it hands out a
    /// position the epoch does not have or counts past a u64 (the state fuzz target found
    /// the overflow).
    #[test]
    fn a_queue_that_does_not_add_up_is_refused() {
        let mut queue = SampleQueue::new(spec(100, 8));
        queue.assign(&[0, 1]);
        assert_eq!(queue.check(), Ok(()));
        let doctored = |change: &dyn Fn(&mut SampleQueue)| {
            let mut q = queue.clone();
            change(&mut q);
            q.check()
        };
        assert!(doctored(&|q| q.seen = u64::MAX - 3).is_err());
        assert!(doctored(&|q| q.next = 101).is_err());
        assert!(doctored(&|q| q.open.shares[0].spans[0].start = 99).is_err());
        assert!(doctored(&|q| q.returned.push_back(Span {
            start: u64::MAX,
            len: 2
        }))
        .is_err());
        assert!(doctored(&|q| {
            q.speeds.insert(0, f64::NAN);
        })
        .is_err());
        assert!(doctored(&|q| q.spec.per_member = 0).is_err());
    }

    #[test]
    fn a_round_without_members_takes_nothing() {
        let mut queue = SampleQueue::new(spec(10, 4));
        assert!(queue.assign(&[]).shares.is_empty());
        queue.settle(&[], |_| 0);
        assert_eq!(
            queue.assign(&[3]).shares[0].positions().collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }
}
