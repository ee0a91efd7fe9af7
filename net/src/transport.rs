//! QUIC endpoints tuned for bulk tensors: flow-control windows sized from the link's
//! bandwidth-delay product, UDP socket buffers of at least 2 MiB that grow with the windows
//! ([`crate::socket_buffers`]), many concurrent
//! unidirectional streams (one per message, so partitions never block each other) and
//! datagrams for heartbeats only. Every message is a [`Frame`] on its own stream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    Connection, Endpoint, EndpointConfig, IdleTimeout, TokioRuntime, TransportConfig, VarInt,
};

use crate::error::{NetError, Result};
use crate::identity::{fingerprint, Credentials, Role};
pub(crate) use crate::socket_buffers::request_socket_buffers;
use crate::socket_buffers::{follow_window, SizedSocket};
pub use crate::socket_buffers::{SOCKET_BUFFER, WANT_SOCKET_BUFFER};
use crate::tls::{client_tls, server_tls};
use crate::wire::{Frame, Header, Limits, HEADER};
use rustls::pki_types::CertificateDer;

/// What the link between peers can carry; windows are sized to hold a round trip's data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Bandwidth of the path in bytes per second.
    pub bytes_per_second: f64,
    /// Round-trip time of the path, also QUIC's initial RTT estimate.
    pub rtt: Duration,
    /// How long a peer may stay silent before its connection is taken for dead. Both ends
    /// send a keep-alive every [`KEEP_ALIVE`], so only a peer that is gone (killed, frozen,
    /// cut off) stays silent; QUIC uses the smaller of the two ends' values.
    pub peer_timeout: Duration,
    /// The congestion controller of the connections this end sends on.
    pub congestion: Congestion,
    /// Whether the receive windows follow the path as measured or the stated bandwidth and
    /// round trip.
    pub windows: Windows,
}

/// How a connection's receive window is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Windows {
    /// Starts at [`START_WINDOW`] and doubles, up to [`MAX_WINDOW`], whenever the data the
    /// path delivered in a measured round trip reaches half of it (what Linux's TCP receive
    /// autotuning and quic-go do): a window grows to two to four bandwidth-delay products
    /// of the path it is on, and a slow peer costs no more than its path holds.
    #[default]
    Measured,
    /// Fixed from [`Link::bytes_per_second`] and [`Link::rtt`] (the user stated the link).
    Stated,
}

/// Where a measured connection window starts.
pub const START_WINDOW: u64 = 4 << 20;
/// The most a measured connection window grows to: 2 Gbit/s over a second's round trip.
pub const MAX_WINDOW: u64 = 256 << 20;

/// QUIC congestion controllers murmur offers: quinn's three, and murmur's loss-tolerant
/// CUBIC, the default. It keeps 0.93 of a 10 Mbit/s, 150 ms link at 2% loss, where CUBIC
/// keeps a few percent, and shares a link with TCP as CUBIC does, where quinn's BBR takes all
/// of it (a TCP flow beside BBR kept 0.6-1.5% of a 50 Mbit/s link; docs/benchmarks.md,
/// "Goodput").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Congestion {
    /// CUBIC (RFC 9438): backs off on every loss, so random loss on a long path starves it
    /// (2% of a 50 Mbit/s, 100 ms link at 1% loss).
    Cubic,
    /// NewReno (RFC 9002's reference controller).
    NewReno,
    /// BBR (quinn's, experimental, with murmur's patch of its bandwidth samples): paces at
    /// the bottleneck rate it measures and does not take random loss for congestion, so it
    /// keeps 0.94 of a lossy link; but it leaves a TCP flow beside it 0.6-1.5% of the link.
    /// For links murmur has to itself.
    Bbr,
    /// CUBIC that backs off only on loss that comes with a queue or at a high rate
    /// ([`crate::tolerant`]): random loss on an empty path leaves its window alone, and a
    /// queue (its own overflow, or a competing flow's) makes it back off as CUBIC does.
    #[default]
    Tolerant,
}

impl Congestion {
    /// Every controller, in the order reports list them.
    pub const ALL: [Congestion; 4] = [
        Congestion::Cubic,
        Congestion::NewReno,
        Congestion::Bbr,
        Congestion::Tolerant,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::NewReno => "newreno",
            Congestion::Bbr => "bbr",
            Congestion::Tolerant => "tolerant",
        }
    }

    fn factory(self) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
        use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
        match self {
            Congestion::Cubic => Arc::new(CubicConfig::default()),
            Congestion::NewReno => Arc::new(NewRenoConfig::default()),
            Congestion::Bbr => Arc::new(BbrConfig::default()),
            Congestion::Tolerant => Arc::new(crate::tolerant::TolerantConfig::default()),
        }
    }
}

