//! A stage's side of NAT traversal: one QUIC endpoint for its rendezvous connection and its
//! links, punch datagrams from that endpoint's socket, and the choice between a direct path
//! and the pair relay ([`Traversal::meet`]).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};

use super::{
    bind_datagram, canonical, reachable_from, Introduction, Meet, Route, Side, LIMITS, PUNCH,
};
use crate::error::{NetError, Result};
use crate::identity::{Credentials, Role};
use crate::transport::{
    admit, bind_udp, close, connect, expect_peer, hang_up, receive, send, server_endpoint_on, Link,
};
use crate::wire::{Frame, Kind};

/// How long each end tries before it gives up on a path.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For a direct path: the dialing end tries each of the neighbour's addresses this long
    /// (QUIC resends a lost first packet after about a second, and again after three).
    pub punch: Duration,
    /// For the whole meeting: the neighbour's meet, then a path, direct or relayed.
    pub connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            punch: Duration::from_secs(4),
            connect: Duration::from_secs(60),
        }
    }
}

/// Punches sent per second while a listening end waits.
const PUNCH_EVERY: Duration = Duration::from_millis(100);
/// Bind datagrams sent to the relay per second while an end waits (a lost one costs little).
const BIND_EVERY: Duration = Duration::from_millis(500);

/// A stage's endpoint, connected to the rendezvous.
pub struct Traversal {
    endpoint: Endpoint,
    /// The endpoint's socket, cloned: punches and relay binds leave from the address the
    /// NAT gave the endpoint.
    socket: Arc<UdpSocket>,
    rendezvous: Connection,
    /// The endpoint's address on its own network, towards the rendezvous.
    local: Option<SocketAddr>,
}

impl Traversal {
    /// Binds the stage's endpoint on `bind` (port 0 picks one) and connects it to the
    /// rendezvous at `rendezvous`, which must prove the rendezvous role. Call inside a tokio
    /// runtime, which then drives the endpoint.
    pub async fn open(
        bind: SocketAddr,
        rendezvous: SocketAddr,
        creds: &Credentials,
        link: &Link,
        wait: Duration,
    ) -> Result<Traversal> {
        let socket = bind_udp(bind)?;
        let punch = Arc::new(socket.try_clone()?);
        let endpoint = server_endpoint_on(socket, creds, link)?;
        let deadline = Instant::now() + wait;
        // The rendezvous may start after the stage: retry until the deadline.
        let conn = loop {
            match connect(&endpoint, rendezvous).await {
                Ok(conn) => break conn,
                Err(e) if Instant::now() >= deadline => {
                    return Err(NetError::Timeout(format!(
                        "the rendezvous at {rendezvous} did not answer in {wait:?}: {e}"
                    )))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        expect_peer(&conn, Role::Rendezvous)?;
        let port = endpoint.local_addr()?.port();
        let local = route_ip(rendezvous).map(|ip| SocketAddr::new(ip, port));
        Ok(Traversal {
            endpoint,
            socket: punch,
            rendezvous: conn,
            local,
        })
    }

    /// The endpoint, which the links made by [`meet`](Self::meet) live on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Meets the other end of cut `cut` of `session` as the `side` end, and links to it:
    /// directly where a path opens within the punch timeout, through the relay otherwise.
    /// `link` sizes an accepted connection's windows.
    pub async fn meet(
        &self,
        session: &str,
        cut: u32,
        side: Side,
        link: &Link,
        timeouts: Timeouts,
    ) -> Result<(Connection, Route)> {
        let deadline = Instant::now() + timeouts.connect;
        let meet = Meet {
            session: session.into(),
            cut,
            side,
            local: self.local,
        };
        send(&self.rendezvous, Frame::control(Kind::Meet, 0, 0, &meet)).await?;
        let intro = timeout_at(deadline, self.introduction(cut))
            .await
            .map_err(|_| {
                NetError::Timeout(format!(
                    "the other end of cut {cut} did not come to the rendezvous in {:?}",
                    timeouts.connect
                ))
            })??;
        let relay = intro
            .relay_port
            .map(|port| SocketAddr::new(self.rendezvous.remote_address().ip(), port));
        let relay = relay.map(canonical);
        // Both ends bind at the relay from the start: the listening end cannot know which
        // path the dialing end will get through on.
        let _binding = relay.map(|addr| {
            let datagram = bind_datagram(side, &intro.token);
            self.repeat(addr, datagram.to_vec(), BIND_EVERY)
        });
        let candidates = candidates(&intro);
        tracing::debug!(
            "cut {cut}: the {} end sees itself at {} and the other at {candidates:?}",
            side.name(),
            intro.observed
        );
        match side {
            Side::Listen => {
                let _punching: Vec<_> = candidates
                    .iter()
                    .map(|&to| self.repeat(to, PUNCH.to_vec(), PUNCH_EVERY))
                    .collect();
                let conn = accept_stage(&self.endpoint, deadline, link, || {
                    format!("the dialing end of cut {cut} did not link")
                })
                .await?;
                let route = match relay {
                    Some(r) if canonical(conn.remote_address()) == r => Route::Relayed,
                    _ => Route::Direct,
                };
                Ok((conn, route))
            }
            Side::Dial => {
                // The listening end starts punching when its introduction arrives, about
                // when this one's did: a round trip's head start keeps the first handshake
                // packet from reaching its NAT before its punches have left.
                let head_start = self
                    .rendezvous
                    .rtt()
                    .clamp(Duration::from_millis(10), Duration::from_millis(500));
                tokio::time::sleep(head_start).await;
                for to in candidates {
                    match timeout(timeouts.punch, connect(&self.endpoint, to)).await {
                        Ok(Ok(conn)) => {
                            expect_peer(&conn, Role::Stage)?;
                            return Ok((conn, Route::Direct));
                        }
                        Ok(Err(e)) => tracing::debug!("cut {cut}: no direct path to {to}: {e}"),
                        Err(_) => tracing::debug!(
                            "cut {cut}: no direct path to {to} in {:?}",
                            timeouts.punch
                        ),
                    }
                }
                let relay = relay.ok_or_else(|| {
                    NetError::Connection(format!(
                        "cut {cut}: no direct path to {}, and the rendezvous has no relay \
                         free",
                        intro.peer
                    ))
                })?;
                let conn = timeout_at(deadline, connect(&self.endpoint, relay))
                    .await
                    .map_err(|_| {
                        NetError::Timeout(format!("cut {cut}: the relay at {relay} did not link"))
                    })??;
                expect_peer(&conn, Role::Stage)?;
                Ok((conn, Route::Relayed))
            }
        }
    }

    /// Waits for the rendezvous's introduction to cut `cut`.
    async fn introduction(&self, cut: u32) -> Result<Introduction> {
        loop {
            let frame = receive(&self.rendezvous, &LIMITS).await?.ok_or_else(|| {
                NetError::Connection("the rendezvous hung up before the introduction".into())
            })?;
            if frame.kind != Kind::Introduce {
                hang_up(
                    &self.rendezvous,
                    close::PROTOCOL,
                    "expected an introduction",
                );
                return Err(NetError::Protocol(format!(
                    "a {:?} frame from the rendezvous",
                    frame.kind
                )));
            }
            if frame.key == cut as u64 {
                return frame.message();
            }
            tracing::debug!("an introduction to cut {} arrived late", frame.key);
        }
    }

    /// Sends `datagram` to `to` from the endpoint's socket every `every`, until the handle
    /// is dropped.
    fn repeat(&self, to: SocketAddr, datagram: Vec<u8>, every: Duration) -> Repeating {
        let socket = self.socket.clone();
        let to = socket
            .local_addr()
            .map(|local| reachable_from(local, to))
            .unwrap_or(to);
        Repeating(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                // The socket is quinn's, non-blocking; a datagram that does not leave is a
                // punch lost, and the next one follows.
                let _ = socket.send_to(&datagram, to);
            }
        }))
    }

