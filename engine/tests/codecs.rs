//! Codec invariants from the specs (byteps-clan.md §7, loco.md §6, liec-sgd.md §4,
//! clapping.md §5), on the CPU implementations. GPU-against-CPU bytes: codecs_gpu.rs.

use murmur_engine::compress::{parse, Codec, CodecContext};
use murmur_engine::rng::Rng;

const ALL: &[&str] = &[
    "f32",
    "f16",
    "bf16",
    "sign",
    "sign:rounds=2",
    "topk:0.1",
    "topk:k=7:f16",
    "randk:0.25",
    "randk:0.25:explicit:unscaled",
    "dither:linear:s=15:norm=max",
    "dither:linear:s=3:norm=l2",
    "dither:natural:s=3:norm=max",
    "dither:natural:s=5:norm=l2",
    "natural",
    "qsgd:bits=8",
    "qsgd:bits=5:stochastic",
    "loco:bits=4:log2s=10",
    "loco:bits=8:log2s=12",
    "loco:bits=4:log2s=-7:rescalable",
    "blockq:bits=4:group=16",
    "blockq:bits=8:group=100",
    "hybrid:bits=6:topk=0.3",
];

fn ctx(step: u32) -> CodecContext {
    CodecContext {
        seed: 42,
        step,
        key: 7,
        stream: 0,
    }
}

fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed, 0);
    (0..n).map(|_| r.normal()).collect()
}

fn norm2(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum()
}

#[test]
fn payload_sizes_follow_the_formulas() {
    type Formula = fn(usize) -> usize;
    let cases: &[(&str, Formula)] = &[
        ("f32", |n| 4 * n),
        ("f16", |n| 2 * n),
        ("bf16", |n| 2 * n),
        ("sign", |n| 8 * n.div_ceil(64) + 4),
        ("sign:rounds=3", |n| 3 * (8 * n.div_ceil(64) + 4)),
        ("topk:0.001", |n| {
            if n == 0 {
                0
            } else {
                8 * ((n as f64 * 0.001) as usize).max(1)
            }
        }),
        (
            "randk:1/32",
            |n| if n == 0 { 0 } else { 4 * (n / 32).max(1) },
        ),
        ("randk:1/32:explicit", |n| {
            if n == 0 {
                0
            } else {
                8 * (n / 32).max(1)
            }
        }),
        ("dither:linear:s=15:norm=max", |n| 4 + (5 * n).div_ceil(8)),
        ("dither:linear:s=127:norm=max", |n| 4 + n),
        ("natural", |n| (9 * n).div_ceil(8)),
        ("qsgd:bits=6", |n| 4 + (6 * n).div_ceil(8)),
        ("loco:bits=4:log2s=19", |n| n.div_ceil(2)),
        ("loco:bits=4:log2s=19:rescalable", |n| 4 + n.div_ceil(2)),
        ("loco:bits=8:log2s=19", |n| n),
        ("blockq:bits=4:group=2048", |n| {
            4 * n.div_ceil(2048) + n.div_ceil(2)
        }),
        ("hybrid:bits=6:topk=0.3", |n| {
            if n == 0 {
                4
            } else {
                4 + 4 * n.div_ceil(32) + (6 * ((0.3 * n as f64).ceil() as usize)).div_ceil(8)
            }
        }),
    ];
    for &(spec, formula) in cases {
        let c = parse(spec).unwrap();
        for n in [0usize, 1, 2, 31, 63, 64, 65, 1000, 4097, 100_000] {
            let x = normal(n, n as u64);
            assert_eq!(c.payload_len(n), formula(n), "{spec} n={n}");
            assert_eq!(
                c.encode(&x, &ctx(0)).len(),
                formula(n),
                "{spec} n={n}: encoded size"
            );
        }
    }
    // The BytePS-Compress figures: 1-bit ~ 32x, top-0.1% with u32+f32 pairs 500x vs f32.
    let sign = parse("sign").unwrap().properties().bits_per_element;
    assert!((sign - 1.0).abs() < 0.01, "{sign}");
    let topk = parse("topk:0.001").unwrap().properties().bits_per_element;
    assert!((32.0 / topk - 500.0).abs() < 1.0, "{topk}");
}

#[test]
fn every_codec_round_trips_empty_tiny_and_awkward_lengths() {
    for spec in ALL {
        let c = parse(spec).unwrap();
        for n in [0usize, 1, 2, 3, 31, 33, 64, 65, 127, 4095, 4097, 70_001] {
            let x = normal(n, 3 + n as u64);
            let payload = c.encode(&x, &ctx(1));
            let y = c
                .decode(&payload, n, &ctx(1))
                .unwrap_or_else(|e| panic!("{spec} n={n}: {e}"));
            assert_eq!(y.len(), n);
            assert!(y.iter().all(|v| v.is_finite()), "{spec} n={n}");
            // Decoding is the operator: encoding it again changes nothing for deterministic
            // codecs (their outputs sit on their own grids).
            // (Not blockq: its clamp at +max moves the max, hence the scale.)
            let regrids = ["sign", "f16", "bf16", "blockq"]
                .iter()
                .any(|p| spec.starts_with(p));
            if !c.properties().stochastic && !regrids {
                let again = c.decode(&c.encode(&y, &ctx(1)), n, &ctx(1)).unwrap();
                assert_eq!(again, y, "{spec} n={n}: not idempotent");
            }
        }
    }
}

