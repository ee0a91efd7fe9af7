//! `murmur bench ...`: performance as ratios against a reference measured in the same run.

mod codecs;
mod matmul;
mod net;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// GFLOPS of the WGSL matmul kernels beside a native CPU sgemm.
    Matmul(matmul::MatmulArgs),
    /// Encode and decode GB/s per codec on one thread, all threads and the GPU, beside memcpy.
    Codecs(codecs::CodecArgs),
    /// Push/pull throughput of QUIC beside TLS over TCP and TCP on loopback, and time per
    /// training step for f32 and compressed codecs on a shaped link.
    Net(net::NetArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Matmul(a) => matmul::run(a),
        BenchCommand::Codecs(a) => codecs::run(a),
        BenchCommand::Net(a) => net::run(a),
    }
}

/// Today's date (UTC) as YYYY-MM-DD, for reports.
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
