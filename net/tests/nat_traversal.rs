//! Stages behind NATs (network namespaces with nftables NAT and a home router's firewall)
//! reach each other through a rendezvous: directly where both NATs keep one public port per
//! socket, through the rendezvous's relay where one of them is symmetric. The lab itself is
//! checked first, so that its NATs are what the other tests take them for.
//! Needs root, iproute2 and nftables: a skip elsewhere, a failure under CI.
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use murmur_engine::comm::stage::{Direction, StageLink, StageMessage};
use murmur_net::identity::{Role, Swarm};
use murmur_net::nat::lab::{Host, Mapping, NatLab, HOST, PUBLIC};
use murmur_net::nat::rendezvous::Rendezvous;
use murmur_net::nat::Route;
use murmur_net::stage::{meet_neighbours, StageOptions};
use murmur_net::transport::Link;

fn can_nat() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tool = |t: &str| {
        std::process::Command::new(t)
            .arg("--version")
            .output()
            .is_ok()
    };
    let (ip, nft) = (tool("ip"), tool("nft"));
    if root && ip && nft {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "NAT tests need root, iproute2 and nftables under CI (root {root}, ip {ip}, nft {nft})"
    );
    eprintln!("skipped: NAT tests need root, iproute2 and nftables");
    false
}

/// The public ports a host's one socket appears from, towards two destinations; and whether
/// a packet sent to that socket's public address unasked gets through.
fn mapping_seen(lab: &NatLab, host: Host) -> (u16, u16, bool) {
    let listeners = lab
        .in_public(|| {
            [
                UdpSocket::bind((PUBLIC, 0)).unwrap(),
                UdpSocket::bind(("10.80.2.1", 0)).unwrap(),
                UdpSocket::bind((PUBLIC, 0)).unwrap(),
            ]
        })
        .unwrap();
    let targets: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let socket = lab
        .in_host(host, || UdpSocket::bind((HOST, 0)).unwrap())
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut seen = Vec::new();
    for (listener, target) in listeners.iter().zip(&targets).take(2) {
        socket.send_to(b"hello", target).unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let (_, from) = listener.recv_from(&mut [0u8; 16]).unwrap();
        seen.push(from);
    }
    // A stranger (the third socket) writes to the mapping the first destination opened.
    listeners[2].send_to(b"unasked", seen[0]).unwrap();
    let through = socket.recv_from(&mut [0u8; 16]).is_ok();
    (seen[0].port(), seen[1].port(), through)
}

#[test]
fn the_lab_nats_map_as_labelled_and_drop_what_comes_unasked() {
    if !can_nat() {
        return;
    }
    let lab = NatLab::create(Mapping::EndpointIndependent, Mapping::Symmetric).unwrap();
    let (first, second, through) = mapping_seen(&lab, Host::A);
    assert_eq!(
        first, second,
        "NAT A should keep one public port per socket"
    );
    assert!(!through, "NAT A let an unasked packet in");
    let (first, second, through) = mapping_seen(&lab, Host::B);
    assert_ne!(first, second, "NAT B should give each destination a port");
    assert!(!through, "NAT B let an unasked packet in");
}

/// Runs a rendezvous in the lab's public network, stage 0 behind NAT A and stage 1 behind NAT
/// B; each stage sends the other a message. Returns the routes each end saw and the
/// datagrams the relay forwarded.
fn two_stages_meet(a: Mapping, b: Mapping) -> ([Route; 2], u64) {
    let lab = NatLab::create(a, b).unwrap();
    let swarm = Swarm::generate("nat").unwrap();
    let rendezvous_creds = swarm.credentials("rendezvous", Role::Rendezvous).unwrap();
    let runtime = lab
        .in_public(|| {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let rendezvous = runtime
                .block_on(async {
                    Rendezvous::start(
                        SocketAddr::from((PUBLIC, 0)),
                        SocketAddr::from((PUBLIC, 0)),
                        &rendezvous_creds,
                        &Link::default(),
                    )
                })
                .unwrap();
            (runtime, Arc::new(rendezvous))
        })
        .unwrap();
    let (runtime, rendezvous) = runtime;
    let at = rendezvous.local_addr().unwrap();
    runtime.spawn(rendezvous.clone().run());
    let options = StageOptions {
        punch_timeout: Duration::from_secs(3),
        connect_timeout: Duration::from_secs(30),
        message_timeout: Duration::from_secs(10),
        ..StageOptions::default()
    };
    let lab = Arc::new(lab);
    let stages: Vec<_> = [Host::A, Host::B]
        .into_iter()
        .enumerate()
        .map(|(e, host)| {
            let creds = swarm
                .credentials(&format!("stage-{e}"), Role::Stage)
                .unwrap();
            let lab = lab.clone();
            thread::spawn(move || {
                let neighbours = lab
                    .in_host(host, || {
                        meet_neighbours(
                            at,
                            "nat-test",
                            SocketAddr::from(([0, 0, 0, 0], 0)),
                            &creds,
                            (e, 2),
                            options,
                        )
                    })
                    .unwrap()
                    .unwrap();
                let (mut link, route) = neighbours.prev.or(neighbours.next).unwrap();
                let direction = [Direction::Forward, Direction::Backward][e];
                link.send(StageMessage {
                    step: 7,
                    direction,
                    payload: vec![e as u8; 100_000],
                })
                .unwrap();
                let got = link.recv().unwrap();
                assert_eq!((got.step, got.payload), (7, vec![1 - e as u8; 100_000]));
                route
            })
        })
        .collect();
    let routes: Vec<Route> = stages.into_iter().map(|t| t.join().unwrap()).collect();
    let relayed = rendezvous
        .relay()
        .counts
        .datagrams
        .load(std::sync::atomic::Ordering::Relaxed);
    rendezvous.close();
    drop(runtime);
    ([routes[0], routes[1]], relayed)
}

#[test]
fn stages_behind_two_endpoint_independent_nats_link_directly() {
    if !can_nat() {
        return;
    }
    let (routes, relayed) =
        two_stages_meet(Mapping::EndpointIndependent, Mapping::EndpointIndependent);
    assert_eq!(routes, [Route::Direct, Route::Direct]);
    assert_eq!(relayed, 0, "a direct link went through the relay");
}

#[test]
fn stages_behind_a_symmetric_nat_link_through_the_relay() {
    if !can_nat() {
        return;
    }
    let (routes, relayed) = two_stages_meet(Mapping::EndpointIndependent, Mapping::Symmetric);
    assert_eq!(routes, [Route::Relayed, Route::Relayed]);
    // 200 kB each way, in packets of at most about 1.4 kB.
    assert!(
        relayed > 140,
        "the relay forwarded only {relayed} datagrams"
    );
}
