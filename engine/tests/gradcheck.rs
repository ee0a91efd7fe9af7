//! A finite-difference gradient check for every differentiable op of the autograd graph,
//! on the CPU reference path (the GPU kernels are held to the CPU by kernels_gpu_vs_cpu.rs),
//! plus GPU-against-CPU gradients of a composite graph.

mod common;

use murmur_engine::autograd::gradcheck::{gradcheck, GradcheckOptions};
use murmur_engine::kernels::unary::Unary;
use murmur_engine::rng::Rng;
use murmur_engine::{Device, Graph, Tensor, Var};

fn t(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Tensor {
    let mut rng = Rng::new(seed, 0);
    let n = shape.iter().product();
    Tensor::from_vec(
        &Device::Cpu,
        shape,
        (0..n).map(|_| rng.uniform_in(lo, hi)).collect(),
    )
    .unwrap()
}

/// Values in [0.2, 1.5] with random signs: away from the kinks of relu and abs.
fn away_from_zero(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = Rng::new(seed, 1);
    let n = shape.iter().product();
    let v = (0..n)
        .map(|_| rng.uniform_in(0.2, 1.5) * if rng.uniform() < 0.5 { -1.0 } else { 1.0 })
        .collect();
    Tensor::from_vec(&Device::Cpu, shape, v).unwrap()
}

use common::assert_gradcheck as check;

#[test]
fn matmul_all_transposes_and_batch_broadcasts() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = t(if ta { &[4, 3] } else { &[3, 4] }, 1, -1.0, 1.0);
        let b = t(if tb { &[5, 4] } else { &[4, 5] }, 2, -1.0, 1.0);
        check(&format!("matmul ta={ta} tb={tb}"), &[a, b], |g, v| {
            g.matmul_t(v[0], v[1], ta, tb)
        });
        // Batched A with a shared B (the folded gradient path) and the reverse.
        let a = t(if ta { &[2, 4, 3] } else { &[2, 3, 4] }, 3, -1.0, 1.0);
        let b = t(if tb { &[5, 4] } else { &[4, 5] }, 4, -1.0, 1.0);
        check(
            &format!("batched A, shared B ta={ta} tb={tb}"),
            &[a, b],
            |g, v| g.matmul_t(v[0], v[1], ta, tb),
        );
        let a = t(if ta { &[4, 3] } else { &[3, 4] }, 5, -1.0, 1.0);
        let b = t(if tb { &[2, 5, 4] } else { &[2, 4, 5] }, 6, -1.0, 1.0);
        check(
            &format!("shared A, batched B ta={ta} tb={tb}"),
            &[a, b],
            |g, v| g.matmul_t(v[0], v[1], ta, tb),
        );
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    let shapes: [(&[usize], &[usize]); 3] =
        [(&[3, 4], &[3, 4]), (&[3, 4], &[4]), (&[2, 1, 3], &[4, 1])];
    for (sa, sb) in shapes {
        let a = t(sa, 7, -1.0, 1.0);
        let b = t(sb, 8, 0.5, 1.5); // away from zero for division
        check(
            &format!("add {sa:?} {sb:?}"),
            &[a.clone(), b.clone()],
            |g, v| g.add(v[0], v[1]),
        );
        check(
            &format!("sub {sa:?} {sb:?}"),
            &[a.clone(), b.clone()],
            |g, v| g.sub(v[0], v[1]),
        );
        check(
            &format!("mul {sa:?} {sb:?}"),
            &[a.clone(), b.clone()],
            |g, v| g.mul(v[0], v[1]),
        );
        check(&format!("div {sa:?} {sb:?}"), &[a, b], |g, v| {
            g.div(v[0], v[1])
        });
    }
}

#[test]
fn unary_ops() {
    let x = away_from_zero(&[2, 5], 9);
    for op in [
        Unary::Relu,
        Unary::Gelu,
        Unary::Tanh,
        Unary::Sigmoid,
        Unary::Exp,
        Unary::Square,
        Unary::Abs,
        Unary::Affine {
            alpha: -0.7,
            beta: 2.0,
        },
    ] {
        check(&format!("{op:?}"), std::slice::from_ref(&x), |g, v| {
            g.unary(v[0], op)
        });
    }
    let pos = t(&[7], 10, 0.5, 2.0);
    for op in [Unary::Log, Unary::Sqrt] {
        check(&format!("{op:?}"), std::slice::from_ref(&pos), |g, v| {
            g.unary(v[0], op)
        });
    }
}

#[test]
fn reductions() {
    let x = t(&[2, 3, 4], 11, -1.0, 1.0);
    for axis in [0isize, 1, -1] {
        for keepdim in [false, true] {
            check(
                &format!("sum axis {axis} keepdim {keepdim}"),
                std::slice::from_ref(&x),
                |g, v| g.sum_axis(v[0], axis, keepdim),
            );
            check(
                &format!("mean axis {axis} keepdim {keepdim}"),
                std::slice::from_ref(&x),
                |g, v| g.mean_axis(v[0], axis, keepdim),
            );
        }
    }
    check("sum_all", std::slice::from_ref(&x), |g, v| g.sum_all(v[0]));
    check("mean_all", std::slice::from_ref(&x), |g, v| {
        g.mean_all(v[0])
    });
}

