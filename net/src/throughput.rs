//! Push/pull throughput of murmur's QUIC transport beside TLS over TCP (tokio-rustls) and
//! plain TCP, moving the same frames in the same run: a client pushes `frames` frames to an
//! echo server, which sends each one back as soon as it has it; the time is from the first
//! byte pushed to the last byte pulled. QUIC sends each frame on a stream of its own, as the
//! parameter servers do; the TCP transports write frames back to back on one connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::{NetError, Result};
use crate::identity::Credentials;
use crate::tls::{client_tls, server_tls};
use crate::transport::{
    client_endpoint, connect, send, send_bytes, server_endpoint, Incoming, Link, Windows,
};
use crate::wire::{Frame, Header, Kind, Limits, HEADER};

/// The transport a throughput measurement moves its frames over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Murmur's own transport: QUIC through quinn, one stream per frame.
    Quic,
    /// TLS 1.3 over a single TCP connection (tokio-rustls), frames written back to back.
    TlsTcp,
    /// Plain TCP without encryption, frames written back to back, as a baseline.
    Tcp,
}

impl Transport {
    /// A human-readable name of the transport and the library behind it, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Quic => "QUIC (quinn)",
            Transport::TlsTcp => "TLS 1.3 over TCP (tokio-rustls)",
            Transport::Tcp => "plain TCP",
        }
    }
}

/// What one measurement moves.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Frames the client pushes, each of which the server echoes back.
    pub frames: usize,
    /// Payload bytes of each frame, not counting its 32-byte header.
    pub frame_bytes: usize,
    /// QUIC streams in flight at once.
    pub in_flight: usize,
}

impl Workload {
    /// Bytes moved both ways.
    pub fn bytes(&self) -> usize {
        2 * self.frames * (HEADER + self.frame_bytes)
    }
}

fn frame(i: usize, bytes: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..bytes).map(|j| (i + j) as u8).collect();
    Frame::new(Kind::Push, 0, i as u64, 0, (bytes / 4) as u32, payload).encode()
}

fn limits(w: &Workload) -> Limits {
    Limits {
        max_payload: w.frame_bytes,
        ..Limits::default()
    }
}

/// Time to push the workload through an echo server on loopback and pull it back.
pub async fn measure(
    transport: Transport,
    w: Workload,
    server: &Credentials,
    client: &Credentials,
) -> Result<Duration> {
    match transport {
        Transport::Quic => quic(w, server, client).await,
        Transport::TlsTcp | Transport::Tcp => tcp(transport, w, server, client).await,
    }
}

async fn quic(w: Workload, server: &Credentials, client: &Credentials) -> Result<Duration> {
    // A loopback "link": fast and short, so the windows are the defaults' floor.
    let link = Link {
        bytes_per_second: 10e9,
        rtt: Duration::from_millis(1),
        windows: Windows::Stated,
        ..Link::default()
    };
    let lim = limits(&w);
    let listener = server_endpoint("127.0.0.1:0".parse().expect("valid"), server, &link)?;
    let addr = listener.local_addr()?;
    let echo = tokio::spawn(async move {
        let conn = listener
            .accept()
            .await
            .ok_or_else(|| NetError::Connection("no client".into()))?
            .await
            .map_err(|e| NetError::Connection(e.to_string()))?;
        let mut incoming = Incoming::new(conn.clone(), lim, &link);
        while let Some(f) = incoming.next().await? {
            let conn = conn.clone();
            tokio::spawn(async move { send(&conn, f).await });
        }
        Ok::<_, NetError>(())
    });
    let endpoint = client_endpoint(client, &link)?;
    let conn = connect(&endpoint, addr).await?;
    let frames: Vec<Bytes> = (0..w.frames)
        .map(|i| Bytes::from(frame(i, w.frame_bytes)))
        .collect();
    let started = Instant::now();
    let reader = {
        let conn = conn.clone();
        tokio::spawn(async move {
            let mut incoming = Incoming::new(conn, lim, &link);
            for _ in 0..w.frames {
                incoming
                    .next()
                    .await?
                    .ok_or_else(|| NetError::Connection("echo closed early".into()))?;
            }
            Ok::<_, NetError>(())
        })
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(w.in_flight.max(1)));
    for f in frames {
        let permit = permits.clone().acquire_owned().await.expect("open");
        let conn = conn.clone();
        tokio::spawn(async move {
            let sent = send_bytes(&conn, f).await;
            drop(permit);
            sent
        });
    }
    reader
        .await
        .map_err(|e| NetError::Connection(e.to_string()))??;
    let took = started.elapsed();
    conn.close(0u32.into(), b"done");
    echo.abort();
    Ok(took)
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, lim: &Limits) -> Result<Option<Frame>> {
    let mut head = [0u8; HEADER];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let header = Header::decode(&head, lim)?;
    let mut payload = vec![0u8; header.len];
    r.read_exact(&mut payload).await?;
    header.with_payload(payload).map(Some)
}

