//! `murmur bench net --shaped`: goodput over a shaped IP path (two network namespaces and a
//! TUN shaper, `murmur_net::shaped_path`), for each QUIC congestion controller murmur offers
//! beside the kernel's TCP over the same path, over a matrix of rates, round trips and loss.
//! Goodput is application payload bytes per second over the configured rate.

use std::time::Duration;

use clap::Args;
use murmur_net::goodput::{self, Goodput, Window};
use murmur_net::identity::Credentials;
use murmur_net::shape::Shape;
use murmur_net::shaped_path::ShapedPath;
use murmur_net::transport::{Congestion, Link};
use serde::Serialize;

use super::super::machine::Machine;

#[derive(Args)]
pub struct ShapedArgs {
    /// Measure goodput over a shaped path instead (needs root: network namespaces, TUN).
    #[arg(long)]
    shaped: bool,
    /// Link rates in Mbit/s, each way.
    #[arg(long, value_delimiter = ',', default_value = "10,50,200")]
    rates: Vec<f64>,
    /// Round-trip times in milliseconds (half each way).
    #[arg(long, value_delimiter = ',', default_value = "20,80,150")]
    rtts: Vec<f64>,
    /// Packet loss probabilities, each way.
    #[arg(long, value_delimiter = ',', default_value = "0,0.001,0.01,0.02")]
    losses: Vec<f64>,
    /// QUIC congestion controllers to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tolerant,cubic,newreno,bbr"
    )]
    quic: Vec<Congestion>,
    /// Kernel TCP congestion controls to measure beside them (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "cubic,bbr")]
    tcp: Vec<String>,
    /// Seconds left out after the first byte.
    #[arg(long, default_value_t = 3.0)]
    warmup_s: f64,
    /// Seconds counted after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    measure_s: f64,
    /// Also run each QUIC controller beside a kernel TCP flow with this congestion control
    /// on the same path (how they share it), e.g. `--beside cubic`.
    #[arg(long)]
    beside: Option<String>,
}

#[derive(Serialize)]
struct Row {
    mbit: f64,
    rtt_ms: f64,
    loss: f64,
    protocol: String,
    /// Payload bytes per second over the window, as a fraction of the link rate.
    goodput: f64,
    /// The same from the first byte on (slow start included).
    goodput_from_first_byte: f64,
    /// Beside a TCP flow (`quic-X+tcp-Y`): the TCP flow's goodput over the same window.
    beside_goodput: Option<f64>,
    /// Packets the path dropped (loss and full queue), both ways.
    dropped: u64,
    forwarded: u64,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date: String,
    machine: Machine,
    warmup_s: f64,
    measure_s: f64,
    /// Datagrams per UDP send (GSO) and per receive (GRO) quinn gets on this machine.
    gso_segments: usize,
    gro_segments: usize,
    rows: Vec<Row>,
}

/// What one cell measures: a QUIC flow, a kernel TCP flow (its congestion control's name),
/// or the two sharing the path.
#[derive(Clone, Copy)]
enum Flows<'a> {
    Quic(Congestion),
    Tcp(&'a str),
    QuicBesideTcp(Congestion, &'a str),
}

impl std::fmt::Display for Flows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Flows::Quic(c) => write!(f, "quic-{c}"),
            Flows::Tcp(t) => write!(f, "tcp-{t}"),
            Flows::QuicBesideTcp(c, t) => write!(f, "quic-{c}+tcp-{t}"),
        }
    }
}

impl Flows<'_> {
    /// The first flow's goodput, and the TCP flow's beside it when there is one.
    async fn measure(
        self,
        path: &ShapedPath,
        server: &Credentials,
        client: &Credentials,
        window: Window,
    ) -> anyhow::Result<(Goodput, Option<Goodput>)> {
        let link = |congestion| Link {
            congestion,
            ..Link::default()
        };
        Ok(match self {
            Flows::Quic(c) => (
                goodput::quic(path, &link(c), server, client, window).await?,
                None,
            ),
            Flows::Tcp(t) => (goodput::tcp(path, t, window).await?, None),
            Flows::QuicBesideTcp(c, t) => {
                let (q, t) =
                    goodput::quic_beside_tcp(path, &link(c), server, client, t, window).await?;
                (q, Some(t))
            }
        })
    }
}

