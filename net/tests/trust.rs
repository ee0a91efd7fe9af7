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

/// A job of `world` workers, `start_with` of them to start, signed by `swarm`.
fn signed_job(swarm: &Swarm, description: &str, world: u16, start_with: u16) -> JobOffer {
    JobOffer {
        world,
        start_with,
        description: description.into(),
        signature: swarm.sign_job(description).unwrap(),
        queue: None,
        fold_late: false,
    }
}

/// Connects to the shard at `addr` with `creds` and says `hello` there, as a worker would
/// (or an impostor), without waiting for an answer. A send may fail on a connection the shard
/// refused: its close says why.
async fn hello_to_shard(
    creds: &Credentials,
    addr: SocketAddr,
    hello: Hello,
) -> murmur_net::Result<(quinn::Endpoint, quinn::Connection)> {
    let endpoint = client_endpoint(creds, &Link::default())?;
    let conn = connect(&endpoint, addr).await?;
    let _ = send(&conn, Frame::control(Kind::Hello, hello.rank, 0, &hello)).await;
    Ok((endpoint, conn))
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
            let hello = Hello {
                rank,
                world: 2,
                shard: 0,
                shards: 1,
                node: name.into(),
                ticket: None,
            };
            hello_to_shard(&creds, addr, hello).await
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
    let job = signed_job(&swarm, r#"{"job":"ranks"}"#, 2, 2);
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
                let hello = Hello {
                    rank,
                    world: 2,
                    shard: shard as u16,
                    shards: 2,
                    node: "n".into(),
                    ticket,
                };
                hello_to_shard(&creds, addr, hello).await.unwrap()
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

/// The keys come from the job, not from whoever registers first: Mallory, first to reach a
/// fresh shard, registers a key of 2^28 elements and is refused before anything is built;
/// the honest workers then register the job's keys and play a round.
#[test]
fn the_job_fixes_the_keys_whatever_registers_first() {
    use murmur_engine::comm::Collective;
    use murmur_net::ps::job_checks::LayoutCheck;

    let swarm = Swarm::generate("layout").unwrap();
    let job = signed_job(&swarm, r#"{"job":"layout"}"#, 3, 2);
    let keys = vec![f32_key(1)];
    let expected = keys.clone();
    let servers = start_servers(
        &swarm,
        1,
        ServerOptions {
            job: Some(job),
            layout: Some(LayoutCheck::new(move |got| {
                (got == expected.as_slice())
                    .then_some(())
                    .ok_or_else(|| "not the job's key".to_string())
            })),
            ..every_member()
        },
    );
    let member = |name: &str| {
        let creds = swarm.credentials(name, Role::Worker).unwrap();
        let joined = join_job(servers.addrs[0], &creds, name, &quick()).unwrap();
        QuicCollective::connect(
            &servers.addrs,
            &creds,
            joined.rank,
            joined.world,
            name,
            ClientOptions {
                ticket: Some(joined.ticket),
                ..quick()
            },
        )
        .unwrap()
    };
    let mut mallory = member("mallory");
    let mut huge = f32_key(1);
    huge.numel = 1 << 28;
    let refused = mallory.register(&[huge]).unwrap_err().to_string();
    assert!(refused.contains("keys other than the job's"), "{refused}");

    let honest: Vec<_> = ["alice", "bob"].into_iter().map(member).collect();
    let replies = std::thread::scope(|s| {
        let handles: Vec<_> = honest
            .into_iter()
            .map(|mut worker| {
                let keys = keys.clone();
                s.spawn(move || {
                    worker.register(&keys).unwrap();
                    worker.push(0, 1, 1, f32_payload(&[1.0; 4])).unwrap();
                    worker.pull(0, &[1]).unwrap()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(replies[0], replies[1]);
    assert_eq!(replies[0][0].1, f32_payload(&[1.0; 4]));
}

/// Shard 0 keeps a snapshot only if its parameters are the replicas': Mallory's forged
/// snapshot of round 0 costs her the connection and is never kept, Alice's is.
#[test]
fn a_snapshot_other_than_the_replicas_model_is_refused() {
    use murmur_engine::comm::Collective;
    use murmur_net::ps::job_checks::SnapshotDigest;

    let swarm = Swarm::generate("snapshots").unwrap();
    let (kept_tx, kept_rx) = std::sync::mpsc::channel();
    // A stand-in for the node library's check: the "parameters" are the snapshot's first
    // eight bytes, and shorter bytes are no snapshot of the model.
    let servers = start_servers(
        &swarm,
        2,
        ServerOptions {
            snapshot_digest: Some(SnapshotDigest::new(|bytes| {
                let head: [u8; 8] = bytes
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or("too short to be the model")?;
                Ok(u64::from_le_bytes(head))
            })),
            snapshots: Some(kept_tx),
            ..every_member()
        },
    );
    let replica: u64 = 0x5eed;
    let options = ClientOptions {
        replica_digests: true,
        ..quick()
    };
    let workers: Vec<QuicCollective> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let options = options.clone();
                let addrs = servers.addrs.clone();
                let swarm = &swarm;
                s.spawn(move || {
                    let mut w = worker_with(swarm, &addrs, rank, 2, options);
                    w.register(&[f32_key(1), f32_key(2)]).unwrap();
                    w.send_digest(0, replica).unwrap();
                    for key in [1, 2] {
                        w.push(0, key, 1, f32_payload(&[1.0; 4])).unwrap();
                    }
                    w.pull(0, &[1, 2]).unwrap();
                    w
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let [mut alice, mut mallory]: [QuicCollective; 2] = workers.try_into().ok().unwrap();
    mallory
        .snapshot(0, 0xbad_u64.to_le_bytes().to_vec())
        .unwrap();
    mallory.send_digest(1, replica).unwrap();
    mallory.push(1, 1, 1, f32_payload(&[1.0; 4])).unwrap();
    let refused = mallory.pull(1, &[1]).unwrap_err().to_string();
    assert!(refused.contains("not the replicas'"), "{refused}");
    assert!(kept_rx.recv_timeout(Duration::from_millis(300)).is_err());

    alice.snapshot(0, replica.to_le_bytes().to_vec()).unwrap();
    let (step, kept) = kept_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((step, &kept[..]), (0, &replica.to_le_bytes()[..]));
}

/// A job is served and trained only as the swarm's authority signed it: a shard refuses to
/// start on a job whose signature is another's, and a worker refuses a job that a rogue
/// shard 0 (a stolen server certificate) hands out with the honest job's signature.
#[test]
fn a_job_is_served_and_trained_only_as_the_swarm_signed_it() {
    use murmur_net::ticket::TicketSigner;
    use murmur_net::transport::Incoming;
    use murmur_net::wire::{Limits, Welcome};

    let swarm = Swarm::generate("signed").unwrap();
    let honest = r#"{"lr":0.002}"#;
    let rogue = r#"{"lr":1000.0}"#;
    let signature = swarm.sign_job(honest).unwrap();
    let shard_0 = swarm.credentials("s0", Role::Server { shard: 0 }).unwrap();
    let rt = runtime();
    let offer = |description: &str| JobOffer {
        world: 1,
        start_with: 1,
        description: description.into(),
        signature: signature.clone(),
        queue: None,
        fold_late: false,
    };
    let bind = |job: JobOffer| {
        rt.block_on(async {
            Server::bind(
                "127.0.0.1:0".parse().unwrap(),
                &shard_0,
                ServerOptions {
                    job: Some(job),
                    ..ServerOptions::default()
                },
            )
        })
        .map(drop)
    };
    assert!(bind(offer(honest)).is_ok());
    let refused = bind(offer(rogue)).unwrap_err().to_string();
    assert!(
        refused.contains("not the one this swarm's authority signed"),
        "{refused}"
    );
    let by_another = JobOffer {
        signature: Swarm::generate("other").unwrap().sign_job(honest).unwrap(),
        ..offer(honest)
    };
    assert!(bind(by_another).is_err());

    // The rogue shard 0 skips the check and hands out its own job.
    let endpoint = rt
        .block_on(async {
            server_endpoint("127.0.0.1:0".parse().unwrap(), &shard_0, &Link::default())
        })
        .unwrap();
    let addr = endpoint.local_addr().unwrap();
    let me = swarm.credentials("me", Role::Worker).unwrap();
    let ticket = TicketSigner::new(&shard_0)
        .unwrap()
        .sign(0, 1, &[0; 32], &me.chain[0])
        .unwrap();
    let welcome = Welcome {
        rank: 0,
        world: 1,
        job: rogue.into(),
        ticket,
        signature: signature.clone(),
    };
    rt.spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let Ok(conn) = incoming.await else { continue };
            let mut frames = Incoming::new(conn.clone(), Limits::default(), &Link::default());
            if let Ok(Some(_join)) = frames.next().await {
                let _ = send(&conn, Frame::control(Kind::Welcome, 0, 0, &welcome)).await;
            }
            conn.closed().await;
        }
    });
    let err = join_job(addr, &me, "me", &quick())
        .expect_err("a worker took a job the swarm did not sign")
        .to_string();
    assert!(err.contains("refuses"), "{err}");
}

/// Shard 0's word on a round reaches the other shards through the workers, signed: a worker
/// that forges it (to close a round over other ranks, claim more weight or drop the log) is
/// hung up on. (Shard 0's own word, relayed as is, passes in every test of a job on two
/// shards: their rounds close over it.)
#[test]
fn a_forged_word_of_shard_0_is_refused_by_the_other_shards() {
    use murmur_net::wire::Participants;

    let swarm = Swarm::generate("relays").unwrap();
    let job = signed_job(&swarm, r#"{"job":"relays"}"#, 2, 2);
    let servers = start_servers(
        &swarm,
        2,
        ServerOptions {
            job: Some(job),
            ..ServerOptions::default()
        },
    );
    let mallory = swarm.credentials("mallory", Role::Worker).unwrap();
    let joined = join_job(servers.addrs[0], &mallory, "mallory", &quick()).unwrap();
    let shard_1 = servers.addrs[1];
    servers.runtime.block_on(async move {
        let hello = Hello {
            rank: joined.rank,
            world: 2,
            shard: 1,
            shards: 2,
            node: "mallory".into(),
            ticket: Some(joined.ticket.clone()),
        };
        let (_endpoint, conn) = hello_to_shard(&mallory, shard_1, hello).await.unwrap();
        let forged = Participants {
            ranks: vec![joined.rank],
            samples: vec![1_000_000],
            snapshot: Some(0),
            signature: vec![0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01],
        };
        send(
            &conn,
            Frame::control(Kind::Participants, joined.rank, 0, &forged),
        )
        .await
        .unwrap();
        let closed = closed_within(&conn, Duration::from_secs(5))
            .await
            .expect("shard 1 took a forged word of shard 0");
        assert!(closed.contains("does not verify"), "{closed}");
    });
}
