//! What a certificate lets its holder do: its role, its validity, and the swarm's revocation
//! list, checked by servers and workers alike.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use murmur_net::identity::{Credentials, Role, Swarm};
use murmur_net::ps::{join_job, ClientOptions, JobOffer, QuicCollective, Server, ServerOptions};
use murmur_net::ticket::Ticket;
use murmur_net::transport::{client_endpoint, connect, send, server_endpoint, Link};
use murmur_net::wire::{Frame, Hello, Kind};

fn quick() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(5),
        start_timeout: Duration::from_secs(5),
        ..client_options()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A shard 0 without a job on `creds`, served by `rt` until the endpoint is dropped.
fn serving(rt: &tokio::runtime::Runtime, creds: &Credentials) -> (SocketAddr, quinn::Endpoint) {
    let server = rt.block_on(async {
        Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            creds,
            ServerOptions::default(),
        )
        .unwrap()
    });
    let serving = (server.local_addr().unwrap(), server.endpoint());
    rt.spawn(server.run());
    serving
}

/// A swarm folder that removes itself.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let dir = std::env::temp_dir().join(format!("murmur-trust-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Folder(dir)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits up to `within` for `conn` to close; the reason if it did.
async fn closed_within(conn: &quinn::Connection, within: Duration) -> Option<String> {
    tokio::time::timeout(within, conn.closed())
        .await
        .ok()
        .map(|e| e.to_string())
}

#[test]
fn a_worker_certificate_cannot_serve_and_a_server_certificate_cannot_push() {
    let swarm = Swarm::generate("roles").unwrap();
    let worker_creds = swarm.credentials("w", Role::Worker).unwrap();
    let rt = runtime();

    // A shard will not start on a worker's certificate, nor on another shard's.
    let bind = |creds: &Credentials, shard: u16| {
        let options = ServerOptions {
            shard,
            shards: 2,
            ..ServerOptions::default()
        };
        rt.block_on(async { Server::bind("127.0.0.1:0".parse().unwrap(), creds, options) })
            .err()
            .expect("a shard started on the wrong certificate")
            .to_string()
    };
    assert!(bind(&worker_creds, 0).contains("certificate issued for it"));
    let shard_1 = swarm.credentials("s1", Role::Server { shard: 1 }).unwrap();
    assert!(bind(&shard_1, 0).contains("server of shard 1"));

    // An impostor listening with a worker's certificate: a worker refuses to talk to it.
    let impostor = rt.block_on(async {
        server_endpoint(
            "127.0.0.1:0".parse().unwrap(),
            &worker_creds,
            &Link::default(),
        )
    });
    let impostor = impostor.unwrap();
    let addr = impostor.local_addr().unwrap();
    rt.spawn(async move {
        while let Some(incoming) = impostor.accept().await {
            if let Ok(conn) = incoming.await {
                // Holds the connection open, as a server that waits for a hello would.
                tokio::spawn(async move { conn.closed().await });
            }
        }
    });
    let me = swarm.credentials("me", Role::Worker).unwrap();
    let err = QuicCollective::connect(&[addr], &me, 0, 1, "me", quick())
        .err()
        .expect("a worker talked to a server without a server's certificate")
        .to_string();
    assert!(
        err.contains("certified as a worker, not as a server of shard 0"),
        "{err}"
    );

    // Real shards listed in the wrong order: shard 1's certificate does not pass for shard 0.
    let servers = start_servers(&swarm, 2, ServerOptions::default());
    let swapped = [servers.addrs[1], servers.addrs[0]];
    let err = QuicCollective::connect(&swapped, &me, 0, 1, "me", quick())
        .err()
        .expect("shard 1 passed for shard 0")
        .to_string();
    assert!(
        err.contains("server of shard 1, not as a server of shard 0"),
        "{err}"
    );

    // A server's certificate may not act as a worker: the shard hangs up before any hello.
    let as_worker = swarm.credentials("s0", Role::Server { shard: 0 }).unwrap();
    let err = join_job(servers.addrs[0], &as_worker, "s0", &quick())
        .expect_err("a server's certificate joined as a worker")
        .to_string();
    assert!(
        err.contains("certified as a server of shard 0, not as a worker"),
        "{err}"
    );

    // And the honest worker, in the right order, is served.
    QuicCollective::connect(&servers.addrs, &me, 0, 1, "me", quick()).unwrap();
}