#[test]
fn identity_is_exact_and_casts_round_to_nearest_even() {
    let x = normal(1000, 1);
    let f32c = parse("f32").unwrap();
    assert_eq!(
        f32c.decode(&f32c.encode(&x, &ctx(0)), 1000, &ctx(0))
            .unwrap(),
        x
    );
    let f16 = parse("f16")
        .unwrap()
        .decode(&parse("f16").unwrap().encode(&x, &ctx(0)), 1000, &ctx(0))
        .unwrap();
    let bf16 = parse("bf16")
        .unwrap()
        .decode(&parse("bf16").unwrap().encode(&x, &ctx(0)), 1000, &ctx(0))
        .unwrap();
    for i in 0..1000 {
        assert!(
            (f16[i] - x[i]).abs() <= x[i].abs() * 2f32.powi(-11) + 3e-8,
            "f16 {} -> {}",
            x[i],
            f16[i]
        );
        assert!(
            (bf16[i] - x[i]).abs() <= x[i].abs() * 2f32.powi(-8),
            "bf16 {} -> {}",
            x[i],
            bf16[i]
        );
    }
    // Saturation instead of overflow.
    let big = parse("f16").unwrap();
    assert_eq!(
        big.decode(&big.encode(&[1e6, -1e6], &ctx(0)), 2, &ctx(0))
            .unwrap(),
        [65504.0, -65504.0]
    );
}

#[test]
fn recursive_sign_sends_each_round_what_the_previous_left() {
    // Neolithic's FCC (liec-sgd.md §3): m_r = C(x - D(m_1) - ... - D(m_{r-1})), decoded as the
    // sum of the rounds, so each extra round only shrinks the error.
    let sign = parse("sign").unwrap();
    for n in [1usize, 63, 65, 1000] {
        let x = normal(n, 5 + n as u64);
        let m1 = sign.decode(&sign.encode(&x, &ctx(0)), n, &ctx(0)).unwrap();
        let left: Vec<f32> = x.iter().zip(&m1).map(|(a, b)| a - b).collect();
        let m2 = sign
            .decode(&sign.encode(&left, &ctx(0)), n, &ctx(0))
            .unwrap();
        let two = parse("sign:rounds=2").unwrap();
        let payload = two.encode(&x, &ctx(0));
        assert_eq!(
            payload[payload.len() / 2..],
            sign.encode(&left, &ctx(0))[..],
            "n={n}: round 2 is the sign of what round 1 left"
        );
        let sum: Vec<f32> = m1.iter().zip(&m2).map(|(a, b)| a + b).collect();
        assert_eq!(two.decode(&payload, n, &ctx(0)).unwrap(), sum, "n={n}");
        let mut errors = Vec::new();
        for rounds in 1..=4 {
            let c = parse(&format!("sign:rounds={rounds}")).unwrap();
            let y = c.decode(&c.encode(&x, &ctx(0)), n, &ctx(0)).unwrap();
            let e: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
            errors.push(norm2(&e));
        }
        assert!(
            errors.windows(2).all(|w| w[1] <= w[0] * (1.0 + 1e-6)),
            "n={n}: more rounds, no larger error: {errors:?}"
        );
    }
    // A bad second round is refused before the first is applied.
    let two = parse("sign:rounds=2").unwrap();
    let mut payload = two.encode(&normal(65, 1), &ctx(0));
    let last = payload.len() - 1;
    payload[last] = 0xff; // the second round's scale becomes NaN
    let mut out = vec![1.0f32; 65];
    assert!(two
        .decode_into(
            &payload,
            &mut out,
            &ctx(0),
            murmur_engine::compress::DecodeMode::Add
        )
        .is_err());
    assert!(out.iter().all(|v| *v == 1.0), "untouched on error");
    // Two finite scales of f32::MAX with the same signs add up past f32's range: the sum
    // saturates (the encoder makes such payloads from inputs near f32::MAX).
    let mut huge = vec![0u8; 24];
    huge[8..12].copy_from_slice(&f32::MAX.to_le_bytes());
    huge[20..24].copy_from_slice(&f32::MAX.to_le_bytes());
    assert_eq!(two.decode(&huge, 1, &ctx(0)).unwrap(), [f32::MAX]);
}

#[test]
fn scaled_sign_identities() {
    let c = parse("sign").unwrap();
    for n in [1usize, 5, 64, 100, 4097] {
        let mut x = normal(n, n as u64);
        x[0] = 0.0; // sign(0) = +
        let y = c.decode(&c.encode(&x, &ctx(0)), n, &ctx(0)).unwrap();
        let l1: f64 = x.iter().map(|v| v.abs() as f64).sum();
        let scale = (l1 / n as f64) as f32;
        assert!(
            y.iter().all(|v| (v.abs() - scale).abs() <= scale * 1e-5),
            "all |C_j| equal the scale"
        );
        assert!(y[0].is_sign_positive(), "sign(0) is +");
        assert!(
            x.iter()
                .zip(&y)
                .skip(1)
                .all(|(a, b)| (a < &0.0) == (b < &0.0)),
            "signs kept"
        );
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let expected = norm2(&x) - l1 * l1 / n as f64;
        assert!(
            (err - expected).abs() <= 1e-4 * norm2(&x),
            "‖C(v)−v‖² = ‖v‖² − ‖v‖₁²/d: {err} vs {expected}"
        );
        let l1_out: f64 = y.iter().map(|v| v.abs() as f64).sum();
        assert!((l1_out - l1).abs() <= 1e-4 * l1, "‖C(v)‖₁ = ‖v‖₁");
    }
}

