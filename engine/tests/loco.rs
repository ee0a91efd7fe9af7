//! LoCo (loco.md §6) on the least-squares harness: the method against its special cases, the
//! replicated path's integer-sum downlink, the sharded path's owners, bytes, replicas, and the
//! convergence smoke test.

mod common;

use common::algo::*;
use murmur_engine::algo::blocks::blocks;
use murmur_engine::algo::cost::bytes_over_steps;
use murmur_engine::algo::{Hyper, MethodSpec, OptimizerSpec};
use murmur_engine::compress::{parse, Codec, CodecContext};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn loco(spec: &str) -> MethodSpec {
    spec.parse().unwrap()
}

fn run(method: MethodSpec, codec: &'static str, optimizer: OptimizerSpec) -> Run {
    Run {
        workers: 4,
        optimizer,
        lr: 0.01,
        weight_decay: 0.01,
        ..Run::new(method, codec)
    }
}

#[test]
fn special_cases_give_the_exact_baselines() {
    for optimizer in [OptimizerSpec::Sgd, OptimizerSpec::ADAMW] {
        // The identity codec: the plain optimizer, bit for bit, the error always zero.
        let plain = run(MethodSpec::PSgd, "f32", optimizer).trace();
        let identity = run(loco("loco:log2se=10"), "f32", optimizer).trace();
        // beta = 0: the error never moves, naive 4-bit; T_c = 1: reset before every use.
        let codec = "loco:bits=4:log2s=3";
        let naive = run(MethodSpec::DIRECT, codec, optimizer).trace();
        let beta0 = run(loco("loco:beta=0"), codec, optimizer).trace();
        let reset1 = run(loco("loco:beta=0.5:reset=1:f32"), codec, optimizer).trace();
        let full = run(loco("loco:beta=0.5"), codec, optimizer).trace();
        for t in 0..plain.x.len() {
            assert_eq!(
                bits(&identity.x[t][0]),
                bits(&plain.x[t][0]),
                "{optimizer} {t}"
            );
            assert_eq!(
                bits(&beta0.x[t][0]),
                bits(&naive.x[t][0]),
                "{optimizer} {t}"
            );
            assert_eq!(
                bits(&reset1.x[t][0]),
                bits(&naive.x[t][0]),
                "{optimizer} {t}"
            );
            for errors in [&identity, &beta0, &reset1] {
                assert!(errors.worker_error[t].iter().flatten().all(|e| *e == 0.0));
            }
            assert!(
                all_equal_bits(&full.x[t]),
                "{optimizer}: replicas differ at {t}"
            );
        }
        // With a memory that moves, LoCo differs from naive and its error is on the 8-bit
        // grid of s_e = 4 s = 32, within 128 / s_e.
        assert_ne!(full.x[11][0], naive.x[11][0]);
        let e = &full.worker_error[10][0];
        assert!(e.iter().any(|v| *v != 0.0));
        assert!(e
            .iter()
            .all(|v| (v * 32.0).fract() == 0.0 && v.abs() <= 4.0));
    }
}

#[test]
fn four_bit_codes_go_up_and_their_integer_sum_comes_back() {
    // loco.md §6.11 with 4 workers (a power of two): each push is ceil(len/2) bytes of codes,
    // each reply one byte per element (the sum of four 4-bit codes at scale 4 s).
    let r = run(MethodSpec::LOCO, "loco:bits=4:log2s=3", OptimizerSpec::Sgd);
    let trace = r.trace();
    let per_step: u64 = SIZES.iter().map(|&n| n.div_ceil(2) as u64 + n as u64).sum();
    assert_eq!(trace.bytes, per_step * r.steps * r.workers as u64);
    // With 3 workers the mean is not on a power-of-two grid: the reply is f32.
    let three = Run {
        workers: 3,
        ..run(MethodSpec::LOCO, "loco:bits=4:log2s=3", OptimizerSpec::Sgd)
    };
    let per_step: u64 = SIZES
        .iter()
        .map(|&n| n.div_ceil(2) as u64 + 4 * n as u64)
        .sum();
    assert_eq!(three.trace().bytes, per_step * three.steps * 3);
}

