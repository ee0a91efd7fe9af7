//! Addresses as people type them: `host:port`, `127.0.0.1:7400`, `[::1]:7400`,
//! `localhost:7400`, resolved with a clear error when they do not.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::{NodeError, Result};

/// Resolves `host:port` (a name, an IPv4 address or a bracketed IPv6 address) to the first
/// address the resolver gives.
pub fn resolve(text: &str) -> Result<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(NodeError::Address(format!(
            "{text:?} has no port: write HOST:PORT, e.g. localhost:7400 or [::1]:7400"
        )));
    };
    if port.parse::<u16>().is_err() {
        return Err(NodeError::Address(format!(
            "{text:?}: {port:?} is not a port number (0 to 65535)"
        )));
    }
    if host.is_empty() {
        return Err(NodeError::Address(format!("{text:?} has no host")));
    }
    let mut found = text
        .to_socket_addrs()
        .map_err(|e| NodeError::Address(format!("{text:?} does not resolve: {e}")))?;
    found
        .next()
        .ok_or_else(|| NodeError::Address(format!("{text:?} resolves to no address")))
}

/// Resolves every address of a list, in order.
pub fn resolve_all(texts: &[String]) -> Result<Vec<SocketAddr>> {
    if texts.is_empty() {
        return Err(NodeError::Address("none given".into()));
    }
    texts.iter().map(|t| resolve(t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_both_ip_families_resolve_and_bad_ones_say_why() {
        assert_eq!(resolve("127.0.0.1:7400").unwrap().port(), 7400);
        assert!(resolve("[::1]:7400").unwrap().is_ipv6());
        assert!(resolve("localhost:7400").unwrap().ip().is_loopback());
        for (bad, needle) in [
            ("localhost", "no port"),
            ("localhost:http", "not a port"),
            (":7400", "no host"),
            ("no-such-host.invalid:7400", "does not resolve"),
        ] {
            let err = resolve(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }
}