impl std::fmt::Display for Congestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Congestion {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Congestion::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("no congestion controller {s:?}: give cubic, newreno or bbr"))
    }
}

/// The longest peer timeout murmur configures (an hour).
pub const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(3600);

/// Interval of the keep-alives every connection sends when it has nothing else to send.
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// The default [`Link::peer_timeout`]: five keep-alives lost in a row.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for Link {
    /// 1 Gbit/s with 50 ms round trips: a generous internet path.
    fn default() -> Self {
        Link {
            bytes_per_second: 125e6,
            rtt: Duration::from_millis(50),
            peer_timeout: PEER_TIMEOUT,
            congestion: Congestion::default(),
            windows: Windows::default(),
        }
    }
}

/// Streams a peer may have open and unfinished at once: enough for every partition of a
/// 4 GB model in one round.
pub const MAX_STREAMS_IN_FLIGHT: u32 = 1024;

/// What a connection to a listening node may hold before the node admits it (a shard: after
/// a valid hello; a stage: after the role check): this much unread data in all ...
pub const ADMISSION_WINDOW: u32 = 256 << 10;
/// ... on at most this many streams at once. An admitted peer gets the link's windows
/// ([`admit`]); until then a connection costs the node at most the window, whatever it sends.
pub const ADMISSION_STREAMS: u32 = 4;

impl Link {
    /// The bandwidth-delay product in bytes: what the path holds in flight during one round trip.
    pub fn bdp(&self) -> u64 {
        (self.bytes_per_second * self.rtt.as_secs_f64()) as u64
    }

    /// The connection window this link starts with: [`START_WINDOW`] when measured, two
    /// bandwidth-delay products (4 MiB to 2 GiB) when stated.
    fn connection_window(&self) -> u64 {
        match self.windows {
            Windows::Measured => START_WINDOW,
            Windows::Stated => (2 * self.bdp()).clamp(4 << 20, 1 << 31),
        }
    }

    /// A QUIC transport configuration for this link, up to [`MAX_STREAMS_IN_FLIGHT`]
    /// unidirectional streams, keep-alives every [`KEEP_ALIVE`], the link's peer timeout as
    /// QUIC's idle timeout (at least three keep-alives) and its congestion controller.
    /// Stated windows: a stream window of one bandwidth-delay product (1 MiB to 1 GiB) and a
    /// connection window of two (4 MiB to 2 GiB). Measured windows: the connection window
    /// starts at [`START_WINDOW`] and [`Incoming`] grows it; a stream may use all of it.
    pub fn transport(&self) -> TransportConfig {
        let (stream, conn, send) = match self.windows {
            // A stream may fill the pipe alone; the connection holds two pipes' worth.
            Windows::Stated => {
                let conn = self.connection_window();
                (self.bdp().clamp(1 << 20, 1 << 30), conn, conn)
            }
            // The connection window is the bound that grows; what the sender may have
            // unacknowledged must not hold it back.
            Windows::Measured => (MAX_WINDOW, START_WINDOW, MAX_WINDOW),
        };
        let mut t = TransportConfig::default();
        t.stream_receive_window(VarInt::from_u64(stream).expect("below 2^62"))
            .receive_window(VarInt::from_u64(conn).expect("below 2^62"))
            .send_window(send)
            .max_concurrent_uni_streams(VarInt::from_u32(MAX_STREAMS_IN_FLIGHT))
            .max_concurrent_bidi_streams(VarInt::from_u32(0))
            .initial_rtt(self.rtt)
            .keep_alive_interval(Some(KEEP_ALIVE))
            .max_idle_timeout(Some(
                IdleTimeout::try_from(self.peer_timeout.clamp(3 * KEEP_ALIVE, MAX_PEER_TIMEOUT))
                    .expect("below QUIC's limit"),
            ))
            .datagram_receive_buffer_size(Some(64 << 10))
            .congestion_controller_factory(self.congestion.factory());
        t
    }
}

fn conn_err(e: impl std::fmt::Display) -> NetError {
    NetError::Connection(e.to_string())
}

