//! Who may join a swarm. A swarm is a certificate authority: `murmur swarm init` creates its key
//! and certificate; every node gets a key pair and a certificate signed by it. Nodes present
//! their certificate and verify the other side's against the swarm's in a mutual TLS 1.3
//! handshake, so a node without credentials from this swarm is refused before it can send a
//! byte. A peer is known by the fingerprint of its public key.
//!
//! A swarm folder holds `ca.pem` (every node needs it), `ca.key` (secret: whoever holds it can
//! admit nodes), `nodes/<name>.pem` / `nodes/<name>.key`, and `revoked.pem` once a node has
//! been revoked ([`RevocationList`]).
//!
//! A certificate states its holder's [`Role`] and is valid for a number of days (a year
//! unless the issuer says otherwise); TLS refuses an expired one.

mod job_signature;
mod revocation;
mod role;

pub use job_signature::{signature_from_text, signature_text, verify_job};
pub use revocation::{RevocationList, REVOKED_FILE};
pub use role::Role;

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::error::{NetError, Result};

/// The name every node certificate carries and every client asks for; identity is the key.
pub const NODE_NAME: &str = "murmur-node";

fn err(e: impl std::fmt::Display) -> NetError {
    NetError::Identity(e.to_string())
}

/// How long a node certificate is valid unless its issuer says otherwise.
pub const DEFAULT_DAYS: u32 = 365;

/// A node's credentials: the swarm's certificate, its own chain and key, and the swarm's
/// revocation list.
#[derive(Debug)]
pub struct Credentials {
    /// The swarm's CA certificate, against which every peer's certificate is verified.
    pub ca: CertificateDer<'static>,
    /// This node's certificate chain as presented in the TLS handshake, leaf (the node's own
    /// certificate) first.
    pub chain: Vec<CertificateDer<'static>>,
    /// This node's private key (PKCS#8), the one the leaf certificate of `chain` certifies.
    pub key: PrivateKeyDer<'static>,
    /// The certificates the swarm revoked, as read when the credentials were loaded.
    pub revoked: Option<RevocationList>,
    /// The swarm folder the credentials came from, where a server rereads the revocation
    /// list while it runs (`None` for credentials built in memory).
    pub swarm_dir: Option<PathBuf>,
}

impl Clone for Credentials {
    fn clone(&self) -> Self {
        Credentials {
            ca: self.ca.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            revoked: self.revoked.clone(),
            swarm_dir: self.swarm_dir.clone(),
        }
    }
}

/// A swarm authority held in memory.
pub struct Swarm {
    issuer: Issuer<'static, KeyPair>,
    ca_key_pem: String,
    ca_pem: String,
}

fn ca_params(name: &str) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("murmur swarm {name}"));
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

impl Swarm {
    /// A new swarm authority.
    pub fn generate(name: &str) -> Result<Swarm> {
        let ca_key = KeyPair::generate().map_err(err)?;
        let params = ca_params(name)?;
        let ca_pem = params.self_signed(&ca_key).map_err(err)?.pem();
        let ca_key_pem = ca_key.serialize_pem();
        Ok(Swarm {
            issuer: Issuer::new(params, ca_key),
            ca_key_pem,
            ca_pem,
        })
    }

    /// Loads the authority from a swarm folder (needs `ca.key`).
    pub fn load(dir: &Path) -> Result<Swarm> {
        let ca_pem = read(&dir.join("ca.pem"))?;
        let ca_key_pem = read(&dir.join("ca.key"))?;
        let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(err)?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(err)?;
        Ok(Swarm {
            issuer,
            ca_key_pem,
            ca_pem,
        })
    }

