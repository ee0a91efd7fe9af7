//! Codec payloads arrive from the network: decoding any bytes as any codec must return an
//! error or finite values, never panic, never touch the accumulator on error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_engine::compress::{parse, CodecContext, DecodeMode};

const SPECS: &[&str] = &[
    "f32",
    "f16",
    "bf16",
    "sign",
    "sign:rounds=2",
    "topk:0.1",
    "topk:k=3:f16",
    "randk:0.25",
    "randk:0.25:explicit",
    "dither:linear:s=15:norm=max",
    "dither:natural:s=3:norm=l2",
    "natural",
    "qsgd:bits=6",
    "qsgd:bits=3:stochastic",
    "loco:bits=4:log2s=19",
    "loco:bits=8:log2s=10",
    "loco:bits=4:log2s=7:rescalable",
    "blockq:bits=4:group=8",
    "hybrid:bits=6:topk=0.3",
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let codec = parse(SPECS[data[0] as usize % SPECS.len()]).expect("valid spec");
    let n = u16::from_le_bytes([data[1], data[2]]) as usize % 4096;
    let payload = &data[3..];
    let ctx = CodecContext {
        seed: 1,
        step: 2,
        key: 3,
        ..CodecContext::default()
    };
    let mut acc = vec![0.25f32; n];
    match codec.decode_into(payload, &mut acc, &ctx, DecodeMode::Add) {
        Ok(()) => assert!(acc.iter().all(|v| v.is_finite())),
        Err(_) => assert!(acc.iter().all(|&v| v == 0.25)),
    }
    // A valid payload re-encodes to a valid payload of the same length.
    if let Ok(values) = codec.decode(payload, n, &ctx) {
        assert_eq!(codec.encode(&values, &ctx).len(), payload.len());
    }
});