/// A UDP socket bound to `addr` with large buffers (the kernel may cap them at
/// net.core.*mem_max), for [`server_endpoint_on`] or [`client_endpoint_on`].
pub fn bind_udp(addr: SocketAddr) -> Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    request_socket_buffers(socket2::SockRef::from(&socket));
    let (r, s) = (socket.recv_buffer_size()?, socket.send_buffer_size()?);
    if r < SOCKET_BUFFER || s < SOCKET_BUFFER {
        tracing::warn!("UDP buffers capped by the kernel at {r} / {s} bytes (want {SOCKET_BUFFER}); raise net.core.rmem_max and wmem_max for fast links");
    }
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Dual stack: one socket reaches IPv4 peers (as mapped addresses) and IPv6 peers.
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// What the platform offloads for quinn on `socket`: datagrams per send (GSO) and per
/// receive (GRO); 1 where it offloads nothing. quinn uses both wherever they exist
/// (`TransportConfig::enable_segmentation_offload` stays on).
pub fn offload(socket: &std::net::UdpSocket) -> Result<(usize, usize)> {
    let state = quinn::udp::UdpSocketState::new(socket.into())?;
    Ok((state.max_gso_segments(), state.gro_segments()))
}

/// How an endpoint accepts swarm peers: TLS with `creds` (and their revocation list), QUIC
/// sized for `link` once [`admit`]ted, and the admission windows until then. A server swaps
/// in a new one when the revocation list changes (`Endpoint::set_server_config`).
pub fn server_config(creds: &Credentials, link: &Link) -> Result<quinn::ServerConfig> {
    let crypto = QuicServerConfig::try_from(server_tls(creds)?).map_err(conn_err)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = link.transport();
    transport
        .receive_window(VarInt::from_u32(ADMISSION_WINDOW))
        .max_concurrent_uni_streams(VarInt::from_u32(ADMISSION_STREAMS));
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}

/// Gives an accepted peer the link's full windows: the node has checked who it is.
pub fn admit(conn: &Connection, link: &Link) {
    conn.set_receive_window(VarInt::from_u64(link.connection_window()).expect("below 2^62"));
    conn.set_max_concurrent_uni_streams(VarInt::from_u32(MAX_STREAMS_IN_FLIGHT));
}

/// An endpoint that accepts swarm peers on `addr` (and can also connect out).
pub fn server_endpoint(addr: SocketAddr, creds: &Credentials, link: &Link) -> Result<Endpoint> {
    server_endpoint_on(bind_udp(addr)?, creds, link)
}

/// [`server_endpoint`] on a socket the caller bound (in another network namespace, say).
pub fn server_endpoint_on(
    socket: std::net::UdpSocket,
    creds: &Credentials,
    link: &Link,
) -> Result<Endpoint> {
    follow_window(link.connection_window());
    let mut endpoint = Endpoint::new_with_abstract_socket(
        EndpointConfig::default(),
        Some(server_config(creds, link)?),
        SizedSocket::wrap(socket)?,
        Arc::new(TokioRuntime),
    )?;
    endpoint.set_default_client_config(client_config(creds, link)?);
    Ok(endpoint)
}

/// An endpoint that only connects out.
pub fn client_endpoint(creds: &Credentials, link: &Link) -> Result<Endpoint> {
    // A dual-stack socket where the machine has IPv6, so that peers of either family can be
    // reached; IPv4 alone where it has not.
    let socket = bind_udp("[::]:0".parse().expect("valid"))
        .or_else(|_| bind_udp("0.0.0.0:0".parse().expect("valid")))?;
    client_endpoint_on(socket, creds, link)
}

/// [`client_endpoint`] on a socket the caller bound.
pub fn client_endpoint_on(
    socket: std::net::UdpSocket,
    creds: &Credentials,
    link: &Link,
) -> Result<Endpoint> {
    follow_window(link.connection_window());
    let mut endpoint = Endpoint::new_with_abstract_socket(
        EndpointConfig::default(),
        None,
        SizedSocket::wrap(socket)?,
        Arc::new(TokioRuntime),
    )?;
    endpoint.set_default_client_config(client_config(creds, link)?);
    Ok(endpoint)
}

fn client_config(creds: &Credentials, link: &Link) -> Result<quinn::ClientConfig> {
    let crypto = QuicClientConfig::try_from(client_tls(creds)?).map_err(conn_err)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(Arc::new(link.transport()));
    Ok(cfg)
}

/// Connects to a swarm peer, which must prove the swarm signed it.
pub async fn connect(endpoint: &Endpoint, addr: SocketAddr) -> Result<Connection> {
    endpoint
        .connect(addr, crate::identity::NODE_NAME)
        .map_err(conn_err)?
        .await
        .map_err(|e| NetError::Connection(format!("{addr}: {e}")))
}

/// The certificate the peer presented (its leaf), which the handshake verified.
pub fn peer_certificate(conn: &Connection) -> Option<CertificateDer<'static>> {
    conn.peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .and_then(|certs| certs.first().cloned())
}

/// The fingerprint of the peer's key.
pub fn peer_fingerprint(conn: &Connection) -> String {
    peer_certificate(conn).map_or_else(|| "unknown".into(), |c| fingerprint(&c))
}

