//! A durable shard never replies past what it saved: one whose state can no longer be
//! written stops before replying (its run ends with the reason), and started again from its
//! folder it resumes at the round it could not save.

mod common;

use std::time::Duration;

use common::*;
use murmur_engine::comm::{Collective, Key, KeySpec};
use murmur_engine::compress::parse;
use murmur_net::identity::Swarm;
use murmur_net::ps::{Server, ServerOptions};

const KEY: Key = 0x20001;

fn keys() -> Vec<KeySpec> {
    vec![f32_key(KEY)]
}

fn push(value: f32) -> Vec<(Key, Vec<u8>)> {
    vec![(
        KEY,
        parse("f32")
            .unwrap()
            .encode(&[value; 4], &Default::default()),
    )]
}

#[test]
fn a_shard_that_cannot_save_stops_before_replying_and_resumes_there() {
    let swarm = Swarm::generate("unsaved").unwrap();
    let dir = std::env::temp_dir().join(format!("murmur-unsaved-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let creds = swarm
        .credentials("server-0", murmur_net::identity::Role::Server { shard: 0 })
        .unwrap();
    let options = ServerOptions {
        state_dir: Some(dir.clone()),
        ..ServerOptions::default()
    };
    let bind = |addr: std::net::SocketAddr| {
        let (creds, options) = (&creds, options.clone());
        runtime.block_on(async move { Server::bind(addr, creds, options).unwrap() })
    };
    let server = bind("127.0.0.1:0".parse().unwrap());
    let addr = server.local_addr().unwrap();
    let serving = runtime.spawn(server.run());
    let mut worker_0 = worker(&swarm, &[addr], 0, 1);
    worker_0.register(&keys()).unwrap();
    worker_0.push_pull(0, 1, push(1.0)).unwrap();
    // The disk goes bad: the state file can no longer be replaced.
    let state = dir.join("state");
    let good = std::fs::read(&state).unwrap();
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir_all(state.join("in-the-way")).unwrap();
    let lost = worker_0.push_pull(1, 1, push(2.0));
    assert!(lost.is_err(), "a reply to a round the shard did not save");
    let ended = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), serving).await })
        .expect("the shard stopped")
        .unwrap();
    let why = ended
        .expect_err("the shard's run ends with the reason")
        .to_string();
    assert!(why.contains("could not be saved"), "{why}");
    drop(worker_0);

    // The disk is mended; the shard starts again and resumes at round 1, the unsaved one.
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, good).unwrap();
    // (On another port: the stopped shard's tasks may still hold its socket a moment.)
    let server = bind("127.0.0.1:0".parse().unwrap());
    let addr = server.local_addr().unwrap();
    runtime.spawn(server.run());
    let mut worker_0 = worker(&swarm, &[addr], 0, 1);
    worker_0.register(&keys()).unwrap();
    assert!(worker_0.underway());
    let plan = worker_0.catch_up(1).unwrap();
    assert_eq!((plan.from, plan.to), (1, 1), "{plan:?}");
    let reply = worker_0.push_pull(1, 1, push(2.0)).unwrap();
    let values = parse("f32")
        .unwrap()
        .decode(&reply[0].1, 4, &Default::default())
        .unwrap();
    assert_eq!(values, [2.0; 4]);
    drop(worker_0);
    std::fs::remove_dir_all(&dir).unwrap();
}