/// Echoes frames on one stream until it ends.
async fn echo_stream<S: AsyncRead + AsyncWrite + Unpin>(stream: S, lim: Limits) -> Result<()> {
    let (mut r, mut wr) = tokio::io::split(stream);
    while let Some(f) = read_frame(&mut r, &lim).await? {
        wr.write_all(&f.header().encode()).await?;
        wr.write_all(&f.payload).await?;
    }
    wr.shutdown().await?;
    Ok(())
}

async fn run_client<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    w: Workload,
) -> Result<Duration> {
    let lim = limits(&w);
    let frames: Vec<Vec<u8>> = (0..w.frames).map(|i| frame(i, w.frame_bytes)).collect();
    let (mut r, mut wr) = tokio::io::split(stream);
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        for f in frames {
            wr.write_all(&f).await?;
        }
        wr.flush().await?;
        Ok::<_, NetError>(wr)
    });
    for _ in 0..w.frames {
        read_frame(&mut r, &lim)
            .await?
            .ok_or_else(|| NetError::Connection("echo closed early".into()))?;
    }
    let took = started.elapsed();
    let _ = writer.await;
    Ok(took)
}

fn tcp_socket_options(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true)?;
    crate::transport::request_socket_buffers(socket2::SockRef::from(s));
    Ok(())
}

async fn tcp(
    transport: Transport,
    w: Workload,
    server: &Credentials,
    client: &Credentials,
) -> Result<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let lim = limits(&w);
    let tls = transport == Transport::TlsTcp;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_tls(server)?));
    let echo = tokio::spawn(async move {
        let (s, _) = listener.accept().await?;
        tcp_socket_options(&s)?;
        if tls {
            let s = acceptor.accept(s).await?;
            echo_stream(s, lim).await
        } else {
            echo_stream(s, lim).await
        }
    });
    let s = TcpStream::connect(addr).await?;
    tcp_socket_options(&s)?;
    let took = if tls {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls(client)?));
        let name = rustls::pki_types::ServerName::try_from(crate::identity::NODE_NAME)
            .map_err(|e| NetError::Identity(e.to_string()))?;
        let s = connector.connect(name, s).await?;
        run_client(s, w).await?
    } else {
        run_client(s, w).await?
    };
    echo.abort();
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Role, Swarm};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_transport_moves_the_whole_workload() {
        let swarm = Swarm::generate("bench").unwrap();
        let (server, client) = (
            swarm.credentials("s", Role::Server { shard: 0 }).unwrap(),
            swarm.credentials("c", Role::Worker).unwrap(),
        );
        let w = Workload {
            frames: 12,
            frame_bytes: 100_003,
            in_flight: 4,
        };
        for t in [Transport::Quic, Transport::TlsTcp, Transport::Tcp] {
            let took =
                tokio::time::timeout(Duration::from_secs(20), measure(t, w, &server, &client))
                    .await
                    .unwrap_or_else(|_| panic!("{} stalled", t.name()))
                    .unwrap();
            assert!(took > Duration::ZERO);
        }
    }
}
