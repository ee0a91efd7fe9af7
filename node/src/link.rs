//! What the link between a node and its peers carries: by default QUIC's windows follow the
//! path as measured; a speed and round trip the user states fix them instead.

use std::time::Duration;

use murmur_net::transport::{Congestion, Link, Windows};
use serde::{Deserialize, Serialize};

use crate::error::{NodeError, Result};

/// A link's congestion controller, peer timeout and, optionally, speed and round trip
/// (node-local: every node states its own).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct LinkConfig {
    /// Link bandwidth in Mbit/s. Stating it (or --link-rtt-ms) fixes QUIC's receive windows
    /// at two bandwidth-delay products instead of growing them to the path as measured.
    #[cfg_attr(feature = "cli", arg(long))]
    pub link_mbit: Option<f64>,
    /// Link round-trip time in milliseconds (see --link-mbit).
    #[cfg_attr(feature = "cli", arg(long))]
    pub link_rtt_ms: Option<f64>,
    /// Seconds a peer may stay silent (keep-alives go every second) before its connection
    /// counts as dead: a server drops a dead worker from the rounds then, a worker reconnects
    /// to a dead server. 3 to 3600.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = LinkConfig::default().peer_timeout_s))]
    pub peer_timeout_s: f64,
    /// QUIC congestion controller of what this node sends: tolerant (CUBIC that takes only
    /// loss with a queue, or at a high rate, for congestion) keeps its rate through random
    /// loss and shares the link with other traffic; cubic backs off on every loss; bbr keeps
    /// its rate through loss but starves other flows on the link, so give it only on links
    /// murmur has to itself (docs/benchmarks.md, "Goodput").
    #[cfg_attr(feature = "cli", arg(long, default_value_t = LinkConfig::default().congestion))]
    pub congestion: Congestion,
}

/// The speed a link is taken to have when only its round trip is stated.
const ASSUMED_MBIT: f64 = 1000.0;
/// The round trip a link is taken to have when only its speed is stated (also QUIC's first
/// round-trip estimate on a measured link).
const ASSUMED_RTT_MS: f64 = 50.0;

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            link_mbit: None,
            link_rtt_ms: None,
            peer_timeout_s: murmur_net::transport::PEER_TIMEOUT.as_secs_f64(),
            congestion: Congestion::default(),
        }
    }
}

impl LinkConfig {
    /// Refuses values no link has: a speed that is not positive, a negative round trip, a
    /// peer timeout outside 3 to 3600 s.
    pub fn validate(&self) -> Result<()> {
        if let Some(mbit) = self.link_mbit {
            if !(mbit.is_finite() && mbit > 0.0) {
                return Err(NodeError::Config(format!(
                    "a link of {mbit} Mbit/s: give a positive speed"
                )));
            }
        }
        if let Some(ms) = self.link_rtt_ms {
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(NodeError::Config(format!("a round trip of {ms} ms")));
            }
        }
        if !(3.0..=3600.0).contains(&self.peer_timeout_s) {
            return Err(NodeError::Config(format!(
                "a peer timeout of {} s: give 3 to 3600 (keep-alives go every second)",
                self.peer_timeout_s
            )));
        }
        Ok(())
    }

    /// The transport's view of it.
    pub fn link(&self) -> Link {
        let stated = self.link_mbit.is_some() || self.link_rtt_ms.is_some();
        Link {
            bytes_per_second: self.link_mbit.unwrap_or(ASSUMED_MBIT) * 1e6 / 8.0,
            rtt: Duration::from_secs_f64(self.link_rtt_ms.unwrap_or(ASSUMED_RTT_MS).max(0.0) / 1e3),
            peer_timeout: Duration::from_secs_f64(self.peer_timeout_s.clamp(3.0, 3600.0)),
            congestion: self.congestion,
            windows: if stated {
                Windows::Stated
            } else {
                Windows::Measured
            },
        }
    }

    /// The same settings as flags, for a node process.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--peer-timeout-s={}", self.peer_timeout_s),
            format!("--congestion={}", self.congestion),
        ];
        args.extend(self.link_mbit.map(|m| format!("--link-mbit={m}")));
        args.extend(self.link_rtt_ms.map(|r| format!("--link-rtt-ms={r}")));
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_measured_unless_the_link_is_stated() {
        let measured = LinkConfig::default().link();
        assert_eq!(measured.windows, Windows::Measured);
        assert_eq!(measured.congestion, Congestion::Tolerant);
        let stated = LinkConfig {
            link_rtt_ms: Some(120.0),
            ..LinkConfig::default()
        }
        .link();
        assert_eq!(stated.windows, Windows::Stated);
        assert_eq!(stated.rtt, Duration::from_millis(120));
        assert_eq!(stated.bytes_per_second, ASSUMED_MBIT * 1e6 / 8.0);
        let bad = LinkConfig {
            link_mbit: Some(0.0),
            ..LinkConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
