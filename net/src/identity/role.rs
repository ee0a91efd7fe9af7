//! What a certificate allows its holder to be. The swarm's authority writes the role into
//! every node certificate it issues (`murmur swarm issue --role`), and every node checks the
//! other side's role before it speaks: a server takes pushes only from workers, a worker
//! talks only to the server of the shard it expects, stages only to stages. A certificate
//! without a role (issued before roles existed) is refused, with a hint to reissue it.
//!
//! The role sits in the certificate's subject as an organizational unit, `murmur-role:worker`
//! or `murmur-role:server/2`, readable with any X.509 tool (`openssl x509 -subject`).

use std::fmt;
use std::str::FromStr;

use rustls::pki_types::CertificateDer;

use crate::error::{NetError, Result};

/// The prefix of the organizational unit that carries the role.
const PREFIX: &str = "murmur-role:";

/// A node's role in the swarm, as its certificate states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A parameter-server shard: it alone may serve pushes, and only as this shard.
    Server {
        /// The shard index the certificate may serve.
        shard: u16,
    },
    /// A data-parallel worker: it pushes to servers and is handed a rank by shard 0.
    Worker,
    /// A pipeline stage: it talks only to the stages next to it.
    Stage,
    /// A reachable node that introduces stages behind NATs to each other and relays their
    /// packets when no direct path opens (`nat::rendezvous`): it serves stages only.
    Rendezvous,
}

impl Role {
    /// The text the certificate carries after the prefix: `server/2`, `worker`, `stage`.
    fn text(&self) -> String {
        match self {
            Role::Server { shard } => format!("server/{shard}"),
            Role::Worker => "worker".into(),
            Role::Stage => "stage".into(),
            Role::Rendezvous => "rendezvous".into(),
        }
    }

    /// The organizational unit written into a certificate's subject.
    pub(crate) fn unit(&self) -> String {
        format!("{PREFIX}{}", self.text())
    }

    /// The role that `cert` states; an error if it states none, or one this version does not
    /// know.
    pub fn of(cert: &CertificateDer<'_>) -> Result<Role> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
            .map_err(|e| NetError::Identity(format!("the peer's certificate: {e}")))?;
        let mut units = parsed.subject().iter_organizational_unit();
        let stated = units.find_map(|unit| unit.as_str().ok()?.strip_prefix(PREFIX));
        match stated {
            Some(text) => text.parse(),
            None => Err(NetError::Identity(
                "the certificate states no role (issued before roles existed?): reissue it \
                 with `murmur swarm issue --role`"
                    .into(),
            )),
        }
    }
}

impl FromStr for Role {
    type Err = NetError;

    /// `server/N` (or `server` for shard 0), `worker`, `stage` or `rendezvous`.
    fn from_str(text: &str) -> Result<Role> {
        let bad = || {
            NetError::Identity(format!(
                "role {text:?}: use worker, stage, rendezvous, server or server/N (N the shard \
                 index)"
            ))
        };
        match text {
            "worker" => Ok(Role::Worker),
            "stage" => Ok(Role::Stage),
            "rendezvous" => Ok(Role::Rendezvous),
            "server" => Ok(Role::Server { shard: 0 }),
            _ => {
                let shard = text.strip_prefix("server/").ok_or_else(bad)?;
                Ok(Role::Server {
                    shard: shard.parse().map_err(|_| bad())?,
                })
            }
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Server { shard } => write!(f, "server of shard {shard}"),
            Role::Worker => f.write_str("worker"),
            Role::Stage => f.write_str("stage"),
            Role::Rendezvous => f.write_str("rendezvous"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_back_as_written_and_unknown_text_is_refused() {
        for role in [
            Role::Server { shard: 3 },
            Role::Worker,
            Role::Stage,
            Role::Rendezvous,
        ] {
            assert_eq!(role.text().parse::<Role>().unwrap(), role);
        }
        assert_eq!("server".parse::<Role>().unwrap(), Role::Server { shard: 0 });
        for bad in ["", "admin", "server/", "server/x", "server/70000", "Worker"] {
            assert!(bad.parse::<Role>().is_err(), "{bad:?}");
        }
    }
}
