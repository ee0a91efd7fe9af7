//! `murmur relay`: forwards UDP (a QUIC link) to a target while adding delay, a rate limit
//! and loss in each direction, so a swarm can be tried on a bad internet path on one machine.
//! `scripts/shaped-swarm.sh` puts it between workers and servers.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use murmur_net::relay::{run_relay, RelayStats};
use murmur_net::shape::Shape;

#[derive(Args, Debug)]
pub struct RelayArgs {
    /// Address the relay listens on; clients connect here instead of to the target.
    #[arg(long)]
    listen: SocketAddr,
    /// Where packets go (a `murmur server`).
    #[arg(long)]
    forward: SocketAddr,
    /// One-way delay added in each direction, in milliseconds (the round trip grows by twice).
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Rate limit of each direction in Mbit/s (0: none).
    #[arg(long, default_value_t = 0.0)]
    mbit: f64,
    /// Probability that a packet is lost, in each direction.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Longest a packet may queue for the rate limit before it is dropped, in milliseconds.
    #[arg(long, default_value_t = 50.0)]
    queue_ms: f64,
    /// Seed of the loss draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds between one-line reports of packets forwarded and dropped (0: none).
    #[arg(long, default_value_t = 10.0)]
    report_every: f64,
}

pub fn run(a: RelayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..1.0).contains(&a.loss),
        "--loss {} is not a probability below 1",
        a.loss
    );
    anyhow::ensure!(
        a.delay_ms >= 0.0 && a.mbit >= 0.0 && a.queue_ms > 0.0,
        "--delay-ms and --mbit must not be negative, --queue-ms must be positive"
    );
    let shape = Shape {
        delay: Duration::from_secs_f64(a.delay_ms / 1e3),
        rate: if a.mbit > 0.0 {
            a.mbit * 1e6 / 8.0
        } else {
            f64::INFINITY
        },
        loss: a.loss,
        queue: Duration::from_secs_f64(a.queue_ms / 1e3),
        seed: a.seed,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let stats = Arc::new(RelayStats::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let relay = tokio::spawn(run_relay(a.listen, a.forward, shape, stats.clone(), tx));
        let bound = rx.await?;
        println!(
            "{}",
            serde_json::json!({"event": "relaying", "listen": bound, "forward": a.forward})
        );
        eprintln!(
            "murmur relay: {bound} -> {}, {} ms each way, {}, {:.2}% loss",
            a.forward,
            a.delay_ms,
            if a.mbit > 0.0 {
                format!("{} Mbit/s", a.mbit)
            } else {
                "no rate limit".into()
            },
            a.loss * 100.0
        );
        if a.report_every > 0.0 {
            let stats = stats.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(a.report_every));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    eprintln!(
                        "murmur relay: {} packets forwarded, {} dropped",
                        stats.forwarded.load(Ordering::Relaxed),
                        stats.dropped.load(Ordering::Relaxed)
                    );
                }
            });
        }
        relay.await??;
        Ok(())
    })
}
