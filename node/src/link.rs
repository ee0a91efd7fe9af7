//! What the link between a node and its peers carries, as the user states it; QUIC's windows
//! are sized from it.

use std::time::Duration;

use murmur_net::transport::Link;
use serde::{Deserialize, Serialize};

use crate::error::{NodeError, Result};

/// A link's speed and round trip (node-local: every node states its own).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default)]
pub struct LinkConfig {
    /// Link bandwidth in Mbit/s.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = LinkConfig::default().link_mbit))]
    pub link_mbit: f64,
    /// Link round-trip time in milliseconds.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = LinkConfig::default().link_rtt_ms))]
    pub link_rtt_ms: f64,
    /// Seconds a peer may stay silent (keep-alives go every second) before its connection
    /// counts as dead: a server drops a dead worker from the rounds then, a worker reconnects
    /// to a dead server. 3 to 3600.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = LinkConfig::default().peer_timeout_s))]
    pub peer_timeout_s: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            link_mbit: 1000.0,
            link_rtt_ms: 50.0,
            peer_timeout_s: murmur_net::transport::PEER_TIMEOUT.as_secs_f64(),
        }
    }
}

impl LinkConfig {
    /// Refuses values no link has: a speed that is not positive, a negative round trip, a
    /// peer timeout outside 3 to 3600 s.
    pub fn validate(&self) -> Result<()> {
        if !(self.link_mbit.is_finite() && self.link_mbit > 0.0) {
            return Err(NodeError::Config(format!(
                "a link of {} Mbit/s: give a positive speed",
                self.link_mbit
            )));
        }
        if !(self.link_rtt_ms.is_finite() && self.link_rtt_ms >= 0.0) {
            return Err(NodeError::Config(format!(
                "a round trip of {} ms",
                self.link_rtt_ms
            )));
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
        Link {
            bytes_per_second: self.link_mbit * 1e6 / 8.0,
            rtt: Duration::from_secs_f64(self.link_rtt_ms.max(0.0) / 1e3),
            peer_timeout: Duration::from_secs_f64(self.peer_timeout_s.clamp(3.0, 3600.0)),
        }
    }

    /// The same settings as flags, for a node process.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("--link-mbit={}", self.link_mbit),
            format!("--link-rtt-ms={}", self.link_rtt_ms),
            format!("--peer-timeout-s={}", self.peer_timeout_s),
        ]
    }
}