/// The scale a sign payload carries (its last four bytes).
fn sign_scale(x: &[f32]) -> f32 {
    let payload = parse("sign").unwrap().encode(x, &ctx(0));
    f32::from_le_bytes(payload[payload.len() - 4..].try_into().unwrap())
}

#[test]
fn the_sign_scale_is_the_mean_magnitude_rounded_once() {
    // One magnitude throughout: the mean is that magnitude exactly (a float sum was up to
    // 4 ulp off: 0.1 over 4097 elements came out as 0.10000002).
    for c in [0.1f32, 1.0 / 3.0, 1e-3, 7.77e30] {
        for n in [3usize, 1000, 4097, 100_003] {
            let x: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -c } else { c }).collect();
            assert_eq!(sign_scale(&x), c, "n = {n}, |v| = {c:e}");
        }
    }
    // A sum past f32's range still has its mean (a float sum saturated at f32::MAX).
    assert_eq!(sign_scale(&[f32::MAX, -f32::MAX, 0.0, 0.0]), f32::MAX / 2.0);
    assert_eq!(sign_scale(&[3e38, 3e38, 3e38]), 3e38);
    // (2 + 2^-22) + (1 - 2^-24) is 3 (1 + 2^-24): over three, halfway between 1 and the next
    // float, so to even; a value far below the others breaks the tie upwards.
    let (a, b) = (2.0 + 2f32.powi(-22), 1.0 - 2f32.powi(-24));
    assert_eq!(sign_scale(&[a, -b, 0.0]), 1.0);
    assert_eq!(
        sign_scale(&[a, -b, 2f32.powi(-100)]),
        f32::from_bits(1f32.to_bits() + 1)
    );
}

#[test]
fn top_k_support_ties_and_error_bound() {
    let c = parse("topk:0.01").unwrap();
    let n = 50_000;
    let mut x = normal(n, 9);
    // Ties: equal magnitudes of both signs around the threshold.
    for i in (0..n).step_by(97) {
        x[i] = if i % 2 == 0 { 2.5 } else { -2.5 };
    }
    let y = c.decode(&c.encode(&x, &ctx(0)), n, &ctx(0)).unwrap();
    let k = n / 100;
    let kept: Vec<usize> = (0..n).filter(|&i| y[i] != 0.0).collect();
    assert_eq!(kept.len(), k, "exactly k nonzeros");
    let min_kept = kept
        .iter()
        .map(|&i| x[i].abs())
        .fold(f32::INFINITY, f32::min);
    let max_dropped = (0..n)
        .filter(|i| y[*i] == 0.0)
        .map(|i| x[i].abs())
        .fold(0.0, f32::max);
    assert!(
        min_kept >= max_dropped,
        "min kept {min_kept} < max dropped {max_dropped}"
    );
    // Among equal magnitudes the lower indices win.
    let tied: Vec<usize> = (0..n).filter(|&i| x[i].abs() == min_kept).collect();
    let tied_kept: Vec<usize> = tied.iter().copied().filter(|&i| y[i] != 0.0).collect();
    assert_eq!(
        tied_kept,
        tied[..tied_kept.len()].to_vec(),
        "ties go to lower indices"
    );
    assert!(kept.iter().all(|&i| y[i] == x[i]), "kept values are exact");
    let err: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    assert!(err <= (1.0 - k as f64 / n as f64) * norm2(&x));
    // f16 values: the same support, values rounded.
    let h = parse("topk:k=500:f16").unwrap();
    let yh = h.decode(&h.encode(&x, &ctx(0)), n, &ctx(0)).unwrap();
    assert_eq!((0..n).filter(|&i| yh[i] != 0.0).collect::<Vec<_>>(), kept);
}

/// Mean of `trials` decoded encodings of x, and the mean squared norm.
fn monte_carlo(c: &dyn Codec, x: &[f32], trials: u32) -> (Vec<f64>, f64) {
    let mut mean = vec![0.0f64; x.len()];
    let mut sq = 0.0;
    for t in 0..trials {
        let y = c.decode(&c.encode(x, &ctx(t)), x.len(), &ctx(t)).unwrap();
        mean.iter_mut()
            .zip(&y)
            .for_each(|(m, v)| *m += *v as f64 / trials as f64);
        sq += norm2(&y) / trials as f64;
    }
    (mean, sq)
}