#[test]
fn loco_tracks_sgd_where_naive_four_bit_drifts() {
    // loco.md §6.13: 1500 SGD steps with a grid of step 1 (log2 s = 0), where most gradient
    // entries sit within half a step of zero. Distances of the final models to P-SGD's.
    let long = |method, codec| {
        Run {
            steps: 1500,
            weight_decay: 0.0,
            ..run(method, codec, OptimizerSpec::Sgd)
        }
        .trace()
    };
    let last = |t: &Trace| t.x[t.x.len() - 1][0].clone();
    let sgd = last(&long(MethodSpec::PSgd, "f32"));
    let distance = |method| {
        let x = last(&long(method, "loco:bits=4:log2s=0"));
        norm2(&x.iter().zip(&sgd).map(|(a, b)| a - b).collect::<Vec<_>>()).sqrt()
    };
    let naive = distance(MethodSpec::DIRECT);
    let mode_a = distance(loco("loco:f32"));
    let ef8 = distance(loco("loco:beta=1:reset=0"));
    assert!(mode_a < naive / 2.0, "LoCo {mode_a} vs naive {naive}");
    assert!(
        ef8 < naive / 2.0,
        "EF with 8-bit error {ef8} vs naive {naive}"
    );
}

#[test]
fn the_sharded_path_steps_the_owners_and_hands_out_bf16_parameters() {
    // loco.md §2.6: the owners adopt the workers' parameters, then every step average the
    // dequantized pushes in f32, step AdamW on their f32 master copy and send it back in bf16,
    // which the workers compute their next gradients at. Checked against that recursion
    // written out here (naive 4-bit pushes, so no worker memory is involved).
    let codec = "loco:bits=4:log2s=3";
    let r = run(
        MethodSpec::Direct { sharded: true },
        codec,
        OptimizerSpec::ADAMW,
    );
    let trace = r.trace();
    let (four, bf16) = (parse(codec).unwrap(), parse("bf16").unwrap());
    let ctx = CodecContext::default();
    let round_trip =
        |c: &dyn Codec, v: &[f32]| c.decode(&c.encode(v, &ctx), v.len(), &ctx).unwrap();
    let mut master = trace.x0.clone();
    let mut optimizer = OptimizerSpec::ADAMW.build(&[D]);
    let mut replicas: Vec<LeastSquares> = (0..r.workers).map(LeastSquares::new).collect();
    for t in 0..r.steps {
        let x = round_trip(&*bf16, &master);
        let pushes: Vec<Vec<f32>> = replicas
            .iter_mut()
            .map(|w| round_trip(&*four, &w.clone_gradient(&x, t)))
            .collect();
        let u = mean(&pushes);
        let hyper = Hyper {
            step: t,
            lr: r.lr,
            weight_decay: r.weight_decay,
        };
        optimizer.step(&mut master, &u, hyper).unwrap();
        let expected = bits(&round_trip(&*bf16, &master));
        for (i, x) in trace.x[t as usize].iter().enumerate() {
            assert_eq!(bits(x), expected, "worker {i} after step {t}");
        }
    }
    // Bytes: the parameter round (f32 up, bf16 down), then per step the codes plus an 8-byte
    // step header up and bf16 parameters down, per block.
    let params: u64 = SIZES.iter().map(|&n| 6 * n as u64).sum();
    let per_step: u64 = SIZES
        .iter()
        .map(|&n| 8 + n.div_ceil(2) as u64 + 2 * n as u64)
        .sum();
    let expected = (params + per_step * r.steps) * r.workers as u64;
    assert_eq!(trace.bytes, expected);
    let blocks = blocks(&SIZES, r.blocking).unwrap();
    let formula = bytes_over_steps(r.method, codec, &blocks, r.workers as u64, r.steps).unwrap();
    assert_eq!(formula, expected);
}

#[test]
fn sharded_loco_keeps_replicas_identical_and_tracks_the_replicated_path() {
    // The same LoCo memories on both paths; only the parameters the gradients are taken at
    // differ (bf16 copies of the owners' f32 master on the sharded path).
    let codec = "loco:bits=4:log2s=3";
    let long = |method| {
        Run {
            steps: 200,
            ..run(method, codec, OptimizerSpec::ADAMW)
        }
        .trace()
    };
    let sharded = long(loco("loco:beta=0.5:sharded"));
    let replicated = long(loco("loco:beta=0.5"));
    for (t, xs) in sharded.x.iter().enumerate() {
        assert!(all_equal_bits(xs), "replicas differ after step {t}");
    }
    let loss = |x: &[f32]| {
        let mut w = LeastSquares::new(0);
        (0..16).map(|s| w.clone_loss(x, 10_000 + s)).sum::<f32>()
    };
    let (first, end) = (loss(&sharded.x0), sharded.x.len() - 1);
    let (s, p) = (loss(&sharded.x[end][0]), loss(&replicated.x[end][0]));
    assert!(s < 0.5 * first, "sharded LoCo: loss {first} -> {s}");
    assert!((s - p).abs() < 0.05 * p, "sharded {s} vs replicated {p}");
    let e = &sharded.worker_error[end][0];
    assert!(e.iter().any(|v| *v != 0.0), "the worker memories move");
}
