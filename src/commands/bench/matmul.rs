//! `murmur bench matmul`: GFLOPS of the WGSL matmul for square sizes and the transposed
//! variants, beside a native CPU sgemm (the `matrixmultiply` crate, all cores) measured in the
//! same run.

use clap::{Args, ValueEnum};
use murmur_engine::cpu::gemm::{self, Arithmetic};
use murmur_engine::gpu::Gpu;
use murmur_engine::kernels::matmul::{matmul_gpu, MatmulDims, MatmulKernel};
use murmur_engine::rng::Rng;
use serde::Serialize;

use super::super::machine::Machine;

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub enum KernelChoice {
    /// The kernel murmur uses on this adapter.
    Auto,
    Tiled,
    Rows,
    /// Both kernels, one row each.
    Both,
}

#[derive(Args)]
pub struct MatmulArgs {
    /// Square sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024,2048")]
    sizes: Vec<usize>,
    #[arg(long, value_enum, default_value = "auto")]
    kernel: KernelChoice,
    /// Seconds spent timing each configuration (five trials; the median is reported).
    #[arg(long, default_value_t = 1.0)]
    min_seconds: f64,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    size: usize,
    kernel: String,
    /// GFLOPS for C = A B, A^T B, A B^T, A^T B^T.
    nn: f64,
    tn: f64,
    nt: f64,
    tt: f64,
    cpu_sgemm: f64,
    /// nn / cpu_sgemm.
    ratio_to_cpu: f64,
}

/// The CPU path (`--device cpu`, and auto's choice where the adapter is software) beside the
/// same sgemm: with the reference's bits, and with fused multiply-adds (what exactness costs).
#[derive(Serialize)]
struct CpuRow {
    size: usize,
    /// GFLOPS for C = A B, A^T B, A B^T, A^T B^T with the reference's bits.
    nn: f64,
    tn: f64,
    nt: f64,
    tt: f64,
    /// GFLOPS for C = A B with one fused multiply-add per term (other bits; never trained with).
    nn_fused: f64,
    cpu_sgemm: f64,
    /// nn / cpu_sgemm.
    ratio_to_sgemm: f64,
    /// nn / nn_fused: below 1 by what the separately rounded multiply and add cost.
    exact_over_fused: f64,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date: String,
    machine: Machine,
    adapter: String,
    adapter_type: String,
    rows: Vec<Row>,
    /// The CPU path's micro-kernel, e.g. "avx512 12x32".
    cpu_kernel: String,
    cpu_rows: Vec<CpuRow>,
}

fn time_until(min_seconds: f64, sync: impl FnMut(), f: impl FnMut()) -> f64 {
    super::seconds_per_call(min_seconds, 1 << 16, sync, f)
}

/// Random `n x n` operands and the dims of their product with the given transposes.
fn square_product(n: usize, ta: bool, tb: bool) -> (Vec<f32>, Vec<f32>, MatmulDims) {
    let mut rng = Rng::new(n as u64, 0);
    let a: Vec<f32> = (0..n * n).map(|_| rng.uniform_in(-1.0, 1.0)).collect();
    let b: Vec<f32> = (0..n * n).map(|_| rng.uniform_in(-1.0, 1.0)).collect();
    let dims = MatmulDims {
        trans_a: ta,
        trans_b: tb,
        ..MatmulDims::square(n)
    };
    (a, b, dims)
}

pub(super) fn gpu_gflops(
    gpu: &Gpu,
    n: usize,
    ta: bool,
    tb: bool,
    kernel: MatmulKernel,
    min_seconds: f64,
) -> anyhow::Result<f64> {
    let (a, b, dims) = square_product(n, ta, tb);
    let (ga, gb) = (
        gpu.upload(bytemuck::cast_slice(&a))?,
        gpu.upload(bytemuck::cast_slice(&b))?,
    );
    // One checked call first: later calls cannot fail on sizes.
    matmul_gpu(gpu, &ga, &gb, &dims, kernel)?;
    let seconds = time_until(
        min_seconds,
        || gpu.sync().expect("GPU sync"),
        || {
            let _ =
                matmul_gpu(gpu, &ga, &gb, &dims, kernel).expect("sizes checked by the first call");
        },
    );
    gpu.check()?;
    Ok(dims.flops() / seconds / 1e9)
}

/// GFLOPS of murmur's CPU path on an `n`-cubed product.
pub(super) fn cpu_path_gflops(
    n: usize,
    ta: bool,
    tb: bool,
    arithmetic: Arithmetic,
    min_seconds: f64,
) -> f64 {
    let (a, b, dims) = square_product(n, ta, tb);
    let seconds = time_until(
        min_seconds,
        || {},
        || {
            std::hint::black_box(gemm::matmul_with(&a, &b, &dims, arithmetic));
        },
    );
    dims.flops() / seconds / 1e9
}