    /// Writes `ca.pem` and `ca.key` into `dir` (created if needed).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        write_secret(&dir.join("ca.key"), &self.ca_key_pem)?;
        std::fs::write(dir.join("ca.pem"), &self.ca_pem)?;
        Ok(())
    }

    /// Credentials (certificate and key, PEM) for a new node called `name` in `role`, valid
    /// for `days` from now (and from an hour ago, for clocks that lag).
    pub fn issue(&self, name: &str, role: Role, days: u32) -> Result<(String, String)> {
        let now = OffsetDateTime::now_utc();
        self.issue_valid(
            name,
            role,
            now - time::Duration::hours(1),
            now + time::Duration::days(days.into()),
        )
    }

    /// Credentials for a node valid from `not_before` to `not_after`.
    pub fn issue_valid(
        &self,
        name: &str,
        role: Role,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<(String, String)> {
        if not_after <= not_before {
            return Err(NetError::Identity(format!(
                "a certificate valid from {not_before} to {not_after}"
            )));
        }
        let key = KeyPair::generate().map_err(err)?;
        let mut p =
            CertificateParams::new(vec![NODE_NAME.to_string(), name.to_string()]).map_err(err)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationalUnitName, role.unit());
        p.distinguished_name = dn;
        p.not_before = not_before;
        p.not_after = not_after;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &self.issuer).map_err(err)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues `name` in `role` for `days` and writes `nodes/<name>.pem` and `.key` below
    /// `dir` (replacing an earlier certificate of that name, which stays valid until it
    /// expires or is revoked).
    pub fn issue_to(&self, dir: &Path, name: &str, role: Role, days: u32) -> Result<()> {
        check_name(name)?;
        let (cert, key) = self.issue(name, role, days)?;
        let nodes = dir.join("nodes");
        std::fs::create_dir_all(&nodes)?;
        write_secret(&nodes.join(format!("{name}.key")), &key)?;
        std::fs::write(nodes.join(format!("{name}.pem")), cert)?;
        Ok(())
    }

    /// In-memory credentials for a node in `role` (tests and local swarms), valid for
    /// [`DEFAULT_DAYS`].
    pub fn credentials(&self, name: &str, role: Role) -> Result<Credentials> {
        let (cert, key) = self.issue(name, role, DEFAULT_DAYS)?;
        Credentials::from_pem(&self.ca_pem, &cert, &key)
    }

    /// Revokes node `name`'s certificate in swarm folder `dir`: adds it to the folder's
    /// revocation list, signed anew, written whole (a server that rereads the file never sees
    /// half of it). Returns `false` if the list already revoked it.
    pub fn revoke(&self, dir: &Path, name: &str) -> Result<bool> {
        check_name(name)?;
        let path = dir.join("nodes").join(format!("{name}.pem"));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            NetError::Identity(format!(
                "no certificate of node {name:?} to revoke ({}: {e})",
                path.display()
            ))
        })?;
        let cert: CertificateDer<'static> = from_pem(&text, "node certificate")?;
        let previous = RevocationList::load(dir)?;
        let Some((_, pem)) = RevocationList::adding(previous.as_ref(), &cert, &self.issuer)? else {
            return Ok(false);
        };
        let fresh = dir.join(format!("{REVOKED_FILE}.new"));
        std::fs::write(&fresh, pem)?;
        std::fs::rename(&fresh, dir.join(REVOKED_FILE))?;
        Ok(true)
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(NetError::Identity(format!(
            "node name {name:?}: use letters, digits, - and _"
        )));
    }
    Ok(())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        NetError::Identity(format!(
            "cannot read {}: {e} (create a swarm with `murmur swarm init`)",
            path.display()
        ))
    })
}

/// Writes a secret readable by its owner alone from the moment it exists: a new file created
/// with mode 0600 (an old one is removed first, since opening it would keep its mode).
fn write_secret(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)?.write_all(text.as_bytes())?;
    Ok(())
}

/// The first PEM section of the right type in `text` (rustls' own PEM reader).
fn from_pem<T: PemObject>(text: &str, what: &str) -> Result<T> {
    T::from_pem_slice(text.as_bytes()).map_err(|e| NetError::Identity(format!("{what}: {e}")))
}

