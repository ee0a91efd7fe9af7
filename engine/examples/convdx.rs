use murmur_engine::cpu::conv::input_gradient;
use murmur_engine::kernels::conv_geometry::ConvGeometry;
use std::time::Instant;
fn main() {
    murmur_engine::cpu::pool::on_pool(main_);
}
fn main_() {
    let g = ConvGeometry {
        n: 128,
        h: 14,
        w: 14,
        c: 16,
        kh: 3,
        kw: 3,
        stride: 1,
        pad: 1,
    };
    let oc = 32;
    let dy: Vec<f32> = (0..128 * 196 * oc)
        .map(|i| ((i * 7919 % 1013) as f32) / 1013.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..144 * oc)
        .map(|i| ((i * 31 % 997) as f32) / 997.0 - 0.5)
        .collect();
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut ts = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(input_gradient(&dy, &w, oc, &g));
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "input_gradient median {:.3} ms min {:.3}",
        ts[ts.len() / 2],
        ts[0]
    );
}
