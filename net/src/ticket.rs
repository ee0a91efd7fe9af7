//! Rank tickets: how every shard knows that a rank belongs to a certificate. Shard 0 hands
//! out ranks (one per certificate, for good); with each it signs a ticket, "rank r of this
//! job belongs to the key with this digest", using its own certificate's key. The worker
//! shows the ticket in its hello to every shard, and a shard accepts the hello only if the
//! ticket names the connecting certificate's key, this shard's job, and the hello's rank, and
//! was signed by a certificate the swarm issued to shard 0 (not expired, not revoked). So no
//! certificate takes another's place on any shard, and the shards need no link of their own.
//!
//! Shard 0 signs its word on each round with the same key ([`crate::word`]).
//!
//! Signatures are ECDSA P-256 with SHA-256 ([`crate::signing`]).

use rustls::pki_types::{CertificateDer, UnixTime};
use serde::{Deserialize, Serialize};

use crate::error::{NetError, Result};
use crate::identity::{key_digest, Credentials, Role};
use crate::signing::{verify, Signer};

/// What a ticket's signature covers is prefixed with this, so that no other message murmur
/// signs can pass for a ticket.
const DOMAIN: &[u8] = b"murmur rank ticket v1\0";

/// Rank `rank` of the job whose description hashes to `job` belongs to the key `holder`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// The rank shard 0 assigned.
    pub rank: u16,
    /// Workers in the job.
    pub world: u16,
    /// SHA-256 of the job's description, as every shard of the job holds it.
    pub job: Vec<u8>,
    /// SHA-256 of the holder's public key (its certificate's subject public key info).
    pub holder: Vec<u8>,
    /// The certificate of shard 0 that signed the ticket (DER).
    pub issuer: Vec<u8>,
    /// ECDSA P-256 / SHA-256 signature (ASN.1) over `murmur rank ticket v1` and a zero byte,
    /// then the fields above.
    pub signature: Vec<u8>,
}

fn err(e: impl std::fmt::Display) -> NetError {
    NetError::Identity(format!("rank ticket: {e}"))
}

/// The holder's key digest ([`crate::identity::key_digest`]), an error if it does not parse.
fn holder_digest(cert: &CertificateDer<'_>) -> Result<Vec<u8>> {
    key_digest(cert)
        .map(|d| d.to_vec())
        .ok_or_else(|| err("the holder's certificate does not parse"))
}

fn message(rank: u16, world: u16, job: &[u8], holder: &[u8]) -> Vec<u8> {
    let mut m = DOMAIN.to_vec();
    m.extend_from_slice(&rank.to_le_bytes());
    m.extend_from_slice(&world.to_le_bytes());
    for part in [job, holder] {
        m.extend_from_slice(&(part.len() as u32).to_le_bytes());
        m.extend_from_slice(part);
    }
    m
}

/// Shard 0's signing key, from its credentials.
pub struct TicketSigner {
    pub(crate) key: Signer,
    cert: CertificateDer<'static>,
}

impl TicketSigner {
    /// The signer for `creds`, which must be a server certificate for shard 0 with a P-256
    /// key.
    pub fn new(creds: &Credentials) -> Result<TicketSigner> {
        Ok(TicketSigner {
            key: Signer::new(&creds.key).map_err(|e| err(format!("the shard's key: {e}")))?,
            cert: creds.chain[0].clone(),
        })
    }

    /// A ticket giving `rank` of a `world`-worker job (description digest `job`) to the
    /// certificate `holder`.
    pub fn sign(
        &self,
        rank: u16,
        world: u16,
        job: &[u8],
        holder: &CertificateDer<'_>,
    ) -> Result<Ticket> {
        let holder = holder_digest(holder)?;
        let signature = self
            .key
            .sign(&message(rank, world, job, &holder))
            .map_err(err)?;
        Ok(Ticket {
            rank,
            world,
            job: job.to_vec(),
            holder,
            issuer: self.cert.to_vec(),
            signature,
        })
    }
}