    /// Hangs up on the rendezvous: the links are made.
    pub fn leave(&self) {
        hang_up(&self.rendezvous, close::DONE, "linked");
    }
}

/// Accepts the next stage on `endpoint` until `deadline`, and admits it with `link`'s
/// windows. Only a stage's certificate may take that place: anyone else is hung up on (by
/// `expect_peer`), and the wait goes on. `late` says what did not happen by the deadline.
pub(crate) async fn accept_stage(
    endpoint: &Endpoint,
    deadline: Instant,
    link: &Link,
    late: impl Fn() -> String,
) -> Result<Connection> {
    loop {
        let incoming = timeout_at(deadline, endpoint.accept())
            .await
            .map_err(|_| NetError::Timeout(late()))?
            .ok_or_else(|| NetError::Connection("the endpoint closed".into()))?;
        let conn = match incoming.await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!("refused a connection: {e}");
                continue;
            }
        };
        match expect_peer(&conn, Role::Stage) {
            Ok(()) => {
                admit(&conn, link);
                return Ok(conn);
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

/// A task sending datagrams, stopped when dropped.
struct Repeating(JoinHandle<()>);

impl Drop for Repeating {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where the dialing end tries to reach the listening one, in order: its address on their
/// shared network when both appear behind the same public address (many routers do not
/// loop packets back to their own public side), then the address the rendezvous saw.
fn candidates(intro: &Introduction) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    if let Some(local) = intro.peer_local {
        if intro.peer.ip() == intro.observed.ip() && local != intro.peer {
            out.push(local);
        }
    }
    out.push(intro.peer);
    out
}

/// The local address the system routes towards `to` from: no packet is sent.
fn route_ip(to: SocketAddr) -> Option<std::net::IpAddr> {
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("valid"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("valid"),
    };
    let probe = UdpSocket::bind(any).ok()?;
    probe.connect(to).ok()?;
    Some(probe.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intro(peer: &str, observed: &str, peer_local: Option<&str>) -> Introduction {
        Introduction {
            peer: peer.parse().unwrap(),
            peer_local: peer_local.map(|a| a.parse().unwrap()),
            observed: observed.parse().unwrap(),
            relay_port: None,
            token: [0; super::super::TOKEN],
        }
    }

    #[test]
    fn a_neighbour_behind_the_same_public_address_is_tried_on_its_own_network_first() {
        let same = intro("1.2.3.4:500", "1.2.3.4:600", Some("192.168.1.7:40"));
        assert_eq!(
            candidates(&same),
            ["192.168.1.7:40".parse().unwrap(), same.peer]
        );
        // Behind another NAT, its private address means nothing here (both may be
        // 192.168.1.x): only the public one is tried.
        let other = intro("5.6.7.8:500", "1.2.3.4:600", Some("192.168.1.7:40"));
        assert_eq!(candidates(&other), [other.peer]);
        let no_local = intro("1.2.3.4:500", "1.2.3.4:600", None);
        assert_eq!(candidates(&no_local), [no_local.peer]);
    }
}
