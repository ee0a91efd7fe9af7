//! Stages that reach each other through NATs, without port forwarding.
//!
//! Most volunteers cannot accept incoming connections: their router drops what it did not
//! ask for. Two stages behind such routers meet through a reachable node, the
//! [rendezvous](rendezvous::Rendezvous):
//!
//! 1. Each stage connects to the rendezvous from the one QUIC endpoint it will use for its
//!    links, and says which cut it is an end of ([`Meet`]). The rendezvous sees the address
//!    the stage's NAT gave that endpoint.
//! 2. Once both ends of a cut have met, the rendezvous tells each where the other appeared,
//!    with a token for its [pair relay](pair_relay) ([`Introduction`]).
//! 3. The listening end sends small punch datagrams from its endpoint's socket to the other's
//!    address, which opens its own NAT to packets from there; the dialing end connects to the
//!    listener's address, its QUIC handshake opening its NAT the same way
//!    ([`traverse`]). Behind NATs that keep one public port per socket (endpoint-independent
//!    mapping) the handshake gets through.
//! 4. When it does not in a few seconds (a NAT that gives each destination a port of its own,
//!    a symmetric one, defeats the addresses the rendezvous saw), both ends go through the
//!    pair relay: a UDP port on the rendezvous node that forwards each end's datagrams to the
//!    other. QUIC's TLS runs end to end over it, so the relay carries only ciphertext and
//!    cannot pose as either stage.
//!
//! Which way a link went is logged and reported ([`Route`]).

#[cfg(target_os = "linux")]
pub mod lab;
pub mod pair_relay;
pub mod rendezvous;
pub mod traverse;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::error::{NetError, Result};
use crate::wire::Limits;

/// Which end of a cut a stage is: stage c listens for the cut (c, c+1), stage c+1 dials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Side {
    /// The stage before the cut, which accepts the connection.
    Listen,
    /// The stage after the cut, which makes it.
    Dial,
}

impl Side {
    /// The other end.
    pub fn other(self) -> Side {
        match self {
            Side::Listen => Side::Dial,
            Side::Dial => Side::Listen,
        }
    }

    /// How logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Side::Listen => "listening",
            Side::Dial => "dialing",
        }
    }

    fn code(self) -> u8 {
        match self {
            Side::Listen => 0,
            Side::Dial => 1,
        }
    }
}

/// Longest session name a stage may give: the rendezvous keeps it while the stage waits.
pub const MAX_SESSION: usize = 64;

/// Stage → rendezvous ([`crate::wire::Kind::Meet`]): this stage is the `side` end of cut
/// `cut` of the pipeline `session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meet {
    /// The pipeline's name, which every stage of it gives (a run's own, so that two pipelines
    /// on one rendezvous do not meet each other's stages).
    pub session: String,
    /// The cut: stages `cut` and `cut + 1`.
    pub cut: u32,
    /// Which end this stage is.
    pub side: Side,
    /// The address the stage's endpoint has on its own network (the interface it reaches the
    /// rendezvous by), for a neighbour behind the same NAT.
    pub local: Option<SocketAddr>,
}

impl Meet {
    /// Refuses a session name that is empty or too long.
    pub fn check(&self) -> Result<()> {
        if self.session.is_empty() || self.session.len() > MAX_SESSION {
            return Err(NetError::Protocol(format!(
                "a session name of {} bytes (1 to {MAX_SESSION})",
                self.session.len()
            )));
        }
        Ok(())
    }
}

/// Rendezvous → stage ([`crate::wire::Kind::Introduce`], key: the cut): where the other end
/// of the cut is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Introduction {
    /// The neighbour's address as the rendezvous saw it (its NAT's public side).
    pub peer: SocketAddr,
    /// The neighbour's address on its own network, as it stated it.
    pub peer_local: Option<SocketAddr>,
    /// This stage's own address as the rendezvous saw it.
    pub observed: SocketAddr,
    /// The UDP port of the pair relay, on the rendezvous node's address (none when the relay
    /// was full).
    pub relay_port: Option<u16>,
    /// What binds this cut's two ends at the relay.
    pub token: [u8; TOKEN],
}

/// Bytes of a relay token: random, so that no one else can bind to a pair.
pub const TOKEN: usize = 16;