/// Checks that the peer's certificate states the role `expected` (a worker checks its
/// servers, a server its workers, a stage its neighbours); on a mismatch, or a certificate
/// without a role, hangs up saying why and returns the reason.
pub fn expect_peer(conn: &Connection, expected: Role) -> Result<()> {
    let stated = peer_certificate(conn)
        .ok_or_else(|| NetError::Identity("the peer presented no certificate".into()))
        .and_then(|cert| Role::of(&cert));
    let refusal = match stated {
        Ok(role) if role == expected => return Ok(()),
        Ok(role) => format!("it is certified as a {role}, not as a {expected}"),
        Err(e) => e.to_string(),
    };
    let why = format!(
        "peer {} at {} refused: {refusal}",
        peer_fingerprint(conn),
        conn.remote_address()
    );
    hang_up(conn, close::PROTOCOL, &why);
    Err(NetError::Identity(why))
}

/// Application close codes: why a peer hung up.
pub mod close {
    /// Orderly shutdown.
    pub const DONE: u32 = 0;
    /// The peer broke the protocol; the reason says how.
    pub const PROTOCOL: u32 = 1;
    /// The peer missed a round's deadline.
    pub const DEADLINE: u32 = 2;
    /// A newer connection took over the peer's rank.
    pub const REPLACED: u32 = 3;
    /// A worker hangs up to connect again at once (it lost another shard): the open round
    /// waits for its rank.
    pub const RECONNECTING: u32 = 4;
}

/// Closes a connection with a code from [`close`] and a reason the peer will see and log.
pub fn hang_up(conn: &Connection, code: u32, reason: &str) {
    // A close frame must fit in one packet (quinn would cut it anywhere, even inside a
    // character): at most 400 bytes, cut at a character boundary.
    let mut end = reason.len().min(400);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    conn.close(VarInt::from_u32(code), &reason.as_bytes()[..end]);
}

/// Sends one frame on a stream of its own; the payload is handed to quinn without a copy.
pub async fn send(conn: &Connection, frame: Frame) -> Result<()> {
    let header = frame.header();
    send_parts(conn, &header, Bytes::from(frame.payload)).await
}

/// Sends a frame from its header and a payload shared with other sends (the server encodes a
/// reply once and sends the same bytes to every worker).
pub async fn send_parts(conn: &Connection, header: &Header, payload: Bytes) -> Result<()> {
    debug_assert_eq!(header.len, payload.len());
    let header = Bytes::copy_from_slice(&header.encode());
    send_chunks(conn, &mut [header, payload]).await
}

/// Sends a push frame: `header` (whose length counts the sample count) and the payload, the
/// count of samples the push stands for ahead of the codec payload, which goes to quinn
/// without a copy.
pub async fn send_push(
    conn: &Connection,
    header: &Header,
    samples: u32,
    payload: Bytes,
) -> Result<()> {
    debug_assert_eq!(header.len, crate::wire::PUSH_PREFIX + payload.len());
    let header = Bytes::copy_from_slice(&header.encode());
    let samples = Bytes::copy_from_slice(&samples.to_le_bytes());
    send_chunks(conn, &mut [header, samples, payload]).await
}

/// Sends one frame on a stream of its own and waits until the peer has acknowledged all of
/// it: a stage link may then close as soon as its sends are done without losing the last
/// message, and a probe times the path. `what` begins the error.
pub async fn send_acknowledged(conn: &Connection, frame: Frame, what: &str) -> Result<()> {
    let lost = |e: String| NetError::Connection(format!("{what}: {e}"));
    let header = Bytes::copy_from_slice(&frame.header().encode());
    let mut stream = conn.open_uni().await.map_err(|e| lost(e.to_string()))?;
    stream
        .write_all_chunks(&mut [header, Bytes::from(frame.payload)])
        .await
        .map_err(|e| lost(e.to_string()))?;
    stream.finish().map_err(|e| lost(e.to_string()))?;
    match stream.stopped().await {
        Ok(None) => Ok(()),
        Ok(Some(code)) => Err(lost(format!("the peer stopped the stream ({code})"))),
        Err(e) => Err(lost(e.to_string())),
    }
}

/// Sends bytes that are already a whole frame, on a stream of its own.
pub async fn send_bytes(conn: &Connection, bytes: Bytes) -> Result<()> {
    send_chunks(conn, &mut [bytes]).await
}

async fn send_chunks(conn: &Connection, chunks: &mut [Bytes]) -> Result<()> {
    let mut stream = conn.open_uni().await.map_err(conn_err)?;
    stream.write_all_chunks(chunks).await.map_err(conn_err)?;
    stream.finish().map_err(conn_err)?;
    Ok(())
}

