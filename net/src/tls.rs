//! Mutual TLS 1.3 configurations: both sides present swarm credentials and accept only peers
//! whose certificate the swarm signed, that has not expired and that the swarm's revocation
//! list does not name. (Roles are checked once connected: [`crate::transport::expect_peer`].)

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::error::{NetError, Result};
use crate::identity::Credentials;

/// ALPN of murmur's protocol.
pub const ALPN: &[u8] = b"murmur/1";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(creds: &Credentials) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    roots
        .add(creds.ca.clone())
        .map_err(|e| NetError::Identity(format!("swarm certificate: {e}")))?;
    Ok(Arc::new(roots))
}

fn tls_err(e: impl std::fmt::Display) -> NetError {
    NetError::Identity(e.to_string())
}

/// The revocation lists to check peers against: the swarm's, if it has one.
fn crls(creds: &Credentials) -> Vec<rustls::pki_types::CertificateRevocationListDer<'static>> {
    creds.revoked.iter().map(|list| list.der.clone()).collect()
}

/// How a server checks a certificate: signed by this swarm, not expired, not revoked (also
/// used for certificates met inside messages, such as a rank ticket's issuer).
pub fn client_verifier(
    creds: &Credentials,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    // The swarm's list covers the node certificates it issued; the swarm's own certificate is
    // the trust anchor, which no list revokes.
    WebPkiClientVerifier::builder_with_provider(roots(creds)?, provider())
        .with_crls(crls(creds))
        .only_check_end_entity_revocation()
        .build()
        .map_err(tls_err)
}

/// A server that demands a client certificate from this swarm.
pub fn server_tls(creds: &Credentials) -> Result<rustls::ServerConfig> {
    let verifier = client_verifier(creds)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(creds.chain.clone(), creds.key.clone_key())
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// A client that trusts only this swarm's servers and presents its own certificate.
pub fn client_tls(creds: &Credentials) -> Result<rustls::ClientConfig> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_webpki_verifier(
            WebPkiServerVerifier::builder_with_provider(roots(creds)?, provider())
                .with_crls(crls(creds))
                .only_check_end_entity_revocation()
                .build()
                .map_err(tls_err)?,
        )
        .with_client_auth_cert(creds.chain.clone(), creds.key.clone_key())
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}