impl ShapedArgs {
    pub fn wanted(&self) -> bool {
        self.shaped
    }
}

pub fn run(a: &ShapedArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.losses.iter().all(|l| (0.0..1.0).contains(l)),
        "--losses are probabilities below 1"
    );
    anyhow::ensure!(
        a.rates.iter().all(|r| *r > 0.0) && a.rtts.iter().all(|r| *r >= 0.0),
        "--rates must be positive and --rtts not negative"
    );
    anyhow::ensure!(
        a.measure_s > 0.0 && a.warmup_s >= 0.0,
        "--measure-s must be positive and --warmup-s not negative"
    );
    // `--tcp ""` measures no TCP.
    let tcp: Vec<&str> = a
        .tcp
        .iter()
        .map(String::as_str)
        .filter(|c| !c.is_empty())
        .collect();
    let (_, server, client, runtime) = super::bench_peers()?;
    let window = Window {
        warmup: Duration::from_secs_f64(a.warmup_s),
        measure: Duration::from_secs_f64(a.measure_s),
    };
    let (gso, gro) = murmur_net::transport::offload(&std::net::UdpSocket::bind("127.0.0.1:0")?)?;
    let mut rows = Vec::new();
    // The table goes to stderr as the rows come (a matrix takes half an hour), the JSON to
    // stdout at the end.
    eprintln!(
        "goodput over a shaped path (payload over link rate; {} s counted after {} s; \
         UDP offload: {gso} datagrams a send, {gro} a receive)",
        a.measure_s, a.warmup_s
    );
    eprintln!(
        "  {:>6} {:>6} {:>6}  {:14} {:>8} {:>11} {:>8}",
        "Mbit/s", "RTT ms", "loss", "protocol", "goodput", "from start", "dropped"
    );
    for &mbit in &a.rates {
        for &rtt_ms in &a.rtts {
            for &loss in &a.losses {
                let rtt = Duration::from_secs_f64(rtt_ms / 1e3);
                let shape = Shape::link(mbit, rtt, loss);
                let flows = a
                    .quic
                    .iter()
                    .map(|&c| Flows::Quic(c))
                    .chain(tcp.iter().map(|&c| Flows::Tcp(c)))
                    .chain(
                        a.beside
                            .iter()
                            .flat_map(|t| a.quic.iter().map(move |&c| Flows::QuicBesideTcp(c, t))),
                    );
                for flows in flows {
                    // A fresh path each time: no queue or socket state carries over.
                    let path = ShapedPath::create(
                        shape,
                        Shape {
                            seed: shape.seed ^ 0xBACC,
                            ..shape
                        },
                    )?;
                    let (got, beside) =
                        runtime.block_on(flows.measure(&path, &server, &client, window))?;
                    let rate = mbit * 1e6 / 8.0;
                    let row = Row {
                        mbit,
                        rtt_ms,
                        loss,
                        protocol: flows.to_string(),
                        goodput: got.steady / rate,
                        goodput_from_first_byte: got.whole / rate,
                        beside_goodput: beside.map(|b| b.steady / rate),
                        dropped: path
                            .stats
                            .dropped
                            .load(std::sync::atomic::Ordering::Relaxed),
                        forwarded: path
                            .stats
                            .forwarded
                            .load(std::sync::atomic::Ordering::Relaxed),
                    };
                    eprintln!(
                        "  {:>6} {:>6} {:>6}  {:14} {:>8.3} {:>11.3} {:>8}{}",
                        mbit,
                        rtt_ms,
                        loss,
                        row.protocol,
                        row.goodput,
                        row.goodput_from_first_byte,
                        row.dropped,
                        row.beside_goodput
                            .map_or(String::new(), |b| format!("  (TCP beside it: {b:.3})"))
                    );
                    rows.push(row);
                }
            }
        }
    }
    if json {
        let report = Report {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            date: super::today(),
            machine: Machine::detect(),
            warmup_s: a.warmup_s,
            measure_s: a.measure_s,
            gso_segments: gso,
            gro_segments: gro,
            rows,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
