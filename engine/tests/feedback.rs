//! Error-feedback memories: the fused residual pass equals the unfused definition bit for bit,
//! the EF and LoCo invariants of the specs hold, and the GPU memories track the CPU ones
//! exactly.

mod common;

use murmur_engine::compress::support::clean;
use murmur_engine::compress::{parse, CodecContext, DecodeMode};
use murmur_engine::feedback::{Feedback, Memory};
use murmur_engine::rng::Rng;
use murmur_engine::Device;

const CODECS: &[&str] = &[
    "f32",
    "f16",
    "sign",
    "sign:rounds=2",
    "topk:0.05",
    "topk:0.05:f16",
    "randk:0.1:unscaled",
    "randk:0.1:explicit",
    "dither:linear:s=7:norm=max",
    "natural",
    "qsgd:bits=6",
    "loco:bits=4:log2s=10",
    "loco:bits=4:log2s=10:rescalable",
    "blockq:bits=4:group=64",
    "hybrid:bits=6:topk=0.3",
];

fn ctx(step: u32) -> CodecContext {
    CodecContext {
        seed: 9,
        step,
        key: 1,
        stream: 0,
    }
}

fn gradient(n: usize, step: u64) -> Vec<f32> {
    let mut r = Rng::new(100 + step, 0);
    (0..n).map(|_| r.normal() * 1e-3).collect()
}

#[test]
fn fused_residual_equals_the_unfused_definition() {
    for spec in CODECS {
        let c = parse(spec).unwrap();
        for n in [0usize, 1, 33, 5000] {
            let mut q = gradient(n, n as u64);
            if n > 3 {
                q[2] = f32::NAN;
            }
            let mut fused = vec![0.0; n];
            let payload = c.encode_residual(&q, &ctx(0), &mut fused).unwrap();
            assert_eq!(payload, c.encode(&q, &ctx(0)), "{spec}: same payload");
            let mut unfused: Vec<f32> = q.iter().map(|&v| clean(v)).collect();
            c.decode_into(&payload, &mut unfused, &ctx(0), DecodeMode::Subtract)
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&unfused), "{spec} n={n}");
        }
    }
}

#[test]
fn residual_memory_keeps_what_was_not_sent() {
    let n = 2000;
    for spec in [
        "topk:0.01",
        "sign",
        "randk:0.05:unscaled",
        "loco:bits=4:log2s=12",
    ] {
        let mut fb =
            Feedback::new(parse(spec).unwrap(), Memory::Residual, n, &Device::Cpu).unwrap();
        let (mut sent, mut true_sum) = (vec![0f64; n], vec![0f64; n]);
        for t in 0..30 {
            let g = gradient(n, t);
            let e_before = fb.error().unwrap();
            let payload = fb.encode(&g, &ctx(t as u32)).unwrap();
            let delta = fb.codec().decode(&payload, n, &ctx(t as u32)).unwrap();
            let e_after = fb.error().unwrap();
            for i in 0..n {
                // delta + e_{t+1} == q = g + e_t (exactly for sparsifiers: e is q with the
                // kept entries zeroed).
                let q = clean(g[i] + e_before[i]);
                if spec.starts_with("topk") || spec.starts_with("randk") {
                    assert!(
                        e_after[i] == 0.0 && delta[i] == q || e_after[i] == q && delta[i] == 0.0,
                        "{spec} element {i}"
                    );
                } else {
                    // One rounding of q - delta, then one of the sum.
                    assert!(
                        ((delta[i] + e_after[i]) - q).abs()
                            <= 2.0 * f32::EPSILON * (q.abs() + delta[i].abs()),
                        "{spec} element {i}"
                    );
                }
                sent[i] += delta[i] as f64;
                true_sum[i] += g[i] as f64;
            }
        }
        // Telescoping: what was sent is what was given, less what is still held back.
        let e = fb.error().unwrap();
        for i in 0..n {
            assert!(
                (sent[i] - (true_sum[i] - e[i] as f64)).abs() < 1e-5,
                "{spec}: element {i}"
            );
        }
    }
}

fn loco(beta: f32, reset_every: u32, reference: bool) -> Memory {
    // s = 2^10, s_e = 4 s.
    Memory::LocoEma {
        beta,
        reset_every,
        se: 4096.0,
        reference,
    }
}

