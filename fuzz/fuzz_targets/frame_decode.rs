//! Frames and control messages arrive from the network: decoding must never panic, a frame
//! that decodes must re-encode to the same bytes (one canonical form), and whatever a
//! `register` message names (key specs with codec and memory strings) must either be refused
//! or build the server's per-key state within the limits, which then decodes bytes safely.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::shard::KeyState;
use murmur_net::identity::{Role, Swarm};
use rustls::pki_types::CertificateDer;
use murmur_net::wire::{
    split_push, Catchup, CatchupRequest, Closed, Frame, Header, Hello, Join, Kind, Limits,
    Participants, Register, Registered, ReplicaDigest, Welcome, HEADER,
};

type Verifier = Arc<dyn rustls::server::danger::ClientCertVerifier>;

/// A swarm's verifier and a worker's certificate, made once: what a shard checks a hello's
/// rank ticket against.
fn ticket_check() -> &'static (Verifier, CertificateDer<'static>) {
    static CHECK: OnceLock<(Verifier, CertificateDer<'static>)> = OnceLock::new();
    CHECK.get_or_init(|| {
        let swarm = Swarm::generate("fuzz").expect("a swarm");
        let shard = swarm
            .credentials("s1", Role::Server { shard: 1 })
            .expect("credentials");
        let worker = swarm.credentials("w", Role::Worker).expect("credentials");
        (
            murmur_net::tls::client_verifier(&shard).expect("a verifier"),
            worker.chain[0].clone(),
        )
    })
}

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
            // A ticket is untrusted bytes too: its issuer certificate is parsed and verified,
            // its signature checked.
            if let Ok(Hello {
                ticket: Some(ticket),
                rank,
                world,
                ..
            }) = frame.message::<Hello>()
            {
                let (verifier, holder) = ticket_check();
                let _ = ticket.check(verifier.as_ref(), holder, &[7; 32], rank, world);
            }
        }
        Kind::Register => {
            if let Ok(register) = frame.message::<Register>() {
                if register.check(&limits).is_ok() {
                    for spec in register.keys {
                        // A codec the server builds must also refuse a payload cleanly.
                        if let Ok(state) = KeyState::new(spec, Aggregate::Mean) {
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
