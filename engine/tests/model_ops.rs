//! The ops the CNN and the transformer add (convolution lowering, pooling, dropout, axis
//! permutation, causal softmax, image normalization, attention): each WGSL kernel against its
//! CPU reference on awkward shapes, each op's gradient against finite differences, and the
//! lowered convolution against a direct one.
//!
//! Gathers, copies and masks are exact everywhere; sums (col2im, pooling backward, average
//! pooling) run in the same order on both sides, so on lavapipe everything is bit-exact and
//! elsewhere within 1e-5 relative.

mod common;

use common::{assert_close, gpu, random};
use murmur_engine::kernels::attention::{causal_attention, causal_attention_backward};
use murmur_engine::kernels::conv::{col2im, conv2d_direct_ref, im2col};
use murmur_engine::kernels::conv_geometry::ConvGeometry;
use murmur_engine::kernels::dropout::{dropout, DropoutMask};
use murmur_engine::kernels::permute::permute;
use murmur_engine::kernels::pool::{pool, pool_backward, Pool, PoolGeometry};
use murmur_engine::kernels::softmax::causal_softmax;
use murmur_engine::nn::{CausalSelfAttention, Module};
use murmur_engine::rng::Rng;
use murmur_engine::{Device, Graph, Tensor};

fn both(shape: &[usize], data: &[f32]) -> (Tensor, Tensor) {
    (
        Tensor::from_vec(&Device::Cpu, shape, data.to_vec()).unwrap(),
        Tensor::from_vec(&gpu(), shape, data.to_vec()).unwrap(),
    )
}

fn cpu_tensor(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let mut rng = Rng::new(seed, 3);
    let n = shape.iter().product();
    Tensor::from_vec(&Device::Cpu, shape, random(&mut rng, n, scale)).unwrap()
}

use common::assert_gradcheck as check_grad;

// (n, h, w, c, k, stride, pad): 1x1, odd sizes, stride 2 with and without padding, a
// window as large as the padded image.
const CONV_CASES: [(usize, usize, usize, usize, usize, usize, usize); 6] = [
    (1, 1, 1, 1, 1, 1, 0),
    (2, 5, 7, 3, 3, 1, 1),
    (3, 9, 6, 2, 3, 2, 0),
    (1, 8, 8, 5, 5, 2, 2),
    (2, 4, 3, 1, 2, 1, 0),
    (1, 3, 3, 2, 5, 1, 1),
];

#[test]
fn im2col_and_col2im_gpu_match_cpu() {
    let mut rng = Rng::new(31, 0);
    for (n, h, w, c, k, stride, pad) in CONV_CASES {
        let g = ConvGeometry::of(&[n, h, w, c], k, k, stride, pad).unwrap();
        let x = random(&mut rng, n * h * w * c, 1.0);
        let (cx, gx) = both(&[n, h, w, c], &x);
        let (ccols, gcols) = (im2col(&cx, &g).unwrap(), im2col(&gx, &g).unwrap());
        assert_eq!(
            gcols.to_vec().unwrap(),
            ccols.to_vec().unwrap(),
            "im2col {g:?}"
        );
        let dcols = random(&mut rng, ccols.numel(), 1.0);
        let (cd, gd) = both(ccols.shape(), &dcols);
        assert_close(
            &format!("col2im {g:?}"),
            &col2im(&gd, &g).unwrap().to_vec().unwrap(),
            &col2im(&cd, &g).unwrap().to_vec().unwrap(),
            1e-6,
            1e-5,
        );
    }
}