#[test]
fn loco_ema_invariants() {
    let n = 500;
    let codec = || parse("loco:bits=4:log2s=10").unwrap();
    // beta = 0: the error never moves: naive quantization.
    let mut naive = Feedback::new(codec(), loco(0.0, 0, false), n, &Device::Cpu).unwrap();
    for t in 0..10 {
        let g = gradient(n, t);
        assert_eq!(
            naive.encode(&g, &ctx(0)).unwrap(),
            codec().encode(&g, &ctx(0))
        );
        assert_eq!(naive.nonzero_fraction().unwrap(), 0.0);
    }
    // T_c = 1 resets after every call: also naive.
    let mut reset_always = Feedback::new(codec(), loco(0.5, 1, false), n, &Device::Cpu).unwrap();
    for t in 0..5 {
        let g = gradient(n, t);
        assert_eq!(
            reset_always.encode(&g, &ctx(0)).unwrap(),
            codec().encode(&g, &ctx(0))
        );
    }
    // The reset schedule: the error used at calls 1, T_c + 1, ... is zero.
    let mut fb = Feedback::new(codec(), loco(0.5, 4, false), n, &Device::Cpu).unwrap();
    for call in 0..12u32 {
        let zero = fb.nonzero_fraction().unwrap() == 0.0;
        if call % 4 == 1 || call == 0 {
            assert!(zero, "call {call} must use a zero error");
        }
        fb.encode(&gradient(n, call as u64), &ctx(0)).unwrap();
        if call % 4 != 0 {
            assert!(
                fb.nonzero_fraction().unwrap() > 0.0,
                "after call {call} the error is in use"
            );
        }
    }
    // Error codes stay in range, |ê| <= 128 / s_e.
    assert!(fb
        .error()
        .unwrap()
        .iter()
        .all(|v| v.abs() <= 128.0 / 4096.0));
}

#[test]
fn loco_reference_mode_satisfies_lemma_1() {
    // d_{k+1} = g_k + (et_k - et_{k+1}) / beta + (C_d(et_k) - et_k) on non-reset steps, with
    // et the f32 moving average and C_d its 8-bit round trip (what compensates).
    let n = 300;
    let beta = 0.25f32;
    let codec = parse("loco:bits=4:log2s=10").unwrap();
    let mut fb = Feedback::new(
        parse("loco:bits=4:log2s=10").unwrap(),
        loco(beta, 0, true),
        n,
        &Device::Cpu,
    )
    .unwrap();
    let mut et = vec![0f64; n];
    for t in 0..20u64 {
        let g = gradient(n, t);
        let compensation = fb.error().unwrap(); // C_d(et_k)
        let d = codec
            .decode(&fb.encode(&g, &ctx(0)).unwrap(), n, &ctx(0))
            .unwrap();
        // Recompute et_{k+1} from the definition in f64 to check the identity.
        let h: Vec<f64> = (0..n)
            .map(|i| g[i] as f64 + compensation[i] as f64)
            .collect();
        let et_next: Vec<f64> = (0..n)
            .map(|i| et[i] * (1.0 - beta as f64) + (h[i] - d[i] as f64) * beta as f64)
            .collect();
        for i in 0..n {
            let rhs =
                g[i] as f64 + (et[i] - et_next[i]) / beta as f64 + (compensation[i] as f64 - et[i]);
            assert!(
                (d[i] as f64 - rhs).abs() < 1e-6,
                "step {t} element {i}: {} vs {rhs}",
                d[i]
            );
        }
        et = et_next;
    }
}

#[test]
fn gpu_memories_track_cpu_memories_exactly() {
    let device = common::gpu();
    let gpu = device.as_gpu().unwrap().clone();
    let n = 3001;
    let memories = [
        Memory::None,
        Memory::Residual,
        loco(0.2, 3, false),
        loco(0.5, 0, true),
    ];
    for spec in CODECS {
        for memory in memories {
            let mut cpu = Feedback::new(parse(spec).unwrap(), memory, n, &Device::Cpu).unwrap();
            let mut dev = Feedback::new(parse(spec).unwrap(), memory, n, &device).unwrap();
            for t in 0..5u32 {
                let g = gradient(n, t as u64);
                let want = cpu.encode(&g, &ctx(t)).unwrap();
                let gg = gpu.upload(bytemuck::cast_slice(&g)).unwrap();
                let got = gpu
                    .read(&dev.encode_gpu(&gpu, &gg, &ctx(t)).unwrap())
                    .unwrap();
                assert_eq!(
                    &got[..want.len()],
                    &want[..],
                    "{spec} {memory:?} step {t}: payload"
                );
                let (ec, eg) = (cpu.error().unwrap(), dev.error().unwrap());
                assert_eq!(
                    ec.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    eg.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{spec} {memory:?} step {t}: error state"
                );
            }
        }
    }
}