/// Receives the next frame the peer sent; `Ok(None)` when the connection closed in order.
///
/// Reads one stream to its end before the next is accepted: fine for a reply or two, but a
/// peer that keeps many large streams in flight needs [`Incoming`], which reads them all at
/// once.
pub async fn receive(conn: &Connection, limits: &Limits) -> Result<Option<Frame>> {
    match next_stream(conn).await? {
        Some(stream) => read_frame(stream, limits).await.map(Some),
        None => Ok(None),
    }
}

/// The next stream the peer opened; `None` when it closed the connection in order.
async fn next_stream(conn: &Connection) -> Result<Option<quinn::RecvStream>> {
    match conn.accept_uni().await {
        Ok(s) => Ok(Some(s)),
        Err(quinn::ConnectionError::LocallyClosed) => Ok(None),
        Err(quinn::ConnectionError::ApplicationClosed(c))
            if c.error_code == VarInt::from_u32(close::DONE) =>
        {
            Ok(None)
        }
        Err(quinn::ConnectionError::ApplicationClosed(c)) => Err(NetError::Connection(format!(
            "the peer closed the connection: {}",
            String::from_utf8_lossy(&c.reason)
        ))),
        Err(e) => Err(conn_err(e)),
    }
}

/// The most a frame's buffer holds before its first bytes arrive.
const READ_CHUNK: usize = 64 << 10;

/// Bytes a connection's frames hold between arriving and being handled, against
/// [`Limits::max_buffered`].
#[derive(Debug)]
struct Buffered {
    bytes: AtomicUsize,
    max: usize,
}

impl Buffered {
    /// Counts `n` more bytes, or refuses them when they would pass the limit.
    fn take(&self, n: usize) -> Result<()> {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(n).filter(|after| *after <= self.max)
            })
            .map(|_| ())
            .map_err(|held| {
                NetError::Protocol(format!(
                    "the peer's frames waiting to be handled would pass {} bytes ({held} \
                     waiting, {n} more arriving): it sends faster than it is served",
                    self.max
                ))
            })
    }

    fn release(&self, n: usize) {
        self.bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What a frame being read has counted against its connection's [`Buffered`]; given back if
/// the read fails, kept by a frame that was read until it is handed out.
struct Counted<'a> {
    budget: Option<&'a Buffered>,
    bytes: usize,
}

impl Counted<'_> {
    fn take(&mut self, n: usize) -> Result<()> {
        if let Some(budget) = self.budget {
            budget.take(n)?;
            self.bytes += n;
        }
        Ok(())
    }

    /// Leaves the bytes counted: the frame they went into holds them until
    /// [`Incoming::next`] hands it out and gives them back.
    fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if let Some(budget) = self.budget {
            budget.release(self.bytes);
        }
    }
}

/// Reads one frame: the header first, checked against the limits before any payload is
/// buffered, then exactly the payload it announces, into a buffer that grows as it arrives.
async fn read_frame(stream: quinn::RecvStream, limits: &Limits) -> Result<Frame> {
    read_frame_within(stream, limits, None).await
}

/// [`read_frame`], counting the payload against `budget` as it arrives; a frame read whole
/// stays counted (its reader gives it back when it hands the frame out).
async fn read_frame_within(
    mut stream: quinn::RecvStream,
    limits: &Limits,
    budget: Option<&Buffered>,
) -> Result<Frame> {
    let mut counted = Counted { budget, bytes: 0 };
    let wire = |e: String| NetError::Wire(e);
    let mut head = [0u8; HEADER];
    stream.read_exact(&mut head).await.map_err(|e| match e {
        quinn::ReadExactError::FinishedEarly(n) => wire(format!(
            "the stream ended after {n} bytes, inside the {HEADER}-byte header"
        )),
        quinn::ReadExactError::ReadError(e) => wire(format!("reading a frame: {e}")),
    })?;
    let header = Header::decode(&head, limits)?;
    // The buffer grows with what arrives, never to what the header merely announces: a peer
    // that announces the largest frame and sends a byte costs a byte.
    let mut payload = Vec::with_capacity(header.len.min(READ_CHUNK));
    while payload.len() < header.len {
        let want = header.len - payload.len();
        match stream.read_chunk(want, true).await {
            Ok(Some(chunk)) => {
                counted.take(chunk.bytes.len())?;
                if payload.capacity() - payload.len() < chunk.bytes.len() {
                    // Double, up to the announced length: at most twice what arrived.
                    payload.reserve(payload.len().max(chunk.bytes.len()).min(want));
                }
                payload.extend_from_slice(&chunk.bytes);
            }
            Ok(None) => {
                return Err(wire(format!(
                    "header announces {} payload bytes, {} follow",
                    header.len,
                    payload.len()
                )))
            }
            Err(e) => return Err(wire(format!("reading a frame: {e}"))),
        }
    }
    match stream.read_chunk(1, true).await {
        Ok(None) => {
            let frame = header.with_payload(payload)?;
            counted.keep();
            Ok(frame)
        }
        Ok(Some(_)) => Err(wire(format!(
            "more bytes follow the {} payload bytes the header announces",
            header.len
        ))),
        Err(e) => Err(wire(format!("reading a frame: {e}"))),
    }
}

