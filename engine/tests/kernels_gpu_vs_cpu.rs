//! Every WGSL kernel against its CPU reference on awkward shapes: 1, primes, sizes that are
//! not multiples of any tile or workgroup, and batched/broadcast layouts.
//!
//! On lavapipe the two must agree bit for bit (see `common::exact_adapter`): the references
//! sum in the kernels' order and share their exp and log. On other adapters the comparison
//! allows |gpu - cpu| <= atol + rtol * |cpu|, because drivers may fuse multiply-adds:
//!
//! - elementwise ops: rtol 1e-5;
//! - matmul: relative 1e-5 of sum_k |a_ik * b_kj|;
//! - reductions, softmax, layernorm: rtol 1e-5 to 1e-4.
//!
//! Copies, transposes, gathers, scatter-adds and argmax are exact everywhere.

mod common;

use common::{assert_close, gpu, random};
use murmur_engine::kernels::binary::{binary, Binary};
use murmur_engine::kernels::embedding::{embedding, embedding_backward};
use murmur_engine::kernels::layernorm::{layernorm, layernorm_backward};
use murmur_engine::kernels::matmul::{matmul_gpu, matmul_ref, MatmulDims, MatmulKernel};
use murmur_engine::kernels::optim::{adamw_step, sgd_step, AdamWStep, SgdStep};
use murmur_engine::kernels::reduce::{argmax_last, reduce_axis, sum_all, sum_to_shape, Reduce};
use murmur_engine::kernels::softmax::{
    cross_entropy, cross_entropy_backward, softmax, softmax_backward,
};
use murmur_engine::kernels::unary::{unary, unary_backward, Unary};
use murmur_engine::rng::Rng;
use murmur_engine::{Device, Tensor};

fn both(shape: &[usize], data: &[f32]) -> (Tensor, Tensor) {
    (
        Tensor::from_vec(&Device::Cpu, shape, data.to_vec()).unwrap(),
        Tensor::from_vec(&gpu(), shape, data.to_vec()).unwrap(),
    )
}

fn both_u32(shape: &[usize], data: &[u32]) -> (Tensor, Tensor) {
    (
        Tensor::from_u32(&Device::Cpu, shape, data.to_vec()).unwrap(),
        Tensor::from_u32(&gpu(), shape, data.to_vec()).unwrap(),
    )
}

