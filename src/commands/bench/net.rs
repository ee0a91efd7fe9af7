//! `murmur bench net`: (1) push/pull throughput over loopback QUIC beside TLS over TCP and
//! plain TCP moving the same frames in the same run; (2) time per data-parallel training step
//! through a parameter server for f32 and compressed codecs, each worker behind a shaped link
//! (murmur's UDP relay: rate limit, drop-tail queue, delay).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::gpu::Gpu;
use murmur_engine::train::{Classifier, ClassifierConfig, DataParallel};
use murmur_engine::Device;
use murmur_net::identity::{Role, Swarm};
use murmur_net::ps::{ClientOptions, QuicCollective, Server, ServerOptions};
use murmur_net::relay::{run_relay, RelayStats};
use murmur_net::shape::Shape;
use murmur_net::throughput::{measure, Transport, Workload};
use murmur_net::transport::Link;
use serde::Serialize;

use super::super::machine::Machine;
use super::median;

#[derive(Args)]
pub struct NetArgs {
    /// Frames per throughput measurement.
    #[arg(long, default_value_t = 48)]
    frames: usize,
    /// Bytes per frame (the default partition size).
    #[arg(long, default_value_t = 4_096_000)]
    frame_bytes: usize,
    /// QUIC frames (streams) in flight at once.
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Throughput trials per transport (the median is reported).
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// Shaped link: bandwidth of each worker's link in Mbit/s ...
    #[arg(long, default_value_t = 100.0)]
    mbit: f64,
    /// ... and its round-trip time in milliseconds.
    #[arg(long, default_value_t = 40.0)]
    rtt_ms: f64,
    /// Workers in the shaped-link runs.
    #[arg(long, default_value_t = 2)]
    workers: u16,
    /// Measured steps per codec (after two warm-up steps).
    #[arg(long, default_value_t = 8)]
    steps: u64,
    /// Codecs to time on the shaped link, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "f32,bf16,topk:0.01,sign,loco:bits=4:log2s=19"
    )]
    codecs: Vec<String>,
    /// Skip the shaped-link runs.
    #[arg(long)]
    no_shaped: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    shaped: super::goodput::ShapedArgs,
}

#[derive(Serialize)]
struct ThroughputRow {
    transport: String,
    /// Median over trials, bytes moved both ways per second.
    megabytes_per_second: f64,
    trials_mb_per_s: Vec<f64>,
}

#[derive(Serialize)]
struct StepRow {
    codec: String,
    pushed_per_step: usize,
    pulled_per_step: usize,
    f32_per_step: usize,
    /// Median seconds per training step over the measured steps.
    step_seconds: f64,
    speedup_vs_f32: Option<f64>,
    relay_drops: u64,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date: String,
    machine: Machine,
    frames: usize,
    frame_bytes: usize,
    throughput: Vec<ThroughputRow>,
    quic_vs_tls_tcp: f64,
    shaped_link: Option<String>,
    adapter: Option<String>,
    steps: Vec<StepRow>,
}

