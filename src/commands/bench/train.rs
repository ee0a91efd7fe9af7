//! `murmur bench train`: training throughput per model (samples or tokens per second) and the
//! GFLOPS it achieves, beside the matmul peak of the same adapter measured in the same run
//! (before and after the models, the larger kept).
//! Inputs are random (throughput does not depend on the data); FLOPs count the matmuls and
//! convolutions of the forward pass, times three for forward plus backward.

use clap::{Args, ValueEnum};
use murmur_engine::cpu::gemm::{self, Arithmetic};
use murmur_engine::kernels::matmul::{MatmulDims, MatmulKernel};
use murmur_engine::nn::{CnnConfig, Module};
use murmur_engine::rng::Rng;
use murmur_engine::train::{Classifier, ClassifierConfig, LanguageModel, LmConfig};
use murmur_engine::Device;
use murmur_node::DeviceKind;
use serde::Serialize;

use super::super::machine::Machine;

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub enum BenchModel {
    Mlp,
    Cnn,
    Gpt,
}

#[derive(Args)]
pub struct TrainBenchArgs {
    #[arg(long, value_enum, value_delimiter = ',', default_value = "mlp,cnn,gpt")]
    models: Vec<BenchModel>,
    /// Images per step for mlp and cnn.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Sequences per step for gpt (of the default GPT's context).
    #[arg(long, default_value_t = 32)]
    sequences: usize,
    /// Square matmul size whose GFLOPS is the adapter's reference peak.
    #[arg(long, default_value_t = 1024)]
    peak_size: usize,
    /// Seconds spent timing each model (five trials; the median is reported).
    #[arg(long, default_value_t = 5.0)]
    min_seconds: f64,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
}

#[derive(Serialize)]
struct Row {
    model: String,
    parameters: usize,
    batch: String,
    steps_per_second: f64,
    /// Samples per second, or tokens per second for gpt.
    throughput: f64,
    unit: &'static str,
    gflops: f64,
    /// gflops / matmul_peak_gflops.
    fraction_of_matmul_peak: f64,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date: String,
    machine: Machine,
    adapter: String,
    matmul_peak_size: usize,
    /// The larger of the two timings below.
    matmul_peak_gflops: f64,
    matmul_peak_gflops_before: f64,
    matmul_peak_gflops_after: f64,
    rows: Vec<Row>,
}

/// Seconds per call of `step`, which must not fail after a first successful call.
fn time_steps(
    device: &Device,
    min_seconds: f64,
    mut step: impl FnMut() -> murmur_engine::Result<()>,
) -> anyhow::Result<f64> {
    step()?;
    Ok(super::seconds_per_call(
        min_seconds,
        1 << 12,
        || device.sync().expect("GPU sync"),
        || step().expect("the first step succeeded"),
    ))
}

fn bench_classifier(
    device: &Device,
    cnn: bool,
    batch: usize,
    min_seconds: f64,
) -> anyhow::Result<Row> {
    let config = ClassifierConfig {
        cnn: cnn.then(CnnConfig::default),
        ..ClassifierConfig::default()
    };
    let mut clf = Classifier::new(device, 784, 10, &config)?;
    let mut rng = Rng::new(1, 0);
    let x: Vec<f32> = (0..batch * 784).map(|_| rng.uniform()).collect();
    let y: Vec<u32> = (0..batch).map(|_| rng.below(10) as u32).collect();
    let seconds = time_steps(device, min_seconds, || clf.step(&x, &y).map(drop))?;
    let throughput = batch as f64 / seconds;
    Ok(Row {
        model: clf.model.name().into(),
        parameters: clf.model.parameter_count(),
        batch: format!("{batch} images"),
        steps_per_second: 1.0 / seconds,
        throughput,
        unit: "samples/s",
        gflops: 3.0 * clf.model.forward_flops() * throughput / 1e9,
        fraction_of_matmul_peak: 0.0,
    })
}