#[test]
fn softmax_and_cross_entropy() {
    let x = t(&[3, 5], 12, -2.0, 2.0);
    check("softmax", std::slice::from_ref(&x), |g, v| g.softmax(v[0]));
    let labels = Tensor::from_u32(&Device::Cpu, &[3], vec![4, 0, 2]).unwrap();
    check("cross_entropy", std::slice::from_ref(&x), |g, v| {
        g.cross_entropy(v[0], &labels)
    });
    check("cross_entropy_mean", std::slice::from_ref(&x), |g, v| {
        g.cross_entropy_mean(v[0], &labels)
    });
}

#[test]
fn layer_norm() {
    let x = t(&[3, 6], 13, -2.0, 2.0);
    let gamma = t(&[6], 14, 0.5, 1.5);
    let beta = t(&[6], 15, -0.5, 0.5);
    check("layer_norm", &[x, gamma, beta], |g, v| {
        g.layer_norm(v[0], v[1], v[2], 1e-5)
    });
}

#[test]
fn embedding_transpose_reshape() {
    let table = t(&[5, 3], 16, -1.0, 1.0);
    let ids = Tensor::from_u32(&Device::Cpu, &[2, 3], vec![4, 0, 4, 1, 1, 3]).unwrap();
    check(
        "embedding (repeated ids accumulate)",
        std::slice::from_ref(&table),
        |g, v| g.embedding(v[0], &ids),
    );
    let x = t(&[2, 3, 4], 17, -1.0, 1.0);
    check("transpose", std::slice::from_ref(&x), |g, v| {
        g.transpose(v[0])
    });
    check("reshape", std::slice::from_ref(&x), |g, v| {
        g.reshape(v[0], &[6, 4])
    });
}

#[test]
fn a_parameter_used_twice_gets_both_contributions() {
    // y = (x W) W^T: W appears in two products (weight tying).
    let x = t(&[2, 3], 18, -1.0, 1.0);
    let w = t(&[3, 4], 19, -1.0, 1.0);
    check("tied weight", &[x, w], |g, v| {
        let w_again = g.param(&g.value(v[1])); // a handle to the same storage: the same node
        assert_eq!(w_again, v[1]);
        let h = g.matmul(v[0], v[1])?;
        g.matmul_t(h, w_again, false, true)
    });
}

#[test]
fn a_wrong_rule_would_be_caught() {
    // The check itself must fail for a function whose backward is wrong: exp's value used
    // as sigmoid's derivative is off everywhere.
    let x = t(&[4], 20, -1.0, 1.0);
    let honest = gradcheck(
        std::slice::from_ref(&x),
        |g, v| g.sigmoid(v[0]),
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(honest.passed());
    // A graph whose forward is sigmoid but whose recorded op is exp (value swapped in).
    let report = gradcheck(
        std::slice::from_ref(&x),
        |g, v| {
            let e = g.unary(v[0], Unary::Exp)?; // backward: exp(x)
            let s = g.value(v[0]).sigmoid()?; // forward value of sigmoid, no graph
            let shift = g.input(&s.sub(&g.value(e))?);
            g.add(e, shift) // value = sigmoid(x), gradient claims exp(x)
        },
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(
        !report.passed(),
        "a wrong derivative passed: {}",
        report.worst
    );
}

#[test]
fn gpu_gradients_match_cpu_gradients_on_a_small_network() {
    let gpu = common::gpu();
    let x = t(&[6, 7], 21, -1.0, 1.0);
    let w1 = t(&[7, 5], 22, -0.5, 0.5);
    let b1 = t(&[5], 23, -0.1, 0.1);
    let w2 = t(&[5, 3], 24, -0.5, 0.5);
    let gamma = t(&[5], 25, 0.8, 1.2);
    let beta = t(&[5], 26, -0.1, 0.1);
    let labels = vec![0u32, 2, 1, 1, 0, 2];
    let run = |d: &Device| -> Vec<Vec<f32>> {
        let params: Vec<Tensor> = [&w1, &b1, &w2, &gamma, &beta]
            .iter()
            .map(|p| p.to(d).unwrap())
            .collect();
        let g = Graph::new(d);
        let v: Vec<Var> = params.iter().map(|p| g.param(p)).collect();
        let xi = g.input(&x.to(d).unwrap());
        let h = g.matmul(xi, v[0]).unwrap();
        let h = g.add(h, v[1]).unwrap();
        let h = g.layer_norm(h, v[3], v[4], 1e-5).unwrap();
        let h = g.gelu(h).unwrap();
        let logits = g.matmul(h, v[2]).unwrap();
        let loss = g
            .cross_entropy_mean(logits, &Tensor::from_u32(d, &[6], labels.clone()).unwrap())
            .unwrap();
        let grads = g.backward(loss).unwrap();
        grads
            .for_params(&params.iter().collect::<Vec<_>>())
            .unwrap()
            .iter()
            .map(|t| t.to_vec().unwrap())
            .collect()
    };
    let (cpu, gpu) = (run(&Device::Cpu), run(&gpu));
    for (i, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        common::assert_close(&format!("parameter {i}"), g, c, 1e-5, 1e-3);
    }
}
