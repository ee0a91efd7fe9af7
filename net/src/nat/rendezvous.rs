//! The rendezvous node: a reachable QUIC endpoint where the two ends of each cut meet, and the
//! [pair relay](super::pair_relay) for the pairs that cannot reach each other directly.
//!
//! Only stages are served (their certificates say so), each holding at most two waiting
//! meets (a stage is an end of at most two cuts), and the table of waiting meets is bounded:
//! a peer cannot grow the node's memory. A meet whose stage hangs up is forgotten; a second
//! meet for the same end of the same cut replaces the first (a restarted stage meets again).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use quinn::{Connection, Endpoint};
use ring::rand::{SecureRandom, SystemRandom};

use super::pair_relay::PairRelay;
use super::{canonical, Introduction, Meet, Side, LIMITS, TOKEN};
use crate::error::{NetError, Result};
use crate::identity::{Credentials, Role};
use crate::transport::{close, expect_peer, hang_up, receive, send, server_endpoint, Link};
use crate::wire::{Frame, Kind};

/// Most meets waiting at once, over all stages.
pub const MAX_WAITING: usize = 4096;
/// Most meets one connection may have waiting.
const MAX_WAITING_PER_STAGE: usize = 2;

/// Which end of which cut of which session.
type Slot = (String, u32, Side);

struct Waiting {
    conn: Connection,
    local: Option<SocketAddr>,
}

/// The rendezvous node: its endpoint, its relay, and the meets waiting for their other end.
pub struct Rendezvous {
    endpoint: Endpoint,
    relay: PairRelay,
    waiting: Arc<Mutex<HashMap<Slot, Waiting>>>,
    rng: SystemRandom,
}

impl Rendezvous {
    /// Listens for stages on `addr` and relays on `relay` (port 0 picks one), on the current
    /// tokio runtime. `creds` should state the rendezvous role: stages check it.
    pub fn start(
        addr: SocketAddr,
        relay: SocketAddr,
        creds: &Credentials,
        link: &Link,
    ) -> Result<Rendezvous> {
        Ok(Rendezvous {
            endpoint: server_endpoint(addr, creds, link)?,
            relay: PairRelay::start(relay)?,
            waiting: Arc::default(),
            rng: SystemRandom::new(),
        })
    }

    /// Where stages reach it.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// The relay's UDP port.
    pub fn relay_port(&self) -> Result<u16> {
        self.relay.port()
    }

    /// The relay, for its counts.
    pub fn relay(&self) -> &PairRelay {
        &self.relay
    }

    /// Serves stages until the endpoint closes.
    pub async fn run(self: Arc<Self>) {
        while let Some(incoming) = self.endpoint.accept().await {
            let this = self.clone();
            tokio::spawn(async move {
                let conn = match incoming.await {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::debug!("rendezvous: a handshake failed: {e}");
                        return;
                    }
                };
                if let Err(e) = expect_peer(&conn, Role::Stage) {
                    tracing::warn!("rendezvous: {e}");
                    hang_up(&conn, close::PROTOCOL, "only stages meet here");
                    return;
                }
                if let Err(e) = this.serve(&conn).await {
                    tracing::info!("rendezvous: stage at {}: {e}", conn.remote_address());
                    hang_up(&conn, close::PROTOCOL, &e.to_string());
                }
                this.forget(&conn);
            });
        }
    }

    /// Closes the endpoint; [`run`](Self::run) returns.
    pub fn close(&self) {
        self.endpoint
            .close(close::DONE.into(), b"rendezvous closing");
    }

    /// Reads one stage's meets until it hangs up.
    async fn serve(&self, conn: &Connection) -> Result<()> {
        while let Some(frame) = receive(conn, &LIMITS).await? {
            if frame.kind != Kind::Meet {
                return Err(NetError::Protocol(format!(
                    "a {:?} frame at a rendezvous",
                    frame.kind
                )));
            }
            let meet: Meet = frame.message()?;
            meet.check()?;
            self.meet(conn, meet)?;
        }
        Ok(())
    }

    /// Files a meet, or introduces it to its other end.
    fn meet(&self, conn: &Connection, meet: Meet) -> Result<()> {
        let other = {
            let mut waiting = self.waiting.lock().expect("waiting meets");
            let other_slot = (meet.session.clone(), meet.cut, meet.side.other());
            match waiting.remove(&other_slot) {
                Some(other) if other.conn.close_reason().is_none() => Some(other),
                _ => {
                    let mine = waiting
                        .values()
                        .filter(|w| w.conn.stable_id() == conn.stable_id())
                        .count();
                    if mine >= MAX_WAITING_PER_STAGE {
                        return Err(NetError::Protocol(format!(
                            "more than {MAX_WAITING_PER_STAGE} meets waiting from one stage"
                        )));
                    }
                    if waiting.len() >= MAX_WAITING {
                        return Err(NetError::Protocol("the rendezvous is full".into()));
                    }
                    let slot = (meet.session.clone(), meet.cut, meet.side);
                    let waiting_meet = Waiting {
                        conn: conn.clone(),
                        local: meet.local,
                    };
                    waiting.insert(slot, waiting_meet);
                    None
                }
            }
        };
        let Some(other) = other else {
            tracing::debug!(
                "rendezvous: {:?} end of cut {} of {:?} waits",
                meet.side,
                meet.cut,
                meet.session
            );
            return Ok(());
        };
        let mut token = [0u8; TOKEN];
        self.rng
            .fill(&mut token)
            .map_err(|_| NetError::Connection("no randomness for a relay token".into()))?;
        let relay_port = if self.relay.open(token) {
            Some(self.relay.port()?)
        } else {
            tracing::warn!("rendezvous: the relay is full; cut {} gets none", meet.cut);
            None
        };
        let (mine, theirs) = (
            canonical(conn.remote_address()),
            canonical(other.conn.remote_address()),
        );
        tracing::info!(
            "rendezvous: introduced the ends of cut {} of {:?}: {} at {mine}, {} at {theirs}",
            meet.cut,
            meet.session,
            meet.side.name(),
            meet.side.other().name()
        );
        let to_me = Introduction {
            peer: theirs,
            peer_local: other.local,
            observed: mine,
            relay_port,
            token,
        };
        let to_them = Introduction {
            peer: mine,
            peer_local: meet.local,
            observed: theirs,
            relay_port,
            token,
        };
        for (c, intro) in [(conn.clone(), to_me), (other.conn, to_them)] {
            let mut frame = Frame::control(Kind::Introduce, 0, 0, &intro);
            frame.key = meet.cut as u64;
            tokio::spawn(async move {
                if let Err(e) = send(&c, frame).await {
                    tracing::debug!("rendezvous: an introduction was not delivered: {e}");
                }
            });
        }
        Ok(())
    }

    /// Forgets the meets of a stage that hung up.
    fn forget(&self, conn: &Connection) {
        let id = conn.stable_id();
        self.waiting
            .lock()
            .expect("waiting meets")
            .retain(|_, w| w.conn.stable_id() != id);
    }
}
