//! A UDP relay that makes a link worse on purpose: a fixed one-way delay, a rate limit with a
//! drop-tail queue, and random loss, in each direction. QUIC peers talk through it to see how
//! murmur behaves on an internet path without leaving the machine (`tc netem` is not available
//! on every machine; `tbf` and `htb` shape rate only).
//!
//! Every client address gets an upstream socket of its own, so the target sees one peer per
//! client. Packets leave in arrival order: each direction is a FIFO whose departure times are
//! `max(arrival, previous departure) + size / rate + delay`; a packet that would wait in the
//! queue longer than `queue` is dropped, as a router's buffer would.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Result;
use crate::shape::{Schedule, Shape};

/// Packets dropped and forwarded, for reports.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Packets the relay has passed on, in both directions together.
    pub forwarded: std::sync::atomic::AtomicU64,
    /// Packets the relay has dropped, to random loss or to a full queue, in both directions
    /// together.
    pub dropped: std::sync::atomic::AtomicU64,
}

/// One direction of the link: a [`Schedule`] and the task that delivers its packets.
struct Pipe {
    schedule: Schedule,
    out: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    stats: Arc<RelayStats>,
}

impl Pipe {
    /// Starts a pipe that delivers into `socket` towards `to`.
    fn start(shape: Shape, socket: Arc<UdpSocket>, to: SocketAddr, stats: Arc<RelayStats>) -> Pipe {
        let (out, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        tokio::spawn(async move {
            while let Some((due, packet)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                let _ = socket.send_to(&packet, to).await;
            }
        });
        Pipe {
            schedule: Schedule::new(shape),
            out,
            stats,
        }
    }

    fn push(&mut self, packet: Vec<u8>) {
        use std::sync::atomic::Ordering::Relaxed;
        match self.schedule.admit(std::time::Instant::now(), packet.len()) {
            Some(due) => {
                self.stats.forwarded.fetch_add(1, Relaxed);
                let _ = self.out.send((Instant::from_std(due), packet));
            }
            None => {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Relays UDP between clients of `listen` and `target` with `shape` applied both ways, until
/// the task is dropped. Returns the bound address through `bound` as soon as it is known.
pub async fn run_relay(
    listen: SocketAddr,
    target: SocketAddr,
    shape: Shape,
    stats: Arc<RelayStats>,
    bound: tokio::sync::oneshot::Sender<SocketAddr>,
) -> Result<()> {
    let front = Arc::new(UdpSocket::bind(listen).await?);
    let _ = bound.send(front.local_addr()?);
    let mut clients: HashMap<SocketAddr, Pipe> = HashMap::new();
    // The readers of the target's replies end with the relay (dropping the set aborts them).
    let mut readers = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = front.recv_from(&mut buf).await?;
        let pipe = match clients.entry(from) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let upstream = Arc::new(UdpSocket::bind(unspecified_like(target)).await?);
                // Replies from the target go back to this client through the front socket.
                let mut back = Pipe::start(
                    Shape {
                        seed: shape.seed ^ 0xBACC,
                        ..shape
                    },
                    front.clone(),
                    from,
                    stats.clone(),
                );
                let reader = upstream.clone();
                readers.spawn(async move {
                    let mut buf = vec![0u8; 65_536];
                    while let Ok((n, _)) = reader.recv_from(&mut buf).await {
                        back.push(buf[..n].to_vec());
                    }
                });
                e.insert(Pipe::start(shape, upstream, target, stats.clone()))
            }
        };
        pipe.push(buf[..n].to_vec());
    }
}

fn unspecified_like(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(a) if a.ip().is_loopback() => "127.0.0.1:0".parse().expect("valid"),
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("valid"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("valid"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn start(shape: Shape) -> (UdpSocket, UdpSocket, SocketAddr, Arc<RelayStats>) {
        let target = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let stats = Arc::new(RelayStats::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let to = target.local_addr().unwrap();
        tokio::spawn(run_relay(
            "127.0.0.1:0".parse().unwrap(),
            to,
            shape,
            stats.clone(),
            tx,
        ));
        let relay = rx.await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        (client, target, relay, stats)
    }

    #[tokio::test]
    async fn the_relay_delays_both_ways_and_paces_to_the_rate() {
        let shape = Shape {
            delay: Duration::from_millis(30),
            rate: 100e3,
            queue: Duration::from_secs(1),
            ..Shape::default()
        };
        let (client, target, relay, _) = start(shape).await;
        let mut buf = [0u8; 2000];
        let sent = Instant::now();
        for _ in 0..5 {
            client.send_to(&[7u8; 1000], relay).await.unwrap();
        }
        let mut from = None;
        for _ in 0..5 {
            let (n, f) = target.recv_from(&mut buf).await.unwrap();
            assert_eq!(n, 1000);
            from = Some(f);
        }
        let took = sent.elapsed();
        // Five packets of 10 ms each on a 100 kB/s wire, then 30 ms of delay.
        assert!(took >= Duration::from_millis(80), "{took:?}");
        let back = Instant::now();
        target.send_to(&[1u8; 10], from.unwrap()).await.unwrap();
        let (n, _) = client.recv_from(&mut buf).await.unwrap();
        assert_eq!(n, 10);
        assert!(back.elapsed() >= Duration::from_millis(30));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_loss_drops_its_share() {
        let shape = Shape {
            rate: 100e3,
            queue: Duration::from_millis(20),
            ..Shape::default()
        };
        let (client, _target, relay, stats) = start(shape).await;
        for _ in 0..50 {
            client.send_to(&[0u8; 1000], relay).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let dropped = stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            dropped >= 30,
            "a 20 ms queue at 100 kB/s holds about 3 packets; dropped {dropped} of 50"
        );

        let shape = Shape {
            loss: 0.3,
            ..Shape::default()
        };
        let (client, _target, relay, stats) = start(shape).await;
        for _ in 0..1000 {
            client.send_to(&[0u8; 10], relay).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let dropped = stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            (240..=360).contains(&dropped),
            "30% loss dropped {dropped} of 1000"
        );
    }
}
