//! Frames and control messages arrive from the network: decoding must never panic, a frame
//! that decodes must re-encode to the same bytes (one canonical form), and whatever a
//! `register` message names (key specs with codec and memory strings) must either be refused
//! or build the server's per-key state within the limits, which then decodes bytes safely.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::shard::KeyState;
use murmur_net::identity::{verify_job, Role, Swarm};
use murmur_net::nat::{Introduction, Meet};
use murmur_net::word::check_participants;
use rustls::pki_types::CertificateDer;
use murmur_net::wire::{
    split_push, Catchup, CatchupRequest, Closed, Frame, Header, Hello, Join, Kind, Limits,
    Participants, Register, Registered, ReplicaDigest, Welcome, HEADER,
};

type Verifier = Arc<dyn rustls::server::danger::ClientCertVerifier>;

/// What a shard checks signed messages against, made once: the swarm's verifier and a
/// worker's certificate (a hello's rank ticket), shard 0's certificate (its signed word on a
/// round), and the swarm's own certificate (a job's signature).
struct Checks {
    verifier: Verifier,
    holder: CertificateDer<'static>,
    shard_0: CertificateDer<'static>,
    ca: CertificateDer<'static>,
}

fn checks() -> &'static Checks {
    static CHECKS: OnceLock<Checks> = OnceLock::new();
    CHECKS.get_or_init(|| {
        let swarm = Swarm::generate("fuzz").expect("a swarm");
        let shard = swarm
            .credentials("s1", Role::Server { shard: 1 })
            .expect("credentials");
        let shard_0 = swarm
            .credentials("s0", Role::Server { shard: 0 })
            .expect("credentials");
        let worker = swarm.credentials("w", Role::Worker).expect("credentials");
        Checks {
            verifier: murmur_net::tls::client_verifier(&shard).expect("a verifier"),
            holder: worker.chain[0].clone(),
            shard_0: shard_0.chain[0].clone(),
            ca: shard.ca.clone(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_payload: 1 << 16,
        max_keys: 16,
        max_numel: 4096,
        max_total_numel: 16_384,
        max_buffered: 1 << 17,
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
                let c = checks();
                let _ = ticket.check(c.verifier.as_ref(), &c.holder, &[7; 32], rank, world);
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
            // The job's signature is checked against the swarm's certificate.
            if let Ok(welcome) = frame.message::<Welcome>() {
                let _ = verify_job(&checks().ca, &welcome.job, &welcome.signature);
            }
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
            // Shard 0's word, relayed by a worker: its signature is checked.
            if let Ok(word) = frame.message::<Participants>() {
                let _ = check_participants(&checks().shard_0, &[7; 32], frame.step, &word);
            }
        }
        Kind::Meet => {
            // The rendezvous files a meet only after its check.
            if let Ok(meet) = frame.message::<Meet>() {
                let _ = meet.check();
            }
        }
        Kind::Introduce => {
            let _ = frame.message::<Introduction>();
        }
        _ => {}
    }
});
