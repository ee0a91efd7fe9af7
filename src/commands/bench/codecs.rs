//! `murmur bench codecs`: encode and decode throughput per codec (GB/s of f32 input) on one
//! CPU thread, on all threads and on the GPU, beside memcpy bandwidth measured in the same run,
//! with each codec's compression ratio against f32 and f16.

use clap::Args;
use murmur_engine::compress::{parse, Codec, CodecContext, DecodeMode};
use murmur_engine::gpu::Gpu;
use murmur_engine::rng::Rng;
use serde::Serialize;

use super::super::machine::Machine;

const DEFAULT_CODECS: &str = "f32,f16,bf16,sign,topk:0.001,topk:0.01:f16,randk:1/32,dither:linear:s=15:norm=max,\
dither:natural:s=3:norm=max,natural,qsgd:bits=8,loco:bits=4:log2s=19,loco:bits=8:log2s=19,blockq:bits=4:group=2048,\
hybrid:bits=6:topk=0.3";

#[derive(Args)]
pub struct CodecArgs {
    /// Elements per encoded vector.
    #[arg(long, default_value_t = 1 << 24)]
    n: usize,
    /// Codec specs, comma-separated.
    #[arg(long, default_value = DEFAULT_CODECS, value_delimiter = ',')]
    codecs: Vec<String>,
    /// Skip the GPU columns.
    #[arg(long)]
    no_gpu: bool,
    /// Seconds per measurement (median of five trials).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Default)]
struct Row {
    codec: String,
    ratio_vs_f32: f64,
    ratio_vs_f16: f64,
    encode_1t: f64,
    encode_all: f64,
    decode_1t: f64,
    decode_all: f64,
    encode_gpu: Option<f64>,
    decode_gpu: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date: String,
    machine: Machine,
    adapter: Option<String>,
    n: usize,
    threads: usize,
    memcpy_1t: f64,
    memcpy_all: f64,
    rows: Vec<Row>,
}

/// Seconds per codec call (codec calls on small inputs are quick: allow many per trial).
fn time(seconds: f64, sync: impl FnMut(), f: impl FnMut()) -> f64 {
    super::seconds_per_call(seconds, 1 << 20, sync, f)
}

fn gbps(n: usize, seconds: f64) -> f64 {
    4.0 * n as f64 / seconds / 1e9
}

fn memcpy(n: usize, seconds: f64, pool: Option<&rayon::ThreadPool>) -> f64 {
    use rayon::prelude::*;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let t = time(
        seconds,
        || {},
        || match pool {
            Some(p) => p.install(|| {
                dst.par_chunks_mut(1 << 16)
                    .zip(src.par_chunks(1 << 16))
                    .for_each(|(d, s)| d.copy_from_slice(s))
            }),
            None => dst.copy_from_slice(&src),
        },
    );
    std::hint::black_box(&dst);
    gbps(n, t)
}

pub fn run(a: CodecArgs) -> anyhow::Result<()> {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let all = rayon::ThreadPoolBuilder::new().build()?;
    let threads = all.current_num_threads();
    let gpu = if a.no_gpu { None } else { Some(Gpu::new()?) };
    let mut rng = Rng::new(1, 0);
    let x: Vec<f32> = (0..a.n).map(|_| rng.normal() * 1e-3).collect();
    let ctx = CodecContext {
        seed: 7,
        step: 1,
        key: 0,
        stream: 0,
    };
    let (memcpy_1t, memcpy_all) = (
        memcpy(a.n, a.seconds, None),
        memcpy(a.n, a.seconds, Some(&all)),
    );
    if !a.json {
        eprintln!(
            "n = {}; memcpy {memcpy_1t:.2} GB/s on one thread, {memcpy_all:.2} GB/s on {threads}",
            a.n
        );
        println!("| codec | ×f32 | ×f16 | enc 1T | enc {threads}T | dec 1T | dec {threads}T | enc GPU | dec GPU |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    }
    let gx = match &gpu {
        Some(g) => Some(g.upload(bytemuck::cast_slice(&x))?),
        None => None,
    };
    let mut rows = vec![];
    for spec in &a.codecs {
        let codec: Box<dyn Codec> = parse(spec)?;
        let payload = codec.encode(&x, &ctx);
        let mut out = vec![0.0f32; a.n];
        let enc = |pool: &rayon::ThreadPool| {
            gbps(
                a.n,
                time(
                    a.seconds,
                    || {},
                    || {
                        std::hint::black_box(pool.install(|| codec.encode(&x, &ctx)));
                    },
                ),
            )
        };
        let mut dec = |pool: &rayon::ThreadPool| {
            gbps(
                a.n,
                time(
                    a.seconds,
                    || {},
                    || {
                        pool.install(|| {
                            codec
                                .decode_into(&payload, &mut out, &ctx, DecodeMode::Set)
                                .expect("own payload")
                        })
                    },
                ),
            )
        };
        let len = payload.len() as f64;
        let mut row = Row {
            codec: codec.spec().to_string(),
            ratio_vs_f32: 4.0 * a.n as f64 / len,
            ratio_vs_f16: 2.0 * a.n as f64 / len,
            encode_1t: enc(&one),
            encode_all: enc(&all),
            decode_1t: dec(&one),
            decode_all: dec(&all),
            ..Row::default()
        };
        if let (Some(g), Some(gx)) = (&gpu, &gx) {
            row.encode_gpu = Some(gbps(
                a.n,
                time(
                    a.seconds,
                    || g.sync().expect("GPU"),
                    || {
                        std::hint::black_box(
                            codec.encode_gpu(g, gx, a.n, &ctx).expect("GPU encode"),
                        );
                    },
                ),
            ));
            let padded = {
                let mut p = payload.clone();
                p.resize(p.len().next_multiple_of(4), 0);
                g.upload(&p)?
            };
            let gout = g.alloc(4 * a.n as u64)?;
            row.decode_gpu = Some(gbps(
                a.n,
                time(
                    a.seconds,
                    || g.sync().expect("GPU"),
                    || {
                        codec
                            .decode_gpu(g, &padded, &gout, a.n, &ctx, DecodeMode::Set)
                            .expect("GPU decode")
                    },
                ),
            ));
        }
        if !a.json {
            let f = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
            println!(
                "| `{}` | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |",
                row.codec,
                row.ratio_vs_f32,
                row.ratio_vs_f16,
                row.encode_1t,
                row.encode_all,
                row.decode_1t,
                row.decode_all,
                f(row.encode_gpu),
                f(row.decode_gpu)
            );
        }
        rows.push(row);
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: super::today(),
        machine: Machine::detect(),
        adapter: gpu.as_ref().map(|g| g.describe()),
        n: a.n,
        threads,
        memcpy_1t,
        memcpy_all,
        rows,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!(
            "GB/s of f32 input; {} on {}; adapter {}",
            report.date,
            report.machine,
            report.adapter.as_deref().unwrap_or("none")
        );
    }
    Ok(())
}
