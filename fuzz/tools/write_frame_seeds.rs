//! Writes `seeds/frame_decode/`: one well-formed frame of every kind, encoded by the wire
//! module as it is now, so that the seeds carry the current protocol version and message
//! layouts (the fuzzer starts from frames that decode, not from ones refused at the header).
//! Run after any change to `murmur_net::wire`: `cargo +nightly run --bin write_frame_seeds`
//! in `fuzz/`.

use murmur_engine::comm::KeySpec;
use murmur_net::identity::{Role, Swarm};
use murmur_net::nat::{Introduction, Meet, Side};
use murmur_net::ticket::TicketSigner;
use murmur_net::wire::{
    Assignment, Catchup, CatchupRequest, Closed, Frame, Hello, Join, Kind, Participants, Register,
    Registered, ReplicaDigest, ReplicaVerdict, Share, Span, Welcome,
};

fn main() -> std::io::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/frame_decode");
    std::fs::create_dir_all(&dir)?;
    let key = |key: murmur_engine::comm::Key, push: &str| KeySpec {
        key,
        numel: 8,
        push: push.into(),
        pull: "f16".into(),
        server_memory: "ef".into(),
        seed: 7,
        sync_every: 0,
        owner: String::new(),
    };
    let floats: Vec<u8> = (0..8)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    // Two members' shares of a round, one of them given back before.
    let assignment = Assignment {
        epoch: 1,
        round: 3,
        shares: vec![
            Share {
                rank: 0,
                spans: vec![
                    Span { start: 96, len: 16 },
                    Span {
                        start: 320,
                        len: 16,
                    },
                ],
            },
            Share {
                rank: 3,
                spans: vec![Span {
                    start: 336,
                    len: 32,
                }],
            },
        ],
    };
    // A push stands for its samples (u32) ahead of the codec payload.
    let push = [&32u32.to_le_bytes()[..], &floats].concat();
    // A real ticket, signed by a shard 0 of a swarm made for the seeds.
    let swarm = Swarm::generate("seeds").expect("a swarm");
    let shard_0 = swarm
        .credentials("server-0", Role::Server { shard: 0 })
        .expect("credentials");
    let worker = swarm
        .credentials("worker-1", Role::Worker)
        .expect("credentials");
    let signer = TicketSigner::new(&shard_0).expect("a signer");
    let ticket = signer
        .sign(1, 4, &[7; 32], &worker.chain[0])
        .expect("a ticket");
    // Shard 0's signed word on round 12.
    let mut word = Participants {
        ranks: vec![0, 1, 3],
        samples: vec![32, 32, 64],
        snapshot: Some(10),
        signature: Vec::new(),
    };
    word.signature = signer
        .sign_participants(&[7; 32], 12, &word)
        .expect("a signed word");
    let seeds = [
        (
            "hello",
            Frame::control(
                Kind::Hello,
                1,
                0,
                &Hello {
                    rank: 1,
                    world: 4,
                    shard: 0,
                    shards: 2,
                    node: "worker-1".into(),
                    ticket: Some(ticket.clone()),
                },
            ),
        ),
        (
            "register",
            Frame::control(
                Kind::Register,
                1,
                0,
                &Register {
                    keys: vec![key(1, "f32"), key(2, "topk:0.25")],
                    replica_digests: true,
                },
            ),
        ),
        (
            "registered",
            Frame::control(
                Kind::Registered,
                0,
                0,
                &Registered {
                    open_step: 12,
                    underway: true,
                    assignment: Some(assignment.clone()),
                },
            ),
        ),
        ("push_f32", Frame::new(Kind::Push, 1, 1, 12, 8, push)),
        ("reply", Frame::new(Kind::Reply, 0, 1, 12, 8, floats)),
        (
            "snapshot",
            Frame::new(Kind::Snapshot, 0, 0, 10, 0, b"snapshot".to_vec()),
        ),
        (
            "catchup_request",
            Frame::control(Kind::CatchupRequest, 1, 0, &CatchupRequest {}),
        ),
        (
            "catchup",
            Frame::control(
                Kind::Catchup,
                0,
                0,
                &Catchup {
                    snapshot_step: Some(10),
                    first_step: 10,
                    open_step: 12,
                },
            ),
        ),
        (
            "join",
            Frame::control(
                Kind::Join,
                0,
                0,
                &Join {
                    node: "worker-1".into(),
                },
            ),
        ),
        (
            "welcome",
            Frame::control(
                Kind::Welcome,
                0,
                0,
                &Welcome {
                    rank: 1,
                    world: 4,
                    job: r#"{"model":"mlp"}"#.into(),
                    ticket: ticket.clone(),
                    signature: swarm.sign_job(r#"{"model":"mlp"}"#).unwrap(),
                },
            ),
        ),
        (
            "digest",
            Frame::control(Kind::Digest, 1, 12, &ReplicaDigest { digest: 0x1234 }),
        ),
        (
            "closed",
            Frame::control(
                Kind::Closed,
                0,
                12,
                &Closed {
                    participants: vec![0, 1, 3],
                    replicas: Some(ReplicaVerdict {
                        majority: Some(0x1234),
                        disagreed: true,
                    }),
                    next: Some(assignment),
                    relay: Some(word.clone()),
                },
            ),
        ),
        (
            "participants",
            Frame::control(
                Kind::Participants,
                0,
                12,
                &word,
            ),
        ),
        (
            "meet",
            Frame::control(
                Kind::Meet,
                0,
                0,
                &Meet {
                    session: "run-1".into(),
                    cut: 2,
                    side: Side::Dial,
                    local: Some("192.168.1.2:40000".parse().unwrap()),
                },
            ),
        ),
        (
            "introduce",
            Frame::control(
                Kind::Introduce,
                0,
                0,
                &Introduction {
                    peer: "203.0.113.5:4000".parse().unwrap(),
                    peer_local: None,
                    observed: "[2001:db8::1]:4100".parse().unwrap(),
                    relay_port: Some(7501),
                    token: [9; 16],
                },
            ),
        ),
    ];
    for (name, frame) in seeds {
        std::fs::write(dir.join(name), frame.encode())?;
    }
    println!("wrote the frame seeds to {}", dir.display());
    Ok(())
}
