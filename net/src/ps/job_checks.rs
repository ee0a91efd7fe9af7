//! What a shard checks against its job beyond what this crate reads itself: the keys a worker
//! of the job registers, and the parameters a snapshot holds. The node library, which knows
//! models and checkpoints, builds both checks from the job; a shard without them takes the
//! first registration's keys as the layout and keeps any snapshot a rank sends.

use std::fmt;
use std::sync::Arc;

use murmur_engine::comm::KeySpec;

type CheckKeys = dyn Fn(&[KeySpec]) -> Result<(), String> + Send + Sync;
type DigestOf = dyn Fn(&[u8]) -> Result<u64, String> + Send + Sync;

/// Checks a registration's keys against the layout the job gives this shard (what a worker of
/// the job registers here), saying what differs.
#[derive(Clone)]
pub struct LayoutCheck(Arc<CheckKeys>);

impl LayoutCheck {
    /// A check by `f`.
    pub fn new(f: impl Fn(&[KeySpec]) -> Result<(), String> + Send + Sync + 'static) -> Self {
        LayoutCheck(Arc::new(f))
    }

    /// Whether `keys` are the job's keys for this shard (an error says what differs).
    pub fn check(&self, keys: &[KeySpec]) -> Result<(), String> {
        (self.0)(keys)
    }
}

impl fmt::Debug for LayoutCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LayoutCheck")
    }
}

/// The digest of the parameters a snapshot holds, computed as every worker computes its
/// replica's digest each round (`ReplicaDigest`), or an error if the bytes are not a
/// snapshot of the job's model.
#[derive(Clone)]
pub struct SnapshotDigest(Arc<DigestOf>);

impl SnapshotDigest {
    /// A digest by `f`.
    pub fn new(f: impl Fn(&[u8]) -> Result<u64, String> + Send + Sync + 'static) -> Self {
        SnapshotDigest(Arc::new(f))
    }

    /// The digest of the parameters in `snapshot`.
    pub fn of(&self, snapshot: &[u8]) -> Result<u64, String> {
        (self.0)(snapshot)
    }
}

impl fmt::Debug for SnapshotDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SnapshotDigest")
    }
}