fn bench_gpt(device: &Device, sequences: usize, min_seconds: f64) -> anyhow::Result<Row> {
    let config = LmConfig {
        batch: sequences,
        ..LmConfig::new(1 << 20)
    };
    let mut lm = LanguageModel::new(device, &config)?;
    let context = lm.model.config.context;
    let mut rng = Rng::new(2, 0);
    let text: Vec<u8> = (0..1 << 16).map(|_| rng.below(256) as u8).collect();
    let seconds = time_steps(device, min_seconds, || lm.step(&text).map(drop))?;
    let throughput = (sequences * context) as f64 / seconds;
    Ok(Row {
        model: "gpt".into(),
        parameters: lm.model.parameter_count(),
        batch: format!("{sequences} x {context} tokens"),
        steps_per_second: 1.0 / seconds,
        throughput,
        unit: "tokens/s",
        gflops: 3.0 * lm.model.forward_flops_per_token(context) * throughput / 1e9,
        fraction_of_matmul_peak: 0.0,
    })
}

pub fn run(a: TrainBenchArgs) -> anyhow::Result<()> {
    let device = a.device.open()?;
    let peak_seconds = a.min_seconds.min(2.0);
    let (adapter, measure_peak): (String, Box<dyn Fn() -> anyhow::Result<f64>>) =
        match device.as_gpu() {
            Some(gpu) => {
                let kernel = MatmulKernel::for_gpu(gpu, &MatmulDims::square(a.peak_size))?;
                let size = a.peak_size;
                (
                    format!("{} with the {kernel:?} matmul kernel", gpu.describe()),
                    Box::new(move || {
                        super::matmul::gpu_gflops(gpu, size, false, false, kernel, peak_seconds)
                    }),
                )
            }
            None => (
                format!("the CPU path ({})", gemm::describe()),
                Box::new(|| {
                    Ok(super::matmul::cpu_path_gflops(
                        a.peak_size,
                        false,
                        false,
                        Arithmetic::Exact,
                        peak_seconds,
                    ))
                }),
            ),
        };
    // The peak is timed before and after the models, and the larger kept: on a shared host
    // one timing can fall in a slow spell (the 2-core Xeon's read 70-122 GFLOPS within one
    // hour), and a low peak would flatter every fraction.
    let peak_before = measure_peak()?;
    let mut rows = vec![];
    for &m in &a.models {
        rows.push(match m {
            BenchModel::Mlp => bench_classifier(&device, false, a.batch, a.min_seconds)?,
            BenchModel::Cnn => bench_classifier(&device, true, a.batch, a.min_seconds)?,
            BenchModel::Gpt => bench_gpt(&device, a.sequences, a.min_seconds)?,
        });
    }
    let peak_after = measure_peak()?;
    let peak = peak_before.max(peak_after);
    if !a.json {
        eprintln!(
            "device: {adapter}; matmul {}³: {peak:.1} GFLOPS (the larger of {peak_before:.1} \
             before the models and {peak_after:.1} after)",
            a.peak_size
        );
        println!("| model | parameters | batch | steps/s | throughput | GFLOPS | of matmul peak |");
        println!("|---|---:|---|---:|---:|---:|---:|");
    }
    for row in &mut rows {
        row.fraction_of_matmul_peak = row.gflops / peak;
        if !a.json {
            println!(
                "| {} | {} | {} | {:.2} | {:.0} {} | {:.2} | {:.2} |",
                row.model,
                row.parameters,
                row.batch,
                row.steps_per_second,
                row.throughput,
                row.unit,
                row.gflops,
                row.fraction_of_matmul_peak
            );
        }
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: super::today(),
        machine: Machine::detect(),
        adapter,
        matmul_peak_size: a.peak_size,
        matmul_peak_gflops: peak,
        matmul_peak_gflops_before: peak_before,
        matmul_peak_gflops_after: peak_after,
        rows,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