#[test]
fn unbiased_codecs_are_unbiased_by_monte_carlo() {
    let x = normal(64, 5);
    for spec in [
        "randk:0.25",
        "dither:linear:s=3:norm=max",
        "dither:linear:s=15:norm=l2",
        "dither:natural:s=3:norm=max",
        "natural",
        "qsgd:bits=3:stochastic",
    ] {
        let c = parse(spec).unwrap();
        assert!(c.properties().unbiased, "{spec}");
        let trials = 20_000;
        let (mean, _) = monte_carlo(c.as_ref(), &x, trials);
        // Tolerance: five standard errors, from the codec's worst per-element variance.
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let l2 = norm2(&x).sqrt();
        let sd = match spec {
            "randk:0.25" => 2.0 * max,
            _ if spec.contains("l2") => l2,
            _ => max,
        };
        let tol = 5.0 * sd / (trials as f64).sqrt();
        for (i, (&m, &v)) in mean.iter().zip(&x).enumerate() {
            assert!(
                (m - v as f64).abs() < tol,
                "{spec}: element {i}: mean {m} vs {v} (tol {tol})"
            );
        }
    }
    // Scaled random-k without replacement: E‖C(v)‖² = (d/k)‖v‖².
    let c = parse("randk:0.25").unwrap();
    let (_, sq) = monte_carlo(c.as_ref(), &x, 20_000);
    assert!(
        (sq / norm2(&x) - 4.0).abs() < 0.05,
        "E‖C‖²/‖v‖² = {}",
        sq / norm2(&x)
    );
    // Linear dithering's per-coordinate variance is at most norm²/(4s²).
    let c = parse("dither:linear:s=3:norm=max").unwrap();
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let (_, sq) = monte_carlo(c.as_ref(), &x, 5000);
    assert!(
        sq - norm2(&x) <= 64.0 * max * max / 36.0 * 1.05,
        "total variance bound"
    );
}

#[test]
fn dithering_and_natural_outputs_lie_on_their_grids() {
    let x = normal(5000, 6);
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let lin = parse("dither:linear:s=15:norm=max").unwrap();
    let y = lin.decode(&lin.encode(&x, &ctx(0)), 5000, &ctx(0)).unwrap();
    let step = max / 15.0;
    for &v in &y {
        assert!(v.abs() <= max * (1.0 + 1e-6));
        let q = v.abs() / step;
        assert!(
            (q - q.round()).abs() < 1e-4,
            "{v} is not a multiple of norm/s"
        );
    }
    let nat = parse("dither:natural:s=3:norm=max").unwrap();
    let y = nat.decode(&nat.encode(&x, &ctx(0)), 5000, &ctx(0)).unwrap();
    for &v in &y {
        let r = v.abs() / (max / 4.0);
        assert!(
            [0.0, 1.0, 2.0, 4.0].iter().any(|g| (r - g).abs() < 1e-5),
            "{v}: natural levels are {{0,1/4,1/2,1}}·norm"
        );
    }
    // Values already on the grid pass through (probability-0 rounding).
    let on_grid: Vec<f32> = (0..16).map(|q| q as f32 / 15.0).collect();
    let z = lin
        .decode(&lin.encode(&on_grid, &ctx(3)), 16, &ctx(3))
        .unwrap();
    for (a, b) in on_grid.iter().zip(&z) {
        assert!((a - b).abs() < 1e-6, "{a} -> {b}");
    }
    let nc = parse("natural").unwrap();
    let y = nc.decode(&nc.encode(&x, &ctx(0)), 5000, &ctx(0)).unwrap();
    for (&a, &b) in x.iter().zip(&y) {
        assert!(
            b == 0.0 || b.abs().log2().fract() == 0.0,
            "{b} is a power of two"
        );
        assert!(b.abs() >= a.abs() / 2.0 && b.abs() <= 2.0 * a.abs() && (a < 0.0) == (b < 0.0));
    }
    assert_eq!(
        nc.decode(&nc.encode(&[0.0], &ctx(0)), 1, &ctx(0)).unwrap(),
        [0.0]
    );
}

#[test]
fn loco_quantizer_is_bit_exact() {
    let c = parse("loco:bits=4:log2s=3").unwrap(); // s = 8: grid 1/8, range [-1, 7/8]
    let x = [
        0.0f32, 0.0625, 0.1875, 0.3125, -0.0625, 10.0, -10.0, 0.874, -1.0, 0.5,
    ];
    let y = c.decode(&c.encode(&x, &ctx(0)), x.len(), &ctx(0)).unwrap();
    // 0.0625 * 8 = 0.5 rounds to 0 (even); 0.1875 * 8 = 1.5 rounds to 2; 2.5 to 2; saturation.
    assert_eq!(
        y,
        [0.0, 0.0, 0.25, 0.25, -0.0, 0.875, -1.0, 0.875, -1.0, 0.5]
    );
    // Round trip of grid values, and the nibble layout q0 | q1 << 4.
    let grid: Vec<f32> = (-8..8).map(|q| q as f32 / 8.0).collect();
    let payload = c.encode(&grid, &ctx(0));
    assert_eq!(c.decode(&payload, 16, &ctx(0)).unwrap(), grid);
    assert_eq!(payload[0], 0x98, "codes -8 and -7 as nibbles");
    let l8 = parse("loco:bits=8:log2s=19").unwrap();
    let tiny = [1.0 / 524_288.0 * 3.0, -127.5 / 524_288.0];
    assert_eq!(
        l8.decode(&l8.encode(&tiny, &ctx(0)), 2, &ctx(0)).unwrap(),
        [3.0 / 524_288.0, -128.0 / 524_288.0]
    );
}