enum Arrival {
    Frame(tokio::task::JoinHandle<Result<Frame>>),
    End(Result<()>),
}

/// Every frame a peer sends, in the order it opened the streams, with all streams read at
/// once by tasks of their own.
///
/// Why not one stream at a time: data the peer has sent on streams nobody reads still holds
/// the connection's flow-control credit. A peer that pushes more partitions at once than the
/// connection window holds would fill the window with the later streams while the reader
/// waits on the first, and both sides would stall for good. Reading every stream as it opens
/// keeps the credit flowing; frames that are read wait here, in order, for
/// [`Incoming::next`]. An honest peer sends one round's partitions, then waits for the
/// replies, so the queue holds at most a round. Making the readers wait for room would bring
/// the stall back (a full queue stops reading streams whose data still holds credit), so the
/// queue is bounded differently: frames read and partly read count against
/// [`Limits::max_buffered`], and a peer that sends past it loses its connection (the frame
/// that would pass the limit reads as a protocol error), never the receiver's memory.
pub struct Incoming {
    arrivals: tokio::sync::mpsc::UnboundedReceiver<Arrival>,
    acceptor: tokio::task::JoinHandle<()>,
    tuner: Option<tokio::task::JoinHandle<()>>,
    buffered: Arc<Buffered>,
}

impl Incoming {
    /// Starts reading every stream `conn` opens, each in a task of its own, checking frames against
    /// `limits`, and grows the connection's receive window where `link`'s windows are
    /// [measured](Windows::Measured); must be called inside a tokio runtime.
    pub fn new(conn: Connection, limits: Limits, link: &Link) -> Self {
        let tuner = tune_window(&conn, link);
        let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let buffered = Arc::new(Buffered {
            bytes: 0.into(),
            max: limits.max_buffered,
        });
        let budget = buffered.clone();
        let acceptor = tokio::spawn(async move {
            loop {
                let arrival = match next_stream(&conn).await {
                    Ok(Some(stream)) => {
                        let budget = budget.clone();
                        Arrival::Frame(tokio::spawn(async move {
                            read_frame_within(stream, &limits, Some(&budget)).await
                        }))
                    }
                    Ok(None) => Arrival::End(Ok(())),
                    Err(e) => Arrival::End(Err(e)),
                };
                let end = matches!(arrival, Arrival::End(_));
                if tx.send(arrival).is_err() || end {
                    return;
                }
            }
        });
        Incoming {
            arrivals,
            acceptor,
            tuner,
            buffered,
        }
    }