#[test]
fn memory_specs_parse() {
    assert_eq!("ef".parse::<Memory>().unwrap(), Memory::Residual);
    assert_eq!(
        "loco-ema:beta=0.2:reset=512:se=2097152:f32"
            .parse::<Memory>()
            .unwrap(),
        Memory::LocoEma {
            beta: 0.2,
            reset_every: 512,
            se: 2_097_152.0,
            reference: true
        }
    );
    assert!("loco-ema:beta=2".parse::<Memory>().is_err());
    assert!("momentum".parse::<Memory>().is_err());
}

#[test]
fn a_rescaled_loco_memory_keeps_its_error_on_the_new_grid() {
    let n = 3000;
    let mut fb = Feedback::new(
        parse("loco:bits=4:log2s=6:rescalable").unwrap(),
        loco(0.5, 0, false),
        n,
        &Device::Cpu,
    )
    .unwrap();
    for step in 0..3 {
        fb.encode(&gradient(n, step), &ctx(step as u32)).unwrap();
    }
    let before = fb.error().unwrap();
    assert!(
        before.iter().any(|&e| e != 0.0),
        "the memory holds an error"
    );
    // A scale 8 times larger: s_e follows, and the error is the same values (finer grid).
    fb.rescale(parse("loco:bits=4:log2s=9:rescalable").unwrap(), 3)
        .unwrap();
    assert!(matches!(fb.memory(), Memory::LocoEma { se, .. } if se == 8.0 * 4096.0));
    assert_eq!(fb.error().unwrap(), before);
    assert_eq!(
        fb.codec().spec().to_string(),
        "loco:bits=4:log2s=9:rescalable"
    );
    // Back down by 16: each error rounds to the coarser grid, half to even, within half a step.
    fb.rescale(parse("loco:bits=4:log2s=5:rescalable").unwrap(), -4)
        .unwrap();
    let step = 1.0 / 2048.0;
    for (after, was) in fb.error().unwrap().iter().zip(&before) {
        assert!((after - was).abs() <= step / 2.0, "{was} became {after}");
        assert_eq!((after / step).fract(), 0.0);
    }
}

/// A late push taken back: the residual then holds the whole compensated gradient
/// `q = g + e`, as if nothing had been sent, so the next push carries it. Exactly for a
/// sparsifier (each element is either sent or kept); within two roundings for a quantizer.
#[test]
fn a_late_push_taken_back_leaves_the_whole_gradient_in_the_memory() {
    let n = 1000;
    for spec in ["topk:0.01", "sign"] {
        let mut fb =
            Feedback::new(parse(spec).unwrap(), Memory::Residual, n, &Device::Cpu).unwrap();
        // A round that counted, so that the memory holds something before the late one.
        fb.encode(&gradient(n, 0), &ctx(0)).unwrap();
        let e_before = fb.error().unwrap();
        let g = gradient(n, 1);
        let payload = fb.encode(&g, &ctx(1)).unwrap();
        let sent = fb.codec().decode(&payload, n, &ctx(1)).unwrap();
        fb.take_back(&sent).unwrap();
        let e = fb.error().unwrap();
        for i in 0..n {
            let q = clean(g[i] + e_before[i]);
            if spec.starts_with("topk") {
                assert_eq!(e[i].to_bits(), q.to_bits(), "{spec} element {i}");
            } else {
                assert!(
                    (e[i] - q).abs() <= 2.0 * f32::EPSILON * (q.abs() + sent[i].abs()),
                    "{spec} element {i}: {} against {q}",
                    e[i]
                );
            }
        }
    }
    // Only a residual can take a push back; a wrong length is refused, not indexed past.
    let mut none =
        Feedback::new(parse("topk:0.01").unwrap(), Memory::None, n, &Device::Cpu).unwrap();
    assert!(none.take_back(&vec![0.0; n]).is_err());
    let mut ef = Feedback::new(
        parse("topk:0.01").unwrap(),
        Memory::Residual,
        n,
        &Device::Cpu,
    )
    .unwrap();
    assert!(ef.take_back(&vec![0.0; n + 1]).is_err());
}