#[test]
fn expired_certificates_are_refused_both_ways() {
    let swarm = Swarm::generate("expiry").unwrap();
    let dir = Folder::new("expiry");
    swarm.save(&dir.0).unwrap();
    let (long_ago, yesterday) = {
        let now = time::OffsetDateTime::now_utc();
        (
            now - time::Duration::days(30),
            now - time::Duration::days(1),
        )
    };
    let expired = |name: &str, role: Role| {
        let (cert, key) = swarm.issue_valid(name, role, long_ago, yesterday).unwrap();
        let ca = std::fs::read_to_string(dir.0.join("ca.pem")).unwrap();
        Credentials::from_pem(&ca, &cert, &key).unwrap()
    };
    let servers = start_servers(&swarm, 1, ServerOptions::default());
    let old_worker = expired("old-worker", Role::Worker);
    let err = join_job(servers.addrs[0], &old_worker, "old", &quick())
        .expect_err("an expired worker certificate was accepted");
    let err = err.to_string();
    assert!(err.to_lowercase().contains("expired"), "{err}");

    // An expired server: the worker refuses it in the handshake.
    let rt = runtime();
    let old_server = expired("old-server", Role::Server { shard: 0 });
    let (addr, _endpoint) = serving(&rt, &old_server);
    let me = swarm.credentials("me", Role::Worker).unwrap();
    let err = QuicCollective::connect(&[addr], &me, 0, 1, "me", quick())
        .err()
        .expect("an expired server certificate was trusted")
        .to_string();
    assert!(err.to_lowercase().contains("expired"), "{err}");
}

#[test]
fn revoked_certificates_are_hung_up_and_refused_without_a_restart() {
    let swarm = Swarm::generate("revocation").unwrap();
    let dir = Folder::new("revocation");
    swarm.save(&dir.0).unwrap();
    swarm
        .issue_to(&dir.0, "server-0", Role::Server { shard: 0 }, 1)
        .unwrap();
    for name in ["honest", "revoked"] {
        swarm.issue_to(&dir.0, name, Role::Worker, 1).unwrap();
    }
    let rt = runtime();
    let server_creds = Credentials::load(&dir.0, "server-0").unwrap();
    let (addr, _endpoint) = serving(&rt, &server_creds);

    let say_hello = |name: &'static str, rank: u16| {
        let creds = Credentials::load(&dir.0, name).unwrap();
        async move {
            let endpoint = client_endpoint(&creds, &Link::default()).unwrap();
            let conn = connect(&endpoint, addr).await?;
            let hello = Hello {
                rank,
                world: 2,
                shard: 0,
                shards: 1,
                node: name.into(),
                ticket: None,
            };
            // A send may fail on a connection the server refused: its close says why.
            let _ = send(&conn, Frame::control(Kind::Hello, rank, 0, &hello)).await;
            Ok::<_, murmur_net::NetError>((endpoint, conn))
        }
    };
    rt.block_on(async {
        let (_e1, honest) = say_hello("honest", 0).await.unwrap();
        let (_e2, revoked) = say_hello("revoked", 1).await.unwrap();
        assert_eq!(closed_within(&revoked, Duration::from_secs(1)).await, None);

        // Revoked while connected: hung up within the server's polling interval.
        assert!(swarm.revoke(&dir.0, "revoked").unwrap());
        let why = closed_within(&revoked, Duration::from_secs(10))
            .await
            .expect("the revoked worker is still connected");
        assert!(why.contains("revoked"), "{why}");
        assert_eq!(
            closed_within(&honest, Duration::from_secs(3)).await,
            None,
            "the honest worker was hung up too"
        );

        // Connecting again: refused in the handshake (TLS 1.3 lets the client finish first,
        // so the refusal may arrive as the connection's close).
        match say_hello("revoked", 1).await {
            Err(e) => assert!(e.to_string().to_lowercase().contains("revoked"), "{e}"),
            Ok((_e3, again)) => {
                let why = closed_within(&again, Duration::from_secs(5))
                    .await
                    .expect("a revoked certificate connected again");
                assert!(why.to_lowercase().contains("revoked"), "{why}");
            }
        }
        let (_e4, honest_again) = say_hello("honest", 0).await.unwrap();
        assert_eq!(
            closed_within(&honest_again, Duration::from_secs(1)).await,
            None
        );
    });
}

