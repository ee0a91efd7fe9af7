//! The CPU path (`engine/src/cpu`) against the CPU references it must equal bit for bit, on
//! shapes off every tile and chunk size.

use murmur_engine::cpu::gemm::{matmul, matmul_on, matmul_on_then, matmul_with, Arithmetic, Isa};
use murmur_engine::kernels::binary::{
    binary_fast, binary_ref, broadcast_shape, broadcast_strides, collapse, Binary,
};
use murmur_engine::kernels::matmul::{matmul_ref, MatmulDims};
use murmur_engine::kernels::pool::{
    max_pool_backward_fast, max_pool_fast, pool_backward_ref, pool_ref, Pool, PoolGeometry,
};
use murmur_engine::rng::Rng;

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed, 0);
    (0..len).map(|_| rng.normal()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn products_give_the_references_bits_on_awkward_shapes() {
    // Shapes off every tile size, both transposes, shared and batched operands (a stack of
    // A's times one B is folded into one tall product), and products large enough to go
    // parallel; on every micro-kernel this CPU can run (an AVX-512 machine checks the AVX2
    // and portable kernels too). Each also finishes its rows (a bias and a ReLU, as a layer
    // does) and must give the bits of the same finish run over the reference's rows after.
    let isas = Isa::available();
    assert_eq!(isas[0], Isa::detect());
    let shapes = [
        (1, 1, 1, 1),
        (1, 3, 5, 7),
        (2, 13, 33, 17),
        (3, 25, 47, 129),
        (1, 64, 96, 300),
        (2, 37, 70, 513),
        (5, 7, 40, 64),
        // At most 16 columns and at least 24 rows: the narrow 24x16 tile on AVX-512.
        (1, 50, 16, 33),
        (2, 400, 13, 40),
        // Many batch entries: split by entry alone.
        (40, 26, 16, 5),
        // Tall products (transposed A, at most 32 columns, k of 256 or more) read their
        // operands in place on AVX-512: blocks cut short, one and two vectors of columns,
        // columns masked off, one row and one column, serial and parallel.
        (1, 9, 16, 1000),
        (1, 13, 32, 257),
        (1, 29, 17, 600),
        (1, 1, 1, 256),
        (1, 12, 5, 300),
        // Several blocks per thread, each taking k in spans of 256 and resuming from C.
        (1, 150, 32, 700),
        // Wider tall products take their columns in blocks of 32: whole blocks, a last
        // block of one vector and of a few lanes, the widest (256) and one past it.
        (1, 30, 64, 300),
        (1, 13, 70, 257),
        (1, 40, 256, 520),
        (1, 5, 257, 256),
        // A of at most 256 columns, not transposed, is read in place by AVX-512's 12x32
        // tile: k at that edge and k of 1, a panel of 12 rows exactly.
        (1, 30, 33, 256),
        (2, 12, 64, 1),
        // Few row panels split their columns between tasks (and (3, 25, 47, 129), (1, 64,
        // 96, 300) and (2, 37, 70, 513) above): column blocks of whole panels and a last
        // one cut short, A packed whole (k over 256) and read in place.
        (1, 40, 200, 300),
        (1, 128, 90, 64),
    ];
    for (seed, &(batch, m, n, k)) in shapes.iter().enumerate() {
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for (a_batched, b_batched) in [(true, true), (true, false), (false, true)] {
                    let d = MatmulDims {
                        batch,
                        m,
                        n,
                        k,
                        trans_a,
                        trans_b,
                        a_batched,
                        b_batched,
                    };
                    let a = values(if a_batched { batch } else { 1 } * m * k, seed as u64);
                    let b = values(if b_batched { batch } else { 1 } * k * n, 100 + seed as u64);
                    let reference = matmul_ref(&a, &b, &d);
                    let want = bits(&reference);
                    assert_eq!(bits(&matmul(&a, &b, &d)), want, "{d:?}");
                    for &isa in &isas[1..] {
                        let got = matmul_on(isa, &a, &b, &d, Arithmetic::Exact);
                        assert_eq!(bits(&got), want, "{isa}: {d:?}");
                    }
                    // A bias by column and a value by row of C (a residual's): every row
                    // finished once, with its own index.
                    let bias = values(n, 200 + seed as u64);
                    let by_row = values(batch * m, 300 + seed as u64);
                    let finish = |i: usize, first_column: usize, row: &mut [f32]| {
                        assert!(first_column + row.len() <= n, "a finished row is inside C");
                        for (v, b) in row.iter_mut().zip(&bias[first_column..]) {
                            *v = (*v + b).max(0.0) + by_row[i];
                        }
                    };
                    let mut finished = reference.clone();
                    for (i, row) in finished.chunks_mut(n).enumerate() {
                        finish(i, 0, row);
                    }
                    for &isa in &isas {
                        let got = matmul_on_then(isa, &a, &b, &d, Arithmetic::Exact, finish);
                        assert_eq!(bits(&got), bits(&finished), "finished, {isa}: {d:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn empty_and_zero_k_products_are_zeros() {
    let d = MatmulDims {
        batch: 2,
        m: 3,
        n: 4,
        k: 0,
        trans_a: false,
        trans_b: false,
        a_batched: true,
        b_batched: true,
    };
    assert_eq!(matmul(&[], &[], &d), vec![0.0; 24]);
    // With no terms, the finish still runs on every row: a layer's output is its bias.
    let finished = matmul_on_then(
        Isa::detect(),
        &[],
        &[],
        &d,
        Arithmetic::Exact,
        |_, _, row| row.iter_mut().for_each(|v| *v += 1.5),
    );
    assert_eq!(finished, vec![1.5; 24]);
    let d = MatmulDims { m: 0, k: 5, ..d };
    assert!(matmul(&[], &values(40, 1), &d).is_empty());
}

#[test]
fn fused_arithmetic_is_close_but_not_the_reference() {
    // The fused variant exists only for the benchmark; it must still compute the product.
    let d = MatmulDims {
        batch: 1,
        m: 40,
        n: 50,
        k: 200,
        trans_a: false,
        trans_b: false,
        a_batched: false,
        b_batched: false,
    };
    let (a, b) = (values(40 * 200, 3), values(200 * 50, 4));
    let exact = matmul(&a, &b, &d);
    let fused = matmul_with(&a, &b, &d, Arithmetic::Fused);
    assert_ne!(bits(&exact), bits(&fused));
    for (x, y) in exact.iter().zip(&fused) {
        assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{x} vs {y}");
    }
}

#[test]
fn broadcasts_give_the_references_bits() {
    // Rows, columns, scalars, a middle axis, and sizes past one chunk.
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 5], &[3, 5]),
        (&[3, 5], &[5]),
        (&[3, 5], &[3, 1]),
        (&[1], &[4, 7]),
        (&[2, 3, 4], &[2, 1, 4]),
        (&[4, 1, 6], &[1, 5, 1]),
        (&[129, 300], &[300]),
        (&[70, 600], &[70, 1]),
        (&[5, 8000], &[5, 8000]),
    ];
    for (i, &(a_shape, b_shape)) in cases.iter().enumerate() {
        let out = broadcast_shape(a_shape, b_shape).unwrap();
        let a = values(a_shape.iter().product(), i as u64);
        let b = values(b_shape.iter().product(), 50 + i as u64);
        let (sa, sb) = (
            broadcast_strides(a_shape, &out),
            broadcast_strides(b_shape, &out),
        );
        let (dims, ca, cb) = collapse(&out, &sa, &sb);
        for op in Binary::ALL {
            assert_eq!(
                bits(&binary_fast(&a, &ca, &b, &cb, &dims, op)),
                bits(&binary_ref(&a, &sa, &b, &sb, &out, op)),
                "{a_shape:?} {op:?} {b_shape:?}"
            );
        }
    }
}

#[test]
fn max_pooling_gives_the_references_bits_and_argmax() {
    // (n, h, w, c, k, stride): overlapping windows, gaps, edges that do not divide, and
    // ties (rounded inputs), as the GPU test has them.
    for (n, h, w, c, k, stride) in [
        (1, 1, 1, 1, 1, 1),
        (2, 4, 4, 3, 2, 2),
        (1, 7, 5, 2, 3, 2),
        (3, 6, 6, 1, 2, 3),
        (2, 9, 8, 5, 3, 1),
        (4, 28, 28, 16, 2, 2),
    ] {
        let g = PoolGeometry::of(&[n, h, w, c], k, stride).unwrap();
        let x: Vec<f32> = values(n * h * w * c, 7)
            .iter()
            .map(|v| (v * 2.0).round())
            .collect();
        let (want_y, want_at) = pool_ref(&x, &g, Pool::Max);
        let (y, at) = max_pool_fast(&x, &g);
        assert_eq!(bits(&y), bits(&want_y), "{g:?}");
        assert_eq!(at, want_at, "{g:?} argmax");
        let dy = values(y.len(), 8);
        assert_eq!(
            bits(&max_pool_backward_fast(&dy, &at, &g)),
            bits(&pool_backward_ref(&dy, &at, &g, Pool::Max)),
            "{g:?} backward"
        );
    }
}
