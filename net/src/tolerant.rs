//! A CUBIC that tells random loss from congestion ([`Tolerant`]): a volunteer's link loses
//! packets to radio and to long paths, and CUBIC, which halves its window on every loss,
//! keeps 2% of a 50 Mbit/s, 100 ms link at 1% loss. BBR keeps its rate there but starves the
//! household's TCP flows beside it. This controller keeps CUBIC's growth and backs off as
//! CUBIC does, but only on a loss that comes with a sign of congestion:
//!
//! - a queue: the round trip (the larger of the smoothed and the latest) above the path's
//!   minimum by a fifth of it (at least [`MIN_QUEUE`]); a full bottleneck queue, the
//!   drop-tail loss CUBIC is built for, shows as one, and so does every queue a competing
//!   TCP flow keeps. The latest sample counts so that a queue shows at once: with the
//!   smoothed one alone, the first overflow losses read as random, and a TCP flow beside
//!   kept 0.38 of a 50 Mbit/s, 80 ms path instead of 0.44;
//! - or heavy loss: more than [`HEAVY_LOSS`] of the bytes sent lately lost without a queue,
//!   which a policer that drops without queueing causes once the window overshoots its rate;
//! - or persistent congestion, always.
//!
//! A loss on an empty path at a low rate is taken for random and leaves the window alone.
//! (Loss discrimination by delay is an old idea: TCP Veno, Westwood.)

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics, CubicConfig};
use quinn_proto::RttEstimator;

/// The smallest queueing delay that counts as a queue.
pub const MIN_QUEUE: Duration = Duration::from_millis(5);
/// The share of recent bytes lost above which loss counts as congestion, queue or not.
pub const HEAVY_LOSS: f64 = 0.05;
/// How many bytes "recent" spans: the loss rate is counted over the last one to two of
/// these, so that one loss in a small window does not read as a high rate (a window of 20
/// packets that loses one has lost 5% of it).
pub const LOSS_HORIZON: u64 = 1 << 20;

/// Builds [`Tolerant`] controllers.
#[derive(Debug, Default)]
pub struct TolerantConfig {
    cubic: Arc<CubicConfig>,
}

impl ControllerFactory for TolerantConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(Tolerant {
            cubic: self.cubic.clone().build(now, current_mtu),
            smoothed: Duration::ZERO,
            min: Duration::MAX,
            acked: 0,
            lost: 0,
        })
    }
}

/// CUBIC that ignores loss on an empty path at a low loss rate (module docs).
pub struct Tolerant {
    cubic: Box<dyn Controller>,
    /// The path's round trip (the larger of smoothed and latest) and its minimum, as of the
    /// last acknowledgement.
    smoothed: Duration,
    min: Duration,
    /// Bytes acknowledged, and lost without a queue, lately (both halved whenever they pass
    /// two [`LOSS_HORIZON`]s).
    acked: u64,
    lost: u64,
}

impl Tolerant {
    /// Whether there is a queue on the path now.
    fn queued(&self) -> bool {
        let queue = self.smoothed.saturating_sub(self.min);
        self.min != Duration::MAX && queue > (self.min / 5).max(MIN_QUEUE)
    }

    /// Whether the losses without a queue come at a high rate. Losses with one are left out:
    /// they are congestion already, and a queue's overflow (a burst of them) would otherwise
    /// make the random losses after it read as a high rate for a horizon.
    fn heavy(&self) -> bool {
        // Until a horizon's bytes have gone by, the rate is counted against a whole one.
        let sent = (self.acked + self.lost).max(LOSS_HORIZON);
        self.lost as f64 / sent as f64 > HEAVY_LOSS
    }
}

impl Controller for Tolerant {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.cubic.on_sent(now, bytes, last_packet_number)
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
        self.smoothed = rtt.conservative();
        self.min = rtt.min();
        self.acked += bytes;
        if self.acked + self.lost > 2 * LOSS_HORIZON {
            self.acked /= 2;
            self.lost /= 2;
        }
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.cubic
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked)
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        let queued = self.queued();
        if !queued {
            self.lost += lost_bytes;
        }
        let congested = is_persistent_congestion || queued || self.heavy();
        tracing::trace!(
            "loss of {lost_bytes} bytes: smoothed {:?}, min {:?}, {} acked and {} lost lately, \
             window {}: {}",
            self.smoothed,
            self.min,
            self.acked,
            self.lost,
            self.cubic.window(),
            if congested { "congestion" } else { "random" }
        );
        if congested {
            self.cubic
                .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.cubic.on_mtu_update(new_mtu)
    }

    fn window(&self) -> u64 {
        self.cubic.window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.cubic.metrics()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Tolerant {
            cubic: self.cubic.clone_box(),
            smoothed: self.smoothed,
            min: self.min,
            acked: self.acked,
            lost: self.lost,
        })
    }

    fn initial_window(&self) -> u64 {
        self.cubic.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(smoothed_ms: u64, min_ms: u64, acked: u64, lost: u64) -> Tolerant {
        let built = Arc::new(TolerantConfig::default()).build(Instant::now(), 1200);
        let mut c = *built.into_any().downcast::<Tolerant>().unwrap();
        c.smoothed = Duration::from_millis(smoothed_ms);
        c.min = Duration::from_millis(min_ms);
        (c.acked, c.lost) = (acked, lost);
        c
    }

    #[test]
    fn loss_counts_as_congestion_only_with_a_queue_or_at_a_high_rate() {
        let congested = |c: Tolerant| c.queued() || c.heavy();
        // 1% lost on a path whose round trip is its minimum: random.
        assert!(!congested(controller(101, 100, 990_000, 10_000)));
        // The same loss with a queue of 30 ms on a 100 ms path: congestion.
        assert!(congested(controller(130, 100, 990_000, 10_000)));
        // A short path's queue: 6 ms on 10 ms counts, 4 ms (under 5 ms) does not.
        assert!(congested(controller(16, 10, 990_000, 10_000)));
        assert!(!congested(controller(14, 10, 990_000, 10_000)));
        // 8% lost with no queue (a policer): congestion.
        assert!(congested(controller(100, 100, 920_000, 80_000)));
        // One packet lost out of a small window early on is not a high rate.
        assert!(!congested(controller(100, 100, 20_000, 1_452)));
        // No round trip measured yet: only the rate counts.
        let mut fresh = controller(0, 0, 0, 1_452);
        fresh.min = Duration::MAX;
        assert!(!congested(fresh));
    }

    #[test]
    fn random_loss_leaves_the_window_and_congestion_shrinks_it() {
        let now = Instant::now();
        let mut random = controller(100, 100, 990_000, 0);
        let before = random.window();
        random.on_congestion_event(now, now, false, 1_200);
        assert_eq!(random.window(), before);
        let mut queued = controller(150, 100, 990_000, 0);
        queued.on_congestion_event(now, now, false, 1_200);
        assert!(queued.window() < before);
        // A loss with a queue does not count towards the rate of the random ones.
        assert_eq!(queued.lost, 0);
        assert_eq!(random.lost, 1_200);
        let mut persistent = controller(100, 100, 990_000, 0);
        persistent.on_congestion_event(now, now, true, 1_200);
        assert!(persistent.window() < before);
    }
}
