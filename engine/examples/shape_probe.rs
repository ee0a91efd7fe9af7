// Throwaway: median time of blocks of 10 calls of cpu::gemm::matmul per shape (COPIES operand copies).
use murmur_engine::cpu::gemm::matmul;
use murmur_engine::kernels::matmul_dims::MatmulDims;
use std::time::Instant;

fn run(label: &str, d: MatmulDims) {
    let asz = d.batch.max(1) * d.m * d.k;
    let bsz = d.k * d.n * if d.b_batched { d.batch } else { 1 };
    let copies: usize = std::env::var("COPIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let av: Vec<Vec<f32>> = (0..copies)
        .map(|_| (0..asz).map(|i| (i % 13) as f32 * 0.1).collect())
        .collect();
    let bv: Vec<Vec<f32>> = (0..copies)
        .map(|_| (0..bsz).map(|i| (i % 7) as f32 * 0.1).collect())
        .collect();
    let mut which = 0usize;
    let mut pick = || {
        which = (which + 1) % copies;
        (&av[which][..], &bv[which][..])
    };
    let flops = 2.0 * (d.batch * d.m * d.n * d.k) as f64;
    for _ in 0..3 {
        let (a, b) = pick();
        std::hint::black_box(matmul(a, b, &d));
    }
    let mut times = vec![];
    for _ in 0..24 {
        let t = Instant::now();
        for _ in 0..10 {
            let (a, b) = pick();
            std::hint::black_box(matmul(a, b, &d));
        }
        times.push(t.elapsed().as_secs_f64() / 10.0);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{label:40} {:8.3} ms {:6.1} GFLOPS",
        times[12] * 1e3,
        flops / times[12] / 1e9
    );
}
fn dims(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MatmulDims {
    MatmulDims {
        batch: 1,
        m,
        n,
        k,
        trans_a: ta,
        trans_b: tb,
        a_batched: false,
        b_batched: false,
    }
}
fn main() {
    murmur_engine::cpu::pool::on_pool(main_);
}
fn main_() {
    for _ in 0..2 {
        run("1024^3", dims(1024, 1024, 1024, false, false));
        run("qkv fwd 2048x64 k64", dims(2048, 64, 64, false, false));
        run("qkv dx 2048x64 k64 tb", dims(2048, 64, 64, false, true));
        run("qkv dW 64x64 k2048 ta", dims(64, 64, 2048, true, false));
        run("fc1 fwd 2048x256 k64", dims(2048, 256, 64, false, false));
        run("fc1 dx 2048x64 k256 tb", dims(2048, 64, 256, false, true));
        run("fc1 dW 64x256 k2048 ta", dims(64, 256, 2048, true, false));
        run("fc2 fwd 2048x64 k256", dims(2048, 64, 256, false, false));
        run("fc2 dx 2048x256 k64 tb", dims(2048, 256, 64, false, true));
        run("fc2 dW 256x64 k2048 ta", dims(256, 64, 2048, true, false));
        run("head fwd 2048x256 k64 tb", dims(2048, 256, 64, false, true));
    }
}