    /// The next frame; `Ok(None)` once the peer closed the connection in order.
    pub async fn next(&mut self) -> Result<Option<Frame>> {
        match self.arrivals.recv().await {
            Some(Arrival::Frame(read)) => {
                let frame = read
                    .await
                    .map_err(|e| NetError::Connection(format!("reading task: {e}")))??;
                self.buffered.release(frame.payload.len());
                Ok(Some(frame))
            }
            Some(Arrival::End(end)) => end.map(|()| None),
            None => Ok(None),
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.acceptor.abort();
        if let Some(tuner) = &self.tuner {
            tuner.abort();
        }
    }
}

/// The window after a round trip that delivered `per_rtt` bytes: twice `window` (at most
/// [`MAX_WINDOW`]) where the path filled half of it or more, else none (unchanged).
fn grown_window(window: u64, per_rtt: f64) -> Option<u64> {
    (2.0 * per_rtt >= window as f64 && window < MAX_WINDOW).then(|| (2 * window).min(MAX_WINDOW))
}

/// Grows `conn`'s receive window while the task runs, where `link`'s windows are
/// [measured](Windows::Measured): doubled whenever a round trip delivered half of it, up to
/// [`MAX_WINDOW`]; [`Incoming`] does it for its
/// connection. Must be called inside a tokio runtime.
pub fn tune_window(conn: &Connection, link: &Link) -> Option<tokio::task::JoinHandle<()>> {
    (link.windows == Windows::Measured)
        .then(|| tokio::spawn(grow_window(conn.clone(), link.connection_window())))
}

/// Doubles `conn`'s receive window, from `window` up to [`MAX_WINDOW`], whenever the bytes
/// that arrived over the last two round trips, per round trip, reach half of it: a window
/// the path fills in a round trip is what holds the sender back. It never shrinks (the
/// data it lets in is read at once into frames, which [`Limits::max_buffered`] bounds).
async fn grow_window(conn: Connection, mut window: u64) {
    let mut seen = conn.stats().udp_rx.bytes;
    let mut since = std::time::Instant::now();
    while window < MAX_WINDOW && conn.close_reason().is_none() {
        let rtt = conn.rtt().max(Duration::from_millis(1));
        tokio::time::sleep((2 * rtt).max(Duration::from_millis(20))).await;
        let (bytes, now) = (conn.stats().udp_rx.bytes, std::time::Instant::now());
        let per_rtt = (bytes - seen) as f64 * rtt.as_secs_f64() / (now - since).as_secs_f64();
        (seen, since) = (bytes, now);
        if let Some(grown) = grown_window(window, per_rtt) {
            window = grown;
            conn.set_receive_window(VarInt::from_u64(window).expect("below 2^62"));
            follow_window(window);
            tracing::debug!(
                "receive window {window} bytes from {}: {per_rtt:.0} bytes a round trip of {rtt:?}",
                conn.remote_address()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Swarm;

    #[test]
    fn a_window_the_path_fills_doubles_up_to_the_cap() {
        // A path that delivers 3 MiB a round trip through a 4 MiB window is held back by it.
        assert_eq!(grown_window(4 << 20, 3.0 * (1 << 20) as f64), Some(8 << 20));
        // One that delivers 1 MiB is not: the window stays.
        assert_eq!(grown_window(4 << 20, (1 << 20) as f64), None);
        // From the start, a 10 MB path's window grows to 32 MiB and stops: 2 to 4 of its
        // bandwidth-delay products.
        let (mut w, bdp) = (START_WINDOW, 10e6_f64);
        while let Some(g) = grown_window(w, bdp.min(w as f64)) {
            w = g;
        }
        assert_eq!(w, 32 << 20);
        assert!((2.0 * bdp..=4.0 * bdp).contains(&(w as f64)));
        assert_eq!(grown_window(MAX_WINDOW / 2 + 1, 1e12), Some(MAX_WINDOW));
        assert_eq!(grown_window(MAX_WINDOW, 1e12), None);
    }
    use crate::wire::Kind;

    /// Many large frames in flight at once, far more than the connection window holds: a
    /// reader that drained one stream at a time would stall here for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn more_streams_in_flight_than_the_window_holds_all_arrive() {
        let swarm = Swarm::generate("t").unwrap();
        let (server, client) = (
            swarm.credentials("s", Role::Server { shard: 0 }).unwrap(),
            swarm.credentials("c", Role::Worker).unwrap(),
        );
        // The smallest windows murmur configures: 1 MiB per stream, 4 MiB per connection.
        let link = Link {
            bytes_per_second: 1e6,
            rtt: Duration::from_millis(1),
            windows: Windows::Stated,
            ..Link::default()
        };
        let (frames, size) = (24u64, 1_000_000usize);
        let limits = Limits {
            max_payload: size,
            ..Limits::default()
        };
        let listener = server_endpoint("127.0.0.1:0".parse().unwrap(), &server, &link).unwrap();
        let addr = listener.local_addr().unwrap();
        let received = tokio::spawn(async move {
            let conn = listener.accept().await.unwrap().await.unwrap();
            let mut incoming = Incoming::new(conn, limits, &link);
            let mut keys = Vec::new();
            for _ in 0..frames {
                let f = incoming
                    .next()
                    .await
                    .unwrap()
                    .expect("all frames before the close");
                assert!(f.payload.iter().all(|&b| b == f.key as u8));
                keys.push(f.key);
            }
            keys
        });
        let endpoint = client_endpoint(&client, &link).unwrap();
        let conn = connect(&endpoint, addr).await.unwrap();
        let sends: Vec<_> = (0..frames)
            .map(|key| {
                let conn = conn.clone();
                let frame = Frame::new(Kind::Push, 0, key, 0, 0, vec![key as u8; size]);
                tokio::spawn(async move { send(&conn, frame).await })
            })
            .collect();
        let all_sent = async {
            for s in sends {
                s.await.unwrap().unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(30), all_sent)
            .await
            .expect("the sender stalled on flow control");
        let mut keys = tokio::time::timeout(Duration::from_secs(30), received)
            .await
            .expect("the reader stalled")
            .unwrap();
        conn.close(VarInt::from_u32(close::DONE), b"done");
        keys.sort_unstable();
        assert_eq!(keys, (0..frames).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frame_longer_than_its_header_announces_is_refused() {
        let swarm = Swarm::generate("t").unwrap();
        let (server, client) = (
            swarm.credentials("s", Role::Server { shard: 0 }).unwrap(),
            swarm.credentials("c", Role::Worker).unwrap(),
        );
        let link = Link::default();
        let listener = server_endpoint("127.0.0.1:0".parse().unwrap(), &server, &link).unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let conn = listener.accept().await.unwrap().await.unwrap();
            let first = receive(&conn, &Limits::default()).await;
            let second = receive(&conn, &Limits::default()).await;
            (first, second)
        });
        let endpoint = client_endpoint(&client, &link).unwrap();
        let conn = connect(&endpoint, addr).await.unwrap();
        let frame = Frame::new(Kind::Push, 0, 7, 0, 1, vec![1, 2, 3, 4]);
        let mut long = frame.encode();
        long.push(0);
        send_bytes(&conn, long.into()).await.unwrap();
        send(&conn, frame.clone()).await.unwrap();
        let (first, second) = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .unwrap()
            .unwrap();
        let err = first.unwrap_err().to_string();
        assert!(err.contains("more bytes follow"), "{err}");
        assert_eq!(second.unwrap().unwrap(), frame);
    }

    /// A peer that sends frames faster than they are handled: the frames that fit in
    /// `max_buffered` come out in order, then a protocol error, and the reader never holds
    /// more than the limit. Handled promptly, the same frames all pass.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_sent_faster_than_handled_cost_the_connection_past_the_limit() {
        let swarm = Swarm::generate("t").unwrap();
        let (server, client) = (
            swarm.credentials("s", Role::Server { shard: 0 }).unwrap(),
            swarm.credentials("c", Role::Worker).unwrap(),
        );
        let link = Link::default();
        let (frames, size) = (12u64, 100_000usize);
        let limits = Limits {
            max_payload: size,
            max_buffered: 3 * size + size / 2,
            ..Limits::default()
        };
        for handled_promptly in [true, false] {
            let listener = server_endpoint("127.0.0.1:0".parse().unwrap(), &server, &link).unwrap();
            let addr = listener.local_addr().unwrap();
            let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
            let (handled_tx, mut handled_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            let reader = tokio::spawn(async move {
                let conn = listener.accept().await.unwrap().await.unwrap();
                let mut incoming = Incoming::new(conn, limits, &link);
                let mut keys = Vec::new();
                if !handled_promptly {
                    // Everything arrives (or is refused) before the first frame is handled.
                    let _ = sent_rx.await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let held = incoming.buffered.bytes.load(Ordering::Relaxed);
                    assert!(held <= limits.max_buffered, "{held} bytes held");
                }
                loop {
                    match incoming.next().await {
                        Ok(Some(f)) => {
                            keys.push(f.key);
                            let _ = handled_tx.send(());
                        }
                        Ok(None) => {
                            // Every frame handed out gave its bytes back.
                            let held = incoming.buffered.bytes.load(Ordering::Relaxed);
                            assert_eq!(held, 0);
                            return (keys, None);
                        }
                        Err(e) => return (keys, Some(e)),
                    }
                }
            });
            let endpoint = client_endpoint(&client, &link).unwrap();
            let conn = connect(&endpoint, addr).await.unwrap();
            // Promptly handled, the peer sends three frames at a time (what fits), the next
            // three once those were handled, as an honest peer sends a round, then waits.
            for key in 0..frames {
                if handled_promptly && key >= 3 {
                    handled_rx.recv().await.expect("the reader handled a frame");
                }
                let frame = Frame::new(Kind::Push, 0, key, 0, 0, vec![key as u8; size]);
                if send(&conn, frame).await.is_err() {
                    break;
                }
            }
            let _ = sent_tx.send(());
            if handled_promptly {
                for _ in 0..3 {
                    handled_rx.recv().await.expect("the reader handled a frame");
                }
            }
            conn.close(VarInt::from_u32(close::DONE), b"done");
            let (keys, error) = tokio::time::timeout(Duration::from_secs(30), reader)
                .await
                .expect("the reader stalled")
                .unwrap();
            if handled_promptly {
                assert!(error.is_none(), "{error:?}");
                assert_eq!(keys, (0..frames).collect::<Vec<_>>());
            } else {
                let error = error
                    .expect("a flood past the limit is an error")
                    .to_string();
                assert!(error.contains("faster than it is served"), "{error}");
                assert!(keys.len() <= 3, "{keys:?}");
                assert_eq!(keys, (0..keys.len() as u64).collect::<Vec<_>>());
            }
        }
    }
}
