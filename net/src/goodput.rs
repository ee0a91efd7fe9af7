//! Goodput over a [`ShapedPath`]: application payload bytes per second that one sender moves
//! to one receiver, for murmur's QUIC (with a chosen congestion controller, through the
//! windows [`Link::transport`] configures) and for the kernel's TCP (with a chosen
//! congestion control) over the same path, so that the two are compared on one link.
//!
//! The sender keeps the path full for the whole measurement: QUIC as murmur's nodes do, one
//! stream per message with several messages in flight; TCP as one connection written back
//! to back. The receiver counts the payload it reads; the figure is the rate of the count
//! over a window that starts `warmup` after the first byte (slow start and the first losses
//! are not the steady rate), beside the count since the first byte.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::{NetError, Result};
use crate::identity::Credentials;
use crate::shaped_path::{ShapedPath, ADDR_A, ADDR_B};
use crate::transport::{self, Link};
use crate::wire::{Frame, Kind};

/// Bytes of each message the TCP sender writes.
const MESSAGE: usize = 1 << 20;
/// Payload bytes of each QUIC frame (a quarter of a default partition).
const FRAME: usize = 256 << 10;
/// QUIC frames (streams) in flight at once, as a parameter server's partitions are: 8 MiB,
/// more than the largest path of the matrix holds (200 Mbit/s over 150 ms, 3.75 MB).
const QUIC_IN_FLIGHT: usize = 32;
/// The longest the first byte may take (a handshake over a bad path).
const FIRST_BYTE: Duration = Duration::from_secs(20);

/// What one measurement found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Goodput {
    /// Payload bytes per second over the window after the warm-up.
    pub steady: f64,
    /// Payload bytes per second from the first byte to the window's end.
    pub whole: f64,
}

/// How long to measure.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Left out after the first byte.
    pub warmup: Duration,
    /// Counted.
    pub measure: Duration,
}

