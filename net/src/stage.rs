//! The engine's [`StageLink`] over QUIC: the connection between neighbouring pipeline stages.
//!
//! Stage e listens ([`StageListener`]) and stage e+1 connects to it ([`connect_stage`]); both
//! directions then share that one connection, each message a [`Kind::Stage`] frame on a stream
//! of its own (rank: the sender's stage, key: the direction, step: the step). Both ends prove
//! they belong to the swarm in the TLS handshake. Like the parameter-server client, a link
//! owns a small tokio runtime so that the stage's training loop stays synchronous.
//!
//! Stages that cannot accept connections (behind NATs) find each other through a rendezvous
//! node instead ([`meet_neighbours`], [`crate::nat`]): then one endpoint and one runtime serve
//! both of a stage's links.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use murmur_engine::comm::stage::{Direction, StageLink, StageMessage};
use quinn::{Connection, Endpoint};
use tokio::task::JoinHandle;

use crate::error::{NetError, Result};
use crate::identity::{Credentials, Role};
use crate::nat::traverse::{accept_stage, Timeouts, Traversal};
use crate::nat::{Route, Side};
use crate::transport::{
    client_endpoint, close, connect, expect_peer, hang_up, send_acknowledged, server_endpoint,
    Incoming, Link,
};
use crate::wire::{Frame, Kind, Limits};

/// Timeouts of a stage link.
#[derive(Debug, Clone, Copy)]
pub struct StageOptions {
    /// What the link between the stages carries, which sizes the QUIC flow-control windows.
    pub link: Link,
    /// Hard limits on the frames a neighbouring stage may send.
    pub limits: Limits,
    /// Longest wait for the neighbour's next message (a step's compute and transfer).
    pub message_timeout: Duration,
    /// Longest wait for the neighbour to connect, or to start listening.
    pub connect_timeout: Duration,
    /// Through a rendezvous: how long the dialing end tries a direct path before it takes
    /// the relay.
    pub punch_timeout: Duration,
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions {
            link: Link::default(),
            limits: Limits::default(),
            message_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(60),
            punch_timeout: Timeouts::default().punch,
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// Stage e's listening endpoint, waiting for stage e+1.
pub struct StageListener {
    runtime: tokio::runtime::Runtime,
    endpoint: Endpoint,
    stage: usize,
    options: StageOptions,
}

impl StageListener {
    /// Listens on `addr` (port 0 picks a free one) as stage `stage`.
    pub fn bind(
        addr: SocketAddr,
        creds: &Credentials,
        stage: usize,
        options: StageOptions,
    ) -> Result<Self> {
        let runtime = runtime()?;
        let endpoint = runtime.block_on(async { server_endpoint(addr, creds, &options.link) })?;
        Ok(StageListener {
            runtime,
            endpoint,
            stage,
            options,
        })
    }

    /// The address the listener is bound to, with the real port when it was bound to port 0.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// Waits for stage e+1 to connect.
    pub fn accept(self) -> Result<QuicStageLink> {
        let StageListener {
            runtime,
            endpoint,
            stage,
            options,
        } = self;
        let conn = runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + options.connect_timeout;
            accept_stage(&endpoint, deadline, &options.link, || {
                format!(
                    "stage {} did not connect in {:?}",
                    stage + 1,
                    options.connect_timeout
                )
            })
            .await
        })?;
        Ok(QuicStageLink::new(
            Arc::new(runtime),
            endpoint,
            conn,
            stage,
            stage + 1,
            options,
        ))
    }
}

