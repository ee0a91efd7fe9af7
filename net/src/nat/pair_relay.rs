//! The pair relay: one UDP socket on the rendezvous node that forwards the datagrams of the two
//! ends of a cut to each other, for stages whose NATs defeat a direct path (TURN's idea, for
//! pairs the rendezvous introduced).
//!
//! The rendezvous [opens](PairRelay::open) a pair under a random token and gives the token to
//! both ends over their authenticated connections. Each end then sends a
//! [bind datagram](super::bind_datagram) from its QUIC endpoint's socket, which tells the
//! relay the address its NAT gave that socket towards the relay; every other datagram from
//! one bound address goes to the other. It forwards only between addresses bound with a live
//! token, so it is no open reflector, and pairs idle for [`IDLE`] are forgotten.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

use super::{canonical, parse_bind, TOKEN};
use crate::error::Result;

/// A pair with no datagram for this long is forgotten (QUIC's keep-alives pass every second
/// on a live link).
pub const IDLE: Duration = Duration::from_secs(60);
/// Most pairs the relay keeps at once; an introduction beyond it offers no relay.
pub const MAX_PAIRS: usize = 4096;

#[derive(Debug)]
struct Pair {
    /// The bound address of each end: [listen, dial].
    ends: [Option<SocketAddr>; 2],
    last: Instant,
}

#[derive(Debug, Default)]
struct Table {
    pairs: HashMap<[u8; TOKEN], Pair>,
    /// Which pair and end each bound address is.
    bound: HashMap<SocketAddr, ([u8; TOKEN], usize)>,
}

impl Table {
    fn forget_idle(&mut self, now: Instant) {
        let before = self.pairs.len();
        self.pairs.retain(|_, p| now.duration_since(p.last) < IDLE);
        if self.pairs.len() != before {
            let pairs = &self.pairs;
            self.bound.retain(|_, (token, _)| pairs.contains_key(token));
        }
    }

    /// Where a datagram from `from` goes: the bound other end of its pair.
    fn route(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) -> Option<SocketAddr> {
        if let Some((side, token)) = parse_bind(datagram) {
            let end = side as usize;
            let pair = self.pairs.get_mut(&token)?;
            pair.last = now;
            if pair.ends[end] != Some(from) {
                // An end whose NAT moved it binds again; its old address stops counting.
                if let Some(old) = pair.ends[end].replace(from) {
                    self.bound.remove(&old);
                }
                if let Some((old_token, old_end)) = self.bound.insert(from, (token, end)) {
                    if old_token != token {
                        if let Some(p) = self.pairs.get_mut(&old_token) {
                            p.ends[old_end] = None;
                        }
                    }
                }
            }
            return None;
        }
        let (token, end) = *self.bound.get(&from)?;
        let pair = self.pairs.get_mut(&token)?;
        pair.last = now;
        pair.ends[1 - end]
    }
}

/// Datagrams the relay has forwarded and the bytes in them.
#[derive(Debug, Default)]
pub struct RelayCounts {
    /// Datagrams forwarded.
    pub datagrams: AtomicU64,
    /// Bytes forwarded.
    pub bytes: AtomicU64,
}

impl RelayCounts {
    /// Datagrams and bytes forwarded so far.
    pub fn get(&self) -> (u64, u64) {
        (self.datagrams.load(Relaxed), self.bytes.load(Relaxed))
    }
}

/// The relay: its socket and its pairs.
#[derive(Debug, Clone)]
pub struct PairRelay {
    socket: Arc<UdpSocket>,
    table: Arc<Mutex<Table>>,
    /// What it has forwarded so far.
    pub counts: Arc<RelayCounts>,
}

impl PairRelay {
    /// Binds the relay's socket on `addr` (port 0 picks one) and starts forwarding, on the
    /// current tokio runtime, until the runtime ends.
    pub fn start(addr: SocketAddr) -> Result<PairRelay> {
        let socket = crate::transport::bind_udp(addr)?;
        socket.set_nonblocking(true)?;
        let relay = PairRelay {
            socket: Arc::new(UdpSocket::from_std(socket)?),
            table: Arc::default(),
            counts: Arc::default(),
        };
        tokio::spawn(relay.clone().forward());
        Ok(relay)
    }

