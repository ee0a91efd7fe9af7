//! LIEC-SGD and its baselines (liec-sgd.md §6): the testable invariants, on a least-squares
//! problem whose gradients are computed on the CPU, with N workers as threads joined by the
//! in-process collective.

mod common;

use murmur_engine::algo::cost::{bytes_over_steps, bytes_per_iteration};
use murmur_engine::algo::{blocks, Blocking, MethodSpec, OptimizerSpec, Worker};
use murmur_engine::comm::codec_context;
use murmur_engine::comm::local::local_collectives;
use murmur_engine::compress::{parse, DecodeMode};

use common::algo::*;

#[test]
fn with_the_identity_codec_every_algorithm_is_p_sgd() {
    let reference = Run {
        weight_decay: 0.01,
        ..Run::new(MethodSpec::PSgd, "f32")
    }
    .trace();
    for method in MethodSpec::liec_table().into_iter().chain([
        MethodSpec::Liec { period: 4 },
        MethodSpec::Cser { period: 3 },
    ]) {
        let trace = Run {
            weight_decay: 0.01,
            ..Run::new(method, "f32")
        }
        .trace();
        for t in 0..trace.x.len() {
            for x in &trace.x[t] {
                let d = max_diff(x, &reference.x[t][0]);
                assert!(d < 1e-5, "{method} step {t}: {d} from P-SGD");
            }
            assert!(
                trace.server_error[t].iter().all(|e| *e == 0.0),
                "{method}: the server holds nothing back"
            );
        }
    }
}

#[test]
fn with_period_one_liec_is_p_sgd_for_any_codec() {
    let reference = Run::new(MethodSpec::PSgd, "f32").trace();
    for codec in ["sign", "topk:k=3"] {
        let trace = Run::new(MethodSpec::Liec { period: 1 }, codec).trace();
        for t in 0..trace.x.len() {
            assert!(
                all_equal_bits(&trace.x[t]),
                "{codec} step {t}: replicas differ"
            );
            let d = max_diff(&trace.x[t][0], &reference.x[t][0]);
            assert!(d < 1e-5, "{codec} step {t}: {d} from P-SGD");
        }
    }
}

/// The scaled sign of each block, decoded, as the workers and the server compute it.
fn sign_blocks(v: &[f32], round: u64) -> Vec<f32> {
    sign_of(v, round, Blocking::Bucket { bytes: 100 })
}

/// The scaled sign of the whole vector, decoded.
fn sign_whole(v: &[f32], round: u64) -> Vec<f32> {
    sign_of(v, round, Blocking::Whole)
}

fn sign_of(v: &[f32], round: u64, blocking: Blocking) -> Vec<f32> {
    let codec = parse("sign").unwrap();
    let mut out = vec![0.0f32; v.len()];
    for b in blocks::blocks(&SIZES, blocking).unwrap() {
        let ctx = codec_context(SEED, round, b.key);
        let range = b.offset..b.offset + b.len;
        let payload = codec.encode(&v[range.clone()], &ctx);
        codec
            .decode_into(&payload, &mut out[range], &ctx, DecodeMode::Set)
            .unwrap();
    }
    out
}

#[test]
fn one_worker_follows_the_hand_written_update() {
    // liec-sgd.md §6.3: with N = 1, x ← x − η(C(e + C(g)) + g − C(g)), e ← e + C(g) − C(e + C(g)).
    let run = Run {
        workers: 1,
        steps: 5,
        ..Run::new(MethodSpec::Liec { period: 100 }, "sign")
    };
    let trace = run.trace();
    let (mut x, mut e) = (trace.x0.clone(), vec![0.0f32; D]);
    let mut replica = LeastSquares::new(0);
    for t in 0..run.steps as usize {
        let g = replica.clone_gradient(&x, t as u64);
        let cg = sign_blocks(&g, t as u64);
        let v: Vec<f32> = e.iter().zip(&cg).map(|(e, c)| e + c).collect();
        let p = sign_blocks(&v, t as u64);
        for i in 0..D {
            x[i] -= run.lr * (p[i] + (g[i] - cg[i]));
            e[i] = v[i] - p[i];
        }
        assert!(max_diff(&x, &trace.x[t][0]) < 1e-6, "step {t}");
        assert!(max_diff(&e, &trace.server_error[t]) < 1e-6, "step {t}");
    }
}

