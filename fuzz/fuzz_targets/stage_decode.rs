//! A pipeline stage's messages arrive from its neighbour: decoding any bytes into a cut's
//! buffer, under any variant's policy and any row codec, must return an error or finite
//! values, never panic, and leave the buffer as it was on error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_engine::pipeline::mirror::{Mirror, OnFresh, Policy};
use murmur_engine::pipeline::sampler::Draw;

const CODECS: &[&str] = &[
    "f32",
    "topk:0.25",
    "qsgd:bits=4",
    "natural",
    "qsgd:bits=8+natural",
    "hybrid:bits=6:topk=0.3",
];

const POLICIES: &[Policy] = &[
    Policy::Uncompressed,
    Policy::Direct,
    Policy::Carried(OnFresh::Compress),
    Policy::Carried(OnFresh::Reset),
    Policy::Carried(OnFresh::Raw),
    Policy::PerSample,
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let codec = CODECS[data[0] as usize % CODECS.len()]
        .parse()
        .expect("valid codec");
    let policy = POLICIES[data[1] as usize % POLICIES.len()];
    let rows = 1 + data[2] as usize % 4;
    let cols = 1 + data[3] as usize % 40;
    let mut mirror = Mirror::new(policy, codec, rows, cols, 7, 1);
    let draw = Draw {
        step: 3,
        ids: (0..rows).collect(),
        fresh: (0..rows).map(|r| data[3] >> r & 1 == 1).collect(),
    };
    let before = mirror.state_bits();
    match mirror.receive(&data[4..], &draw, true) {
        Ok(values) => {
            assert_eq!(values.len(), rows * cols);
            assert!(values.iter().all(|v| v.is_finite()));
        }
        Err(_) => assert_eq!(mirror.state_bits(), before),
    }
});
