//! When a round may close without every member: the quorum rule and its adaptive deadline.
//!
//! A round closes at once when every member (an active rank, or one the round expects back)
//! has pushed. Otherwise, once a quorum of members has pushed, the shard waits a while longer
//! and then closes over those who did: `wait × the median push time` of recent rounds (a
//! push time runs from the round's opening on this shard to the moment a rank has pushed
//! every key), kept between [`WAIT_FLOOR`] and the shard's hard deadline. Without any timing
//! yet (the first round after a restart) the wait is the hard deadline, so that a shard that
//! comes back waits for the workers that reconnect to it.
//!
//! A member that misses the quorum's deadline is not dropped: its pushes of that round are
//! discarded (and counted late if they arrive after), and it takes part in the next round
//! with the reply it receives like everyone else. A fraction of 1 makes every round wait for
//! all members (up to the hard deadline), the rule before quorum rounds, which in-process
//! replays of a run need.

use std::collections::VecDeque;
use std::time::Duration;

/// The least a round waits after its quorum: an internet link's jitter is tens of
/// milliseconds, so a shorter wait would drop honest pushes that a busy round happened to
/// delay.
pub const WAIT_FLOOR: Duration = Duration::from_millis(500);

/// Push times kept for the median: enough rounds of a large swarm to be steady, few enough
/// that the median follows a change of speed within a few dozen rounds.
const RECENT_PUSHES: usize = 256;

/// How many members must have pushed before a round may close without the others, and how
/// long it then waits for them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuorumRule {
    /// The share of members that makes a quorum, in (0, 1]; at least one member always.
    pub fraction: f32,
    /// The wait after the quorum, as a multiple of the recent median push time (at least 0).
    pub wait: f32,
}

impl Default for QuorumRule {
    /// At least half the members, then as long again as a typical push takes.
    fn default() -> Self {
        QuorumRule {
            fraction: 0.5,
            wait: 1.0,
        }
    }
}

impl QuorumRule {
    /// Every member, every round (up to the hard deadline): the rule of runs that must give
    /// the bits of the same run in-process.
    pub const ALL: QuorumRule = QuorumRule {
        fraction: 1.0,
        wait: 1.0,
    };

    /// Checks the rule's numbers, naming the one that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(format!(
                "the quorum must be a share of the workers above 0 and at most 1, not {}",
                self.fraction
            ));
        }
        if !(self.wait.is_finite() && (0.0..=1000.0).contains(&self.wait)) {
            return Err(format!(
                "the quorum's wait must be a multiple of the median push time from 0 to 1000, not {}",
                self.wait
            ));
        }
        Ok(())
    }

    /// The members whose pushes make a quorum among `members`: at least one, at most all.
    pub fn size(&self, members: usize) -> usize {
        // In parts per million, so that a share such as 0.3, a hair above 0.3 as an f32,
        // does not ask for one member more than 3 of 10.
        let ppm = (f64::from(self.fraction) * 1e6).round() as u64;
        let needed = (ppm * members as u64).div_ceil(1_000_000) as usize;
        needed.clamp(1, members.max(1))
    }

    /// How long a round waits after its quorum: the multiple of `median`, between
    /// [`WAIT_FLOOR`] and `ceiling`; `ceiling` itself without a median.
    pub fn wait_after_quorum(&self, median: Option<Duration>, ceiling: Duration) -> Duration {
        match median {
            Some(m) => m.mul_f64(f64::from(self.wait)).max(WAIT_FLOOR).min(ceiling),
            None => ceiling,
        }
    }
}

/// The push times of recent rounds, for the median the wait scales with.
#[derive(Debug, Clone, Default)]
pub struct PushTimes {
    recent: VecDeque<Duration>,
}

impl PushTimes {
    /// Notes that a rank finished pushing `took` after its round opened.
    pub fn record(&mut self, took: Duration) {
        if self.recent.len() == RECENT_PUSHES {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
    }

    /// The median of the recent push times (the lower middle of an even count), if any.
    pub fn median(&self) -> Option<Duration> {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        sorted.get(sorted.len().saturating_sub(1) / 2).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEILING: Duration = Duration::from_secs(30);

    #[test]
    fn a_quorum_is_at_least_half_and_at_least_one() {
        let half = QuorumRule::default();
        let sizes: Vec<usize> = (0..=8).map(|m| half.size(m)).collect();
        assert_eq!(sizes, [1, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(QuorumRule::ALL.size(7), 7);
        let tiny = QuorumRule {
            fraction: 0.01,
            wait: 1.0,
        };
        assert_eq!(tiny.size(8), 1);
        // Decimal shares that f32 holds a hair above their value.
        for (fraction, members, size) in [(0.3, 10, 3), (0.6, 5, 3), (0.1, 10, 1), (0.7, 10, 7)] {
            let rule = QuorumRule {
                fraction,
                wait: 1.0,
            };
            assert_eq!(rule.size(members), size, "{fraction} of {members}");
        }
    }

    #[test]
    fn the_wait_follows_the_median_within_its_bounds() {
        let rule = QuorumRule {
            fraction: 0.5,
            wait: 2.0,
        };
        let mut times = PushTimes::default();
        assert_eq!(times.median(), None);
        assert_eq!(rule.wait_after_quorum(times.median(), CEILING), CEILING);
        // One slow outlier does not move the median.
        for ms in [400, 410, 390, 9_000, 420] {
            times.record(Duration::from_millis(ms));
        }
        assert_eq!(times.median(), Some(Duration::from_millis(410)));
        assert_eq!(
            rule.wait_after_quorum(times.median(), CEILING),
            Duration::from_millis(820)
        );
        // Fast rounds wait the floor; slow ones no longer than the hard deadline.
        assert_eq!(
            rule.wait_after_quorum(Some(Duration::from_millis(10)), CEILING),
            WAIT_FLOOR
        );
        assert_eq!(
            rule.wait_after_quorum(Some(Duration::from_secs(60)), CEILING),
            CEILING
        );
    }

    #[test]
    fn the_median_forgets_old_rounds() {
        let mut times = PushTimes::default();
        for _ in 0..RECENT_PUSHES {
            times.record(Duration::from_secs(5));
        }
        for _ in 0..RECENT_PUSHES / 2 + 1 {
            times.record(Duration::from_millis(100));
        }
        assert_eq!(times.median(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn rules_out_of_range_are_refused() {
        for (fraction, wait) in [(0.0, 1.0), (1.5, 1.0), (f32::NAN, 1.0), (0.5, -1.0)] {
            assert!(QuorumRule { fraction, wait }.validate().is_err());
        }
        assert!(QuorumRule::default().validate().is_ok());
        assert!(QuorumRule::ALL.validate().is_ok());
    }
}