#[test]
fn no_certificate_takes_another_ones_rank_on_any_shard() {
    let swarm = Swarm::generate("ranks").unwrap();
    let job = JobOffer {
        world: 2,
        start_with: 2,
        description: r#"{"job":"ranks"}"#.into(),
        queue: None,
        fold_late: false,
    };
    let servers = start_servers(
        &swarm,
        2,
        ServerOptions {
            job: Some(job),
            ..ServerOptions::default()
        },
    );
    let alice = swarm.credentials("alice", Role::Worker).unwrap();
    let mallory = swarm.credentials("mallory", Role::Worker).unwrap();
    let alices = join_job(servers.addrs[0], &alice, "alice", &quick()).unwrap();
    let mallorys = join_job(servers.addrs[0], &mallory, "mallory", &quick()).unwrap();
    assert_eq!((alices.rank, mallorys.rank), (0, 1));

    let addrs = servers.addrs.clone();
    servers.runtime.block_on(async move {
        let hello_as = |creds: Credentials, shard: usize, rank: u16, ticket: Option<Ticket>| {
            let addr = addrs[shard];
            async move {
                let endpoint = client_endpoint(&creds, &Link::default()).unwrap();
                let conn = connect(&endpoint, addr).await.unwrap();
                let hello = Hello {
                    rank,
                    world: 2,
                    shard: shard as u16,
                    shards: 2,
                    node: "n".into(),
                    ticket,
                };
                send(&conn, Frame::control(Kind::Hello, rank, 0, &hello))
                    .await
                    .unwrap();
                (endpoint, conn)
            }
        };
        // Alice takes her place on both shards with her ticket.
        let mut honest = Vec::new();
        for shard in 0..2 {
            honest.push(hello_as(alice.clone(), shard, 0, Some(alices.ticket.clone())).await);
        }
        // Mallory claims rank 0: without a ticket, with her own, with Alice's (copied off
        // the wire), on shard 1; and on shard 0, which remembers whom it gave rank 0.
        let attempts = [
            (1, None, "without shard 0's ticket"),
            (1, Some(mallorys.ticket.clone()), "not rank 0"),
            (1, Some(alices.ticket.clone()), "another certificate"),
            (0, None, "holds rank 1, not 0"),
        ];
        for (shard, ticket, why) in attempts {
            let (_e, conn) = hello_as(mallory.clone(), shard, 0, ticket).await;
            let closed = closed_within(&conn, Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("shard {shard} let mallory be rank 0 ({why})"));
            assert!(closed.contains(why), "{closed} (expected: {why})");
        }
        for (shard, (_e, conn)) in honest.iter().enumerate() {
            assert_eq!(
                closed_within(conn, Duration::from_millis(500)).await,
                None,
                "alice lost her place on shard {shard}"
            );
        }
        // Mallory's own rank, with her own ticket, is hers.
        let (_e, own) = hello_as(mallory.clone(), 1, 1, Some(mallorys.ticket.clone())).await;
        assert_eq!(closed_within(&own, Duration::from_secs(1)).await, None);
    });
}

/// A peer with a valid certificate that starts a hello, never finishes it, and streams junk
/// on every other stream it may open: the shard, waiting on the hello, lets in at most its
/// admission window, whatever the peer sends.
#[test]
fn junk_before_a_hello_costs_the_server_at_most_its_admission_window() {
    use murmur_net::transport::ADMISSION_WINDOW;
    let swarm = Swarm::generate("junk").unwrap();
    let servers = start_servers(&swarm, 1, ServerOptions::default());
    let addr = servers.addrs[0];
    let junk = swarm.credentials("junk", Role::Worker).unwrap();
    let sent = servers.runtime.block_on(async move {
        let endpoint = client_endpoint(&junk, &Link::default()).unwrap();
        let conn = connect(&endpoint, addr).await.unwrap();
        // Three bytes of a header on the first stream, which stays open ...
        let mut first = conn.open_uni().await.unwrap();
        first.write_all(&[0, 1, 2]).await.unwrap();
        // ... and 8 MiB on each of 63 more, as fast as the server takes them.
        let writers: Vec<_> = (0..63)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    let Ok(mut stream) = conn.open_uni().await else {
                        return;
                    };
                    let block = vec![0xa5u8; 1 << 20];
                    for _ in 0..8 {
                        if stream.write_all(&block).await.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let sent = conn.stats().udp_tx.bytes;
        for w in writers {
            w.abort();
        }
        sent
    });
    // All the peer sent (handshake and packet headers included) bounds what the server holds.
    // Without the admission window it sent tens of megabytes here (a window of two link
    // bandwidth-delay products, read into frame buffers as fast as it came).
    eprintln!("the junk peer got {sent} bytes into the server");
    assert!(
        sent < 2 * u64::from(ADMISSION_WINDOW),
        "the junk peer got {sent} bytes into the server"
    );
}