    /// The port the relay listens on.
    pub fn port(&self) -> Result<u16> {
        Ok(self.socket.local_addr()?.port())
    }

    /// Opens a pair under `token`; false when the relay holds [`MAX_PAIRS`] already.
    pub fn open(&self, token: [u8; TOKEN]) -> bool {
        let mut table = self.table.lock().expect("relay table");
        let now = Instant::now();
        table.forget_idle(now);
        if table.pairs.len() >= MAX_PAIRS {
            return false;
        }
        table.pairs.insert(
            token,
            Pair {
                ends: [None, None],
                last: now,
            },
        );
        true
    }

    async fn forward(self) {
        let mut buf = vec![0u8; 65_536];
        let mut swept = Instant::now();
        let Ok(local) = self.socket.local_addr() else {
            return;
        };
        loop {
            let (n, from) = match self.socket.recv_from(&mut buf).await {
                Ok(got) => got,
                // An ICMP error from an earlier send (a gone peer) surfaces here; go on.
                Err(e) => {
                    tracing::debug!("pair relay: {e}");
                    continue;
                }
            };
            let now = Instant::now();
            let to = {
                let mut table = self.table.lock().expect("relay table");
                if now.duration_since(swept) > IDLE / 4 {
                    table.forget_idle(now);
                    swept = now;
                }
                table.route(canonical(from), &buf[..n], now)
            };
            if let Some(to) = to {
                let to = super::reachable_from(local, to);
                if self.socket.send_to(&buf[..n], to).await.is_ok() {
                    self.counts.datagrams.fetch_add(1, Relaxed);
                    self.counts.bytes.fetch_add(n as u64, Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{bind_datagram, Side};
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn only_bound_ends_of_an_open_pair_are_forwarded_and_only_to_each_other() {
        let mut table = Table::default();
        let now = Instant::now();
        let (token, stranger) = ([1u8; TOKEN], [2u8; TOKEN]);
        table.pairs.insert(
            token,
            Pair {
                ends: [None, None],
                last: now,
            },
        );
        // A bind under a token the relay never opened binds nothing.
        assert_eq!(
            table.route(addr(9), &bind_datagram(Side::Dial, &stranger), now),
            None
        );
        assert_eq!(table.route(addr(9), b"hello", now), None);
        table.route(addr(1), &bind_datagram(Side::Listen, &token), now);
        // One end bound: nowhere to forward yet.
        assert_eq!(table.route(addr(1), b"quic", now), None);
        table.route(addr(2), &bind_datagram(Side::Dial, &token), now);
        assert_eq!(table.route(addr(1), b"quic", now), Some(addr(2)));
        assert_eq!(table.route(addr(2), b"quic", now), Some(addr(1)));
        // Strangers are not forwarded, to either end.
        assert_eq!(table.route(addr(3), b"quic", now), None);
        // An end that moves binds again, and its old address stops counting.
        table.route(addr(4), &bind_datagram(Side::Dial, &token), now);
        assert_eq!(table.route(addr(1), b"quic", now), Some(addr(4)));
        assert_eq!(table.route(addr(2), b"quic", now), None);
    }

    #[test]
    fn idle_pairs_are_forgotten() {
        let mut table = Table::default();
        let start = Instant::now();
        let token = [1u8; TOKEN];
        table.pairs.insert(
            token,
            Pair {
                ends: [None, None],
                last: start,
            },
        );
        table.route(addr(1), &bind_datagram(Side::Listen, &token), start);
        table.route(addr(2), &bind_datagram(Side::Dial, &token), start);
        table.forget_idle(start + IDLE / 2);
        assert_eq!(table.route(addr(1), b"x", start + IDLE / 2), Some(addr(2)));
        table.forget_idle(start + IDLE * 2);
        assert_eq!(table.route(addr(1), b"x", start + IDLE * 2), None);
        assert!(table.bound.is_empty());
    }
}