/// Connects stage `stage` to its predecessor listening on `addr`, retrying until it listens.
pub fn connect_stage(
    addr: SocketAddr,
    creds: &Credentials,
    stage: usize,
    options: StageOptions,
) -> Result<QuicStageLink> {
    let runtime = runtime()?;
    let (endpoint, conn) = runtime.block_on(async {
        let endpoint = client_endpoint(creds, &options.link)?;
        let deadline = Instant::now() + options.connect_timeout;
        loop {
            match connect(&endpoint, addr).await {
                Ok(conn) => {
                    expect_peer(&conn, Role::Stage)?;
                    return Ok((endpoint, conn));
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(NetError::Timeout(format!(
                        "stage {} at {addr} did not answer in {:?}: {e}",
                        stage.wrapping_sub(1),
                        options.connect_timeout
                    )))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })?;
    Ok(QuicStageLink::new(
        Arc::new(runtime),
        endpoint,
        conn,
        stage,
        stage.wrapping_sub(1),
        options,
    ))
}

/// A stage's links to its neighbours, made through a rendezvous, and how each was made.
pub struct Neighbours {
    /// The link to stage e-1 (none for the first stage).
    pub prev: Option<(QuicStageLink, Route)>,
    /// The link to stage e+1 (none for the last).
    pub next: Option<(QuicStageLink, Route)>,
}

/// Links stage `stage` of `stages` to its neighbours through the rendezvous at `rendezvous`,
/// for stages behind NATs: it binds one endpoint on `bind`, meets the previous stage (it
/// dials that cut), then the next (it listens for that one), each directly where a path opens
/// and through the rendezvous's relay otherwise. Every stage of the pipeline gives the same
/// `session`.
pub fn meet_neighbours(
    rendezvous: SocketAddr,
    session: &str,
    bind: SocketAddr,
    creds: &Credentials,
    (stage, stages): (usize, usize),
    options: StageOptions,
) -> Result<Neighbours> {
    let runtime = Arc::new(runtime()?);
    let timeouts = Timeouts {
        punch: options.punch_timeout,
        connect: options.connect_timeout,
    };
    let link = options.link;
    let (traversal, prev, next) = runtime.block_on(async {
        let traversal =
            Traversal::open(bind, rendezvous, creds, &link, options.connect_timeout).await?;
        // The lower cut first: stage 0 completes cut 0 with stage 1, which then completes
        // cut 1 with stage 2, and so on; no stage waits on one that waits on it.
        let prev = match stage {
            0 => None,
            e => Some(
                traversal
                    .meet(session, (e - 1) as u32, Side::Dial, &link, timeouts)
                    .await?,
            ),
        };
        let next = match stage + 1 < stages {
            false => None,
            true => Some(
                traversal
                    .meet(session, stage as u32, Side::Listen, &link, timeouts)
                    .await?,
            ),
        };
        traversal.leave();
        Ok::<_, NetError>((traversal, prev, next))
    })?;
    let endpoint = traversal.endpoint().clone();
    let wrap = |(conn, route): (Connection, Route), neighbour: usize| {
        let via = conn.remote_address();
        let how = match route {
            Route::Direct => "directly",
            Route::Relayed => "through the rendezvous's relay",
        };
        tracing::info!("stage {stage}: linked to stage {neighbour} {how}, at {via}");
        let link = QuicStageLink::new(
            runtime.clone(),
            endpoint.clone(),
            conn,
            stage,
            neighbour,
            options,
        );
        (link, route)
    };
    Ok(Neighbours {
        prev: prev.map(|p| wrap(p, stage - 1)),
        next: next.map(|n| wrap(n, stage + 1)),
    })
}

/// One end of a stage link over QUIC.
pub struct QuicStageLink {
    /// Shared by both of a stage's links when they share an endpoint (through a rendezvous).
    runtime: Arc<tokio::runtime::Runtime>,
    _endpoint: Endpoint,
    conn: Connection,
    incoming: Incoming,
    stage: usize,
    neighbour: usize,
    timeout: Duration,
    /// Sends under way, each done once the neighbour has acknowledged its whole stream.
    sending: Vec<JoinHandle<Result<()>>>,
}

impl QuicStageLink {
    fn new(
        runtime: Arc<tokio::runtime::Runtime>,
        endpoint: Endpoint,
        conn: Connection,
        stage: usize,
        neighbour: usize,
        options: StageOptions,
    ) -> Self {
        let incoming = {
            let _guard = runtime.enter();
            Incoming::new(conn.clone(), options.limits, &options.link)
        };
        QuicStageLink {
            runtime,
            _endpoint: endpoint,
            conn,
            incoming,
            stage,
            neighbour,
            timeout: options.message_timeout,
            sending: Vec::new(),
        }
    }

    /// Where the link goes: the neighbour, or the relay it goes through.
    pub fn remote_address(&self) -> SocketAddr {
        crate::nat::canonical(self.conn.remote_address())
    }

    /// Surfaces the error of a send that failed; forgets the ones that are done.
    fn check_sends(&mut self) -> Result<()> {
        let mut failure = None;
        self.sending.retain_mut(|h| {
            if !h.is_finished() {
                return true;
            }
            if let Ok(Err(e)) | Err(e) = self
                .runtime
                .block_on(h)
                .map_err(|e| NetError::Connection(format!("sending task: {e}")))
            {
                failure.get_or_insert(e);
            }
            false
        });
        failure.map_or(Ok(()), Err)
    }

    fn frame_to_message(&self, frame: Frame) -> Result<StageMessage> {
        let refuse = |why: String| {
            hang_up(&self.conn, close::PROTOCOL, &why);
            Err(NetError::Protocol(why))
        };
        if frame.kind != Kind::Stage {
            return refuse(format!("a {:?} frame on a stage link", frame.kind));
        }
        if frame.rank as usize != self.neighbour {
            return refuse(format!(
                "a frame from stage {} on the link to stage {}",
                frame.rank, self.neighbour
            ));
        }
        let direction = match u8::try_from(frame.key).map(Direction::from_code) {
            Ok(Ok(d)) => d,
            _ => return refuse(format!("direction {} is not 0 or 1", frame.key)),
        };
        Ok(StageMessage {
            step: frame.step,
            direction,
            payload: frame.payload,
        })
    }
}

impl StageLink for QuicStageLink {
    fn send(&mut self, message: StageMessage) -> murmur_engine::Result<()> {
        self.check_sends()?;
        let frame = Frame::new(
            Kind::Stage,
            self.stage as u16,
            message.direction.code() as u64,
            message.step,
            0,
            message.payload,
        );
        // Sent in the background: the stage goes on computing while the bytes travel; the
        // receiver takes streams in the order they were opened.
        let conn = self.conn.clone();
        self.sending.push(self.runtime.spawn(async move {
            send_acknowledged(&conn, frame, "sending to the next stage").await
        }));
        Ok(())
    }

    fn recv(&mut self) -> murmur_engine::Result<StageMessage> {
        self.check_sends()?;
        let timeout = self.timeout;
        let neighbour = self.neighbour;
        let frame = self.runtime.block_on(async {
            match tokio::time::timeout(timeout, self.incoming.next()).await {
                Err(_) => Err(NetError::Timeout(format!(
                    "no message from stage {neighbour} in {timeout:?}"
                ))),
                Ok(Ok(Some(frame))) => Ok(frame),
                Ok(Ok(None)) => Err(NetError::Connection(format!(
                    "stage {neighbour} closed the link"
                ))),
                Ok(Err(e)) => Err(e),
            }
        })?;
        Ok(self.frame_to_message(frame)?)
    }
}

impl Drop for QuicStageLink {
    fn drop(&mut self) {
        // The last messages must arrive before the connection closes (closing discards what
        // is still in flight), and the close itself must leave before the endpoint goes, or the
        // neighbour would wait out its idle timeout; a neighbour that stopped reading costs at
        // most the timeouts.
        let sending = std::mem::take(&mut self.sending);
        let timeout = self.timeout.min(Duration::from_secs(30));
        let (conn, endpoint) = (self.conn.clone(), self._endpoint.clone());
        // The endpoint may serve the stage's other link too: only the last link waits for it.
        let last = Arc::strong_count(&self.runtime) == 1;
        self.runtime.block_on(async move {
            let _ = tokio::time::timeout(timeout, async {
                for h in sending {
                    let _ = h.await;
                }
            })
            .await;
            hang_up(&conn, close::DONE, "pipeline finished");
            if last {
                let _ = tokio::time::timeout(Duration::from_secs(5), endpoint.wait_idle()).await;
            }
        });
    }
}