/// The limits of frames on a rendezvous connection: small control messages only.
pub const LIMITS: Limits = Limits {
    max_payload: 4096,
    max_keys: 0,
    max_numel: 0,
    max_total_numel: 0,
    max_buffered: 64 << 10,
};

/// How a stage link was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Straight to the neighbour's address (no NAT, or a punched one).
    Direct,
    /// Through the rendezvous node's pair relay.
    Relayed,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Route::Direct => "direct",
            Route::Relayed => "relayed",
        })
    }
}

/// The datagram an end sends the pair relay to say where it is: a marker, its side, and the
/// pair's token. 22 bytes: never the length of a QUIC packet the relay must forward, since
/// QUIC pads every datagram that starts a connection to 1200 bytes and a short-header packet
/// with murmur's 8-byte connection IDs and AEAD tag is longer.
const BIND_MARK: &[u8; 5] = b"MMRLY";
/// The length of a bind datagram.
pub const BIND_LEN: usize = BIND_MARK.len() + 1 + TOKEN;

/// The bind datagram of `side` for the pair `token`.
pub fn bind_datagram(side: Side, token: &[u8; TOKEN]) -> [u8; BIND_LEN] {
    let mut out = [0u8; BIND_LEN];
    out[..BIND_MARK.len()].copy_from_slice(BIND_MARK);
    out[BIND_MARK.len()] = side.code();
    out[BIND_MARK.len() + 1..].copy_from_slice(token);
    out
}

/// The side and token of a bind datagram; `None` for anything else.
pub fn parse_bind(datagram: &[u8]) -> Option<(Side, [u8; TOKEN])> {
    if datagram.len() != BIND_LEN || &datagram[..BIND_MARK.len()] != BIND_MARK {
        return None;
    }
    let side = match datagram[BIND_MARK.len()] {
        0 => Side::Listen,
        1 => Side::Dial,
        _ => return None,
    };
    let token = datagram[BIND_MARK.len() + 1..]
        .try_into()
        .expect("TOKEN bytes");
    Some((side, token))
}

/// A punch datagram: too short to parse as a QUIC packet, so that the neighbour's endpoint
/// drops it unanswered (and never answers it with a stateless reset, which needs more than
/// 21 bytes to provoke).
pub const PUNCH: [u8; 4] = [0, 0x6d, 0x6d, 0x70];

/// `addr` as a socket whose own address is `local` can send to: an IPv4 address is mapped
/// into IPv6 for a dual-stack socket.
pub fn reachable_from(local: SocketAddr, addr: SocketAddr) -> SocketAddr {
    match (local, addr) {
        (SocketAddr::V6(_), SocketAddr::V4(v4)) => {
            SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
        }
        _ => addr,
    }
}

/// `addr` with an IPv4-mapped IPv6 address written as IPv4, so that the same peer is the
/// same address whichever socket family saw it.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_datagrams_read_back_and_nothing_else_reads_as_one() {
        let token = [7u8; TOKEN];
        for side in [Side::Listen, Side::Dial] {
            assert_eq!(
                parse_bind(&bind_datagram(side, &token)),
                Some((side, token))
            );
        }
        let mut bad = bind_datagram(Side::Dial, &token);
        bad[5] = 2;
        assert_eq!(parse_bind(&bad), None);
        bad[0] = b'X';
        assert_eq!(parse_bind(&bad), None);
        assert_eq!(
            parse_bind(&bind_datagram(Side::Dial, &token)[..BIND_LEN - 1]),
            None
        );
        assert_eq!(parse_bind(&[0u8; 1200]), None);
        assert_eq!(parse_bind(&PUNCH), None);
    }

    #[test]
    fn addresses_map_between_families_and_back() {
        let v4: SocketAddr = "10.0.0.1:5".parse().unwrap();
        let v6: SocketAddr = "[::]:9".parse().unwrap();
        let mapped = reachable_from(v6, v4);
        assert_eq!(mapped.to_string(), "[::ffff:10.0.0.1]:5");
        assert_eq!(canonical(mapped), v4);
        assert_eq!(reachable_from(v4, v4), v4);
    }

    #[test]
    fn session_names_are_bounded() {
        let meet = |session: String| Meet {
            session,
            cut: 0,
            side: Side::Dial,
            local: None,
        };
        assert!(meet("run".into()).check().is_ok());
        assert!(meet(String::new()).check().is_err());
        assert!(meet("x".repeat(MAX_SESSION + 1)).check().is_err());
    }
}