#[test]
fn matmul_both_kernels_all_transposes_awkward_shapes() {
    let gpu = gpu();
    let g = gpu.as_gpu().unwrap();
    let mut rng = Rng::new(11, 0);
    // (batch, m, n, k, a_batched, b_batched)
    let cases = [
        (1, 1, 1, 1, true, true),
        (1, 1, 7, 3, true, true),
        (1, 5, 1, 9, true, true),
        (1, 17, 13, 11, true, true),
        (1, 64, 64, 64, true, true),
        (1, 65, 129, 67, true, true),
        (1, 3, 300, 2, true, true),
        (1, 33, 8, 4, true, true),
        (3, 7, 10, 5, true, true),
        (4, 9, 6, 13, true, false),
        (2, 31, 17, 8, false, true),
    ];
    for &(batch, m, n, k, ab, bb) in &cases {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let dims = MatmulDims {
                batch,
                m,
                n,
                k,
                trans_a: ta,
                trans_b: tb,
                a_batched: ab,
                b_batched: bb,
            };
            let a = random(&mut rng, if ab { batch } else { 1 } * m * k, 1.0);
            let b = random(&mut rng, if bb { batch } else { 1 } * k * n, 1.0);
            let want = matmul_ref(&a, &b, &dims);
            let abs_a: Vec<f32> = a.iter().map(|v| v.abs()).collect();
            let abs_b: Vec<f32> = b.iter().map(|v| v.abs()).collect();
            let magnitude = matmul_ref(&abs_a, &abs_b, &dims);
            let (ga, gb) = (
                g.upload(bytemuck::cast_slice(&a)).unwrap(),
                g.upload(bytemuck::cast_slice(&b)).unwrap(),
            );
            for kernel in [MatmulKernel::Tiled, MatmulKernel::Rows] {
                let got: Vec<f32> = bytemuck::pod_collect_to_vec(
                    &g.read(&matmul_gpu(g, &ga, &gb, &dims, kernel).unwrap())
                        .unwrap(),
                );
                assert_eq!(got.len(), want.len());
                let exact = common::exact_adapter();
                for i in 0..got.len() {
                    let tol = if exact {
                        0.0
                    } else {
                        1e-5 * magnitude[i] + 1e-6
                    };
                    assert!(
                        (got[i] - want[i]).abs() <= tol,
                        "{kernel:?} {dims:?} element {i}: got {} want {}",
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

#[test]
fn the_adapter_is_the_configuration_the_run_asked_for() {
    // scripts/test.sh reruns these tests with LP_NATIVE_VECTOR_WIDTH set and names the
    // subgroup size it expects: a Mesa that ignored the variable must not pass for a second
    // width. (MURMUR_BACKEND is enforced by adapter selection itself.)
    let device = gpu();
    let info = &device.as_gpu().unwrap().info().adapter;
    if let Ok(want) = std::env::var("MURMUR_EXPECT_SUBGROUP") {
        assert_eq!(
            info.subgroup_min_size.to_string(),
            want,
            "{}: subgroups of {}..{}",
            info.name,
            info.subgroup_min_size,
            info.subgroup_max_size
        );
    }
}

#[test]
fn matmul_grids_past_the_workgroup_limit_take_several_launches() {
    // More row groups than a dispatch dimension allows (65535): 32-row groups for the rows
    // kernel, 64-row tiles for the tiled one. k = 1 keeps every product exact everywhere.
    let gpu = gpu();
    let g = gpu.as_gpu().unwrap();
    let limit = g.info().limits.max_compute_workgroups_per_dimension as usize;
    let mut rng = Rng::new(12, 0);
    for (kernel, rows_per_group) in [(MatmulKernel::Rows, 32), (MatmulKernel::Tiled, 64)] {
        let dims = MatmulDims {
            batch: 1,
            m: limit * rows_per_group + 3,
            n: 3,
            k: 1,
            trans_a: false,
            trans_b: false,
            a_batched: true,
            b_batched: true,
        };
        let a = random(&mut rng, dims.m, 1.0);
        let b = random(&mut rng, dims.n, 1.0);
        let want = matmul_ref(&a, &b, &dims);
        let (ga, gb) = (
            g.upload(bytemuck::cast_slice(&a)).unwrap(),
            g.upload(bytemuck::cast_slice(&b)).unwrap(),
        );
        let dispatches = g.command_stats().1;
        let c = matmul_gpu(g, &ga, &gb, &dims, kernel).unwrap();
        assert!(
            g.command_stats().1 - dispatches >= 2,
            "{kernel:?}: one dispatch cannot cover {} row groups",
            dims.m.div_ceil(rows_per_group)
        );
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&g.read(&c).unwrap());
        let wrong = (0..want.len()).find(|&i| got[i] != want[i]);
        assert_eq!(wrong, None, "{kernel:?}: first wrong element");
        g.check().unwrap();
    }
}

#[test]
fn loops_past_65535_iterations_run_to_the_end() {
    // llvmpipe ends an invocation's loops after 65535 iterations in all and says nothing:
    // every kernel that walks a whole axis per invocation must split long axes into launches
    // (kernels::LOOP_SPAN, matmul's K_SPAN). 70,000 is past the limit; integer-valued data
    // keeps every sum exact, so any driver must match the reference bit for bit.
    const LONG: usize = 70_000;
    let device = gpu();
    let g = device.as_gpu().unwrap();
    let mut rng = Rng::new(14, 0);
    let ints = |rng: &mut Rng, n: usize| -> Vec<f32> {
        (0..n).map(|_| rng.below(5) as f32 - 2.0).collect()
    };

    // A product contracting 70,000 (a convolution's or a GPT's weight gradient does).
    for kernel in [MatmulKernel::Rows, MatmulKernel::Tiled] {
        let dims = MatmulDims {
            batch: 1,
            m: 3,
            n: 5,
            k: LONG,
            trans_a: false,
            trans_b: false,
            a_batched: true,
            b_batched: true,
        };
        let (a, b) = (ints(&mut rng, 3 * LONG), ints(&mut rng, LONG * 5));
        let (ga, gb) = (
            g.upload(bytemuck::cast_slice(&a)).unwrap(),
            g.upload(bytemuck::cast_slice(&b)).unwrap(),
        );
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(
            &g.read(&matmul_gpu(g, &ga, &gb, &dims, kernel).unwrap())
                .unwrap(),
        );
        assert_eq!(got, matmul_ref(&a, &b, &dims), "{kernel:?} over k = {LONG}");
    }

    // Layer norm's parameter gradients sum over 70,000 rows.
    let (rows, cols) = (LONG, 2);
    let x = ints(&mut rng, rows * cols);
    let dy = ints(&mut rng, rows * cols);
    let (cx, gx) = both(&[rows, cols], &x);
    let (cg, gg) = both(&[cols], &[1.0, -1.0]);
    let (cdy, gdy) = both(&[rows, cols], &dy);
    let (_, cs) = layernorm(&cx, &cg, &cg, 1e-5).unwrap();
    let (_, gs) = layernorm(&gx, &gg, &gg, 1e-5).unwrap();
    let (c, gr) = (
        layernorm_backward(&cx, &cg, &cs, &cdy, None).unwrap(),
        layernorm_backward(&gx, &gg, &gs, &gdy, None).unwrap(),
    );
    assert_close(
        "layernorm dbeta over 70,000 rows",
        &gr.2.to_vec().unwrap(),
        &c.2.to_vec().unwrap(),
        0.0,
        0.0,
    );
    assert_close(
        "layernorm dgamma over 70,000 rows",
        &gr.1.to_vec().unwrap(),
        &c.1.to_vec().unwrap(),
        1e-3,
        1e-5,
    );

    // Embedding's gradient walks 70,000 tokens.
    let ids: Vec<u32> = (0..LONG).map(|_| rng.below(3) as u32).collect();
    let dout = ints(&mut rng, LONG * 2);
    let (ci, gi) = both_u32(&[LONG], &ids);
    let (cd, gd) = both(&[LONG, 2], &dout);
    assert_eq!(
        embedding_backward(&gi, &gd, 3).unwrap().to_vec().unwrap(),
        embedding_backward(&ci, &cd, 3).unwrap().to_vec().unwrap(),
        "embedding gradient over {LONG} tokens"
    );

    // argmax along 70,000: the largest value sits past the limit, after a tie before it.
    let mut row = ints(&mut rng, 2 * LONG);
    row[100] = 5.0;
    row[LONG - 3] = 7.0;
    row[LONG + 200] = 7.0;
    row[2 * LONG - 1] = 7.0;
    let (cx, gx) = both(&[2, LONG], &row);
    assert_eq!(
        argmax_last(&gx).unwrap().to_vec_u32().unwrap(),
        argmax_last(&cx).unwrap().to_vec_u32().unwrap(),
    );
    assert_eq!(
        argmax_last(&cx).unwrap().to_vec_u32().unwrap(),
        [LONG as u32 - 3, 200]
    );
}

#[test]
fn matmul_random_shapes() {
    // Property test: 40 shapes drawn at random (sizes 1..=70, any transposes, batches and
    // broadcasts), both kernels, against the reference.
    let gpu = gpu();
    let g = gpu.as_gpu().unwrap();
    let mut rng = Rng::new(99, 0);
    for case in 0..40 {
        let (m, n, k) = (1 + rng.below(70), 1 + rng.below(70), 1 + rng.below(70));
        let batch = 1 + rng.below(3);
        let (ab, bb) = match rng.below(3) {
            0 => (true, true),
            1 => (true, false),
            _ => (false, true),
        };
        let (ta, tb) = (rng.below(2) == 1, rng.below(2) == 1);
        let dims = MatmulDims {
            batch,
            m,
            n,
            k,
            trans_a: ta,
            trans_b: tb,
            a_batched: ab,
            b_batched: bb,
        };
        let a = random(&mut rng, if ab { batch } else { 1 } * m * k, 2.0);
        let b = random(&mut rng, if bb { batch } else { 1 } * k * n, 2.0);
        let want = matmul_ref(&a, &b, &dims);
        let (ga, gb) = (
            g.upload(bytemuck::cast_slice(&a)).unwrap(),
            g.upload(bytemuck::cast_slice(&b)).unwrap(),
        );
        for kernel in [MatmulKernel::Tiled, MatmulKernel::Rows] {
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(
                &g.read(&matmul_gpu(g, &ga, &gb, &dims, kernel).unwrap())
                    .unwrap(),
            );
            assert_close(
                &format!("case {case} {kernel:?} {dims:?}"),
                &got,
                &want,
                1e-4 * (k as f32).sqrt(),
                1e-4,
            );
        }
    }
}

#[test]
fn matmul_through_tensors_handles_broadcast_batches() {
    let mut rng = Rng::new(12, 0);
    let a = random(&mut rng, 2 * 3 * 5 * 7, 1.0);
    let b = random(&mut rng, 7 * 4, 1.0);
    let (ca, ga) = both(&[2, 3, 5, 7], &a);
    let (cb, gb) = both(&[7, 4], &b);
    let want = ca.matmul(&cb).unwrap();
    let got = ga.matmul(&gb).unwrap();
    assert_eq!(got.shape(), [2, 3, 5, 4]);
    assert_close(
        "batched matmul",
        &got.to_vec().unwrap(),
        &want.to_vec().unwrap(),
        1e-5,
        1e-5,
    );
}

#[test]
fn unary_forward_and_backward() {
    let mut rng = Rng::new(13, 0);
    let ops = [
        Unary::Relu,
        Unary::Gelu,
        Unary::Tanh,
        Unary::Sigmoid,
        Unary::Exp,
        Unary::Square,
        Unary::Abs,
        Unary::Affine {
            alpha: -1.5,
            beta: 0.25,
        },
    ];
    for n in [1usize, 7, 256, 257, 1000, 65_537] {
        let mut x = random(&mut rng, n, 4.0);
        x[0] = 0.0; // kinks of relu and abs
        let dy = random(&mut rng, n, 1.0);
        let (cx, gx) = both(&[n], &x);
        let (cd, gd) = both(&[n], &dy);
        for op in ops {
            let what = format!("{op:?} n={n}");
            assert_close(
                &what,
                &unary(&gx, op).unwrap().to_vec().unwrap(),
                &unary(&cx, op).unwrap().to_vec().unwrap(),
                1e-6,
                1e-5,
            );
            let (g, c) = (
                unary_backward(&gx, &gd, op).unwrap(),
                unary_backward(&cx, &cd, op).unwrap(),
            );
            assert_close(
                &format!("{what} backward"),
                &g.to_vec().unwrap(),
                &c.to_vec().unwrap(),
                1e-6,
                1e-5,
            );
        }
        // log and sqrt on positive inputs.
        let pos: Vec<f32> = x.iter().map(|v| v.abs() + 0.1).collect();
        let (cp, gp) = both(&[n], &pos);
        for op in [Unary::Log, Unary::Sqrt] {
            assert_close(
                &format!("{op:?}"),
                &unary(&gp, op).unwrap().to_vec().unwrap(),
                &unary(&cp, op).unwrap().to_vec().unwrap(),
                1e-6,
                1e-5,
            );
            let (g, c) = (
                unary_backward(&gp, &gd, op).unwrap(),
                unary_backward(&cp, &cd, op).unwrap(),
            );
            assert_close(
                &format!("{op:?} backward"),
                &g.to_vec().unwrap(),
                &c.to_vec().unwrap(),
                1e-6,
                1e-5,
            );
        }
    }
    // Saturation: no NaN from tanh-based functions on huge inputs.
    let (cx, gx) = both(&[4], &[-1e4, -60.0, 60.0, 1e4]);
    for op in [Unary::Tanh, Unary::Gelu, Unary::Sigmoid] {
        let g = unary(&gx, op).unwrap().to_vec().unwrap();
        assert!(g.iter().all(|v| v.is_finite()), "{op:?}: {g:?}");
        assert_close(
            &format!("{op:?} saturated"),
            &g,
            &unary(&cx, op).unwrap().to_vec().unwrap(),
            1e-6,
            1e-6,
        );
    }
}

#[test]
fn binary_with_broadcasting() {
    let mut rng = Rng::new(14, 0);
    let shapes: [(&[usize], &[usize]); 8] = [
        (&[1], &[1]),
        (&[257], &[257]),
        (&[13, 7], &[7]),
        (&[13, 7], &[13, 1]),
        (&[3, 1, 5], &[4, 1]),
        (&[2, 3, 4, 5], &[3, 1, 5]),
        (&[6, 1, 1, 3, 2], &[5, 1, 2]),
        (&[], &[5, 3]),
    ];
    for (sa, sb) in shapes {
        let a = random(&mut rng, sa.iter().product(), 2.0);
        let b: Vec<f32> = random(&mut rng, sb.iter().product(), 2.0)
            .iter()
            .map(|v| v + 3.0)
            .collect();
        let (ca, ga) = both(sa, &a);
        let (cb, gb) = both(sb, &b);
        for op in Binary::ALL {
            let (g, c) = (binary(&ga, &gb, op).unwrap(), binary(&ca, &cb, op).unwrap());
            assert_eq!(g.shape(), c.shape());
            assert_close(
                &format!("{op:?} {sa:?} {sb:?}"),
                &g.to_vec().unwrap(),
                &c.to_vec().unwrap(),
                0.0,
                1e-6,
            );
        }
    }
}

#[test]
fn reductions_over_every_axis_and_long_axes() {
    let mut rng = Rng::new(15, 0);
    for shape in [
        vec![1usize],
        vec![7],
        vec![3, 5],
        vec![2, 300, 3],
        vec![1, 5000, 1],
        vec![4, 1, 257],
        vec![70_000],
        vec![131_073],
    ] {
        let x = random(&mut rng, shape.iter().product(), 1.0);
        let (cx, gx) = both(&shape, &x);
        for axis in 0..shape.len() as isize {
            for op in [Reduce::Sum, Reduce::Max, Reduce::Min] {
                let (g, c) = (
                    reduce_axis(&gx, axis, op, false).unwrap(),
                    reduce_axis(&cx, axis, op, false).unwrap(),
                );
                assert_eq!(g.shape(), c.shape());
                let rtol = if op == Reduce::Sum { 1e-4 } else { 0.0 };
                let atol = if op == Reduce::Sum {
                    1e-5 * (shape[axis as usize] as f32).sqrt()
                } else {
                    0.0
                };
                assert_close(
                    &format!("{op:?} axis {axis} of {shape:?}"),
                    &g.to_vec().unwrap(),
                    &c.to_vec().unwrap(),
                    atol,
                    rtol,
                );
            }
        }
        let (g, c) = (
            sum_all(&gx).unwrap().item().unwrap(),
            sum_all(&cx).unwrap().item().unwrap(),
        );
        assert!(
            (g - c).abs() <= 1e-4 * (x.len() as f32).sqrt(),
            "sum_all {shape:?}: {g} vs {c}"
        );
    }
    // Two-pass reduction of an axis longer than one workgroup's chunk, with a known answer.
    let n = 3 * 65536 + 17;
    let ones = Tensor::full(&gpu(), &[n], 1.0).unwrap();
    assert_eq!(sum_all(&ones).unwrap().item().unwrap(), n as f32);
    // sum_to_shape, the gradient of broadcasting.
    let x = random(&mut rng, 2 * 3 * 4, 1.0);
    let (cx, gx) = both(&[2, 3, 4], &x);
    for target in [vec![4usize], vec![3, 1], vec![2, 1, 4], vec![]] {
        let (g, c) = (
            sum_to_shape(&gx, &target).unwrap(),
            sum_to_shape(&cx, &target).unwrap(),
        );
        assert_eq!(g.shape(), target.as_slice());
        assert_close(
            &format!("sum_to_shape {target:?}"),
            &g.to_vec().unwrap(),
            &c.to_vec().unwrap(),
            1e-6,
            1e-5,
        );
    }
}

#[test]
fn argmax_matches_exactly() {
    let mut rng = Rng::new(16, 0);
    for (rows, cols) in [(1, 1), (5, 10), (129, 3), (7, 1000)] {
        let mut x = random(&mut rng, rows * cols, 1.0);
        if cols > 1 {
            x[1] = x[0]; // a tie: the first index wins on both paths
        }
        let (cx, gx) = both(&[rows, cols], &x);
        assert_eq!(
            argmax_last(&gx).unwrap().to_vec_u32().unwrap(),
            argmax_last(&cx).unwrap().to_vec_u32().unwrap()
        );
    }
}

#[test]
fn softmax_and_cross_entropy_forward_backward() {
    let mut rng = Rng::new(17, 0);
    // Rows of 64-lane workgroups: columns below, at and past the lanes and past 4096; 65536
    // rows take more than one row of workgroups, and all but one of the second row's return
    // early.
    for (rows, cols) in [
        (1, 1),
        (1, 10),
        (128, 10),
        (3, 63),
        (2, 64),
        (3, 65),
        (2, 129),
        (5, 300),
        (2, 1000),
        (1, 4097),
        (65536, 3),
    ] {
        let mut x = random(&mut rng, rows * cols, 5.0);
        x[0] = 80.0; // large logits stay finite
        let labels: Vec<u32> = (0..rows).map(|_| rng.below(cols) as u32).collect();
        let dloss = random(&mut rng, rows, 1.0);
        let dy = random(&mut rng, rows * cols, 1.0);
        let (cx, gx) = both(&[rows, cols], &x);
        let (cl, gl) = both_u32(&[rows], &labels);
        let (cd, gd) = both(&[rows], &dloss);
        let (cdy, gdy) = both(&[rows, cols], &dy);
        let what = format!("[{rows}, {cols}]");

        let (cs, gs) = (softmax(&cx).unwrap(), softmax(&gx).unwrap());
        assert_close(
            &format!("softmax {what}"),
            &gs.to_vec().unwrap(),
            &cs.to_vec().unwrap(),
            1e-7,
            1e-5,
        );
        let (cb, gb) = (
            softmax_backward(&cs, &cdy).unwrap(),
            softmax_backward(&gs, &gdy).unwrap(),
        );
        assert_close(
            &format!("softmax backward {what}"),
            &gb.to_vec().unwrap(),
            &cb.to_vec().unwrap(),
            1e-6,
            1e-4,
        );

        let ((closs, cp), (gloss, gp)) = (
            cross_entropy(&cx, &cl).unwrap(),
            cross_entropy(&gx, &gl).unwrap(),
        );
        assert_close(
            &format!("xent loss {what}"),
            &gloss.to_vec().unwrap(),
            &closs.to_vec().unwrap(),
            1e-5,
            1e-5,
        );
        assert_close(
            &format!("xent probs {what}"),
            &gp.to_vec().unwrap(),
            &cp.to_vec().unwrap(),
            1e-7,
            1e-5,
        );
        let (cg, gg) = (
            cross_entropy_backward(&cp, &cl, &cd).unwrap(),
            cross_entropy_backward(&gp, &gl, &gd).unwrap(),
        );
        assert_close(
            &format!("xent backward {what}"),
            &gg.to_vec().unwrap(),
            &cg.to_vec().unwrap(),
            1e-7,
            1e-5,
        );
    }
}

#[test]
fn layernorm_forward_backward() {
    let mut rng = Rng::new(18, 0);
    for (rows, cols) in [
        (1, 1),
        (1, 2),
        (7, 10),
        (2, 63),
        (2, 64),
        (64, 65),
        (2, 129),
        (3, 300),
        (1, 4097),
        (65536, 3),
    ] {
        let x: Vec<f32> = random(&mut rng, rows * cols, 2.0)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        let gamma = random(&mut rng, cols, 1.0);
        let beta = random(&mut rng, cols, 1.0);
        let dy = random(&mut rng, rows * cols, 1.0);
        let (cx, gx) = both(&[rows, cols], &x);
        let (cg, gg) = both(&[cols], &gamma);
        let (cb, gb) = both(&[cols], &beta);
        let (cdy, gdy) = both(&[rows, cols], &dy);
        let ((cy, cs), (gy, gs)) = (
            layernorm(&cx, &cg, &cb, 1e-5).unwrap(),
            layernorm(&gx, &gg, &gb, 1e-5).unwrap(),
        );
        let what = format!("[{rows}, {cols}]");
        assert_close(
            &format!("layernorm {what}"),
            &gy.to_vec().unwrap(),
            &cy.to_vec().unwrap(),
            1e-4,
            1e-4,
        );
        assert_close(
            &format!("layernorm stats {what}"),
            &gs.to_vec().unwrap(),
            &cs.to_vec().unwrap(),
            1e-4,
            1e-4,
        );
        let (c, g) = (
            layernorm_backward(&cx, &cg, &cs, &cdy, None).unwrap(),
            layernorm_backward(&gx, &gg, &gs, &gdy, None).unwrap(),
        );
        assert_close(
            &format!("layernorm dx {what}"),
            &g.0.to_vec().unwrap(),
            &c.0.to_vec().unwrap(),
            1e-3,
            1e-3,
        );
        assert_close(
            &format!("layernorm dgamma {what}"),
            &g.1.to_vec().unwrap(),
            &c.1.to_vec().unwrap(),
            1e-4,
            1e-4,
        );
        assert_close(
            &format!("layernorm dbeta {what}"),
            &g.2.to_vec().unwrap(),
            &c.2.to_vec().unwrap(),
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn embedding_gather_and_scatter_add() {
    let mut rng = Rng::new(19, 0);
    for (vocab, dim, tokens) in [(1, 1, 1), (5, 3, 9), (256, 65, 100), (70, 128, 1)] {
        let table = random(&mut rng, vocab * dim, 1.0);
        let ids: Vec<u32> = (0..tokens).map(|_| rng.below(vocab) as u32).collect();
        let dout = random(&mut rng, tokens * dim, 1.0);
        let (ct, gt) = both(&[vocab, dim], &table);
        let (ci, gi) = both_u32(&[tokens], &ids);
        let (cd, gd) = both(&[tokens, dim], &dout);
        let what = format!("vocab {vocab} dim {dim} tokens {tokens}");
        assert_eq!(
            embedding(&gt, &gi).unwrap().to_vec().unwrap(),
            embedding(&ct, &ci).unwrap().to_vec().unwrap(),
            "{what}"
        );
        let (g, c) = (
            embedding_backward(&gi, &gd, vocab).unwrap(),
            embedding_backward(&ci, &cd, vocab).unwrap(),
        );
        assert_eq!(
            g.to_vec().unwrap(),
            c.to_vec().unwrap(),
            "scatter-add sums in token order on both: {what}"
        );
    }
    // The CPU path refuses ids outside the vocabulary.
    let table = Tensor::zeros(&Device::Cpu, &[4, 2]).unwrap();
    let bad = Tensor::from_u32(&Device::Cpu, &[1], vec![4]).unwrap();
    assert!(embedding(&table, &bad)
        .unwrap_err()
        .to_string()
        .contains("out of range"));
}

#[test]
fn transpose_is_exact() {
    let mut rng = Rng::new(20, 0);
    for shape in [vec![1usize, 1], vec![3, 7], vec![2, 65, 33], vec![4, 1, 9]] {
        let x = random(&mut rng, shape.iter().product(), 1.0);
        let (cx, gx) = both(&shape, &x);
        let (c, g) = (cx.t().unwrap(), gx.t().unwrap());
        assert_eq!(g.shape(), c.shape());
        assert_eq!(g.to_vec().unwrap(), c.to_vec().unwrap());
        assert_eq!(
            c.t().unwrap().to_vec().unwrap(),
            x,
            "transposing twice is the identity"
        );
    }
}

#[test]
fn fill_and_zeros() {
    for n in [0usize, 1, 300] {
        assert_eq!(
            Tensor::full(&gpu(), &[n], 2.5).unwrap().to_vec().unwrap(),
            vec![2.5; n]
        );
        assert_eq!(
            Tensor::zeros(&gpu(), &[n]).unwrap().to_vec().unwrap(),
            vec![0.0; n]
        );
    }
}

#[test]
fn optimizer_steps_match_over_several_iterations() {
    let mut rng = Rng::new(21, 0);
    for n in [1usize, 1000, 4099] {
        let w0 = random(&mut rng, n, 1.0);
        let grads: Vec<Vec<f32>> = (0..4).map(|_| random(&mut rng, n, 0.5)).collect();
        for nesterov in [false, true] {
            let (mut cw, mut gw) = both(&[n], &w0);
            let (mut cb, mut gb) = both(&[n], &vec![0.0; n]);
            for (t, g) in grads.iter().enumerate() {
                let s = SgdStep {
                    lr: 0.1,
                    momentum: 0.9,
                    dampening: 0.0,
                    weight_decay: 1e-2,
                    nesterov,
                    first: t == 0,
                };
                let (cg, gg) = both(&[n], g);
                sgd_step(&mut cw, &cg, &mut cb, &s).unwrap();
                sgd_step(&mut gw, &gg, &mut gb, &s).unwrap();
            }
            assert_close(
                &format!("sgd nesterov={nesterov} n={n}"),
                &gw.to_vec().unwrap(),
                &cw.to_vec().unwrap(),
                1e-6,
                1e-5,
            );
            assert_close(
                "sgd momentum",
                &gb.to_vec().unwrap(),
                &cb.to_vec().unwrap(),
                1e-6,
                1e-5,
            );
        }
        let (mut cw, mut gw) = both(&[n], &w0);
        let (mut cm, mut gm) = both(&[n], &vec![0.0; n]);
        let (mut cv, mut gv) = both(&[n], &vec![0.0; n]);
        for (t, g) in grads.iter().enumerate() {
            let s = AdamWStep {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                step: t as u64 + 1,
            };
            let (cg, gg) = both(&[n], g);
            adamw_step(&mut cw, &cg, &mut cm, &mut cv, &s).unwrap();
            adamw_step(&mut gw, &gg, &mut gm, &mut gv, &s).unwrap();
        }
        assert_close(
            &format!("adamw n={n}"),
            &gw.to_vec().unwrap(),
            &cw.to_vec().unwrap(),
            1e-6,
            1e-5,
        );
        assert_close(
            "adamw m",
            &gm.to_vec().unwrap(),
            &cm.to_vec().unwrap(),
            1e-7,
            1e-5,
        );
        assert_close(
            "adamw v",
            &gv.to_vec().unwrap(),
            &cv.to_vec().unwrap(),
            1e-9,
            1e-5,
        );
    }
}

#[test]
fn in_place_updates_never_change_a_shared_tensor() {
    let d = gpu();
    let w = Tensor::from_vec(&d, &[3], vec![1.0, 2.0, 3.0]).unwrap();
    let snapshot = w.clone();
    let mut updated = w.clone();
    let g = Tensor::full(&d, &[3], 1.0).unwrap();
    let mut buf = Tensor::zeros(&d, &[3]).unwrap();
    let s = SgdStep {
        lr: 1.0,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first: true,
    };
    sgd_step(&mut updated, &g, &mut buf, &s).unwrap();
    assert_eq!(updated.to_vec().unwrap(), [0.0, 1.0, 2.0]);
    assert_eq!(
        snapshot.to_vec().unwrap(),
        [1.0, 2.0, 3.0],
        "the clone kept its value"
    );
}
