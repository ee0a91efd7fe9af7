//! Every codec's WGSL implementation produces the CPU implementation's bytes, and decodes them
//! to the same values, on random inputs of awkward lengths.

mod common;

use murmur_engine::compress::{parse, CodecContext, DecodeMode};
use murmur_engine::gpu::{Gpu, GpuBuf};
use murmur_engine::rng::Rng;

const ALL: &[&str] = &[
    "f32",
    "f16",
    "bf16",
    "sign",
    "sign:rounds=2",
    "topk:0.1",
    "topk:0.3",
    "topk:k=7:f16",
    "topk:k=1",
    "randk:0.25",
    "randk:0.05:explicit:unscaled",
    "dither:linear:s=15:norm=max",
    "dither:linear:s=127:norm=l2",
    "dither:natural:s=3:norm=max",
    "dither:natural:s=7:norm=l2",
    "natural",
    "qsgd:bits=8",
    "qsgd:bits=5:stochastic",
    "qsgd:bits=3",
    "loco:bits=4:log2s=10",
    "loco:bits=8:log2s=12",
    "loco:bits=2:log2s=-2",
    "loco:bits=4:log2s=11:rescalable",
    "blockq:bits=4:group=16",
    "blockq:bits=8:group=100",
    "hybrid:bits=6:topk=0.3",
    "hybrid:bits=3:k=5",
];

fn upload_bytes(gpu: &Gpu, bytes: &[u8]) -> GpuBuf {
    let mut padded = bytes.to_vec();
    padded.resize(bytes.len().next_multiple_of(4), 0);
    gpu.upload(&padded).unwrap()
}

fn read_f32(gpu: &Gpu, buf: &GpuBuf, n: usize) -> Vec<f32> {
    let bytes = gpu.read(buf).unwrap();
    bytemuck::pod_collect_to_vec(&bytes[..4 * n])
}

fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed, 0);
    let mut x: Vec<f32> = (0..n).map(|_| r.normal() * 0.01).collect();
    // Zeros, ties, a non-finite value and a subnormal exercise the edge rules.
    for i in (0..n).step_by(13) {
        x[i] = 0.0;
    }
    for i in (5..n).step_by(29) {
        x[i] = if i % 2 == 0 { 0.02 } else { -0.02 };
    }
    if n > 40 {
        x[40] = f32::NAN;
        x[n - 1] = 1e-40;
    }
    x
}

#[test]
fn gpu_payloads_equal_cpu_payloads_and_decode_alike() {
    let device = common::gpu();
    let gpu = device.as_gpu().unwrap();
    for spec in ALL {
        let codec = parse(spec).unwrap();
        // Around the selection's 4096-element blocks too: 8191..8193, and a last block of one.
        for (case, n) in [
            0usize, 1, 2, 31, 33, 64, 65, 127, 4095, 4097, 8191, 8192, 8193, 12_289, 70_001,
        ]
        .into_iter()
        .enumerate()
        {
            let ctx = CodecContext {
                seed: 0x1234_5678_9abc,
                step: case as u32,
                key: 3,
                stream: 0,
            };
            let x = inputs(n, case as u64 + 17);
            let want = codec.encode(&x, &ctx);
            let gx = gpu.upload(bytemuck::cast_slice(&x)).unwrap();
            let got = gpu
                .read(&codec.encode_gpu(gpu, &gx, n, &ctx).unwrap())
                .unwrap();
            assert!(got.len() >= want.len(), "{spec} n={n}");
            if let Some(at) = (0..want.len()).find(|&i| got[i] != want[i]) {
                panic!(
                    "{spec} n={n}: byte {at} of {} differs: GPU {:#04x} CPU {:#04x}",
                    want.len(),
                    got[at],
                    want[at]
                );
            }
            assert!(
                got[want.len()..].iter().all(|&b| b == 0),
                "{spec} n={n}: padding is zero"
            );

            let decoded = codec.decode(&want, n, &ctx).unwrap();
            let payload = upload_bytes(gpu, &want);
            let out = gpu.alloc(4 * n as u64).unwrap();
            codec
                .decode_gpu(gpu, &payload, &out, n, &ctx, DecodeMode::Set)
                .unwrap();
            let gpu_decoded = read_f32(gpu, &out, n);
            assert_eq!(
                gpu_decoded.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                decoded.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{spec} n={n}: decode"
            );

            let base: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            let mut acc = base.clone();
            codec.decode_add(&want, &mut acc, &ctx).unwrap();
            let gacc = gpu.upload(bytemuck::cast_slice(&base)).unwrap();
            codec
                .decode_gpu(gpu, &payload, &gacc, n, &ctx, DecodeMode::Add)
                .unwrap();
            assert_eq!(read_f32(gpu, &gacc, n), acc, "{spec} n={n}: decode-add");
        }
    }
}

