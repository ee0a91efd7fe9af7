//! The parameter-server system over QUIC: the same bits as in-process, and no admission
//! without the swarm's credentials.

mod common;

use std::time::Duration;

use common::*;
use murmur_engine::comm::local::local_collectives;
use murmur_engine::train::{DataParallel, OuterConfig};
use murmur_net::identity::Swarm;
use murmur_net::ps::{QuicCollective, ServerOptions};

#[test]
fn training_over_quic_gives_the_bits_of_the_same_run_in_process() {
    let (world, steps) = (3u16, 12u64);
    let plan = plan("topk:0.2", "dither:linear:s=7");
    let in_process = train_in_process(local_collectives(world as usize), &plan, steps);
    let swarm = Swarm::generate("bits").unwrap();
    let servers = start_servers(&swarm, 2, every_member());
    let over_quic = on_every_rank(
        &swarm,
        &servers,
        world,
        &plan,
        client_options(),
        |_, mut dp| {
            assert!(dp.partitions().len() > 4, "several keys over two shards");
            train(&mut dp, steps);
            bits(&dp.replica)
        },
    );
    assert_same_training(&in_process, &over_quic);
}

/// Outer rounds of local steps (compressed pseudo-gradients, Nesterov outer steps) over QUIC
/// give the bits of the same run in process: the pseudo-gradients travel as gradients do,
/// and every replica applies the same reply to the same anchor. A rank rejoining from a
/// snapshot the servers keep takes the outer loop's momentum with it.
#[test]
fn outer_rounds_over_quic_give_the_bits_of_the_same_run_in_process() {
    let (world, rounds) = (3u16, 6u64);
    let outer = OuterConfig {
        local_steps: 4,
        step_samples: BATCH / 4,
        lr: 0.7,
        momentum: 0.9,
    };
    let plan = plan("topk:0.2", "sign");
    let in_process =
        train_in_process_with(local_collectives(world as usize), &plan, rounds, |dp| {
            dp.take_local_steps(outer).unwrap()
        });
    let swarm = Swarm::generate("outer-bits").unwrap();
    let servers = start_servers(&swarm, 2, every_member());
    let over_quic = on_every_rank(
        &swarm,
        &servers,
        world,
        &plan,
        client_options(),
        |rank, mut dp| {
            dp.take_local_steps(outer).unwrap();
            train(&mut dp, 3);
            if rank == 0 {
                dp.collective.snapshot(3, dp.save_state().unwrap()).unwrap();
            }
            train(&mut dp, rounds);
            bits(&dp.replica)
        },
    );
    assert_same_training(&in_process, &over_quic);
    // Rank 0 comes back as a fresh process: it restores the snapshot of round 3 (with the
    // outer momentum) and replays rounds 3 to 5 from the servers' log.
    let c = worker(&swarm, &servers.addrs, 0, world);
    let mut dp = DataParallel::new(classifier(), c, &plan, "ef").unwrap();
    dp.take_local_steps(outer).unwrap();
    let caught = murmur_net::ps::catch_up(&mut dp).unwrap().unwrap();
    assert_eq!(
        caught.snapshot.map(|s| s.0),
        Some(3),
        "rejoined from the snapshot"
    );
    assert_eq!(dp.round(), rounds);
    assert_eq!(
        bits(&dp.replica),
        over_quic[0],
        "the rejoined rank caught up"
    );
}

#[test]
fn a_node_without_this_swarms_credentials_is_refused_at_the_handshake() {
    let swarm = Swarm::generate("ours").unwrap();
    let stranger = Swarm::generate("theirs").unwrap();
    let servers = start_servers(&swarm, 1, ServerOptions::default());
    let options = murmur_net::ps::ClientOptions {
        connect_timeout: Duration::from_secs(5),
        start_timeout: Duration::from_secs(5),
        ..client_options()
    };
    // A certificate signed by another swarm: the server refuses it. (In TLS 1.3 the client may
    // finish its half first, so the refusal can surface on the first exchange.)
    let foreign = stranger
        .credentials("intruder", murmur_net::identity::Role::Worker)
        .unwrap();
    let outcome =
        QuicCollective::connect(&servers.addrs, &foreign, 0, 1, "intruder", options.clone())
            .and_then(|mut c| {
                murmur_engine::comm::Collective::register(&mut c, &[])
                    .map_err(|e| murmur_net::NetError::Connection(e.to_string()))
            });
    let err = outcome
        .expect_err("a foreign certificate was admitted")
        .to_string();
    eprintln!("foreign client: {err}");
    assert!(err.contains("peer certificate"), "{err}");

    // A node of ours cannot be lured to a server of another swarm: it rejects the server.
    let theirs = start_servers(&stranger, 1, ServerOptions::default());
    let ours = swarm
        .credentials("member", murmur_net::identity::Role::Worker)
        .unwrap();
    let err = QuicCollective::connect(&theirs.addrs, &ours, 0, 1, "member", options.clone())
        .err()
        .expect("a foreign server was trusted")
        .to_string();
    eprintln!("foreign server: {err}");
    assert!(err.contains("peer certificate"), "{err}");

    // The server still serves members.
    let mut member =
        QuicCollective::connect(&servers.addrs, &ours, 0, 1, "member", options).unwrap();
    murmur_engine::comm::Collective::register(&mut member, &[]).unwrap();
}

/// Every in-process replica and every QUIC replica hold the same bits, and training moved
/// them.
fn assert_same_training(in_process: &[Vec<u32>], over_quic: &[Vec<u32>]) {
    assert!(in_process.iter().all(|b| *b == in_process[0]));
    assert!(
        over_quic.iter().all(|b| *b == over_quic[0]),
        "QUIC replicas differ"
    );
    assert_eq!(
        over_quic[0], in_process[0],
        "QUIC and in-process runs differ"
    );
    assert_ne!(
        in_process[0],
        bits(&classifier()),
        "training changed nothing"
    );
}