/// One worker of `method` with learning rate `lrs[t]` at step t: its model and the server's
/// error after every step.
fn one_worker(method: MethodSpec, lrs: &[f32], wd: f32) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut replica = LeastSquares::new(0);
    let c = local_collectives(1).pop().unwrap();
    let mut w = Worker::new(
        method,
        "sign",
        OptimizerSpec::Sgd,
        Blocking::Whole,
        SEED,
        &replica,
        Box::new(c),
    )
    .unwrap();
    let (mut xs, mut es) = (Vec::new(), Vec::new());
    for &lr in lrs {
        w.step(&mut replica, lr, wd).unwrap();
        xs.push(w.x.clone());
        es.push(w.exchange.server_error().unwrap());
    }
    (xs, es)
}

#[test]
fn the_baselines_follow_their_hand_written_recursions() {
    // liec-sgd.md §3 with N = 1, a learning rate that drops 10x, and weight decay.
    let lrs = [0.05f32, 0.05, 0.05, 0.005, 0.005, 0.005];
    let wd = 0.01;
    let x0 = LeastSquares::new(0).x;
    let mut replica = LeastSquares::new(0);
    let sub = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| a - b).collect::<Vec<f32>>();
    let add = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| a + b).collect::<Vec<f32>>();
    for method in [
        MethodSpec::MemSgd,
        MethodSpec::DoubleSqueeze,
        MethodSpec::Neolithic { rounds: 2 },
        MethodSpec::Ef21P,
    ] {
        let (xs, es) = one_worker(method, &lrs, wd);
        // Worker model (w for EF21-P), worker error, server memory (x − w's negative for EF21-P).
        let (mut x, mut e, mut server) = (x0.clone(), vec![0.0f32; D], vec![0.0f32; D]);
        let mut primal = x0.clone(); // EF21-P's true iterate
        for (t, &lr) in lrs.iter().enumerate() {
            let round = t as u64;
            let g = replica.clone_gradient(&x, round);
            let fcc = |v: &[f32]| {
                let m1 = sign_whole(v, round);
                add(&m1, &sign_whole(&sub(v, &m1), round))
            };
            let u = match method {
                MethodSpec::MemSgd => {
                    let a = add(&g, &e);
                    let c = sign_whole(&a, round);
                    e = sub(&a, &c);
                    c
                }
                MethodSpec::DoubleSqueeze | MethodSpec::Neolithic { .. } => {
                    let compress = |v: &[f32]| {
                        if method == MethodSpec::DoubleSqueeze {
                            sign_whole(v, round)
                        } else {
                            fcc(v)
                        }
                    };
                    let a = add(&g, &e);
                    let c = compress(&a);
                    e = sub(&a, &c);
                    let v = add(&c, &server);
                    let p = compress(&v);
                    server = sub(&v, &p);
                    p
                }
                _ => {
                    // EF21-P in its primal form: x := x − η C(g(w) + λw); p := C(x − w); w += p.
                    let q: Vec<f32> = g.iter().zip(&x).map(|(g, w)| g + wd * w).collect();
                    let c = sign_whole(&q, round);
                    primal = primal.iter().zip(&c).map(|(x, c)| x - lr * c).collect();
                    let p = sign_whole(&sub(&primal, &x), round);
                    x = add(&x, &p);
                    let err = (0..D).map(|k| (x[k] - xs[t][k]).abs()).fold(0.0, f32::max);
                    assert!(
                        err < 1e-5,
                        "{method} step {t}: w is {err} off the primal form"
                    );
                    let m = sub(&xs[t], &es[t]);
                    let err = max_diff(&m, &primal);
                    assert!(err < 1e-5, "{method} step {t}: x = w − M is {err} off");
                    x = xs[t].clone();
                    continue;
                }
            };
            for k in 0..D {
                x[k] -= lr * (u[k] + wd * x[k]);
            }
            let d = max_diff(&x, &xs[t]);
            assert!(d < 1e-5, "{method} step {t}: {d} off the recursion");
            assert!(
                max_diff(&server, &es[t]) < 1e-5,
                "{method} step {t}: server error"
            );
            x = xs[t].clone();
        }
    }
}