#[test]
fn lowered_convolution_equals_a_direct_convolution() {
    let mut rng = Rng::new(32, 0);
    for (n, h, w, c, k, stride, pad) in CONV_CASES {
        let oc = 4;
        let geometry = ConvGeometry::of(&[n, h, w, c], k, k, stride, pad).unwrap();
        let x = random(&mut rng, n * h * w * c, 1.0);
        let weight = random(&mut rng, k * k * c * oc, 1.0);
        let want = conv2d_direct_ref(&x, &weight, &geometry, oc);
        for device in [Device::Cpu, gpu()] {
            let g = Graph::new(&device);
            let xv = g.input(&Tensor::from_vec(&device, &[n, h, w, c], x.clone()).unwrap());
            let wv = g.input(&Tensor::from_vec(&device, &[k * k * c, oc], weight.clone()).unwrap());
            let y = g.conv2d(xv, wv, None, (k, k), stride, pad).unwrap();
            assert_eq!(g.shape(y), [n, geometry.out_h(), geometry.out_w(), oc]);
            let got = g.value(y).to_vec().unwrap();
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{device} {geometry:?} element {i}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn pooling_gpu_matches_cpu_forward_and_backward() {
    let mut rng = Rng::new(33, 0);
    // (n, h, w, c, k, stride): overlapping windows (k > stride), gaps (k < stride), edges
    // that do not divide, and ties (rounded inputs).
    for (n, h, w, c, k, stride) in [
        (1, 1, 1, 1, 1, 1),
        (2, 4, 4, 3, 2, 2),
        (1, 7, 5, 2, 3, 2),
        (3, 6, 6, 1, 2, 3),
        (1, 28, 28, 16, 2, 2),
    ] {
        let g = PoolGeometry::of(&[n, h, w, c], k, stride).unwrap();
        let x: Vec<f32> = random(&mut rng, n * h * w * c, 2.0)
            .iter()
            .map(|v| (v * 2.0).round())
            .collect();
        let (cx, gx) = both(&[n, h, w, c], &x);
        for kind in [Pool::Max, Pool::Avg] {
            let what = format!("{kind:?} {g:?}");
            let ((cy, ca), (gy, ga)) = (pool(&cx, &g, kind).unwrap(), pool(&gx, &g, kind).unwrap());
            assert_close(
                &what,
                &gy.to_vec().unwrap(),
                &cy.to_vec().unwrap(),
                1e-6,
                1e-6,
            );
            if let (Some(ca), Some(ga)) = (&ca, &ga) {
                assert_eq!(
                    ga.to_vec_u32().unwrap(),
                    ca.to_vec_u32().unwrap(),
                    "{what} argmax"
                );
            }
            let dy = random(&mut rng, cy.numel(), 1.0);
            let (cd, gd) = both(cy.shape(), &dy);
            let (cdx, gdx) = (
                pool_backward(&cd, ca.as_ref(), &g, kind).unwrap(),
                pool_backward(&gd, ga.as_ref(), &g, kind).unwrap(),
            );
            assert_close(
                &format!("{what} backward"),
                &gdx.to_vec().unwrap(),
                &cdx.to_vec().unwrap(),
                1e-6,
                1e-5,
            );
            // Max pooling routes each output's gradient to exactly one input.
            if kind == Pool::Max {
                let total: f32 = cdx.to_vec().unwrap().iter().sum();
                assert!((total - dy.iter().sum::<f32>()).abs() < 1e-3, "{what}");
            }
        }
    }
}

#[test]
fn dropout_mask_is_the_same_on_every_device_and_has_the_right_rate() {
    let mut rng = Rng::new(34, 0);
    for (n, rate) in [(1, 0.5), (1000, 0.1), (4097, 0.5), (100_003, 0.25)] {
        let x: Vec<f32> = random(&mut rng, n, 1.0).iter().map(|v| v + 2.0).collect();
        let (cx, gx) = both(&[n], &x);
        let mask = DropoutMask {
            rate,
            seed: 9,
            step: 3,
            key: 1,
            first_sample: 0,
            samples: 1,
        };
        let (c, g) = (
            dropout(&cx, &mask).unwrap().to_vec().unwrap(),
            dropout(&gx, &mask).unwrap().to_vec().unwrap(),
        );
        assert_eq!(g, c, "n {n} rate {rate}");
        let kept = c.iter().filter(|v| **v != 0.0).count();
        if n >= 1000 {
            let want = (1.0 - rate as f64) * n as f64;
            assert!(
                (kept as f64 - want).abs() < 5.0 * (n as f64 * 0.25).sqrt(),
                "kept {kept} of {n}"
            );
        }
        for (i, (&y, &v)) in c.iter().zip(&x).enumerate() {
            assert!(y == 0.0 || y == v * (1.0 / (1.0 - rate)), "element {i}");
        }
        // Another step draws another mask.
        let other = dropout(&cx, &DropoutMask { step: 4, ..mask })
            .unwrap()
            .to_vec()
            .unwrap();
        assert!(n < 100 || other != c);
    }
    assert!(dropout(
        &Tensor::zeros(&Device::Cpu, &[3]).unwrap(),
        &DropoutMask {
            rate: 1.0,
            seed: 0,
            step: 0,
            key: 0,
            first_sample: 0,
            samples: 1,
        }
    )
    .is_err());
}

#[test]
fn each_sample_draws_its_own_mask_wherever_it_is_computed() {
    // Masks were keyed by the row within the tensor, so every data-parallel rank applied the
    // first rows' masks to its own, different samples. Keyed by the sample's place in the
    // global batch, the ranks' shares laid end to end are the whole batch's masks, bit for bit.
    let (samples, width) = (7usize, 13usize);
    let x: Vec<f32> = (0..samples * width).map(|i| 1.0 + i as f32).collect();
    let mask = |first_sample: usize, count: usize| DropoutMask {
        rate: 0.5,
        seed: 11,
        step: 2,
        key: 3,
        first_sample: first_sample as u32,
        samples: count as u32,
    };
    let (cx, gx) = both(&[samples, width], &x);
    let whole = dropout(&cx, &mask(0, samples)).unwrap().to_vec().unwrap();
    assert_eq!(
        dropout(&gx, &mask(0, samples)).unwrap().to_vec().unwrap(),
        whole
    );
    for world in [2usize, 3] {
        let mut laid: Vec<f32> = Vec::new();
        for rank in 0..world {
            let share = murmur_engine::train::rank_share(samples, rank, world);
            let part = &x[share.start * width..share.end * width];
            let (cp, gp) = both(&[share.len(), width], part);
            let m = mask(share.start, share.len());
            let on_cpu = dropout(&cp, &m).unwrap().to_vec().unwrap();
            assert_eq!(dropout(&gp, &m).unwrap().to_vec().unwrap(), on_cpu);
            laid.extend(on_cpu);
        }
        assert_eq!(laid, whole, "{world} ranks");
    }
    // Identical samples at different places draw different masks.
    let same = vec![1.0f32; 2 * 64];
    let y = dropout(&both(&[2, 64], &same).0, &mask(0, 2))
        .unwrap()
        .to_vec()
        .unwrap();
    assert_ne!(y[..64], y[64..]);
    // A tensor that does not split into its samples is an error.
    assert!(dropout(&cx, &mask(0, 2)).is_err());
}

#[test]
fn permute_and_causal_softmax_gpu_match_cpu() {
    let mut rng = Rng::new(35, 0);
    for (shape, perm) in [
        (&[1usize][..], &[0usize][..]),
        (&[3, 5], &[1, 0]),
        (&[2, 7, 3, 5], &[0, 2, 1, 3]),
        (&[2, 3, 4, 5], &[3, 1, 0, 2]),
        (&[4, 1, 6], &[2, 0, 1]),
    ] {
        let x = random(&mut rng, shape.iter().product(), 1.0);
        let (cx, gx) = both(shape, &x);
        let (c, g) = (permute(&cx, perm).unwrap(), permute(&gx, perm).unwrap());
        assert_eq!(g.shape(), c.shape());
        assert_eq!(
            g.to_vec().unwrap(),
            c.to_vec().unwrap(),
            "{shape:?} {perm:?}"
        );
    }
    for (batch, t) in [(1, 1), (3, 5), (2, 64), (1, 130)] {
        let x = random(&mut rng, batch * t * t, 4.0);
        let (cx, gx) = both(&[batch, t, t], &x);
        let (c, g) = (
            causal_softmax(&cx).unwrap().to_vec().unwrap(),
            causal_softmax(&gx).unwrap().to_vec().unwrap(),
        );
        assert_close(&format!("causal softmax {batch}x{t}"), &g, &c, 1e-6, 1e-5);
        for b in 0..batch {
            for i in 0..t {
                let row = &c[(b * t + i) * t..][..t];
                assert!(
                    row[i + 1..].iter().all(|&p| p == 0.0),
                    "row {i} sees the future"
                );
                assert!((row[..=i].iter().sum::<f32>() - 1.0).abs() < 1e-5);
            }
        }
    }
    assert!(causal_softmax(&Tensor::zeros(&Device::Cpu, &[2, 3]).unwrap()).is_err());
}

/// The GPU runs attention as the composition of its kernels, the CPU path in one pass per
/// head: the same values, forward and backward, with dropout and without.
#[test]
fn causal_attention_gpu_matches_cpu() {
    let mut rng = Rng::new(36, 0);
    for (batch, time, heads, width) in [(1, 1, 1, 1), (2, 9, 3, 5), (2, 66, 2, 16)] {
        let shape = [batch, time, heads * width];
        let n = batch * time * heads * width;
        let [q, k, v, dy] =
            [3.0, 3.0, 1.0, 1.0].map(|scale| both(&shape, &random(&mut rng, n, scale)));
        let mask = DropoutMask {
            rate: 0.2,
            seed: 4,
            step: 1,
            key: 3,
            first_sample: 0,
            samples: batch as u32,
        };
        for mask in [None, Some(&mask)] {
            let what = format!("{shape:?} over {heads} heads, dropout {}", mask.is_some());
            let (cy, cw) = causal_attention(&q.0, &k.0, &v.0, heads, mask).unwrap();
            let (gy, gw) = causal_attention(&q.1, &k.1, &v.1, heads, mask).unwrap();
            assert_close(
                &format!("weights, {what}"),
                &gw.to_vec().unwrap(),
                &cw.to_vec().unwrap(),
                1e-6,
                1e-5,
            );
            assert_close(
                &format!("output, {what}"),
                &gy.to_vec().unwrap(),
                &cy.to_vec().unwrap(),
                1e-5,
                1e-4,
            );
            let c =
                causal_attention_backward(&q.0, &k.0, &v.0, &cw, heads, mask, &dy.0, None).unwrap();
            let g =
                causal_attention_backward(&q.1, &k.1, &v.1, &gw, heads, mask, &dy.1, None).unwrap();
            for (name, (g, c)) in ["dq", "dk", "dv"].iter().zip(g.iter().zip(&c)) {
                assert_close(
                    &format!("{name}, {what}"),
                    &g.to_vec().unwrap(),
                    &c.to_vec().unwrap(),
                    1e-5,
                    1e-4,
                );
            }
        }
    }
}

#[test]
fn gradients_of_convolution_pooling_and_image_norm() {
    for (n, h, w, c, k, stride, pad) in [(2, 5, 4, 2, 3, 1, 1), (1, 6, 5, 3, 3, 2, 0)] {
        let x = cpu_tensor(&[n, h, w, c], 40, 1.0);
        let weight = cpu_tensor(&[k * k * c, 3], 41, 0.5);
        let bias = cpu_tensor(&[3], 42, 0.1);
        check_grad(
            "conv2d",
            &[x.clone(), weight.clone(), bias.clone()],
            |g, v| g.conv2d(v[0], v[1], Some(v[2]), (k, k), stride, pad),
        );
        // The input's gradient too, so the operation's composed backward pass; the CPU
        // path's sums from the winners are checked against it bit for bit in
        // `kernels::conv_pool`.
        check_grad("conv2d and max pool", &[x, weight, bias], |g, v| {
            g.conv2d_max_pool2d(v[0], v[1], Some(v[2]), (k, k), stride, pad, 2)
        });
    }
    // Distinct values keep max pooling away from ties, where it is not differentiable.
    let distinct: Vec<f32> = (0..2 * 6 * 5 * 3)
        .map(|i| ((i * 37 % 90) as f32) / 30.0 - 1.5)
        .collect();
    let x = Tensor::from_vec(&Device::Cpu, &[2, 6, 5, 3], distinct).unwrap();
    check_grad("max pool", std::slice::from_ref(&x), |g, v| {
        g.max_pool2d(v[0], 2, 2)
    });
    check_grad("max pool overlapping", std::slice::from_ref(&x), |g, v| {
        g.max_pool2d(v[0], 3, 1)
    });
    check_grad("avg pool", std::slice::from_ref(&x), |g, v| {
        g.avg_pool2d(v[0], 2, 1)
    });
    let gamma = cpu_tensor(&[3], 43, 1.0);
    let beta = cpu_tensor(&[3], 44, 1.0);
    check_grad(
        "image norm",
        &[x.clone(), gamma.clone(), beta.clone()],
        |g, v| g.image_norm(v[0], v[1], v[2], 1e-5),
    );
    // The fused operation's own CPU backward pass (the windows do not overlap); checked
    // against the composition bit for bit in `kernels::norm_pool`.
    check_grad("image norm and max pool", &[x, gamma, beta], |g, v| {
        g.image_norm_max_pool2d(v[0], v[1], v[2], 1e-5, 2)
    });
}

#[test]
fn gradients_of_dropout_permute_and_causal_attention() {
    let x = cpu_tensor(&[4, 9], 50, 1.0);
    let mask = DropoutMask {
        rate: 0.3,
        seed: 5,
        step: 2,
        key: 7,
        first_sample: 3,
        samples: 4,
    };
    check_grad("dropout", std::slice::from_ref(&x), |g, v| {
        g.dropout(v[0], mask)
    });
    let x = cpu_tensor(&[2, 3, 4, 2], 51, 1.0);
    check_grad("permute", std::slice::from_ref(&x), |g, v| {
        g.permute(v[0], &[0, 2, 1, 3])
    });
    // Attention alone: 2 heads of width 3 over 5 positions, with and without dropout on
    // the weights (the mask's gradient is the mask itself).
    let qkv: Vec<Tensor> = (0..3)
        .map(|i| cpu_tensor(&[2, 5, 6], 52 + i, 2.0))
        .collect();
    check_grad("causal attention", &qkv, |g, v| {
        g.causal_attention(v[0], v[1], v[2], 2, None)
    });
    check_grad("causal attention with dropout", &qkv, |g, v| {
        g.causal_attention(
            v[0],
            v[1],
            v[2],
            2,
            Some(DropoutMask { samples: 2, ..mask }),
        )
    });
    // A whole attention layer: 2 heads of width 3 over 5 positions, weights as inputs.
    let attn = CausalSelfAttention::new(&Device::Cpu, 6, 2, 0.3, &mut Rng::new(53, 0)).unwrap();
    let mut inputs = vec![cpu_tensor(&[2, 5, 6], 54, 1.0)];
    // Larger weights than GPT's initialisation, so that attention is far from uniform.
    inputs.extend(
        attn.parameters()
            .iter()
            .enumerate()
            .map(|(i, p)| cpu_tensor(p.shape(), 60 + i as u64, 0.8)),
    );
    check_grad("causal self-attention", &inputs, |g, v| {
        let mut layer = CausalSelfAttention::new(&Device::Cpu, 6, 2, 0.3, &mut Rng::new(53, 0))?;
        for (p, value) in layer.parameters_mut().into_iter().zip(&v[1..]) {
            *p = g.value(*value);
        }
        // The layer reads its parameters through g.param, which finds the input nodes by
        // storage, so the check differentiates with respect to v[1..].
        layer.forward(g, v[0], None)
    });
}

#[test]
fn attention_never_looks_ahead() {
    // Changing the last position's input must not change any earlier output.
    let d = Device::Cpu;
    let attn = CausalSelfAttention::new(&d, 8, 2, 0.5, &mut Rng::new(70, 0)).unwrap();
    let mut x = random(&mut Rng::new(71, 0), 6 * 8, 1.0);
    let run = |x: &[f32]| {
        let g = Graph::new(&d);
        let xv = g.input(&Tensor::from_vec(&d, &[1, 6, 8], x.to_vec()).unwrap());
        g.value(attn.forward(&g, xv, None).unwrap())
            .to_vec()
            .unwrap()
    };
    let before = run(&x);
    for v in &mut x[5 * 8..] {
        *v += 1.0;
    }
    let after = run(&x);
    assert_eq!(before[..5 * 8], after[..5 * 8]);
    assert_ne!(before[5 * 8..], after[5 * 8..]);
}

/// The CNN applies ReLU after max pooling, on a quarter of the pixels, instead of before:
/// the same outputs bit for bit, and the same gradients (a zero's sign aside: where no input
/// of a window is positive, the order decides which input receives the window's `dy * 0`,
/// and every sum the gradient then enters starts at +0, which absorbs a -0). Windows of all
/// negatives, of zeros of both signs, and of tied positive maxima.
#[test]
fn relu_and_max_pooling_commute_bit_for_bit() {
    let (n, side, c) = (2, 6, 3);
    let len = n * side * side * c;
    let mut rng = Rng::new(47, 0);
    let mut x = random(&mut rng, len, 1.0);
    for (i, v) in x.iter_mut().enumerate() {
        match i % 11 {
            0 => *v = -v.abs(),
            1 => *v = 0.0,
            2 => *v = -0.0,
            3 => *v = 0.75,
            _ => {}
        }
    }
    // A window of negatives only and one of two equal positive maxima.
    for (i, v) in [-1.0, -0.5, -2.0, -0.25].into_iter().enumerate() {
        x[(i / 2 * side + i % 2) * c] = v;
    }
    for (i, v) in [0.5, 0.5, -1.0, 0.25].into_iter().enumerate() {
        x[(i / 2 * side + i % 2 + 2) * c + 1] = v;
    }
    let x = Tensor::from_vec(&Device::Cpu, &[n, side, side, c], x).unwrap();
    let half = side / 2;
    let r = cpu_tensor(&[n, half, half, c], 48, 1.0);
    let run = |relu_first: bool| {
        let g = Graph::new(&Device::Cpu);
        let xv = g.param(&x);
        let y = if relu_first {
            g.max_pool2d(g.relu(xv).unwrap(), 2, 2).unwrap()
        } else {
            g.relu(g.max_pool2d(xv, 2, 2).unwrap()).unwrap()
        };
        let loss = g.sum_all(g.mul(y, g.input(&r)).unwrap()).unwrap();
        let y = g.value(y).to_vec().unwrap();
        let (_, grads) = g.loss_and_grads(loss, &[&x]).unwrap();
        (y, grads[0].to_vec().unwrap())
    };
    let ((y_before, dx_before), (y_after, dx_after)) = (run(true), run(false));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&y_after), bits(&y_before));
    assert_eq!(dx_after, dx_before);
    assert!(dx_after.iter().any(|&d| d != 0.0), "some gradient flows");
}
