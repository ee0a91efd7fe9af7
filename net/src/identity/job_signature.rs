//! Signed jobs: the swarm authority (whoever holds `ca.key`) signs the job's description, and
//! every server checks the signature before serving the job and every worker before training
//! it. So a job's model, codecs, schedule and seed are what the authority approved, whichever
//! server hands it out; a server holding the wrong file, or a stolen server certificate,
//! cannot set a job of its own. Servers need only the signature, never `ca.key`.
//!
//! The signature is ECDSA P-256 / SHA-256 ([`crate::signing`]) over `murmur job v1`, a zero
//! byte and the description's bytes; on disk it is one line of hex.

use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

use super::{from_pem, Swarm};
use crate::error::{NetError, Result};
use crate::signing::{verify, Signer};

/// What a job signature covers starts with this.
const DOMAIN: &[u8] = b"murmur job v1\0";

/// The longest signature text read (a P-256 ASN.1 signature is at most 72 bytes).
const MAX_SIGNATURE_BYTES: usize = 128;

fn err(e: impl std::fmt::Display) -> NetError {
    NetError::Identity(format!("job signature: {e}"))
}

fn message(description: &str) -> Vec<u8> {
    [DOMAIN, description.as_bytes()].concat()
}

impl Swarm {
    /// The authority's signature of a job's `description`.
    pub fn sign_job(&self, description: &str) -> Result<Vec<u8>> {
        let key = from_pem::<PrivatePkcs8KeyDer>(&self.ca_key_pem, "swarm key")?;
        Signer::new(&key.into())
            .and_then(|s| s.sign(&message(description)))
            .map_err(err)
    }
}

/// Checks that `signature` is the swarm authority's (certificate `ca`) over `description`.
pub fn verify_job(ca: &CertificateDer<'_>, description: &str, signature: &[u8]) -> Result<()> {
    verify(ca, &message(description), signature).map_err(|e| {
        err(format!(
            "{e}: the job is not the one this swarm's authority signed (another swarm's \
             signature, or a job changed after signing)"
        ))
    })
}

/// A signature as the one line of hex a `.sig` file holds.
pub fn signature_text(signature: &[u8]) -> String {
    signature.iter().map(|b| format!("{b:02x}")).collect()
}

/// A signature from the text of a `.sig` file (hex; surrounding white space is ignored).
pub fn signature_from_text(text: &str) -> Result<Vec<u8>> {
    let text = text.trim();
    if text.is_empty()
        || text.len() > 2 * MAX_SIGNATURE_BYTES
        || !text.len().is_multiple_of(2)
        || !text.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(err("not a signature: expected one line of hex"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| err("not a signature: expected one line of hex"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_signature_holds_for_its_swarm_and_description_only() {
        let swarm = Swarm::generate("jobs").unwrap();
        let ca = swarm
            .credentials("w", super::super::Role::Worker)
            .unwrap()
            .ca;
        let job = r#"{"workers":4,"lr":0.002}"#;
        let signature = swarm.sign_job(job).unwrap();
        assert!(verify_job(&ca, job, &signature).is_ok());
        let text = signature_text(&signature);
        assert_eq!(
            signature_from_text(&format!("{text}\n")).unwrap(),
            signature
        );
        // Another description, another swarm's signature, bytes that are no signature.
        assert!(verify_job(&ca, r#"{"workers":4,"lr":1000}"#, &signature).is_err());
        let other = Swarm::generate("other").unwrap().sign_job(job).unwrap();
        assert!(verify_job(&ca, job, &other).is_err());
        for bad in ["", "zz", "abc", &"00".repeat(200), "é1", "+1"] {
            assert!(signature_from_text(bad).is_err(), "{bad:?}");
        }
        assert!(verify_job(&ca, job, &[]).is_err());
    }
}