fn cpu_gflops(n: usize, min_seconds: f64) -> f64 {
    let mut rng = Rng::new(n as u64, 1);
    let a: Vec<f32> = (0..n * n).map(|_| rng.uniform_in(-1.0, 1.0)).collect();
    let b: Vec<f32> = (0..n * n).map(|_| rng.uniform_in(-1.0, 1.0)).collect();
    let mut c = vec![0.0f32; n * n];
    let seconds = time_until(
        min_seconds,
        || {},
        || unsafe {
            // SAFETY: a, b and c are n x n row-major buffers matching the strides given.
            matrixmultiply::sgemm(
                n,
                n,
                n,
                1.0,
                a.as_ptr(),
                n as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        },
    );
    2.0 * (n as f64).powi(3) / seconds / 1e9
}

pub fn run(a: MatmulArgs) -> anyhow::Result<()> {
    let gpu = Gpu::new()?;
    if a.kernel == KernelChoice::Auto {
        murmur_node::tune_matmul(&gpu)?;
    }
    // Auto: the kernel the tuning chose for each size's shape class.
    let kernels = |n: usize| -> anyhow::Result<Vec<MatmulKernel>> {
        Ok(match a.kernel {
            KernelChoice::Auto => vec![MatmulKernel::for_gpu(&gpu, &MatmulDims::square(n))?],
            KernelChoice::Tiled => vec![MatmulKernel::Tiled],
            KernelChoice::Rows => vec![MatmulKernel::Rows],
            KernelChoice::Both => MatmulKernel::ALL.to_vec(),
        })
    };
    if !a.json {
        eprintln!(
            "adapter: {}; CPU reference: matrixmultiply sgemm on {} threads",
            gpu.describe(),
            Machine::detect().cores
        );
        println!("| size | kernel | A·B | Aᵀ·B | A·Bᵀ | Aᵀ·Bᵀ | CPU sgemm | A·B / CPU |");
        println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    }
    let mut rows = vec![];
    for &n in &a.sizes {
        let cpu = cpu_gflops(n, a.min_seconds);
        for k in kernels(n)? {
            let g = |ta, tb| gpu_gflops(&gpu, n, ta, tb, k, a.min_seconds);
            let row = Row {
                size: n,
                kernel: format!("{k:?}").to_lowercase(),
                nn: g(false, false)?,
                tn: g(true, false)?,
                nt: g(false, true)?,
                tt: g(true, true)?,
                cpu_sgemm: cpu,
                ratio_to_cpu: 0.0,
            };
            let row = Row {
                ratio_to_cpu: row.nn / cpu,
                ..row
            };
            if !a.json {
                println!(
                    "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} |",
                    row.size,
                    row.kernel,
                    row.nn,
                    row.tn,
                    row.nt,
                    row.tt,
                    row.cpu_sgemm,
                    row.ratio_to_cpu
                );
            }
            rows.push(row);
        }
    }
    if !a.json {
        println!();
        println!(
            "CPU path ({}), same bits as the reference; fused: one rounding per term, other bits",
            gemm::describe()
        );
        println!("| size | A·B | Aᵀ·B | A·Bᵀ | Aᵀ·Bᵀ | A·B fused | CPU sgemm | A·B / sgemm | exact / fused |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    }
    let mut cpu_rows = vec![];
    for &n in &a.sizes {
        let g = |ta, tb, arithmetic| cpu_path_gflops(n, ta, tb, arithmetic, a.min_seconds);
        let cpu_sgemm = cpu_gflops(n, a.min_seconds);
        let (nn, nn_fused) = (
            g(false, false, Arithmetic::Exact),
            g(false, false, Arithmetic::Fused),
        );
        let row = CpuRow {
            size: n,
            nn,
            tn: g(true, false, Arithmetic::Exact),
            nt: g(false, true, Arithmetic::Exact),
            tt: g(true, true, Arithmetic::Exact),
            nn_fused,
            cpu_sgemm,
            ratio_to_sgemm: nn / cpu_sgemm,
            exact_over_fused: nn / nn_fused,
        };
        if !a.json {
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
                row.size,
                row.nn,
                row.tn,
                row.nt,
                row.tt,
                row.nn_fused,
                row.cpu_sgemm,
                row.ratio_to_sgemm,
                row.exact_over_fused
            );
        }
        cpu_rows.push(row);
    }
    let info = &gpu.info().adapter;
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: super::today(),
        machine: Machine::detect(),
        adapter: gpu.describe(),
        adapter_type: format!("{:?}", info.device_type),
        rows,
        cpu_kernel: gemm::describe(),
        cpu_rows,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!(
            "GFLOPS = 2 n^3 / seconds; {} on {}",
            report.date, report.machine
        );
    }
    Ok(())
}