#[test]
fn rescalable_loco_payloads_carry_their_scale() {
    use murmur_engine::compress::{payload_log2s, rescaled};
    let x = normal(1000, 7);
    let fixed = parse("loco:bits=4:log2s=3").unwrap();
    let spec: murmur_engine::compress::CodecSpec =
        "loco:bits=4:log2s=3:rescalable".parse().unwrap();
    let carried = murmur_engine::compress::build(spec);
    let payload = carried.encode(&x, &ctx(0));
    // The fixed-scale codes, behind the scale 2^3.
    assert_eq!(&payload[..4], &8.0f32.to_le_bytes());
    assert_eq!(&payload[4..], &fixed.encode(&x, &ctx(0))[..]);
    assert_eq!(payload_log2s(spec, &payload), Some(3));
    // A decoder at any other scale reads the scale from the payload.
    let other = murmur_engine::compress::build(rescaled(spec, -40));
    assert_eq!(
        other.decode(&payload, x.len(), &ctx(0)).unwrap(),
        fixed.decode(&payload[4..], x.len(), &ctx(0)).unwrap()
    );
    // Scales no spec can name are refused: not a power of two, out of range, negative.
    for bad in [3.0f32, 2f32.powi(101), -8.0, 0.0, f32::from_bits(1)] {
        let mut p = payload.clone();
        p[..4].copy_from_slice(&bad.to_le_bytes());
        assert!(
            carried.decode(&p, x.len(), &ctx(0)).is_err(),
            "scale {bad:e}"
        );
        assert_eq!(payload_log2s(spec, &p), None);
    }
}

#[test]
fn block_absmax_quantizes_each_group_against_its_own_max() {
    let c = parse("blockq:bits=4:group=4").unwrap();
    let x = [
        1.0f32, -0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0, 50.0, -25.0, 12.5,
    ];
    let y = c.decode(&c.encode(&x, &ctx(0)), x.len(), &ctx(0)).unwrap();
    // Group 0: scale 1/8, codes 8 -> 7 (clamped), -4, 2, 0; group 1 all zero; group 2: scale 12.5.
    assert_eq!(
        y,
        [0.875, -0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 87.5, 50.0, -25.0, 12.5]
    );
}

#[test]
fn qsgd_and_hybrid_errors_stay_within_half_a_step() {
    let x = normal(10_000, 8);
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let q = parse("qsgd:bits=6").unwrap();
    let y = q.decode(&q.encode(&x, &ctx(0)), x.len(), &ctx(0)).unwrap();
    let step = max / 31.0;
    assert!(x
        .iter()
        .zip(&y)
        .all(|(a, b)| (a - b).abs() <= step / 2.0 * 1.0001));
    let h = parse("hybrid:bits=6:topk=0.3").unwrap();
    let y = h.decode(&h.encode(&x, &ctx(0)), x.len(), &ctx(0)).unwrap();
    let t = parse("topk:k=3000").unwrap();
    let support = t.decode(&t.encode(&x, &ctx(0)), x.len(), &ctx(0)).unwrap();
    for i in 0..x.len() {
        if support[i] == 0.0 {
            assert_eq!(y[i], 0.0, "element {i} outside the top 30%");
        } else {
            assert!((y[i] - x[i]).abs() <= step / 2.0 * 1.0001, "element {i}");
        }
    }
}

#[test]
fn random_k_indices_are_shared_by_seed_step_and_key() {
    let c = parse("randk:0.1").unwrap();
    let x = normal(1000, 2);
    let support = |cx: CodecContext| -> Vec<usize> {
        let y = c.decode(&c.encode(&x, &cx), 1000, &cx).unwrap();
        (0..1000).filter(|&i| y[i] != 0.0).collect()
    };
    let base = support(ctx(5));
    assert_eq!(base.len(), 100);
    assert_eq!(
        support(ctx(5)),
        base,
        "same (seed, step, key): same indices"
    );
    assert_ne!(support(ctx(6)), base, "another step");
    assert_ne!(
        support(CodecContext { key: 8, ..ctx(5) }),
        base,
        "another key"
    );
    assert_ne!(
        support(CodecContext { seed: 1, ..ctx(5) }),
        base,
        "another seed"
    );
    // A values-only payload decodes at the server with the same indices.
    let payload = c.encode(&x, &ctx(5));
    assert_eq!(payload.len(), 400);
    // Every sender shares the index set: each worker's push and the server's reply.
    assert_eq!(support(ctx(5).sent_by(0)), base, "worker 0");
    assert_eq!(support(ctx(5).sent_by(3)), base, "worker 3");
}

