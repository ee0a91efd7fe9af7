//! One round of a worker, from the servers' side of it: the replica's digest sent before the
//! pushes, the step itself, and the shards' summaries after the replies, which say whether
//! this worker's push counted and whether its replica is the swarm's.

use murmur_engine::train::{DataParallel, Learner, RoundBytes};
use murmur_net::ps::QuicCollective;
use murmur_net::wire::Closed;

use crate::error::NodeError;

/// What a round that went through tells the worker.
pub(crate) struct Played {
    /// Its loss on its share of the batch (NaN without a share).
    pub loss: f32,
    /// Bytes it moved.
    pub bytes: RoundBytes,
    /// Whether shard 0 compared the replicas that entered the round and found this one the
    /// majority's: a snapshot of that state is safe to hand the servers.
    pub confirmed: bool,
    /// The link failed after the round's replies were applied (its summaries did not come):
    /// the round counts, and the worker reconnects before the next one.
    pub lost_after: Option<String>,
    /// The ranks whose pushes shard 0 summed into the round (empty when its summary did not
    /// come): live members, every worker told the same.
    pub participants: Vec<u16>,
    /// The shards that closed the round without this worker's push, by index.
    pub late_on: Vec<usize>,
}

impl Played {
    /// Whether every shard summed its push: false when a shard closed the round without it
    /// (its samples then changed nothing there); `None` when the summaries did not come.
    pub fn counted(&self) -> Option<bool> {
        self.lost_after.is_none().then_some(self.late_on.is_empty())
    }
}

/// Why a round did not go through.
pub(crate) enum RoundFailure {
    /// The worker cannot go on: its own arithmetic failed, or its replica went astray.
    Fatal(NodeError),
    /// The link to the servers failed: reconnect and catch up.
    Lost(String),
}

/// Plays round `dp.round()` on this rank's share: `batch`, whose first sample is sample
/// `first` of the global batch; `None` where shard 0 gave this rank no share of the round
/// (it pushes zeros standing for no samples).
pub(crate) fn play_round<M: Learner>(
    dp: &mut DataParallel<QuicCollective, M>,
    rank: u16,
    share: Option<(M::Batch<'_>, usize)>,
    attacking: bool,
) -> Result<Played, RoundFailure> {
    let step = dp.round();
    let digest = dp
        .parameter_digest()
        .map_err(|e| RoundFailure::Fatal(e.into()))?;
    dp.collective
        .send_digest(step, digest)
        .map_err(|e| RoundFailure::Lost(e.to_string()))?;
    let stepped = match share {
        Some((batch, first)) => dp.step(batch, first),
        None => dp.step_without_share().map(|bytes| (f32::NAN, bytes)),
    };
    let (loss, bytes) = match stepped {
        Ok(done) => done,
        // A fault of this node's own arithmetic: rejoining would not mend it.
        Err(e @ murmur_engine::Error::NonFinite { .. }) => {
            return Err(RoundFailure::Fatal(e.into()))
        }
        Err(e) => return Err(RoundFailure::Lost(e.to_string())),
    };
    let summaries = match dp.collective.closed(step) {
        Ok(summaries) => summaries,
        Err(e) => {
            return Ok(Played {
                loss,
                bytes,
                confirmed: false,
                lost_after: Some(e.to_string()),
                participants: Vec::new(),
                late_on: Vec::new(),
            })
        }
    };
    // An attacker's replica goes astray (its own learning rate), and it goes on regardless.
    let confirmed = if attacking {
        false
    } else {
        check_replica(&summaries, step, digest).map_err(RoundFailure::Fatal)?
    };
    Ok(Played {
        loss,
        bytes,
        confirmed,
        lost_after: None,
        participants: summaries
            .first()
            .map_or_else(Vec::new, |c| c.participants.clone()),
        late_on: summaries
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.participants.contains(&rank))
            .map(|(shard, _)| shard)
            .collect(),
    })
}

/// Whether shard 0 compared the replicas that entered the round and found this one the
/// majority's; fails where they differed and this one's digest is not the majority's (or
/// there was none).
fn check_replica(summaries: &[Closed], step: u64, digest: u64) -> Result<bool, NodeError> {
    let Some(verdict) = summaries.first().and_then(|c| c.replicas) else {
        return Ok(false);
    };
    if verdict.majority == Some(digest) {
        return Ok(true);
    }
    if !verdict.disagreed {
        return Ok(false);
    }
    Err(NodeError::Diverged {
        step,
        digest,
        majority: verdict.majority.map_or_else(
            || "and no digest had a majority".to_string(),
            |d| format!("most workers hold {d:016x}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_net::wire::ReplicaVerdict;

    fn summary(majority: Option<u64>, disagreed: bool) -> Vec<Closed> {
        vec![Closed {
            participants: vec![0, 1, 2],
            replicas: Some(ReplicaVerdict {
                majority,
                disagreed,
            }),
            next: None,
            relay: None,
        }]
    }

    #[test]
    fn only_a_replica_outside_the_majority_fails() {
        assert!(check_replica(&summary(Some(7), false), 3, 7).is_ok());
        // Another worker went astray: this one holds the majority's replica.
        assert!(check_replica(&summary(Some(7), true), 3, 7).is_ok());
        let astray = check_replica(&summary(Some(7), true), 3, 8).unwrap_err();
        assert!(astray.to_string().contains("round 3"), "{astray}");
        // No majority: nobody can say which replica is right.
        assert!(check_replica(&summary(None, true), 3, 7).is_err());
        // No digests compared (another shard, or none arrived in time).
        assert!(check_replica(&[], 3, 7).is_ok());
    }
}
