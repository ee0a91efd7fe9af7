//! Checks the node configs share: numbers in range, and the node's credentials loaded with a
//! message that says where they were looked for.

use std::path::Path;

use murmur_net::identity::Credentials;

use crate::error::{NodeError, Result};

/// `value` must be a positive, finite number of seconds.
pub(crate) fn positive_seconds(name: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        return Ok(());
    }
    Err(NodeError::Config(format!(
        "{name} must be a positive number of seconds, not {value}"
    )))
}

/// The credentials of node `node` in the swarm folder `swarm`.
pub(crate) fn load_credentials(swarm: &Path, node: &str) -> Result<Credentials> {
    if node.is_empty() {
        return Err(NodeError::Config("the node needs a name".into()));
    }
    Credentials::load(swarm, node).map_err(|e| {
        NodeError::Config(format!(
            "loading node {node:?} from {}: {e}",
            swarm.display()
        ))
    })
}