pub fn run(a: NetArgs) -> anyhow::Result<()> {
    if a.shaped.wanted() {
        return super::goodput::run(&a.shaped, a.json);
    }
    let (swarm, server, client, runtime) = super::bench_peers()?;
    let workload = Workload {
        frames: a.frames,
        frame_bytes: a.frame_bytes,
        in_flight: a.in_flight,
    };
    let transports = [Transport::Quic, Transport::TlsTcp, Transport::Tcp];
    let mut trials = vec![Vec::new(); transports.len()];
    // Interleave the transports so that drift in the machine's load touches all alike.
    for _ in 0..a.trials.max(1) {
        for (i, t) in transports.iter().enumerate() {
            let took = runtime.block_on(measure(*t, workload, &server, &client))?;
            trials[i].push(workload.bytes() as f64 / took.as_secs_f64() / 1e6);
        }
    }
    let throughput: Vec<ThroughputRow> = transports
        .iter()
        .zip(trials)
        .map(|(t, trials)| ThroughputRow {
            transport: t.name().into(),
            megabytes_per_second: median(trials.clone()),
            trials_mb_per_s: trials,
        })
        .collect();
    let quic_vs_tls_tcp = throughput[0].megabytes_per_second / throughput[1].megabytes_per_second;
    if !a.json {
        eprintln!(
            "loopback push/pull, {} frames of {} bytes each way, median of {} trials:",
            a.frames, a.frame_bytes, a.trials
        );
        for r in &throughput {
            eprintln!("  {:34} {:8.0} MB/s", r.transport, r.megabytes_per_second);
        }
        eprintln!("  QUIC / TLS-over-TCP: {:.2}", quic_vs_tls_tcp);
    }

    let mut steps = Vec::new();
    let mut adapter = None;
    let shaped_link =
        (!a.no_shaped).then(|| format!("{} Mbit/s, {} ms RTT per worker", a.mbit, a.rtt_ms));
    if !a.no_shaped {
        let shape = Shape {
            delay: Duration::from_secs_f64(a.rtt_ms / 2e3),
            rate: a.mbit * 1e6 / 8.0,
            // A router buffer of about one round trip.
            queue: Duration::from_secs_f64((a.rtt_ms / 1e3).max(0.02)),
            ..Shape::default()
        };
        let link = Link {
            bytes_per_second: shape.rate,
            rtt: Duration::from_secs_f64(a.rtt_ms / 1e3),
            ..Link::default()
        };
        let gpus: Vec<Arc<Gpu>> = (0..a.workers)
            .map(|_| Gpu::new())
            .collect::<Result<_, _>>()?;
        adapter = Some(gpus[0].info().adapter.name.clone());
        let mut f32_time = None;
        for codec in &a.codecs {
            let row = shaped_steps(&runtime, &swarm, &gpus, codec, shape, link, a.steps)?;
            if codec == "f32" {
                f32_time = Some(row.step_seconds);
            }
            let row = StepRow {
                speedup_vs_f32: f32_time.map(|t| t / row.step_seconds),
                ..row
            };
            if !a.json {
                eprintln!(
                    "  {:28} {:9.0} KB up {:9.0} KB down per step  {:7.0} ms/step{}",
                    row.codec,
                    row.pushed_per_step as f64 / 1e3,
                    row.pulled_per_step as f64 / 1e3,
                    row.step_seconds * 1e3,
                    row.speedup_vs_f32
                        .map_or(String::new(), |s| format!("  {s:.1}x f32's speed"))
                );
            }
            steps.push(row);
        }
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: super::today(),
        machine: Machine::detect(),
        frames: a.frames,
        frame_bytes: a.frame_bytes,
        throughput,
        quic_vs_tls_tcp,
        shaped_link,
        adapter,
        steps,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// One worker's measured step times and its bytes per step: pushed, pulled, f32 each way.
type WorkerTimes = (Vec<f64>, usize, usize, usize);

/// Trains the MNIST-sized MLP (784-512-256-10) for `steps` rounds with `workers` threads, each
/// reaching one parameter-server shard through its own shaped relay. Every tensor is
/// compressed (no size threshold), so the codecs are compared on the whole model.
fn shaped_steps(
    runtime: &tokio::runtime::Runtime,
    swarm: &Swarm,
    gpus: &[Arc<Gpu>],
    codec: &str,
    shape: Shape,
    link: Link,
    steps: u64,
) -> anyhow::Result<StepRow> {
    let workers = gpus.len() as u16;
    let creds = swarm.credentials("server", Role::Server { shard: 0 })?;
    let server = runtime.block_on(async {
        Server::bind(
            "127.0.0.1:0".parse().expect("valid"),
            &creds,
            ServerOptions {
                link,
                ..ServerOptions::default()
            },
        )
    })?;
    let target = server.local_addr()?;
    let endpoint = server.endpoint();
    runtime.spawn(server.run());
    let stats = Arc::new(RelayStats::default());
    let mut relays: Vec<SocketAddr> = Vec::new();
    let mut relay_tasks = Vec::new();
    for _ in 0..workers {
        let (tx, rx) = tokio::sync::oneshot::channel();
        relay_tasks.push(runtime.spawn(run_relay(
            "127.0.0.1:0".parse().expect("valid"),
            target,
            shape,
            stats.clone(),
            tx,
        )));
        relays.push(runtime.block_on(rx)?);
    }
    let plan = PartitionPlan {
        min_compress_bytes: 0,
        push: codec.into(),
        pull: codec.into(),
        server_memory: "ef".into(),
        ..PartitionPlan::default()
    };
    let rows: Vec<anyhow::Result<WorkerTimes>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..workers)
            .map(|rank| {
                let (plan, gpu, relay) = (
                    plan.clone(),
                    gpus[rank as usize].clone(),
                    relays[rank as usize],
                );
                let creds = swarm.credentials(&format!("worker-{rank}"), Role::Worker);
                s.spawn(move || -> anyhow::Result<WorkerTimes> {
                    let options = ClientOptions {
                        link,
                        ..ClientOptions::default()
                    };
                    let c = QuicCollective::connect(
                        &[relay],
                        &creds?,
                        rank,
                        workers,
                        "bench",
                        options,
                    )?;
                    let device = Device::Gpu(gpu);
                    let config = ClassifierConfig {
                        hidden: vec![512, 256],
                        ..ClassifierConfig::default()
                    };
                    let clf = Classifier::new(&device, 784, 10, &config)?;
                    let mut dp = DataParallel::new(clf, c, &plan, "ef")?;
                    let mut rng = murmur_engine::rng::Rng::new(rank as u64, 0);
                    let batch = 64;
                    let x: Vec<f32> = (0..batch * 784).map(|_| rng.uniform()).collect();
                    let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();
                    let mut times = Vec::new();
                    let mut last = Default::default();
                    for i in 0..steps + 2 {
                        let t = Instant::now();
                        let (_, bytes) = dp.step((&x, &y), rank as usize * batch)?;
                        // Time the whole round, the optimizer step included.
                        if let Some(gpu) = dp.replica.device.as_gpu() {
                            gpu.sync()?;
                        }
                        if i >= 2 {
                            times.push(t.elapsed().as_secs_f64());
                        }
                        last = bytes;
                    }
                    let murmur_engine::train::RoundBytes {
                        pushed,
                        pulled,
                        f32_each_way,
                    } = last;
                    Ok((times, pushed, pulled, f32_each_way))
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("worker thread"))
            .collect()
    });
    endpoint.close(0u32.into(), b"bench over");
    for t in relay_tasks {
        t.abort();
    }
    let rows = rows.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let times: Vec<f64> = rows.iter().flat_map(|r| r.0.clone()).collect();
    Ok(StepRow {
        codec: codec.into(),
        pushed_per_step: rows[0].1,
        pulled_per_step: rows[0].2,
        f32_per_step: rows[0].3,
        step_seconds: median(times),
        speedup_vs_f32: None,
        relay_drops: stats.dropped.load(std::sync::atomic::Ordering::Relaxed),
    })
}