#[test]
fn stochastic_rounding_is_independent_per_sender_and_repeatable_per_sender() {
    // Workers' rounding must not share random numbers (nor with the server's re-compression):
    // otherwise the errors of a mean do not shrink with the number of workers and a two-way
    // round is biased (byteps-clan.md Algorithm 3).
    let x = normal(4000, 9);
    for spec in ["dither:linear:s=3", "natural", "qsgd:bits=4:stochastic"] {
        let c = parse(spec).unwrap();
        let y = |cx: CodecContext| c.decode(&c.encode(&x, &cx), x.len(), &cx).unwrap();
        assert_eq!(
            y(ctx(5).sent_by(1)),
            y(ctx(5).sent_by(1)),
            "{spec}: repeatable"
        );
        let (a, b, server) = (y(ctx(5).sent_by(0)), y(ctx(5).sent_by(1)), y(ctx(5)));
        // With independent draws the two workers' errors are uncorrelated.
        let err =
            |v: &[f32]| -> Vec<f64> { v.iter().zip(&x).map(|(v, x)| (v - x) as f64).collect() };
        let (ea, eb, es) = (err(&a), err(&b), err(&server));
        let corr = |p: &[f64], q: &[f64]| {
            let dot: f64 = p.iter().zip(q).map(|(p, q)| p * q).sum();
            let (np, nq) = (
                p.iter().map(|v| v * v).sum::<f64>().sqrt(),
                q.iter().map(|v| v * v).sum::<f64>().sqrt(),
            );
            dot / (np * nq)
        };
        assert!(
            corr(&ea, &eb).abs() < 0.1,
            "{spec}: workers correlated {}",
            corr(&ea, &eb)
        );
        assert!(
            corr(&ea, &es).abs() < 0.1,
            "{spec}: worker and server correlated"
        );
    }
}

#[test]
fn non_finite_inputs_encode_as_zero() {
    for spec in ALL {
        let c = parse(spec).unwrap();
        let mut x = normal(300, 11);
        let mut zeroed = x.clone();
        for (j, bad) in [
            (3usize, f32::NAN),
            (100, f32::INFINITY),
            (250, f32::NEG_INFINITY),
        ] {
            x[j] = bad;
            zeroed[j] = 0.0;
        }
        assert_eq!(c.encode(&x, &ctx(2)), c.encode(&zeroed, &ctx(2)), "{spec}");
    }
}

#[test]
fn encoding_is_deterministic_across_thread_counts() {
    let x = normal(300_000, 12);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for spec in ALL {
        let c = parse(spec).unwrap();
        let all = c.encode(&x, &ctx(4));
        assert_eq!(one.install(|| c.encode(&x, &ctx(4))), all, "{spec}");
        assert_eq!(c.encode(&x, &ctx(4)), all, "{spec}: twice");
    }
}

#[test]
fn bad_payloads_are_errors_and_leave_the_accumulator_untouched() {
    let n = 200;
    let x = normal(n, 13);
    for spec in ALL {
        let c = parse(spec).unwrap();
        let good = c.encode(&x, &ctx(0));
        let mut acc = vec![1.5f32; n];
        let mut bad_inputs: Vec<Vec<u8>> = vec![
            good[..good.len().saturating_sub(1)].to_vec(),
            [good.clone(), vec![0]].concat(),
            vec![],
        ];
        // Corrupt every byte position in turn with all-ones: whatever decodes must be finite,
        // whatever does not must leave `acc` alone.
        for pos in 0..good.len() {
            let mut b = good.clone();
            b[pos] = 0xff;
            bad_inputs.push(b);
        }
        for b in &bad_inputs {
            let before = acc.clone();
            match c.decode_add(b, &mut acc, &ctx(0)) {
                Ok(()) => {
                    assert!(
                        acc.iter().all(|v| v.is_finite()),
                        "{spec}: a payload decoded to non-finite values"
                    );
                    acc = before;
                }
                Err(e) => {
                    assert_eq!(acc, before, "{spec}: error {e} but the accumulator changed");
                    assert!(e.to_string().contains("payload"), "{e}");
                }
            }
        }
    }
}

#[test]
fn decode_add_sums_into_the_accumulator() {
    let x = normal(1000, 14);
    for spec in ALL {
        let c = parse(spec).unwrap();
        let p = c.encode(&x, &ctx(0));
        let y = c.decode(&p, 1000, &ctx(0)).unwrap();
        let mut acc: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        c.decode_add(&p, &mut acc, &ctx(0)).unwrap();
        for i in 0..1000 {
            assert_eq!(acc[i], i as f32 + y[i], "{spec} element {i}");
        }
    }
}

#[test]
fn specific_malformed_payloads_name_the_problem() {
    let topk = parse("topk:k=2").unwrap();
    let mut p = topk.encode(&[1.0, 5.0, 3.0, 4.0], &ctx(0));
    p[0..4].copy_from_slice(&9u32.to_le_bytes());
    assert!(
        topk.decode(&p, 4, &ctx(0))
            .unwrap_err()
            .to_string()
            .contains("increasing")
            || topk
                .decode(&p, 4, &ctx(0))
                .unwrap_err()
                .to_string()
                .contains("range")
    );
    let sign = parse("sign").unwrap();
    let mut p = sign.encode(&[1.0, -1.0], &ctx(0));
    let at = p.len() - 4;
    p[at..].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(sign
        .decode(&p, 2, &ctx(0))
        .unwrap_err()
        .to_string()
        .contains("scale"));
    let q = parse("qsgd:bits=4").unwrap();
    let mut p = q.encode(&[1.0, 0.5], &ctx(0));
    p[4] = 0x08; // code -8 is not a qsgd level
    assert!(q
        .decode(&p, 2, &ctx(0))
        .unwrap_err()
        .to_string()
        .contains("no encoder produces"));
}

