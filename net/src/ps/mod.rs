//! The BytePS-Compress parameter-server system over QUIC (byteps-clan.md §5): server shards
//! that decode, average, compensate and re-encode each key once per round, and the workers'
//! [`Collective`](murmur_engine::comm::Collective) that talks to them.
//!
//! Membership: a swarm starts when `world` workers have registered; rounds close on a quorum
//! of them ([`quorum`]), so a late worker holds nobody; a worker that dies is out of the
//! rounds once its connection times out, or evicted at a round's hard deadline; a worker that
//! comes back registers as a listener, loads the newest snapshot, replays the rounds logged
//! since, and takes part again from the open round ([`catch_up`]).

pub mod client;
pub mod durable;
pub mod job_checks;
pub mod queue;
pub mod quorum;
pub mod server;
pub mod state;

pub use client::{join_job, CatchupPlan, ClientOptions, QuicCollective};
pub use server::{JobOffer, Server, ServerOptions, MAX_UNSENT_ROUNDS};

use murmur_engine::train::{DataParallel, Learner};

use crate::error::Result;

/// Brings a trainer that joined a running swarm to the swarm's current round: loads the
/// newest snapshot (unless the servers still log every round since the trainer's own, as
/// after a pause) and applies every round after it, exactly as the others did. Returns the
/// plan it followed. A trainer of a swarm that has not started is left as it is.
pub fn catch_up<M: Learner>(
    dp: &mut DataParallel<QuicCollective, M>,
) -> Result<Option<CatchupPlan>> {
    if !dp.collective.underway() {
        return Ok(None);
    }
    let plan = dp.collective.catch_up(dp.round())?;
    match &plan.snapshot {
        Some((step, bytes)) => dp.restore(bytes, *step)?,
        None if dp.round() != plan.from => {
            return Err(crate::NetError::Protocol(format!(
                "no snapshot to rejoin from, and this trainer is at step {} rather than {}",
                dp.round(),
                plan.from
            )))
        }
        None => {}
    }
    while dp.round() < plan.to {
        dp.replay_round()?;
    }
    Ok(Some(plan))
}
