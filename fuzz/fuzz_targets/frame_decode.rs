//! Frames and control messages arrive from the network: decoding must never panic, a frame
//! that decodes must re-encode to the same bytes (one canonical form), and whatever a
//! `register` message names (key specs with codec and memory strings) must either be refused
//! or build the server's per-key state within the limits, which then decodes bytes safely.
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_engine::comm::shard::KeyState;
use murmur_net::wire::{
    split_push, Catchup, CatchupRequest, Closed, Frame, Header, Hello, Join, Kind, Limits,
    Participants, Register, Registered, ReplicaDigest, Welcome, HEADER,
};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_payload: 1 << 16,
        max_keys: 16,
        max_numel: 4096,
        max_total_numel: 16_384,
    };
    if let Some(head) = data.get(..HEADER) {
        let _ = Header::decode(head.try_into().expect("32 bytes"), &limits);
    }
    let Ok(frame) = Frame::decode(data, &limits) else {
        return;
    };
    assert_eq!(
        frame.encode(),
        data,
        "a decoded frame re-encodes to its bytes"
    );
    match frame.kind {
        Kind::Hello => {
            let _ = frame.message::<Hello>();
        }
        Kind::Register => {
            if let Ok(register) = frame.message::<Register>() {
                if register.check(&limits).is_ok() {
                    for spec in register.keys {
                        // A codec the server builds must also refuse a payload cleanly.
                        if let Ok(state) = KeyState::new(spec) {
                            if let (Ok(d), Ok((samples, codes))) =
                                (state.push_decoder(0, 0), split_push(&frame.payload))
                            {
                                let _ = d.decode(samples, codes);
                            }
                        }
                    }
                }
            }
        }
        Kind::Registered => {
            let _ = frame.message::<Registered>();
        }
        Kind::Catchup => {
            let _ = frame.message::<Catchup>();
        }
        Kind::Join => {
            let _ = frame.message::<Join>();
        }
        Kind::Welcome => {
            let _ = frame.message::<Welcome>();
        }
        Kind::CatchupRequest => {
            let _ = frame.message::<CatchupRequest>();
        }
        Kind::Digest => {
            let _ = frame.message::<ReplicaDigest>();
        }
        Kind::Closed => {
            let _ = frame.message::<Closed>();
        }
        Kind::Participants => {
            let _ = frame.message::<Participants>();
        }
        _ => {}
    }
});
