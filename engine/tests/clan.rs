//! CLAN (byteps-clan.md §7): LANS and Nesterov momentum over the parameter servers' two-way
//! compressed rounds, Algorithm 3 (`two-way`, no memory) and Algorithm 4 (`double-squeeze`,
//! error feedback on both sides), on the least-squares harness.

mod common;

use common::algo::*;
use murmur_engine::algo::cost::bytes_over_steps;
use murmur_engine::algo::{blocks, MethodSpec, OptimizerSpec};

fn clan(method: MethodSpec, codec: &'static str, optimizer: OptimizerSpec) -> Run {
    Run {
        optimizer,
        lr: 0.02,
        weight_decay: 0.01,
        ..Run::new(method, codec)
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn with_the_identity_codec_both_algorithms_are_exactly_lans_and_nag() {
    for optimizer in [OptimizerSpec::LANS, OptimizerSpec::NAG] {
        let reference = clan(MethodSpec::PSgd, "f32", optimizer).trace();
        for method in [MethodSpec::TwoWay, MethodSpec::DoubleSqueeze] {
            let trace = clan(method, "f32", optimizer).trace();
            for t in 0..trace.x.len() {
                assert_eq!(
                    bits(&trace.x[t][0]),
                    bits(&reference.x[t][0]),
                    "{method} with {optimizer}, step {t}"
                );
                assert!(trace.server_error[t].iter().all(|e| *e == 0.0));
                assert!(trace.worker_error[t].iter().flatten().all(|e| *e == 0.0));
            }
        }
    }
}

#[test]
fn replicas_stay_bit_identical_with_every_codec_of_the_paper() {
    for (method, codec) in [
        (MethodSpec::DoubleSqueeze, "sign"),
        (MethodSpec::DoubleSqueeze, "topk:0.25"),
        (MethodSpec::DoubleSqueeze, "randk:1/4:unscaled"),
        (MethodSpec::TwoWay, "dither:linear:s=7"),
        (MethodSpec::TwoWay, "dither:natural:s=3"),
        (MethodSpec::TwoWay, "f16"),
    ] {
        for optimizer in [OptimizerSpec::LANS, OptimizerSpec::NAG] {
            let run = clan(method, codec, optimizer);
            let trace = run.trace();
            for t in 0..trace.x.len() {
                assert!(
                    all_equal_bits(&trace.x[t]),
                    "{method} {codec} {optimizer}: replicas differ at step {t}"
                );
            }
            let moved = max_diff(&trace.x[trace.x.len() - 1][0], &trace.x0);
            assert!(moved > 1e-3, "{method} {codec} {optimizer}: moved {moved}");
            let bl = blocks::blocks(&SIZES, run.blocking).unwrap();
            let expected = bytes_over_steps(method, codec, &bl, 3, run.steps).unwrap();
            assert_eq!(trace.bytes, expected, "{method} {codec}: counted bytes");
        }
    }
}

/// `p_t`, the reply every worker applied at step t, from SGD's `x_{t+1} = x_t − η p_t`.
fn replies(trace: &Trace, lr: f32) -> Vec<Vec<f64>> {
    let mut prev: Vec<f64> = trace.x0.iter().map(|&v| v as f64).collect();
    trace
        .x
        .iter()
        .map(|xs| {
            let now: Vec<f64> = xs[0].iter().map(|&v| v as f64).collect();
            let p = prev
                .iter()
                .zip(&now)
                .map(|(a, b)| (a - b) / lr as f64)
                .collect();
            prev = now;
            p
        })
        .collect()
}

#[test]
fn algorithm_4_telescopes_and_its_errors_stay_within_lemma_2() {
    // Σ_τ≤t p_τ = Σ_τ≤t mean_i g_τ,i − mean_i e_t+1,i − ẽ_t+1 (byteps-clan.md §7.4), with
    // top-k of ratio 1/4 on blocks of 37 and 5 elements (δ ≥ min k/d_p = 1/5).
    let run = Run {
        steps: 30,
        ..clan(MethodSpec::DoubleSqueeze, "topk:0.25", OptimizerSpec::Sgd)
    };
    let run = Run {
        weight_decay: 0.0,
        ..run
    };
    let trace = run.trace();
    let p = replies(&trace, run.lr);
    let mut sent = vec![0f64; D];
    let mut true_sum = vec![0f64; D];
    let mut g_max = 0f64;
    for (t, p) in p.iter().enumerate() {
        for (s, p) in sent.iter_mut().zip(p) {
            *s += p;
        }
        for g in &trace.g[t] {
            for (i, s) in true_sum.iter_mut().enumerate() {
                *s += g[i] as f64 / run.workers as f64;
                g_max = g_max.max((g[i] as f64).abs());
            }
        }
        let held: Vec<f64> = (0..D)
            .map(|i| {
                trace.worker_error[t]
                    .iter()
                    .map(|e| e[i] as f64)
                    .sum::<f64>()
                    / run.workers as f64
                    + trace.server_error[t][i] as f64
            })
            .collect();
        for i in 0..D {
            let gap = (sent[i] - (true_sum[i] - held[i])).abs();
            assert!(
                gap < 1e-3 * (1.0 + true_sum[i].abs()),
                "step {t} element {i}: {gap}"
            );
        }
        // Lemma 2 with d = 42, δ = 1/5, G the largest gradient entry so far.
        let (d, delta) = (D as f64, 0.2f64);
        let q = (1.0 - delta).sqrt();
        let worker_bound = (d * (1.0 - delta)).sqrt() / (1.0 - q) * g_max;
        let both_bound =
            (worker_bound / g_max + 2.0 * q / (1.0 - q) * (1.0 + worker_bound / g_max)) * g_max;
        for e in &trace.worker_error[t] {
            assert!(norm2(e).sqrt() <= worker_bound, "step {t}: worker error");
        }
        let held_norm = held.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!(
            held_norm <= both_bound,
            "step {t}: {held_norm} > {both_bound}"
        );
        assert!(held_norm > 0.0, "top-k holds something back");
    }
}

#[test]
fn algorithm_3_with_unbiased_dithering_is_unbiased_through_both_compressions() {
    // E[p_0] = mean_i g_0,i (byteps-clan.md §7.8): the first reply over many codec seeds,
    // against the exact mean, within four standard errors per element.
    let draws = 300;
    let lr = 0.02;
    let mut sum = vec![0f64; D];
    let mut sum_sq = vec![0f64; D];
    let mut mean_g = vec![0f64; D];
    for seed in 0..draws {
        let run = Run {
            steps: 1,
            seed,
            weight_decay: 0.0,
            ..clan(MethodSpec::TwoWay, "dither:linear:s=3", OptimizerSpec::Sgd)
        };
        let trace = run.trace();
        let p = &replies(&trace, lr)[0];
        for i in 0..D {
            sum[i] += p[i];
            sum_sq[i] += p[i] * p[i];
        }
        if seed == 0 {
            for g in &trace.g[0] {
                for i in 0..D {
                    mean_g[i] += g[i] as f64 / run.workers as f64;
                }
            }
        }
    }
    let n = draws as f64;
    let mut spread = 0.0;
    for i in 0..D {
        let m = sum[i] / n;
        let var = (sum_sq[i] / n - m * m).max(0.0);
        spread += var;
        let se = (var / n).sqrt();
        assert!(
            (m - mean_g[i]).abs() <= 4.0 * se + 1e-4,
            "element {i}: {m} vs {} (se {se})",
            mean_g[i]
        );
    }
    assert!(spread > 0.0, "the codec is stochastic");
}

#[test]
fn tensors_under_the_size_threshold_travel_uncompressed() {
    // byteps-clan.md §5.3: the 5-element tensor (20 bytes) is under a 64-byte threshold and
    // goes in f32 both ways; the 37-element one is compressed. Under a threshold above both,
    // Algorithm 4 with top-k is exactly LANS.
    let thresholded = |threshold| Run {
        blocking: format!("bucket:100:threshold={threshold}").parse().unwrap(),
        ..clan(MethodSpec::DoubleSqueeze, "topk:0.25", OptimizerSpec::LANS)
    };
    let lans = clan(MethodSpec::PSgd, "f32", OptimizerSpec::LANS).trace();
    let all_plain = thresholded(1000).trace();
    let mixed_run = thresholded(64);
    let mixed = mixed_run.trace();
    let compressed = clan(MethodSpec::DoubleSqueeze, "topk:0.25", OptimizerSpec::LANS).trace();
    let small = SIZES[0]..D;
    for t in 0..lans.x.len() {
        assert_eq!(bits(&all_plain.x[t][0]), bits(&lans.x[t][0]), "step {t}");
        // The small tensor keeps no error anywhere; the large one does.
        assert!(mixed.worker_error[t][0][small.clone()]
            .iter()
            .all(|e| *e == 0.0));
        assert!(mixed.server_error[t][small.clone()]
            .iter()
            .all(|e| *e == 0.0));
        assert!(all_equal_bits(&mixed.x[t]), "replicas differ at {t}");
    }
    let last = lans.x.len() - 1;
    assert!(mixed.worker_error[last][0][..SIZES[0]]
        .iter()
        .any(|e| *e != 0.0));
    assert!(compressed.worker_error[last][0][small]
        .iter()
        .any(|e| *e != 0.0));
    let bl = blocks::blocks(&SIZES, mixed_run.blocking).unwrap();
    assert_eq!(
        bl.iter().map(|b| b.plain).collect::<Vec<_>>(),
        [false, true]
    );
    let expected = bytes_over_steps(mixed_run.method, "topk:0.25", &bl, 3, mixed_run.steps);
    assert_eq!(mixed.bytes, expected.unwrap());
    // Top-k of 9 of 37 (8-byte pairs) both ways, and 5 plain floats both ways, per worker.
    assert_eq!(mixed.bytes, 3 * mixed_run.steps * (2 * 9 * 8 + 2 * 5 * 4));
}
