//! IDX dataset files (raw or gzipped) are untrusted input: decoding must never panic, and a
//! decoded array must be consistent with its header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_engine::data::decode_idx_file_bytes;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = decode_idx_file_bytes(data) {
        assert_eq!(a.dims.iter().product::<usize>(), a.data.len());
    }
});