#[test]
fn the_average_model_lags_ideal_sgd_by_exactly_the_server_error() {
    // Lemma 3 (liec-sgd.md §6.4): x̄_{t+1} = x̄_t − η(avg g_t + e_t − e_{t+1}), so with a constant
    // η, x̄_t − x̂_t = η e_t for the virtual sequence x̂_{t+1} = x̂_t − η avg g_t; and the drift
    // identity (§6.6): x̄_t − x_t^i = η Σ_τ (r_τ^i − avg_j r_τ^j) since the last sync.
    let run = Run {
        steps: 10,
        ..Run::new(MethodSpec::Liec { period: 100 }, "sign")
    };
    let trace = run.trace();
    let mut ideal = trace.x0.clone();
    let mut drift = vec![vec![0.0f32; D]; run.workers];
    for t in 0..run.steps as usize {
        let avg_g = mean(&trace.g[t]);
        ideal
            .iter_mut()
            .zip(&avg_g)
            .for_each(|(x, g)| *x -= run.lr * g);
        let x_bar = mean(&trace.x[t]);
        let lag: Vec<f32> = x_bar.iter().zip(&ideal).map(|(a, b)| a - b).collect();
        let expected: Vec<f32> = trace.server_error[t].iter().map(|e| run.lr * e).collect();
        assert!(max_diff(&lag, &expected) < 2e-5, "step {t}: x̄ − x̂ ≠ η e");
        let r: Vec<Vec<f32>> = trace.g[t]
            .iter()
            .map(|g| {
                let c = sign_blocks(g, t as u64);
                g.iter().zip(&c).map(|(g, c)| g - c).collect()
            })
            .collect();
        let avg_r = mean(&r);
        for i in 0..run.workers {
            for k in 0..D {
                drift[i][k] += run.lr * (r[i][k] - avg_r[k]);
            }
            let actual: Vec<f32> = x_bar
                .iter()
                .zip(&trace.x[t][i])
                .map(|(a, b)| a - b)
                .collect();
            assert!(
                max_diff(&actual, &drift[i]) < 2e-5,
                "step {t} worker {i}: drift"
            );
        }
        assert!(
            !all_equal_bits(&trace.x[t]),
            "step {t}: local models differ between syncs"
        );
    }
}

#[test]
fn a_sync_step_averages_the_models_and_empties_the_server() {
    // liec-sgd.md §6.5 and §6.12: sync steps are t = H − 1, 2H − 1, ... of the global counter.
    let period = 4;
    let run = Run {
        steps: 13,
        weight_decay: 0.01,
        ..Run::new(MethodSpec::Liec { period }, "sign")
    };
    let trace = run.trace();
    for t in 0..run.steps as usize {
        let sync = (t as u64 + 1).is_multiple_of(period);
        assert_eq!(all_equal_bits(&trace.x[t]), sync, "step {t}");
        assert_eq!(
            trace.server_error[t].iter().all(|e| *e == 0.0),
            sync,
            "step {t}: the server error is reset exactly at syncs"
        );
    }
}