/// Reads the receivers' counts at the window's edges, once every flow has delivered a
/// byte; the window starts `warmup` after the last flow's first byte.
async fn sample(received: &[&AtomicU64], window: Window) -> Result<Vec<Goodput>> {
    let asked = Instant::now();
    let mut first = vec![None; received.len()];
    while first.iter().any(Option::is_none) {
        for (f, r) in first.iter_mut().zip(received) {
            if f.is_none() && r.load(Relaxed) > 0 {
                *f = Some(Instant::now());
            }
        }
        if asked.elapsed() > FIRST_BYTE {
            return Err(NetError::Timeout(format!(
                "no byte crossed the path in {FIRST_BYTE:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(window.warmup).await;
    // Counts every few milliseconds through the window, and the steady rate is their
    // least-squares slope rather than the difference of the two edge counts: a shaper or
    // reader held off the CPU for a few tens of milliseconds at an edge (a loaded 2-core
    // machine) hands over a burst that the edge difference counts as rate, up to 4% of a
    // 2-second window at 20 Mbit/s; the slope weighs such a step by how short it is.
    let t0 = Instant::now();
    let mut samples: Vec<(f64, Vec<u64>)> = Vec::new();
    loop {
        let counts = received.iter().map(|r| r.load(Relaxed)).collect();
        let at = t0.elapsed();
        samples.push((at.as_secs_f64(), counts));
        if at >= window.measure {
            break;
        }
        tokio::time::sleep(SAMPLE_EVERY.min(window.measure - at)).await;
    }
    let (end, last) = samples.last().expect("the loop samples at least once");
    let end = t0 + Duration::from_secs_f64(*end);
    Ok((0..received.len())
        .map(|i| Goodput {
            steady: slope(samples.iter().map(|(t, c)| (*t, c[i] as f64))),
            whole: last[i] as f64 / (end - first[i].expect("every flow started")).as_secs_f64(),
        })
        .collect())
}

/// How often [`sample`] reads the counts through its window.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The least-squares slope of `points` (x, y); 0 for fewer than two distinct x.
fn slope(points: impl Iterator<Item = (f64, f64)> + Clone) -> f64 {
    let n = points.clone().count() as f64;
    let (mx, my) = points
        .clone()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x / n, sy + y / n));
    let (sxy, sxx) = points.fold((0.0, 0.0), |(sxy, sxx), (x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
    });
    if sxx > 0.0 {
        sxy / sxx
    } else {
        0.0
    }
}

/// murmur's QUIC from end A to end B of `path`, both ends configured for `link` (its
/// congestion controller and windows, grown as [`crate::transport::Incoming`] grows them):
/// frames of 256 KiB, each on a stream of its own, 32 at a time.
/// The receiver counts stream bytes as they arrive (a frame's 32-byte header among them,
/// 0.01% of it), so that frames still partly in flight at a window's edge count for what
/// has arrived.
pub async fn quic(
    path: &ShapedPath,
    link: &Link,
    server: &Credentials,
    client: &Credentials,
    window: Window,
) -> Result<Goodput> {
    let flow = QuicFlow::start(path, link, server, client).await?;
    let measured = sample(&[&flow.received], window).await;
    flow.stop().await;
    Ok(measured?[0])
}

/// The kernel's TCP from end A to end B of `path`, the sender's congestion control set to
/// `congestion` (a name the kernel offers: net.ipv4.tcp_available_congestion_control).
pub async fn tcp(path: &ShapedPath, congestion: &str, window: Window) -> Result<Goodput> {
    let flow = TcpFlow::start(path, congestion)?;
    let measured = sample(&[&flow.received], window).await;
    flow.stop();
    Ok(measured?[0])
}

/// murmur's QUIC and the kernel's TCP from A to B at once, sharing the path: what each
/// gets of it (QUIC first). A fair pair gets about half each.
pub async fn quic_beside_tcp(
    path: &ShapedPath,
    link: &Link,
    server: &Credentials,
    client: &Credentials,
    congestion: &str,
    window: Window,
) -> Result<(Goodput, Goodput)> {
    let quic = QuicFlow::start(path, link, server, client).await?;
    let tcp = match TcpFlow::start(path, congestion) {
        Ok(tcp) => tcp,
        Err(e) => {
            quic.stop().await;
            return Err(e);
        }
    };
    let measured = sample(&[&quic.received, &tcp.received], window).await;
    tcp.stop();
    quic.stop().await;
    let m = measured?;
    Ok((m[0], m[1]))
}

/// A QUIC sender and receiver keeping the path full.
struct QuicFlow {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sender: quinn::Endpoint,
    receiver: quinn::Endpoint,
    conn: quinn::Connection,
    writers: tokio::task::JoinSet<()>,
    reading: tokio::task::JoinHandle<()>,
}

impl QuicFlow {
    async fn start(
        path: &ShapedPath,
        link: &Link,
        server: &Credentials,
        client: &Credentials,
    ) -> Result<QuicFlow> {
        let b =
            path.in_b(|| transport::bind_udp(SocketAddr::V4(SocketAddrV4::new(ADDR_B, 0))))??;
        let a =
            path.in_a(|| transport::bind_udp(SocketAddr::V4(SocketAddrV4::new(ADDR_A, 0))))??;
        let receiver = transport::server_endpoint_on(b, server, link)?;
        let sender = transport::client_endpoint_on(a, client, link)?;
        let to = receiver.local_addr()?;
        let received = Arc::new(AtomicU64::new(0));

        let (count, accepting, link_copy) = (received.clone(), receiver.clone(), *link);
        let reading = tokio::spawn(async move {
            let Some(incoming) = accepting.accept().await else {
                return;
            };
            let Ok(conn) = incoming.await else { return };
            // A peer the node has checked gets the link's windows, as a server's workers do.
            transport::admit(&conn, &link_copy);
            let _tuner = transport::tune_window(&conn, &link_copy);
            let mut readers = tokio::task::JoinSet::new();
            while let Ok(mut stream) = conn.accept_uni().await {
                let count = count.clone();
                readers.spawn(async move {
                    while let Ok(Some(chunk)) = stream.read_chunk(usize::MAX, false).await {
                        count.fetch_add(chunk.bytes.len() as u64, Relaxed);
                    }
                });
            }
        });

        let conn = transport::connect(&sender, to).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let frame = Bytes::from(
            Frame::new(Kind::Push, 0, 0, 0, (FRAME / 4) as u32, vec![0x5A; FRAME]).encode(),
        );
        let mut writers = tokio::task::JoinSet::new();
        for _ in 0..QUIC_IN_FLIGHT {
            let (conn, stop, frame) = (conn.clone(), stop.clone(), frame.clone());
            writers.spawn(async move {
                while !stop.load(Relaxed) {
                    // A frame counts as in flight until the receiver has all of it: quinn
                    // takes a write as soon as it is buffered.
                    let Ok(mut stream) = conn.open_uni().await else {
                        return;
                    };
                    if stream.write_chunk(frame.clone()).await.is_err()
                        || stream.finish().is_err()
                        || stream.stopped().await.is_err()
                    {
                        return;
                    }
                }
            });
        }
        Ok(QuicFlow {
            received,
            stop,
            sender,
            receiver,
            conn,
            writers,
            reading,
        })
    }

    async fn stop(mut self) {
        self.stop.store(true, Relaxed);
        self.writers.abort_all();
        self.conn.close(0u32.into(), b"measured");
        self.reading.abort();
        // Both ends say goodbye before the path goes away under them.
        self.sender.close(0u32.into(), b"measured");
        self.receiver.close(0u32.into(), b"measured");
        let idle = async { tokio::join!(self.sender.wait_idle(), self.receiver.wait_idle()) };
        let _ = tokio::time::timeout(Duration::from_secs(2), idle).await;
    }
}

/// A kernel TCP connection written back to back by one thread and read by another.
struct TcpFlow {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    stream: std::net::TcpStream,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl TcpFlow {
    fn start(path: &ShapedPath, congestion: &str) -> Result<TcpFlow> {
        use std::io::{Read, Write};
        let listener = path.in_b(|| std::net::TcpListener::bind((ADDR_B, 0)))??;
        let to = listener.local_addr()?;
        let ca = congestion.to_owned();
        let stream = path.in_a(move || -> Result<std::net::TcpStream> {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.set_tcp_congestion(ca.as_bytes()).map_err(|e| {
                NetError::Connection(format!(
                    "the kernel offers no TCP congestion control {ca:?}: {e}"
                ))
            })?;
            socket.connect(&to.into())?;
            Ok(socket.into())
        })??;
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let timed_out = |e: &std::io::Error| {
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        };

        let (count, reader_stop) = (received.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
            let mut buf = vec![0u8; 1 << 16];
            while !reader_stop.load(Relaxed) {
                match conn.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        count.fetch_add(n as u64, Relaxed);
                    }
                    Err(e) if timed_out(&e) => {}
                    Err(_) => return,
                }
            }
        });
        let writer_stop = stop.clone();
        let mut out = stream.try_clone()?;
        let writer = std::thread::spawn(move || {
            let _ = out.set_write_timeout(Some(Duration::from_millis(100)));
            let message = vec![0x5Au8; MESSAGE];
            while !writer_stop.load(Relaxed) {
                match out.write(&message) {
                    Ok(_) => {}
                    Err(e) if timed_out(&e) => {}
                    Err(_) => return,
                }
            }
        });
        Ok(TcpFlow {
            received,
            stop,
            stream,
            threads: vec![reader, writer],
        })
    }

    fn stop(self) {
        self.stop.store(true, Relaxed);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn a_burst_after_a_stall_at_the_window_edge_barely_moves_the_slope() {
        // 2.5 MB/s sampled every 10 ms for 2 s; the shaper is held off the CPU from 40 ms
        // before the window to 40 ms into it, then hands its backlog over at once.
        let rate = 2.5e6;
        let points: Vec<(f64, f64)> = (0..=200)
            .map(|i| {
                let t = i as f64 * 0.01;
                let got = rate * if t < 0.04 { -0.04 } else { t };
                (t, got)
            })
            .collect();
        let edges = (points[200].1 - points[0].1) / 2.0;
        let fitted = slope(points.iter().copied());
        assert!(edges / rate > 1.019, "the edge difference reads {edges}");
        assert!(
            (fitted / rate - 1.0).abs() < 0.005,
            "the slope reads {fitted}"
        );
        assert_eq!(slope([(1.0, 5.0)].into_iter()), 0.0);
    }
}