impl Ticket {
    /// Checks that the ticket gives `rank` of a `world`-worker job (digest `job`) to the
    /// certificate `holder`, signed by shard 0's certificate as `verifier` (the swarm's
    /// trust and revocation list) accepts it.
    pub fn check(
        &self,
        verifier: &dyn rustls::server::danger::ClientCertVerifier,
        holder: &CertificateDer<'_>,
        job: &[u8],
        rank: u16,
        world: u16,
    ) -> Result<()> {
        if (self.rank, self.world) != (rank, world) {
            return Err(err(format!(
                "it gives rank {} of {}, not rank {rank} of {world}",
                self.rank, self.world
            )));
        }
        if self.job != job {
            return Err(err(
                "it was issued for another job (do all shards serve the same job file?)",
            ));
        }
        if self.holder != holder_digest(holder)? {
            return Err(err("it was issued to another certificate"));
        }
        let issuer = CertificateDer::from(self.issuer.as_slice());
        verifier
            .verify_client_cert(&issuer, &[], UnixTime::now())
            .map_err(|e| err(format!("its issuer: {e}")))?;
        if Role::of(&issuer)? != (Role::Server { shard: 0 }) {
            return Err(err("its issuer is not the server of shard 0"));
        }
        verify(
            &self.issuer,
            &message(self.rank, self.world, &self.job, &self.holder),
            &self.signature,
        )
        .map_err(|e| err(format!("its signature: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Swarm;

    #[test]
    fn a_ticket_holds_for_its_holder_rank_and_job_only() {
        let swarm = Swarm::generate("tickets").unwrap();
        let shard_0 = swarm.credentials("s0", Role::Server { shard: 0 }).unwrap();
        let shard_1 = swarm.credentials("s1", Role::Server { shard: 1 }).unwrap();
        let (alice, mallory) = (
            swarm.credentials("alice", Role::Worker).unwrap(),
            swarm.credentials("mallory", Role::Worker).unwrap(),
        );
        let verifier = crate::tls::client_verifier(&shard_1).unwrap();
        let job = vec![7u8; 32];
        let ticket = TicketSigner::new(&shard_0)
            .unwrap()
            .sign(1, 4, &job, &alice.chain[0])
            .unwrap();
        let check = |t: &Ticket, holder: &Credentials, job: &[u8], rank: u16| {
            t.check(verifier.as_ref(), &holder.chain[0], job, rank, 4)
                .map_err(|e| e.to_string())
        };
        assert_eq!(check(&ticket, &alice, &job, 1), Ok(()));
        assert!(check(&ticket, &mallory, &job, 1)
            .unwrap_err()
            .contains("another certificate"));
        assert!(check(&ticket, &alice, &job, 0)
            .unwrap_err()
            .contains("not rank 0"));
        assert!(check(&ticket, &alice, b"other", 1)
            .unwrap_err()
            .contains("another job"));
        // Rewritten to name mallory: the signature no longer verifies.
        let mut forged = ticket.clone();
        forged.holder = holder_digest(&mallory.chain[0]).unwrap();
        assert!(check(&forged, &mallory, &job, 1)
            .unwrap_err()
            .contains("signature"));
        // Signed by shard 1, or by a worker: not shard 0.
        let by_shard_1 = TicketSigner::new(&shard_1)
            .unwrap()
            .sign(1, 4, &job, &mallory.chain[0])
            .unwrap();
        assert!(check(&by_shard_1, &mallory, &job, 1)
            .unwrap_err()
            .contains("not the server of shard 0"));
        let self_made = TicketSigner::new(&mallory)
            .unwrap()
            .sign(1, 4, &job, &mallory.chain[0])
            .unwrap();
        assert!(check(&self_made, &mallory, &job, 1).is_err());
        // Signed by a shard 0 of another swarm.
        let other = Swarm::generate("other").unwrap();
        let foreign = other.credentials("s0", Role::Server { shard: 0 }).unwrap();
        let foreign = TicketSigner::new(&foreign)
            .unwrap()
            .sign(1, 4, &job, &mallory.chain[0])
            .unwrap();
        assert!(check(&foreign, &mallory, &job, 1)
            .unwrap_err()
            .contains("issuer"));
    }
}
