//! How a shaped link treats each packet, one direction at a time: random loss, a rate limit
//! behind a drop-tail queue, then a fixed delay. The UDP relay ([`crate::relay`]) and the TUN
//! shaper ([`crate::shaped_path`]) both schedule their packets with it, so that a relayed QUIC
//! link and a shaped IP path degrade the same way.

use std::time::{Duration, Instant};

/// What a link does to each direction's packets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Fixed one-way delay added to every packet after its rate-limited departure time.
    pub delay: Duration,
    /// Bytes per second; infinite for no limit.
    pub rate: f64,
    /// Probability that a packet is dropped.
    pub loss: f64,
    /// Longest a packet may wait for the rate limit before it is dropped.
    pub queue: Duration,
    /// Seed of the loss draws.
    pub seed: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            delay: Duration::ZERO,
            rate: f64::INFINITY,
            loss: 0.0,
            queue: Duration::from_millis(50),
            seed: 1,
        }
    }
}

impl Shape {
    /// One direction of a link of `mbit` Mbit/s whose round trip is `rtt` and whose packets
    /// are each lost with probability `loss`: half the round trip of delay, and a router's
    /// buffer of one round trip at the rate (at least 20 ms).
    pub fn link(mbit: f64, rtt: Duration, loss: f64) -> Shape {
        Shape {
            delay: rtt / 2,
            rate: mbit * 1e6 / 8.0,
            loss,
            queue: rtt.max(Duration::from_millis(20)),
            seed: 1,
        }
    }
}

/// One direction's FIFO: departure times `max(arrival, previous departure) + size / rate`,
/// delivery at departure plus the delay, a drop where the wait for departure would exceed
/// the queue, and seeded loss draws.
#[derive(Debug, Clone)]
pub struct Schedule {
    shape: Shape,
    next_free: Option<Instant>,
    rng: u64,
}

impl Schedule {
    /// An empty queue.
    pub fn new(shape: Shape) -> Schedule {
        Schedule {
            shape,
            next_free: None,
            rng: shape.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn uniform(&mut self) -> f64 {
        // xorshift64*: plenty for loss draws, and the same draws for the same seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// When a packet of `bytes` that arrives at `now` reaches the far end, or `None` when it
    /// is lost or finds the queue full. Arrivals must come in time order.
    pub fn admit(&mut self, now: Instant, bytes: usize) -> Option<Instant> {
        if self.shape.loss > 0.0 && self.uniform() < self.shape.loss {
            return None;
        }
        let start = self.next_free.map_or(now, |free| free.max(now));
        if start - now > self.shape.queue {
            return None;
        }
        // A rate that is not a positive number means no limit.
        let transmit = if self.shape.rate.is_finite() && self.shape.rate > 0.0 {
            Duration::from_secs_f64(bytes as f64 / self.shape.rate)
        } else {
            Duration::ZERO
        };
        let departure = start + transmit;
        self.next_free = Some(departure);
        Some(departure + self.shape.delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_leave_at_the_rate_after_the_delay_in_order() {
        let shape = Shape {
            delay: Duration::from_millis(30),
            rate: 100e3,
            queue: Duration::from_secs(1),
            ..Shape::default()
        };
        let mut s = Schedule::new(shape);
        let t0 = Instant::now();
        let due: Vec<Instant> = (0..5).map(|_| s.admit(t0, 1000).unwrap()).collect();
        // Back to back: 10 ms of wire each, then 30 ms of delay.
        for (i, d) in due.iter().enumerate() {
            assert_eq!(*d - t0, Duration::from_millis(10 * (i as u64 + 1) + 30));
        }
        // An idle link sends a late packet at once.
        let late = t0 + Duration::from_secs(2);
        assert_eq!(
            s.admit(late, 1000).unwrap() - late,
            Duration::from_millis(40)
        );
    }

    #[test]
    fn a_full_queue_drops_and_loss_drops_its_share() {
        let shape = Shape {
            rate: 100e3,
            queue: Duration::from_millis(20),
            ..Shape::default()
        };
        let mut s = Schedule::new(shape);
        let t0 = Instant::now();
        let kept = (0..50).filter(|_| s.admit(t0, 1000).is_some()).count();
        // Waits of 0, 10 and 20 ms fit a 20 ms queue; the rest find it full.
        assert_eq!(kept, 3);

        let mut s = Schedule::new(Shape {
            loss: 0.3,
            ..Shape::default()
        });
        let lost = (0..10_000).filter(|_| s.admit(t0, 10).is_none()).count();
        assert!(
            (2_700..=3_300).contains(&lost),
            "30% loss dropped {lost} of 10,000"
        );
    }

    #[test]
    fn a_link_is_half_its_round_trip_each_way() {
        let s = Shape::link(50.0, Duration::from_millis(100), 0.01);
        assert_eq!(s.delay, Duration::from_millis(50));
        assert_eq!(s.rate, 6.25e6);
        assert_eq!(s.queue, Duration::from_millis(100));
        assert_eq!(
            Shape::link(10.0, Duration::ZERO, 0.0).queue,
            Duration::from_millis(20)
        );
    }
}
