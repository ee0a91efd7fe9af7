//! Shard 0's word on each round: who took part, the samples it counted for each, and the
//! snapshot it holds ([`Participants`]). Shard 0 signs it with the key that signs rank
//! tickets ([`TicketSigner`]); the workers relay it to the other shards, which check it
//! against the issuer of the relaying worker's ticket, so no worker can make them close a
//! round over other ranks, weigh a push by other samples, or drop logged rounds.

use crate::error::{NetError, Result};
use crate::signing::verify;
use crate::ticket::TicketSigner;
use crate::wire::Participants;

fn err(e: impl std::fmt::Display) -> NetError {
    NetError::Identity(format!("shard 0's word: {e}"))
}

/// What the signature of a round's participants covers starts with this.
const PARTICIPANTS_DOMAIN: &[u8] = b"murmur participants v1\0";

/// What shard 0 signs of round `step`'s participants in the job `job`.
fn participants_message(job: &[u8], step: u64, p: &Participants) -> Vec<u8> {
    let mut m = PARTICIPANTS_DOMAIN.to_vec();
    m.extend_from_slice(&(job.len() as u32).to_le_bytes());
    m.extend_from_slice(job);
    m.extend_from_slice(&step.to_le_bytes());
    m.extend_from_slice(&(p.ranks.len() as u32).to_le_bytes());
    p.ranks
        .iter()
        .for_each(|r| m.extend_from_slice(&r.to_le_bytes()));
    m.extend_from_slice(&(p.samples.len() as u32).to_le_bytes());
    p.samples
        .iter()
        .for_each(|n| m.extend_from_slice(&n.to_le_bytes()));
    match p.snapshot {
        Some(step) => {
            m.push(1);
            m.extend_from_slice(&step.to_le_bytes());
        }
        None => m.push(0),
    }
    m
}

/// Checks shard 0's signature of round `step`'s participants in the job `job`, against the
/// certificate (DER) that issued the relaying worker's ticket (already checked with it).
pub fn check_participants(
    issuer: &[u8],
    job: &[u8],
    step: u64,
    participants: &Participants,
) -> Result<()> {
    verify(
        issuer,
        &participants_message(job, step, participants),
        &participants.signature,
    )
    .map_err(|e| {
        NetError::Identity(format!(
            "shard 0's participants of round {step}, as relayed: {e}"
        ))
    })
}

impl TicketSigner {
    /// Shard 0's signature of `participants` (its fields but the signature) of round `step`
    /// in the job `job`.
    pub fn sign_participants(
        &self,
        job: &[u8],
        step: u64,
        participants: &Participants,
    ) -> Result<Vec<u8>> {
        self.key
            .sign(&participants_message(job, step, participants))
            .map_err(err)
    }
}