impl Credentials {
    /// Builds credentials from PEM text: the swarm's certificate, this node's certificate and its
    /// PKCS#8 key, failing with [`NetError::Identity`] naming the part that does not parse.
    pub fn from_pem(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Credentials> {
        Ok(Credentials {
            ca: from_pem(ca_pem, "swarm certificate")?,
            chain: vec![from_pem(cert_pem, "node certificate")?],
            key: PrivateKeyDer::Pkcs8(from_pem::<PrivatePkcs8KeyDer>(key_pem, "node key")?),
            revoked: None,
            swarm_dir: None,
        })
    }

    /// Node `name`'s credentials from a swarm folder, with the folder's revocation list.
    pub fn load(dir: &Path, name: &str) -> Result<Credentials> {
        check_name(name)?;
        let nodes: PathBuf = dir.join("nodes");
        let mut creds = Credentials::from_pem(
            &read(&dir.join("ca.pem"))?,
            &read(&nodes.join(format!("{name}.pem")))?,
            &read(&nodes.join(format!("{name}.key")))?,
        )?;
        creds.revoked = RevocationList::load(dir)?;
        creds.swarm_dir = Some(dir.to_path_buf());
        Ok(creds)
    }

    /// This node's fingerprint.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.chain[0])
    }

    /// The role this node's own certificate states.
    pub fn role(&self) -> Result<Role> {
        Role::of(&self.chain[0])
    }
}

/// SHA-256 of a certificate's subject public key info: the key it certifies (`None` if the
/// certificate does not parse).
pub fn key_digest(cert: &CertificateDer<'_>) -> Option<[u8; 32]> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(Sha256::digest(parsed.tbs_certificate.subject_pki.raw).into())
}

/// A peer's identity: the first 16 hex digits of its [`key_digest`] (or of SHA-256 over the
/// whole certificate if it cannot be parsed).
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let digest = key_digest(cert).unwrap_or_else(|| Sha256::digest(cert.as_ref()).into());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swarm_folders_round_trip_and_names_are_checked() {
        let dir = std::env::temp_dir().join(format!("murmur-swarm-{}", std::process::id()));
        let swarm = Swarm::generate("test").unwrap();
        swarm.save(&dir).unwrap();
        swarm.issue_to(&dir, "worker-1", Role::Worker, 1).unwrap();
        let again = Swarm::load(&dir).unwrap();
        again.issue_to(&dir, "worker-2", Role::Stage, 1).unwrap();
        let a = Credentials::load(&dir, "worker-1").unwrap();
        let b = Credentials::load(&dir, "worker-2").unwrap();
        assert_eq!(a.ca, b.ca);
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 16);
        assert_eq!(
            (a.role().unwrap(), b.role().unwrap()),
            (Role::Worker, Role::Stage)
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for key in ["ca.key", "nodes/worker-1.key", "nodes/worker-2.key"] {
                let mode = std::fs::metadata(dir.join(key))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{key}");
            }
        }
        // Revoking writes a list that names the certificate, once.
        assert!(a.revoked.is_none());
        assert!(swarm.revoke(&dir, "worker-1").unwrap());
        assert!(!again.revoke(&dir, "worker-1").unwrap());
        let list = RevocationList::load(&dir).unwrap().unwrap();
        assert!(list.revokes(&a.chain[0]) && !list.revokes(&b.chain[0]));
        assert!(again.revoke(&dir, "worker-2").unwrap());
        let reloaded = Credentials::load(&dir, "worker-1")
            .unwrap()
            .revoked
            .unwrap();
        assert_eq!(reloaded.len(), 2);
        assert!(reloaded.revokes(&a.chain[0]) && reloaded.revokes(&b.chain[0]));
        assert!(Credentials::load(&dir, "nobody")
            .unwrap_err()
            .to_string()
            .contains("swarm init"));
        assert!(swarm.issue_to(&dir, "../evil", Role::Worker, 1).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pem_that_is_not_pem_or_not_base64_is_refused() {
        let swarm = Swarm::generate("t").unwrap();
        let (cert, key) = swarm.issue("n", Role::Worker, 1).unwrap();
        let ca = swarm.ca_pem.clone();
        assert!(Credentials::from_pem(&ca, &cert, &key).is_ok());
        let not_pem = Credentials::from_pem("hello", &cert, &key).unwrap_err();
        assert!(
            not_pem.to_string().contains("swarm certificate"),
            "{not_pem}"
        );
        let bad_base64 = cert.replacen("MII", "M*I", 1);
        assert!(Credentials::from_pem(&ca, &bad_base64, &key).is_err());
    }
}