#[test]
fn tiny_and_subnormal_partitions_never_make_nan() {
    // Found by fuzzing: with a subnormal scale, levels / scale overflowed and 0 * inf was NaN.
    for spec in ALL {
        let c = parse(spec).unwrap();
        for x in [
            vec![1e-40f32, 0.0, -1e-40, 0.0],
            vec![1e-37, 0.0, -3e-38],
            vec![f32::MIN_POSITIVE, 0.0],
            vec![1e38, -3e38, 0.0],
        ] {
            let y = c.decode(&c.encode(&x, &ctx(0)), x.len(), &ctx(0)).unwrap();
            assert!(y.iter().all(|v| v.is_finite()), "{spec} {x:?} -> {y:?}");
            // Re-encoding a decoded payload is always possible.
            let again = c.encode(&y, &ctx(0));
            assert_eq!(again.len(), c.payload_len(x.len()));
        }
    }
}

#[test]
fn payloads_whose_values_would_overflow_are_refused() {
    // Found by fuzzing: a block-absmax scale near f32::MAX times a code is infinite.
    let c = parse("blockq:bits=4:group=8").unwrap();
    let mut p = c.encode(&[1.0; 8], &ctx(0));
    p[..4].copy_from_slice(&f32::MAX.to_le_bytes());
    let mut acc = vec![0.0; 8];
    assert!(c.decode_add(&p, &mut acc, &ctx(0)).is_err());
    assert_eq!(acc, vec![0.0; 8]);
}

#[test]
fn every_codec_decodes_its_own_payloads_at_the_edges_of_f32() {
    // Found by review: scaled random-k multiplied values near f32::MAX by n / k to +inf, its
    // own decoder refused the payload, and error feedback's encode_residual panicked.
    let big = |n: usize, v: f32| vec![v; n];
    let alternating = |n: usize| {
        (0..n)
            .map(|i| if i % 2 == 0 { f32::MAX } else { -3e38 })
            .collect::<Vec<f32>>()
    };
    let mixed = vec![
        f32::MAX,
        1e-45,
        f32::NAN,
        f32::NEG_INFINITY,
        -f32::MAX,
        2e19,
        0.0,
    ];
    for spec in ALL {
        let c = parse(spec).unwrap();
        for x in [
            big(64, f32::MAX),
            big(1000, -3e38),
            alternating(333),
            mixed.clone(),
        ] {
            let n = x.len();
            let payload = c.encode(&x, &ctx(1));
            let y = c
                .decode(&payload, n, &ctx(1))
                .unwrap_or_else(|e| panic!("{spec}: its own payload refused: {e}"));
            assert!(y.iter().all(|v| v.is_finite()), "{spec}: {y:?}");
            let mut residual = vec![0.0; n];
            let again = c
                .encode_residual(&x, &ctx(1), &mut residual)
                .unwrap_or_else(|e| panic!("{spec}: encode_residual failed: {e}"));
            assert_eq!(again, payload, "{spec}");
        }
    }
}

#[test]
fn values_too_small_to_code_stay_in_error_feedback() {
    // Natural compression flushes subnormal inputs to zero, and QSGD, block-absmax and the
    // dithering codecs send a partition whose largest value is below about 1.5e-36 as zeros
    // (levels / scale would pass 2^126): nothing that small matters to training, and
    // flushing keeps every device agreeing, FTZ GPUs included. What is not sent is not lost:
    // the residual that error feedback carries forward holds every such value exactly.
    for spec in [
        "natural",
        "qsgd:bits=8",
        "blockq:bits=8:group=4",
        "dither:linear:s=15:norm=max",
    ] {
        let c = parse(spec).unwrap();
        let x = vec![1e-40f32, -3e-39, 2e-37, 0.0];
        let mut residual = vec![0.0; x.len()];
        let payload = c.encode_residual(&x, &ctx(3), &mut residual).unwrap();
        let sent = c.decode(&payload, x.len(), &ctx(3)).unwrap();
        for ((&v, &s), &r) in x.iter().zip(&sent).zip(&residual) {
            assert_eq!(s + r, v, "{spec}: {v} = sent {s} + kept {r}");
        }
        match spec {
            "natural" => assert_eq!(sent[..2], [0.0, 0.0], "subnormals flush to zero"),
            // s / max stays below 2^126 here: dithering codes the partition.
            "dither:linear:s=15:norm=max" => assert!(sent.iter().any(|v| *v != 0.0)),
            _ => assert!(sent.iter().all(|v| *v == 0.0), "{spec}: {sent:?}"),
        }
    }
}

