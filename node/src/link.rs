//! What the link between a node and its peers carries, as the user states it; QUIC's windows
//! are sized from it.

use std::time::Duration;

use murmur_net::transport::Link;
use serde::{Deserialize, Serialize};

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
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            link_mbit: 1000.0,
            link_rtt_ms: 50.0,
        }
    }
}

impl LinkConfig {
    /// The transport's view of it.
    pub fn link(&self) -> Link {
        Link {
            bytes_per_second: self.link_mbit * 1e6 / 8.0,
            rtt: Duration::from_secs_f64(self.link_rtt_ms.max(0.0) / 1e3),
        }
    }

    /// The same settings as flags, for a node process.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("--link-mbit={}", self.link_mbit),
            format!("--link-rtt-ms={}", self.link_rtt_ms),
        ]
    }
}
