//! Certificates the swarm no longer admits. `murmur swarm revoke` adds a node's certificate
//! to `revoked.pem` in the swarm folder: a certificate revocation list (X.509 CRL) signed by
//! the swarm's key, so a node that reads it can tell it came from the authority. Every TLS
//! handshake checks the peer against it (rustls' verifiers), and a server rereads the file
//! while it runs ([`crate::ps::Server::run`]), refusing revoked certificates from then on
//! and hanging up the connections they hold.

use std::path::Path;

use rcgen::{
    CertificateRevocationListParams, Issuer, KeyIdMethod, KeyPair, RevokedCertParams, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use time::OffsetDateTime;

use crate::error::{NetError, Result};

/// The revocation list's file in a swarm folder.
pub const REVOKED_FILE: &str = "revoked.pem";

/// A parsed revocation list: the signed list as rustls takes it, and the serial numbers it
/// revokes.
#[derive(Debug, Clone)]
pub struct RevocationList {
    /// The list as the authority signed it (DER).
    pub der: CertificateRevocationListDer<'static>,
    /// The revoked certificates: serial number (big-endian without leading zeros) and when
    /// it was revoked.
    entries: Vec<(Vec<u8>, OffsetDateTime)>,
}

fn err(e: impl std::fmt::Display) -> NetError {
    NetError::Identity(format!("the revocation list: {e}"))
}

/// A certificate's serial number, big-endian without leading zeros.
fn serial_of(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(parsed.serial.to_bytes_be())
}

impl RevocationList {
    /// Parses a list from its PEM text. Its signature is checked where it is used (the TLS
    /// verifiers refuse a list the swarm did not sign).
    pub fn from_pem(text: &str) -> Result<RevocationList> {
        let der = CertificateRevocationListDer::from_pem_slice(text.as_bytes()).map_err(err)?;
        let (_, parsed) = x509_parser::parse_x509_crl(der.as_ref()).map_err(err)?;
        let entries = parsed
            .iter_revoked_certificates()
            .map(|r| (r.serial().to_bytes_be(), r.revocation_date.to_datetime()))
            .collect();
        Ok(RevocationList { der, entries })
    }

    /// The list in swarm folder `dir`, or `None` if it has none.
    pub fn load(dir: &Path) -> Result<Option<RevocationList>> {
        let path = dir.join(REVOKED_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => RevocationList::from_pem(&text)
                .map(Some)
                .map_err(|e| NetError::Identity(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(NetError::Identity(format!("{}: {e}", path.display()))),
        }
    }

    /// Whether the list revokes `cert`.
    pub fn revokes(&self, cert: &CertificateDer<'_>) -> bool {
        serial_of(cert).is_some_and(|s| self.revokes_serial(&s))
    }

    fn revokes_serial(&self, serial: &[u8]) -> bool {
        self.entries.iter().any(|(s, _)| s == serial)
    }

    /// How many certificates the list revokes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the list revokes nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A list with `cert` added to `previous` (which may be `None`), signed by `issuer`;
    /// `None` if `previous` already revokes it.
    pub(crate) fn adding(
        previous: Option<&RevocationList>,
        cert: &CertificateDer<'_>,
        issuer: &Issuer<'_, KeyPair>,
    ) -> Result<Option<(RevocationList, String)>> {
        let serial = serial_of(cert).ok_or_else(|| err("the certificate does not parse"))?;
        let mut entries = previous.map_or_else(Vec::new, |p| p.entries.clone());
        if entries.iter().any(|(s, _)| *s == serial) {
            return Ok(None);
        }
        let now = OffsetDateTime::now_utc();
        entries.push((serial, now));
        let params = CertificateRevocationListParams {
            this_update: now,
            // murmur does not enforce the next update: a list holds until replaced.
            next_update: now + time::Duration::days(3650),
            // Increasing with every list the authority signs (one a second at most).
            crl_number: SerialNumber::from(now.unix_timestamp().max(0) as u64),
            issuing_distribution_point: None,
            revoked_certs: entries
                .iter()
                .map(|(serial, at)| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(serial),
                    revocation_time: *at,
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let pem = params.signed_by(issuer).map_err(err)?.pem().map_err(err)?;
        Ok(Some((RevocationList::from_pem(&pem)?, pem)))
    }
}