#[test]
fn the_server_error_is_what_the_scaled_sign_drops() {
    // liec-sgd.md §6.7: e_{t+1} = v − C(v), so |e|² = |v|² − Σ_b |v_b|_1² / d_b, with
    // v = C(v) + e the server's compensated mean.
    let run = Run::new(MethodSpec::Liec { period: 100 }, "sign");
    let trace = run.trace();
    let bl = blocks::blocks(&SIZES, Blocking::Bucket { bytes: 100 }).unwrap();
    for t in 0..trace.x.len() {
        let e = &trace.server_error[t];
        // The reply every worker decoded, recovered from worker 0's update (λ = 0):
        // x_{t+1} = x_t − η(p + r), so p = (x_t − x_{t+1})/η − r.
        let before = if t == 0 {
            trace.x0.clone()
        } else {
            trace.x[t - 1][0].clone()
        };
        let g = &trace.g[t][0];
        let c = sign_blocks(g, t as u64);
        let p: Vec<f32> = (0..D)
            .map(|k| (before[k] - trace.x[t][0][k]) / run.lr - (g[k] - c[k]))
            .collect();
        let v: Vec<f32> = p.iter().zip(e).map(|(p, e)| p + e).collect();
        let dropped: f64 = bl
            .iter()
            .map(|b| {
                let vb = &v[b.offset..b.offset + b.len];
                let l1: f64 = vb.iter().map(|v| v.abs() as f64).sum();
                norm2(vb) - l1 * l1 / b.len as f64
            })
            .sum();
        assert!(
            (norm2(e) - dropped).abs() < 1e-3 * norm2(&v).max(1e-6),
            "step {t}: |e|² = {} but the sign drops {dropped}",
            norm2(e)
        );
    }
}

#[test]
fn cser_drift_is_the_spread_of_the_accumulated_residuals() {
    // liec-sgd.md §3: η s_i is worker i's drift, x_i − x̄ = η(s_i − avg_j s_j) (λ = 0), and the
    // reset round every H_c steps shrinks the spread.
    let run = Run::new(MethodSpec::Cser { period: 4 }, "sign");
    let trace = run.trace();
    for t in 0..run.steps as usize {
        let x_bar = mean(&trace.x[t]);
        let s_bar = mean(&trace.worker_error[t]);
        for i in 0..run.workers {
            let actual: Vec<f32> = trace.x[t][i]
                .iter()
                .zip(&x_bar)
                .map(|(a, b)| a - b)
                .collect();
            let expected: Vec<f32> = trace.worker_error[t][i]
                .iter()
                .zip(&s_bar)
                .map(|(s, m)| run.lr * (s - m))
                .collect();
            assert!(max_diff(&actual, &expected) < 2e-5, "step {t} worker {i}");
        }
    }
    let spread = |t: usize| -> f64 {
        let s_bar = mean(&trace.worker_error[t]);
        trace.worker_error[t]
            .iter()
            .map(|s| norm2(&s.iter().zip(&s_bar).map(|(a, b)| a - b).collect::<Vec<_>>()))
            .sum()
    };
    assert!(
        spread(3) < spread(2),
        "the reset at t = 3 shrinks the drift"
    );
}

#[test]
fn fused_sync_payload_matches_a_literal_transcription_of_algorithm_1() {
    // The unfused form: workers send g_i and x_i, the server returns v = mean g + e (e reset)
    // and x̄, every worker sets x := x̄ − η(v + λx̄) (liec-sgd.md §2).
    let run = Run {
        steps: 11,
        weight_decay: 0.02,
        ..Run::new(MethodSpec::Liec { period: 4 }, "sign")
    };
    let trace = run.trace();
    let mut x = vec![trace.x0.clone(); run.workers];
    let mut e = vec![0.0f32; D];
    let mut replicas: Vec<LeastSquares> = (0..run.workers).map(LeastSquares::new).collect();
    let (lr, wd) = (run.lr, run.weight_decay);
    for t in 0..run.steps as usize {
        let g: Vec<Vec<f32>> = (0..run.workers)
            .map(|i| replicas[i].clone_gradient(&x[i], t as u64))
            .collect();
        if (t + 1) % 4 == 0 {
            let v: Vec<f32> = mean(&g).iter().zip(&e).map(|(g, e)| g + e).collect();
            e = vec![0.0; D];
            let x_bar = mean(&x);
            for xi in x.iter_mut() {
                for k in 0..D {
                    xi[k] = x_bar[k] - lr * (v[k] + wd * x_bar[k]);
                }
            }
        } else {
            let c: Vec<Vec<f32>> = g.iter().map(|g| sign_blocks(g, t as u64)).collect();
            let v: Vec<f32> = mean(&c).iter().zip(&e).map(|(c, e)| c + e).collect();
            let p = sign_blocks(&v, t as u64);
            e = v.iter().zip(&p).map(|(v, p)| v - p).collect();
            for i in 0..run.workers {
                for k in 0..D {
                    x[i][k] -= lr * (p[k] + g[i][k] - c[i][k] + wd * x[i][k]);
                }
            }
        }
        for (i, (xi, traced)) in x.iter().zip(&trace.x[t]).enumerate() {
            let d = max_diff(xi, traced);
            assert!(
                d < 1e-5,
                "step {t} worker {i}: fused and literal differ by {d}"
            );
        }
    }
}

