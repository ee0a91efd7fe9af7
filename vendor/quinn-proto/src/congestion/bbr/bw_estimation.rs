use std::fmt::{Debug, Display, Formatter};

use super::min_max::MinMax;
use crate::{Duration, Instant};

#[derive(Clone, Debug, Default)]
pub(crate) struct BandwidthEstimation {
    total_acked: u64,
    prev_total_acked: u64,
    acked_time: Option<Instant>,
    prev_acked_time: Option<Instant>,
    total_sent: u64,
    prev_total_sent: u64,
    sent_time: Option<Instant>,
    prev_sent_time: Option<Instant>,
    max_filter: MinMax,
    acked_at_last_window: u64,
    /// murmur's patch: where the current round's delivery-rate sample began (round, time,
    /// bytes acked, last send time, bytes sent).
    round_start: Option<(u64, Instant, u64, Option<Instant>, u64)>,
}

impl BandwidthEstimation {
    pub(crate) fn on_sent(&mut self, now: Instant, bytes: u64) {
        self.prev_total_sent = self.total_sent;
        self.total_sent += bytes;
        self.prev_sent_time = self.sent_time;
        self.sent_time = Some(now);
    }

    pub(crate) fn on_ack(
        &mut self,
        now: Instant,
        _sent: Instant,
        bytes: u64,
        round: u64,
        app_limited: bool,
    ) {
        self.prev_total_acked = self.total_acked;
        self.total_acked += bytes;
        self.prev_acked_time = self.acked_time;
        self.acked_time = Some(now);

        // murmur's patch: one bandwidth sample per round trip, the bytes acked (and sent)
        // over the whole round over its duration. A sample per acknowledgement (bytes of
        // one ACK over the gap since the previous one) read batched ACKs (GRO, delayed ACKs)
        // as bursts many times the bottleneck rate, and the max filter kept them: BBR paced
        // far above the link, lost a third of its packets at the queue and starved flows
        // beside it. Samples now go into the filter whether or not they are its new max, so
        // an old max ages out after the filter's window of rounds (app-limited samples only
        // raise it, as BBR's draft says).
        let Some((start_round, t0, acked0, sent_t0, sent0)) = self.round_start else {
            self.round_start = Some((round, now, self.total_acked, self.sent_time, self.total_sent));
            return;
        };
        if round <= start_round {
            return;
        }
        let ack_rate = Self::bw_from_delta(self.total_acked - acked0, now - t0).unwrap_or(0);
        let send_rate = match (sent_t0, self.sent_time) {
            (Some(a), Some(b)) if b > a => {
                Self::bw_from_delta(self.total_sent - sent0, b - a).unwrap_or(u64::MAX)
            }
            _ => u64::MAX,
        };
        let bandwidth = send_rate.min(ack_rate);
        if !app_limited || self.max_filter.get() < bandwidth {
            self.max_filter.update_max(round, bandwidth);
        }
        self.round_start = Some((round, now, self.total_acked, self.sent_time, self.total_sent));
    }

    pub(crate) fn bytes_acked_this_window(&self) -> u64 {
        self.total_acked - self.acked_at_last_window
    }

    pub(crate) fn end_acks(&mut self, _current_round: u64, _app_limited: bool) {
        self.acked_at_last_window = self.total_acked;
    }

    pub(crate) fn get_estimate(&self) -> u64 {
        self.max_filter.get()
    }

    pub(crate) const fn bw_from_delta(bytes: u64, delta: Duration) -> Option<u64> {
        let window_duration_ns = delta.as_nanos();
        if window_duration_ns == 0 {
            return None;
        }
        let b_ns = bytes * 1_000_000_000;
        let bytes_per_second = b_ns / (window_duration_ns as u64);
        Some(bytes_per_second)
    }
}

impl Display for BandwidthEstimation {
    fn fmt(&self, f: &mut Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.3} MB/s",
            self.get_estimate() as f32 / (1024 * 1024) as f32
        )
    }
}
