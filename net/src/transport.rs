//! QUIC endpoints tuned for bulk tensors: flow-control windows sized from the link's
//! bandwidth-delay product, UDP socket buffers of at least 2 MiB, many concurrent
//! unidirectional streams (one per message, so partitions never block each other) and
//! datagrams for heartbeats only. Every message is a [`Frame`] on its own stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    Connection, Endpoint, EndpointConfig, IdleTimeout, TokioRuntime, TransportConfig, VarInt,
};

use crate::error::{NetError, Result};
use crate::identity::{fingerprint, Credentials};
use crate::tls::{client_tls, server_tls};
use crate::wire::{Frame, Limits};

/// What the link between peers can carry; windows are sized to hold a round trip's data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub bytes_per_second: f64,
    pub rtt: Duration,
}

impl Default for Link {
    /// 1 Gbit/s with 50 ms round trips: a generous internet path.
    fn default() -> Self {
        Link {
            bytes_per_second: 125e6,
            rtt: Duration::from_millis(50),
        }
    }
}

/// Smallest UDP socket buffer murmur asks for.
pub const SOCKET_BUFFER: usize = 2 << 20;

impl Link {
    pub fn bdp(&self) -> u64 {
        (self.bytes_per_second * self.rtt.as_secs_f64()) as u64
    }

    pub fn transport(&self) -> TransportConfig {
        let bdp = self.bdp();
        // A stream may fill the pipe alone; the connection holds two pipes' worth.
        let stream = bdp.clamp(1 << 20, 1 << 30);
        let conn = (2 * bdp).clamp(4 << 20, 1 << 31);
        let mut t = TransportConfig::default();
        t.stream_receive_window(VarInt::from_u64(stream).expect("below 2^62"))
            .receive_window(VarInt::from_u64(conn).expect("below 2^62"))
            .send_window(conn)
            .max_concurrent_uni_streams(VarInt::from_u32(4096))
            .max_concurrent_bidi_streams(VarInt::from_u32(0))
            .initial_rtt(self.rtt)
            .keep_alive_interval(Some(Duration::from_secs(5)))
            .max_idle_timeout(Some(
                IdleTimeout::try_from(Duration::from_secs(60)).expect("valid"),
            ))
            .datagram_receive_buffer_size(Some(64 << 10));
        t
    }
}

fn conn_err(e: impl std::fmt::Display) -> NetError {
    NetError::Connection(e.to_string())
}

/// A UDP socket with large buffers (the kernel may cap them at net.core.*mem_max).
fn udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER.max(4 << 20));
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER.max(4 << 20));
    let (r, s) = (socket.recv_buffer_size()?, socket.send_buffer_size()?);
    if r < SOCKET_BUFFER || s < SOCKET_BUFFER {
        tracing::warn!("UDP buffers capped by the kernel at {r} / {s} bytes (want {SOCKET_BUFFER}); raise net.core.rmem_max and wmem_max for fast links");
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// An endpoint that accepts swarm peers on `addr` (and can also connect out).
pub fn server_endpoint(addr: SocketAddr, creds: &Credentials, link: &Link) -> Result<Endpoint> {
    let crypto = QuicServerConfig::try_from(server_tls(creds)?).map_err(conn_err)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(Arc::new(link.transport()));
    let mut endpoint = Endpoint::new(
        EndpointConfig::default(),
        Some(cfg),
        udp_socket(addr)?,
        Arc::new(TokioRuntime),
    )?;
    endpoint.set_default_client_config(client_config(creds, link)?);
    Ok(endpoint)
}

/// An endpoint that only connects out.
pub fn client_endpoint(creds: &Credentials, link: &Link) -> Result<Endpoint> {
    let any: SocketAddr = "0.0.0.0:0".parse().expect("valid");
    let mut endpoint = Endpoint::new(
        EndpointConfig::default(),
        None,
        udp_socket(any)?,
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

/// The fingerprint of the peer's key.
pub fn peer_fingerprint(conn: &Connection) -> String {
    conn.peer_identity()
        .and_then(|id| {
            id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .and_then(|certs| certs.first().map(fingerprint))
        .unwrap_or_else(|| "unknown".into())
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
}

/// Closes a connection with a code from [`close`] and a reason the peer will see and log.
pub fn hang_up(conn: &Connection, code: u32, reason: &str) {
    // A close frame must fit in one packet.
    let reason: String = reason.chars().take(400).collect();
    conn.close(VarInt::from_u32(code), reason.as_bytes());
}

/// Sends one frame on a stream of its own.
pub async fn send(conn: &Connection, frame: &Frame) -> Result<()> {
    send_bytes(conn, &frame.encode()).await
}

/// Sends an encoded frame on a stream of its own (the server encodes a reply once and sends
/// the same bytes to every worker).
pub async fn send_bytes(conn: &Connection, bytes: &[u8]) -> Result<()> {
    let mut stream = conn.open_uni().await.map_err(conn_err)?;
    stream.write_all(bytes).await.map_err(conn_err)?;
    stream.finish().map_err(conn_err)?;
    Ok(())
}

/// Receives the next frame the peer sent; `Ok(None)` when the connection closed in order.
pub async fn receive(conn: &Connection, limits: &Limits) -> Result<Option<Frame>> {
    let mut stream = match conn.accept_uni().await {
        Ok(s) => s,
        Err(quinn::ConnectionError::LocallyClosed) => return Ok(None),
        Err(quinn::ConnectionError::ApplicationClosed(c))
            if c.error_code == VarInt::from_u32(close::DONE) =>
        {
            return Ok(None)
        }
        Err(quinn::ConnectionError::ApplicationClosed(c)) => {
            return Err(NetError::Connection(format!(
                "the peer closed the connection: {}",
                String::from_utf8_lossy(&c.reason)
            )))
        }
        Err(e) => return Err(conn_err(e)),
    };
    let bytes = stream
        .read_to_end(limits.max_frame())
        .await
        .map_err(|e| NetError::Wire(format!("reading a frame: {e}")))?;
    Frame::decode(&bytes, limits).map(Some)
}