#[test]
fn replicas_of_every_shared_model_algorithm_stay_bit_identical() {
    for method in [
        MethodSpec::PSgd,
        MethodSpec::MemSgd,
        MethodSpec::DoubleSqueeze,
        MethodSpec::Neolithic { rounds: 2 },
        MethodSpec::Ef21P,
    ] {
        let trace = Run {
            weight_decay: 0.01,
            ..Run::new(method, "sign")
        }
        .trace();
        for (t, xs) in trace.x.iter().enumerate() {
            assert!(all_equal_bits(xs), "{method} step {t}");
        }
    }
}

#[test]
fn byte_counters_equal_the_cost_formulas() {
    // liec-sgd.md §6.10, over 13 steps: three LIEC(4) syncs, three CSER(4) resets.
    for method in MethodSpec::liec_table().into_iter().chain([
        MethodSpec::Liec { period: 4 },
        MethodSpec::Cser { period: 4 },
    ]) {
        let run = Run {
            steps: 13,
            ..Run::new(method, "sign")
        };
        let trace = run.trace();
        let bl = blocks::blocks(&SIZES, run.blocking).unwrap();
        let expected = bytes_over_steps(method, "sign", &bl, run.workers as u64, 13).unwrap();
        assert_eq!(trace.bytes, expected, "{method}: counted bytes");
    }
    // Neolithic sends twice what DoubleSqueeze sends; MEM-SGD's downlink is always full.
    let bl = blocks::blocks(&SIZES, Blocking::Whole).unwrap();
    let cost = |m| bytes_per_iteration(m, "sign", &bl, 8).unwrap();
    assert_eq!(
        cost(MethodSpec::Neolithic { rounds: 2 }),
        2.0 * cost(MethodSpec::DoubleSqueeze)
    );
    let sign_bytes = parse("sign").unwrap().payload_len(D) as f64;
    assert_eq!(
        cost(MethodSpec::MemSgd),
        8.0 * (sign_bytes + 4.0 * D as f64)
    );
}

#[test]
fn liec_reports_no_worker_error_and_the_error_feedback_baselines_do() {
    // liec-sgd.md §6.11: LIEC's only persistent vector is the server's error.
    let replica = LeastSquares::new(0);
    let c = local_collectives(1).pop().unwrap();
    let mut w = Worker::new(
        MethodSpec::Liec { period: 8 },
        "sign",
        OptimizerSpec::Sgd,
        Blocking::Whole,
        SEED,
        &replica,
        Box::new(c),
    )
    .unwrap();
    let mut replica = replica;
    w.step(&mut replica, 0.05, 0.0).unwrap();
    assert!(w.method.worker_error().is_none());
    for method in [
        MethodSpec::MemSgd,
        MethodSpec::DoubleSqueeze,
        MethodSpec::Cser { period: 4 },
    ] {
        let c = local_collectives(1).pop().unwrap();
        let mut replica = LeastSquares::new(0);
        let mut w = Worker::new(
            method,
            "sign",
            OptimizerSpec::Sgd,
            Blocking::Whole,
            SEED,
            &replica,
            Box::new(c),
        )
        .unwrap();
        w.step(&mut replica, 0.05, 0.0).unwrap();
        let e = w.method.worker_error().expect("a worker error");
        assert!(
            norm2(&e) > 0.0,
            "{method}: the worker keeps what sign dropped"
        );
    }
}
