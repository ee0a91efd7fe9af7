//! `murmur bench net --shaped`: goodput over a shaped IP path (two network namespaces and a
//! TUN shaper, `murmur_net::shaped_path`), for each QUIC congestion controller murmur offers
//! beside the kernel's TCP over the same path, over a matrix of rates, round trips and loss.
//! Goodput is application payload bytes per second over the configured rate.

use std::time::Duration;

use clap::Args;
use murmur_net::goodput::{self, Goodput, Window};
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
    #[arg(long, value_delimiter = ',', default_value = "cubic,newreno,bbr")]
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
    let tcp: Vec<&String> = a.tcp.iter().filter(|c| !c.is_empty()).collect();
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
                let protocols = a
                    .quic
                    .iter()
                    .map(|c| format!("quic-{c}"))
                    .chain(tcp.iter().map(|c| format!("tcp-{c}")))
                    .chain(
                        a.beside
                            .iter()
                            .flat_map(|t| a.quic.iter().map(move |c| format!("quic-{c}+tcp-{t}"))),
                    );
                for protocol in protocols {
                    // A fresh path each time: no queue or socket state carries over.
                    let path = ShapedPath::create(
                        shape,
                        Shape {
                            seed: shape.seed ^ 0xBACC,
                            ..shape
                        },
                    )?;
                    let (got, beside): (Goodput, Option<Goodput>) = runtime.block_on(async {
                        let (quic, tcp) = match protocol.split_once('+') {
                            Some((q, t)) => (q.strip_prefix("quic-"), t.strip_prefix("tcp-")),
                            None => match protocol.strip_prefix("quic-") {
                                Some(q) => (Some(q), None),
                                None => (None, protocol.strip_prefix("tcp-")),
                            },
                        };
                        let link = |c: &str| -> anyhow::Result<Link> {
                            Ok(Link {
                                congestion: c.parse().map_err(anyhow::Error::msg)?,
                                ..Link::default()
                            })
                        };
                        Ok::<_, anyhow::Error>(match (quic, tcp) {
                            (Some(q), None) => (
                                goodput::quic(&path, &link(q)?, &server, &client, window).await?,
                                None,
                            ),
                            (None, Some(t)) => (goodput::tcp(&path, t, window).await?, None),
                            (Some(q), Some(t)) => {
                                let (q, t) = goodput::quic_beside_tcp(
                                    &path,
                                    &link(q)?,
                                    &server,
                                    &client,
                                    t,
                                    window,
                                )
                                .await?;
                                (q, Some(t))
                            }
                            (None, None) => unreachable!("every protocol names one"),
                        })
                    })?;
                    let rate = mbit * 1e6 / 8.0;
                    let row = Row {
                        mbit,
                        rtt_ms,
                        loss,
                        protocol,
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