/// ulps between two finite f32 of one sign.
fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn qsgd_values_are_within_ulps_of_the_papers_formula() {
    // QSGD and block-absmax decode l * (scale / L); the formulation in the specs
    // (clapping.md §5, byteps-clan.md's dithering) is scale * l / L. Both round twice; this
    // measures how far apart they land, and how far each is from the exact value, over every
    // level of many scales. (Printed with --nocapture; docs/wire-format.md quotes the numbers.)
    let mut rng = Rng::new(77, 0);
    for bits in [5u32, 6, 8] {
        let c = parse(&format!("qsgd:bits={bits}")).unwrap();
        let top = (1u32 << (bits - 1)) - 1;
        let (mut differ, mut total, mut widest) = (0u64, 0u64, 0u32);
        let (mut ours_worst, mut theirs_worst) = (0.0f64, 0.0f64);
        for _ in 0..2000 {
            let scale = (rng.normal() * 0.01).abs().max(1e-30);
            // A payload of every level at this scale.
            let x: Vec<f32> = (0..=top).map(|l| scale * l as f32 / top as f32).collect();
            let mut payload = c.encode(&x, &ctx(0));
            payload[..4].copy_from_slice(&scale.to_le_bytes());
            let codes: Vec<u32> = (0..=top).collect();
            let mut packed = vec![0u8; payload.len() - 4];
            murmur_engine::compress::support::pack(&codes, bits, &mut packed);
            payload[4..].copy_from_slice(&packed);
            let ours = c.decode(&payload, x.len(), &ctx(0)).unwrap();
            for (l, &v) in ours.iter().enumerate().skip(1) {
                let theirs = scale * l as f32 / top as f32;
                let exact = scale as f64 * l as f64 / top as f64;
                let step = ((exact as f32).next_up() - exact as f32) as f64;
                let ulp = |v: f32| (v as f64 - exact).abs() / step;
                ours_worst = ours_worst.max(ulp(v));
                theirs_worst = theirs_worst.max(ulp(theirs));
                let d = ulps(v, theirs);
                widest = widest.max(d);
                differ += (d > 0) as u64;
                total += 1;
            }
        }
        println!(
            "qsgd:bits={bits}: {:.1}% of values differ from scale * l / L, by at most {widest} ulp; \
             worst error against the exact value: ours {ours_worst:.2} ulp, theirs {theirs_worst:.2} ulp",
            100.0 * differ as f64 / total as f64
        );
        // Two correctly rounded operations each: a relative error below 2 * 2^-24, so at most
        // 2 ulp from the exact value, and the two at most 3 ulp apart (measured: see above).
        assert!(widest <= 3, "bits {bits}: {widest} ulps apart");
        assert!(
            ours_worst <= 2.0 && theirs_worst <= 2.0,
            "{ours_worst} {theirs_worst}"
        );
    }
}

#[test]
fn the_l2_norm_is_right_past_the_squares_range() {
    // Squares in f32 overflowed from about 1.8e19: the norm saturated at f32::MAX (so the
    // scale was capped and every value decoded far too large or too small).
    use murmur_engine::compress::support::l2_norm;
    for (v, n) in [(2e19f32, 100usize), (3e30, 7), (1e36, 4096 * 2 + 3)] {
        let x = vec![v; n];
        let want = (v as f64) * (n as f64).sqrt();
        let got = l2_norm(&x) as f64;
        assert!(
            (got - want).abs() <= 4e-7 * want,
            "{n} x {v}: {got} against {want}"
        );
    }
    // Below the overflow the bits are those of the plain sum, as before.
    let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1e-3).collect();
    let plain: f32 = murmur_engine::compress::support::canonical_sum(x.len(), |i| x[i] * x[i]);
    assert_eq!(l2_norm(&x).to_bits(), plain.sqrt().to_bits());
    // And the codec's scale follows: a vector of 2e19s decodes back to about 2e19.
    let c = parse("dither:linear:s=15:norm=l2").unwrap();
    let x = vec![2e19f32; 100];
    let y = c.decode(&c.encode(&x, &ctx(0)), 100, &ctx(0)).unwrap();
    let mean = y.iter().map(|&v| v as f64).sum::<f64>() / 100.0;
    assert!((mean / 2e19 - 1.0).abs() < 0.3, "decoded mean {mean}");
}

#[test]
fn clipped_codes_are_counted_in_the_packed_bytes() {
    use murmur_engine::compress::{clipped_codes, support, CodecSpec};
    let x = normal(1001, 21);
    for (bits, log2s) in [(4u32, 2), (8, 6), (4, 9), (8, 12)] {
        let spec = CodecSpec::Loco {
            bits,
            log2s,
            rescalable: false,
        };
        let payload = parse(&spec.to_string()).unwrap().encode(&x, &ctx(0));
        let codes = support::unpack(&payload, x.len(), bits, "loco").unwrap();
        let (top, bottom) = (
            support::to_pattern((1 << (bits - 1)) - 1, bits),
            support::to_pattern(-(1 << (bits - 1)), bits),
        );
        let want = codes.iter().filter(|&&c| c == top || c == bottom).count();
        assert_eq!(clipped_codes(spec, &payload, x.len()), Some(want), "{spec}");
        assert!(
            want > 0 && want < x.len(),
            "{spec}: {want} clipped, a case that tells"
        );
    }
    assert_eq!(clipped_codes(CodecSpec::Sign, &[0; 12], 64), None);
    assert_eq!(
        clipped_codes(
            CodecSpec::Loco {
                bits: 4,
                log2s: 0,
                rescalable: false
            },
            &[0; 3],
            64
        ),
        None
    );
}
