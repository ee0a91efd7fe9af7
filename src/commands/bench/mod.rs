//! `murmur bench ...`: performance as ratios against a reference measured in the same run.

mod aggregate;
mod codecs;
mod goodput;
mod matmul;
mod net;
mod train;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// GFLOPS of the WGSL matmul kernels beside a native CPU sgemm.
    Matmul(matmul::MatmulArgs),
    /// Milliseconds per round of each aggregation rule (with its push histories), beside the
    /// sample-weighted mean.
    Aggregate(aggregate::AggregateArgs),
    /// Encode and decode GB/s per codec on one thread, all threads and the GPU, beside memcpy.
    Codecs(codecs::CodecArgs),
    /// Push/pull throughput of QUIC beside TLS over TCP and TCP on loopback, and time per
    /// training step for f32 and compressed codecs on a shaped link.
    Net(net::NetArgs),
    /// Training samples (tokens) per second and achieved GFLOPS per model, beside the
    /// adapter's matmul GFLOPS.
    Train(train::TrainBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Matmul(a) => matmul::run(a),
        BenchCommand::Aggregate(a) => aggregate::run(a),
        BenchCommand::Codecs(a) => codecs::run(a),
        BenchCommand::Net(a) => net::run(a),
        BenchCommand::Train(a) => train::run(a),
    }
}

/// The middle value (the upper one of an even count); `NaN` for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Seconds per call of `f`: after a warm-up, five trials of about `min_seconds / 5` each (at
/// most `max_reps` calls per trial), and the median trial, so that one disturbed trial on a
/// shared machine does not move the result. `sync` waits for queued work (a GPU's) to finish.
pub fn seconds_per_call(
    min_seconds: f64,
    max_reps: usize,
    mut sync: impl FnMut(),
    mut f: impl FnMut(),
) -> f64 {
    f();
    sync();
    let trial_seconds = min_seconds / 5.0;
    let mut reps = 1usize;
    let mut trials = vec![];
    while trials.len() < 5 {
        let t = std::time::Instant::now();
        for _ in 0..reps {
            f();
        }
        sync();
        let dt = t.elapsed().as_secs_f64();
        if dt < trial_seconds && reps < max_reps {
            // Too short to time well: grow the trial and start over.
            reps = (reps * 2)
                .max((reps as f64 * trial_seconds / dt.max(1e-7)).ceil() as usize)
                .min(max_reps);
            trials.clear();
            continue;
        }
        trials.push(dt / reps as f64);
    }
    median(trials)
}

/// Today's date (UTC) as YYYY-MM-DD, for reports.
/// A throwaway swarm, a server's and a client's credentials from it, and a runtime: the two
/// ends the network benchmarks connect.
pub fn bench_peers() -> anyhow::Result<(
    murmur_net::identity::Swarm,
    murmur_net::identity::Credentials,
    murmur_net::identity::Credentials,
    tokio::runtime::Runtime,
)> {
    use murmur_net::identity::{Role, Swarm};
    let swarm = Swarm::generate("bench")?;
    let server = swarm.credentials("server", Role::Server { shard: 0 })?;
    let client = swarm.credentials("client", Role::Worker)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    Ok((swarm, server, client, runtime))
}

pub fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}