#[test]
fn tiny_and_huge_scales_match_too() {
    let device = common::gpu();
    let gpu = device.as_gpu().unwrap();
    let ctx = CodecContext {
        seed: 5,
        step: 1,
        key: 2,
        stream: 0,
    };
    for spec in ALL {
        let codec = parse(spec).unwrap();
        for x in [
            vec![1e-40f32, 0.0, -1e-40, 0.0, 2e-39],
            vec![1e-37, 0.0, -3e-38],
            vec![1e38, -3e38, 0.0, 1.0],
            // Squares past f32's range: the l2 norm is taken of values scaled by 2^-64.
            vec![2e19; 100],
            // Values near f32::MAX: scales saturate, random-k's n / k saturates, recursive
            // sign's rounds add up past the range; every payload still decodes alike.
            vec![f32::MAX; 64],
            (0..333)
                .map(|i| if i % 2 == 0 { f32::MAX } else { -3e38 })
                .collect(),
            // The sign scale's rounding: a tie to even, the same tie broken upwards by a value
            // below the fixed-point frame, a subnormal tie, one magnitude across chunks.
            vec![2.0 + 2f32.powi(-22), -(1.0 - 2f32.powi(-24)), 0.0],
            vec![
                2.0 + 2f32.powi(-22),
                -(1.0 - 2f32.powi(-24)),
                2f32.powi(-100),
            ],
            vec![f32::from_bits(3), 0.0],
            (0..10_007)
                .map(|i| if i % 3 == 0 { -0.1 } else { 0.1 })
                .collect(),
        ] {
            let n = x.len();
            let want = codec.encode(&x, &ctx);
            let gx = gpu.upload(bytemuck::cast_slice(&x)).unwrap();
            let got = gpu
                .read(&codec.encode_gpu(gpu, &gx, n, &ctx).unwrap())
                .unwrap();
            assert_eq!(&got[..want.len()], &want[..], "{spec} {x:?}");
            let decoded = codec.decode(&want, n, &ctx).unwrap();
            let out = gpu.zeros(4 * n as u64).unwrap();
            codec
                .decode_gpu(
                    gpu,
                    &upload_bytes(gpu, &want),
                    &out,
                    n,
                    &ctx,
                    DecodeMode::Set,
                )
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&read_f32(gpu, &out, n)),
                bits(&decoded),
                "{spec} {x:?}"
            );
        }
    }
}

#[test]
fn ties_across_blocks_keep_the_lowest_indices_alike() {
    // Every magnitude equal: the selection takes the k lowest indices, and the tied keys'
    // prefix sums cross all three blocks (the scans in select.wgsl).
    let device = common::gpu();
    let gpu = device.as_gpu().unwrap();
    let n = 12_289;
    let x: Vec<f32> = (0..n)
        .map(|i| if i % 3 == 0 { -0.5 } else { 0.5 })
        .collect();
    let specs = [
        "topk:k=1",
        "topk:0.5",
        "topk:k=8193",
        "topk:1.0",
        "hybrid:bits=4:k=6000",
    ];
    gpu_payloads_equal_cpu_payloads(gpu, &x, &specs);
}

#[test]
fn multi_level_reductions_match_on_long_inputs() {
    // 4096 * 4096 + 5 elements: the canonical sum needs three levels.
    let device = common::gpu();
    let gpu = device.as_gpu().unwrap();
    let n = 4096 * 4096 + 5;
    let x = inputs(n, 99);
    gpu_payloads_equal_cpu_payloads(gpu, &x, &["sign", "dither:linear:s=15:norm=l2"]);
}

/// Encodes `x` with each codec on the CPU and on the GPU and fails unless the payloads are the
/// same bytes.
fn gpu_payloads_equal_cpu_payloads(gpu: &murmur_engine::gpu::Gpu, x: &[f32], specs: &[&str]) {
    let gx = gpu.upload(bytemuck::cast_slice(x)).unwrap();
    let ctx = CodecContext::default();
    for spec in specs {
        let codec = parse(spec).unwrap();
        let want = codec.encode(x, &ctx);
        let got = gpu
            .read(&codec.encode_gpu(gpu, &gx, x.len(), &ctx).unwrap())
            .unwrap();
        assert!(got[..want.len()] == want[..], "{spec}: bytes differ");
    }
}
