//! ECDSA P-256 / SHA-256 signatures by a swarm's keys: shard 0 signs rank tickets and round
//! participants with its certificate's key, the swarm authority signs jobs with its own.
//! Every key `murmur swarm` makes is P-256; ring does the arithmetic (it is already under
//! rustls). Each kind of message starts with its own domain string, so that no signed
//! message can pass for another kind.

use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING,
};
use rustls::pki_types::PrivateKeyDer;

/// A private key that signs.
pub struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl Signer {
    /// The signer for a PKCS#8 P-256 key; an error says why it is not one.
    pub fn new(key: &PrivateKeyDer<'_>) -> Result<Signer, String> {
        let PrivateKeyDer::Pkcs8(key) = key else {
            return Err("the key is not PKCS#8".into());
        };
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            key.secret_pkcs8_der(),
            &rng,
        )
        .map_err(|e| format!("the key is not ECDSA P-256: {e}"))?;
        Ok(Signer { key, rng })
    }

    /// The signature (ASN.1) of `message`.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        self.key
            .sign(&self.rng, message)
            .map(|s| s.as_ref().to_vec())
            .map_err(|e| e.to_string())
    }
}

/// Whether `signature` is the signature of `message` by the key that the certificate
/// `cert` (DER) certifies; the certificate itself is not checked here.
pub fn verify(cert: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|e| e.to_string())?;
    let public = &parsed.tbs_certificate.subject_pki.subject_public_key.data;
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public.as_ref())
        .verify(message, signature)
        .map_err(|_| "the signature does not verify".to_string())
}
