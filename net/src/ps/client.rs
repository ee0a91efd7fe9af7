//! The engine's [`Collective`] over QUIC: a worker's connections to every server shard.
//!
//! The collective owns a small tokio runtime, so the trainer stays synchronous. `push` hands
//! each partition to the runtime at once (one stream per frame, so partitions never wait on
//! each other); a reader task per shard files replies by (step, key) as they arrive; `pull`
//! waits until the round's replies are all there, or a shard fails, or the timeout passes.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use murmur_engine::comm::partition::shard_of;
use murmur_engine::comm::{Collective, Key, KeySpec};
use quinn::{Connection, Endpoint};

use crate::error::{NetError, Result};
use crate::identity::{verify_job, Credentials, Role};
use crate::ticket::Ticket;
use crate::transport::{
    client_endpoint, close, connect, expect_peer, hang_up, send, send_acknowledged, send_push,
    Incoming, Link,
};
use crate::wire::{
    Assignment, Catchup, CatchupRequest, Closed, Frame, Header, Hello, Join, Kind, Limits,
    Participants, Register, Registered, ReplicaDigest, Welcome, PUSH_PREFIX,
};

/// How a worker talks to the servers.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// What the path to the servers carries, which sizes the QUIC flow-control windows.
    pub link: Link,
    /// Hard limits on the frames the worker accepts from the servers.
    pub limits: Limits,
    /// Longest wait for one round's replies (the servers' deadline evicts stragglers sooner).
    pub round_timeout: Duration,
    /// Longest wait at the start barrier for the other workers to arrive.
    pub start_timeout: Duration,
    /// Longest wait for a QUIC handshake.
    pub connect_timeout: Duration,
    /// Whether this worker sends shard 0 a replica digest every round
    /// ([`QuicCollective::send_digest`]): shard 0 then counts its round only with the digest,
    /// so that every round's verdict compares every participant's replica.
    pub replica_digests: bool,
    /// The rank ticket shard 0 handed out with the job ([`join_job`]'s [`Welcome`]), shown
    /// to every shard in the hello; servers that serve a job ask for it on every shard but 0.
    pub ticket: Option<Ticket>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            link: Link::default(),
            limits: Limits::default(),
            round_timeout: Duration::from_secs(600),
            start_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(20),
            replica_digests: false,
            ticket: None,
        }
    }
}

/// What the reader tasks have received.
#[derive(Default)]
struct Received {
    replies: HashMap<(u64, Key), Vec<u8>>,
    /// Each shard's summary of a round it closed, by (step, shard).
    closed: HashMap<(u64, usize), Closed>,
    registered: HashMap<usize, Registered>,
    /// Shard 0's assignments of rounds, by step (jobs with a sample queue).
    assignments: BTreeMap<u64, Assignment>,
    catchups: HashMap<usize, Catchup>,
    snapshot: Option<(u64, Vec<u8>)>,
    failure: Option<String>,
}

#[derive(Default)]
struct Inbox {
    received: Mutex<Received>,
    changed: Condvar,
}

impl Inbox {
    fn update(&self, f: impl FnOnce(&mut Received)) {
        f(&mut self.received.lock().expect("inbox lock"));
        self.changed.notify_all();
    }

    /// Waits until `ready` returns a value, a shard fails, or `timeout` passes.
    fn wait<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut ready: impl FnMut(&mut Received) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut received = self.received.lock().expect("inbox lock");
        loop {
            if let Some(v) = ready(&mut received) {
                return Ok(v);
            }
            if let Some(f) = &received.failure {
                return Err(NetError::Connection(f.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NetError::Timeout(format!("{what} after {timeout:?}")));
            }
            received = self
                .changed
                .wait_timeout(received, left)
                .expect("inbox lock")
                .0;
        }
    }
}

/// Where a rejoining worker starts and how far it must replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchupPlan {
    /// The snapshot to load first, and the rounds it includes.
    pub snapshot: Option<(u64, Vec<u8>)>,
    /// Replay rounds from here (the snapshot's step, or 0) ...
    pub from: u64,
    /// ... up to, not including, here: the first round the worker takes part in.
    pub to: u64,
}

/// Asks shard 0 at `server` for the job it serves and for this certificate's rank in it, on a
/// connection of its own that ends with the answer. Gives up after the options' connect
/// time-out for the handshake and again for the answer.
pub fn join_job(
    server: SocketAddr,
    creds: &Credentials,
    node: &str,
    options: &ClientOptions,
) -> Result<Welcome> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let endpoint = client_endpoint(creds, &options.link)?;
        let conn = tokio::time::timeout(options.connect_timeout, connect(&endpoint, server))
            .await
            .map_err(|_| {
                NetError::Timeout(format!(
                    "no answer from {server} within {:?}",
                    options.connect_timeout
                ))
            })??;
        expect_peer(&conn, Role::Server { shard: 0 })?;
        let join = Join {
            node: node.chars().take(128).collect(),
        };
        send(&conn, Frame::control(Kind::Join, 0, 0, &join)).await?;
        let mut incoming = Incoming::new(conn.clone(), options.limits, &options.link);
        let answer = tokio::time::timeout(options.connect_timeout, incoming.next())
            .await
            .map_err(|_| {
                NetError::Timeout(format!(
                    "{server} did not hand out the job within {:?}",
                    options.connect_timeout
                ))
            })?;
        let welcome = match answer {
            Ok(Some(frame)) if frame.kind == Kind::Welcome => frame.message::<Welcome>(),
            Ok(Some(frame)) => Err(NetError::Protocol(format!(
                "{server} answered a join with a {:?} frame",
                frame.kind
            ))),
            Ok(None) => Err(NetError::Connection(format!(
                "{server} closed the connection instead of handing out the job"
            ))),
            Err(e) => Err(match conn.close_reason() {
                // The server refused the join and said why: asking again will not help.
                Some(quinn::ConnectionError::ApplicationClosed(c))
                    if c.error_code == quinn::VarInt::from_u32(close::PROTOCOL) =>
                {
                    NetError::Protocol(format!(
                        "{server} refused to hand out the job: {}",
                        String::from_utf8_lossy(&c.reason)
                    ))
                }
                _ => e,
            }),
        };
        hang_up(&conn, close::DONE, "joined");
        let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        // A job the swarm's authority did not sign is not trained, whoever offers it.
        let welcome = welcome?;
        verify_job(&creds.ca, &welcome.job, &welcome.signature).map_err(|e| {
            NetError::Identity(format!("{server} offered a job this worker refuses: {e}"))
        })?;
        Ok(welcome)
    })
}

/// What a probe measured on the path to one shard.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathSample {
    /// Bytes sent.
    pub bytes: usize,
    /// Seconds until the shard had acknowledged them all.
    pub seconds: f64,
    /// The connection's smoothed round trip, in seconds, after the probe.
    pub rtt: f64,
}

impl PathSample {
    /// Seconds that `bytes` would take on this path, sent as the probe was: a round trip,
    /// then the bytes at the rate the probe's bytes beyond its first round trip went at.
    pub fn seconds_for(&self, bytes: usize) -> f64 {
        self.rtt + bytes as f64 / self.rate()
    }

    /// Bytes per second the probe's bytes went at beyond its first round trip.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / (self.seconds - self.rtt).max(1e-6)
    }
}

/// One worker's collective over QUIC.
pub struct QuicCollective {
    runtime: tokio::runtime::Runtime,
    endpoint: Endpoint,
    shards: Vec<Connection>,
    rank: u16,
    world: u16,
    options: ClientOptions,
    inbox: Arc<Inbox>,
    /// Shard and size of every registered key.
    owners: HashMap<Key, (usize, u32)>,
    in_flight: Vec<tokio::task::JoinHandle<Result<()>>>,
    underway: bool,
}

impl QuicCollective {
    /// Connects to every shard (in the same order on every worker) and introduces this rank.
    pub fn connect(
        servers: &[SocketAddr],
        creds: &Credentials,
        rank: u16,
        world: u16,
        node: &str,
        options: ClientOptions,
    ) -> Result<Self> {
        if servers.is_empty() || servers.len() > u16::MAX as usize {
            return Err(NetError::Protocol(format!("{} servers", servers.len())));
        }
        if rank >= world {
            return Err(NetError::Protocol(format!(
                "rank {rank} of a world of {world}"
            )));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("murmur-net")
            .enable_all()
            .build()?;
        let inbox = Arc::new(Inbox::default());
        let shards_total = servers.len() as u16;
        let (endpoint, shards) = runtime.block_on(async {
            let endpoint = client_endpoint(creds, &options.link)?;
            let mut shards = Vec::new();
            for (shard, addr) in servers.iter().enumerate() {
                let conn = tokio::time::timeout(options.connect_timeout, connect(&endpoint, *addr))
                    .await
                    .map_err(|_| NetError::Timeout(format!("connecting to {addr}")))??;
                expect_peer(
                    &conn,
                    Role::Server {
                        shard: shard as u16,
                    },
                )?;
                let hello = Hello {
                    rank,
                    world,
                    shard: shard as u16,
                    shards: shards_total,
                    node: node.chars().take(128).collect(),
                    ticket: options.ticket.clone(),
                };
                send(&conn, Frame::control(Kind::Hello, rank, 0, &hello)).await?;
                shards.push(conn);
            }
            for (shard, conn) in shards.iter().enumerate() {
                // Shard 0's participants go on to the other shards, which close over them.
                let relay = Relay {
                    rank,
                    to: if shard == 0 {
                        shards[1..].to_vec()
                    } else {
                        Vec::new()
                    },
                    last: None,
                };
                tokio::spawn(read_replies(
                    shard,
                    conn.clone(),
                    options.limits,
                    options.link,
                    inbox.clone(),
                    relay,
                ));
            }
            Ok::<_, NetError>((endpoint, shards))
        })?;
        Ok(QuicCollective {
            runtime,
            endpoint,
            shards,
            rank,
            world,
            options,
            inbox,
            owners: HashMap::new(),
            in_flight: Vec::new(),
            underway: false,
        })
    }

    /// Measures the path to every shard: sends each `bytes` bytes (at most
    /// [`crate::wire::PROBE_MAX`]) at once and times how long until each has acknowledged
    /// all of them. Returns, per shard in order, the seconds that took and the connection's
    /// smoothed round trip. Call before registering: the probe travels as pushes will.
    pub fn probe(&mut self, bytes: usize) -> Result<Vec<PathSample>> {
        let bytes = bytes.min(crate::wire::PROBE_MAX);
        let shards = self.shards.clone();
        let rank = self.rank;
        self.runtime.block_on(async move {
            // One task per shard: the probes travel at once, as a round's pushes do.
            let timed: Vec<_> = shards
                .into_iter()
                .map(|conn| {
                    tokio::spawn(async move {
                        let started = std::time::Instant::now();
                        let frame = Frame::new(Kind::Probe, rank, 0, 0, 0, vec![0u8; bytes]);
                        send_acknowledged(&conn, frame, "probing a shard").await?;
                        Ok::<_, NetError>(PathSample {
                            bytes,
                            seconds: started.elapsed().as_secs_f64(),
                            rtt: conn.rtt().as_secs_f64(),
                        })
                    })
                })
                .collect();
            let mut samples = Vec::with_capacity(timed.len());
            for task in timed {
                samples.push(
                    task.await
                        .map_err(|e| NetError::Connection(format!("probing a shard: {e}")))??,
                );
            }
            Ok(samples)
        })
    }

    /// Whether the swarm had started before this worker registered: it must catch up (see
    /// [`QuicCollective::catch_up`]) before its first round.
    pub fn underway(&self) -> bool {
        self.underway
    }

    /// Sends a snapshot of the model after `step` rounds to shard 0, which keeps it for
    /// rejoining workers (once it has checked it) and tells the other shards, in its word on
    /// the next rounds, to forget the rounds before it.
    pub fn snapshot(&mut self, step: u64, bytes: Vec<u8>) -> Result<()> {
        // Shard 0 would refuse it and drop this worker: say so here instead.
        if bytes.len() > self.options.limits.max_payload {
            return Err(NetError::Protocol(format!(
                "a {}-byte snapshot exceeds the {}-byte frame limit",
                bytes.len(),
                self.options.limits.max_payload
            )));
        }
        let frame = Frame::new(Kind::Snapshot, self.rank, 0, step, 0, bytes);
        let conn = self.shards[0].clone();
        self.in_flight
            .push(self.runtime.spawn(async move { send(&conn, frame).await }));
        Ok(())
    }

    /// Asks every shard for what this worker missed, the worker's replica being after `at`
    /// rounds. The replies stay in the inbox, where [`Collective::pull`] finds them as the
    /// worker replays rounds `from..to`: from `at` itself when every shard still logs the
    /// rounds since (a worker that paused keeps its state), else from the newest snapshot.
    pub fn catch_up(&mut self, at: u64) -> Result<CatchupPlan> {
        // A snapshot notice may reach one shard before another: retry a few times.
        let mut last = String::new();
        for _ in 0..5 {
            match self.try_catch_up(at) {
                Ok(plan) => return Ok(plan),
                Err(NetError::Protocol(why)) => {
                    last = why;
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
        Err(NetError::Protocol(format!("cannot catch up: {last}")))
    }

    fn try_catch_up(&mut self, at: u64) -> Result<CatchupPlan> {
        self.inbox.update(|r| r.catchups.clear());
        for conn in &self.shards {
            let frame = Frame::control(Kind::CatchupRequest, self.rank, 0, &CatchupRequest {});
            let conn = conn.clone();
            self.runtime
                .block_on(async move { send(&conn, frame).await })?;
        }
        let shards = self.shards.len();
        let summaries = self
            .inbox
            .wait(self.options.round_timeout, "catching up", |r| {
                (r.catchups.len() == shards).then(|| {
                    let mut all: Vec<(usize, Catchup)> = r.catchups.drain().collect();
                    all.sort_by_key(|(s, _)| *s);
                    all.into_iter().map(|(_, c)| c).collect::<Vec<_>>()
                })
            })?;
        let to = summaries.iter().map(|c| c.open_step).min().unwrap_or(0);
        if at <= to && summaries.iter().all(|c| c.first_step <= at) {
            return Ok(CatchupPlan {
                snapshot: None,
                from: at,
                to,
            });
        }
        let snapshot_step = summaries[0].snapshot_step;
        let from = snapshot_step.unwrap_or(0);
        for (shard, c) in summaries.iter().enumerate() {
            if c.first_step > from {
                return Err(NetError::Protocol(format!(
                    "shard {shard} keeps rounds from step {} on, but the newest snapshot covers only {from}",
                    c.first_step
                )));
            }
        }
        let snapshot = match snapshot_step {
            None => None,
            Some(step) => Some(self.inbox.wait(
                self.options.round_timeout,
                "the snapshot",
                |r| match &r.snapshot {
                    Some((s, _)) if *s == step => r.snapshot.take(),
                    _ => None,
                },
            )?),
        };
        Ok(CatchupPlan { snapshot, from, to })
    }

    /// Leaves the rounds: waits for pushes under way, then hangs up on every shard, which
    /// drops this rank from the open round at once instead of at its deadline. The
    /// collective is spent; a worker that comes back connects a new one.
    pub fn leave(&mut self) {
        let _ = self.flush();
        for conn in &self.shards {
            hang_up(conn, close::DONE, "leaving");
        }
    }

    /// Hangs up on every shard to connect again at once (a shard was lost, or a round
    /// failed): the shards keep waiting for this rank in the open round, up to its deadline,
    /// instead of closing it without this worker.
    pub fn leave_to_reconnect(&mut self) {
        let _ = self.flush();
        for conn in &self.shards {
            hang_up(conn, close::RECONNECTING, "reconnecting");
        }
    }

    /// Sends shard 0 the digest of the replica with which this worker enters round `step`
    /// (before the round's pushes), for the shard to compare with the other workers'. Only a
    /// worker connected with [`ClientOptions::replica_digests`] sends them: shard 0 then
    /// waits for one every round.
    pub fn send_digest(&mut self, step: u64, digest: u64) -> Result<()> {
        if !self.options.replica_digests {
            return Err(NetError::Protocol(
                "replica digests need ClientOptions::replica_digests when connecting".into(),
            ));
        }
        let frame = Frame::control(Kind::Digest, self.rank, step, &ReplicaDigest { digest });
        let conn = self.shards[0].clone();
        self.in_flight
            .push(self.runtime.spawn(async move { send(&conn, frame).await }));
        Ok(())
    }

    /// The registered keys that live on the shards `shards` (indices in `--connect` order).
    pub fn keys_on(&self, shards: &[usize]) -> Vec<Key> {
        self.owners
            .iter()
            .filter(|(_, (shard, _))| shards.contains(shard))
            .map(|(key, _)| *key)
            .collect()
    }

    /// Shard 0's assignment of round `step` (in a job with a sample queue), if this worker
    /// has received it: with the previous round's summary, or on registering within the
    /// round.
    pub fn assignment(&self, step: u64) -> Option<Assignment> {
        let received = self.inbox.received.lock().expect("inbox lock");
        received.assignments.get(&step).cloned()
    }

    /// Every shard's summary of round `step`, in shard order, once all have arrived (they
    /// follow the round's replies).
    pub fn closed(&mut self, step: u64) -> Result<Vec<Closed>> {
        let shards = self.shards.len();
        let what = format!("waiting for the summaries of step {step}");
        self.inbox.wait(self.options.round_timeout, &what, |r| {
            (0..shards)
                .all(|shard| r.closed.contains_key(&(step, shard)))
                .then(|| {
                    (0..shards)
                        .map(|shard| r.closed.remove(&(step, shard)).expect("checked"))
                        .collect()
                })
        })
    }

    /// Waits for the pushes handed to the runtime; the first send error fails the round.
    fn flush(&mut self) -> Result<()> {
        let handles = std::mem::take(&mut self.in_flight);
        self.runtime.block_on(async {
            for h in handles {
                h.await
                    .map_err(|e| NetError::Connection(format!("send task: {e}")))??;
            }
            Ok(())
        })
    }
}

/// Where a worker relays shard 0's participants of each round it learns of ([`Participants`]):
/// the other shards, which close their rounds over them.
struct Relay {
    rank: u16,
    to: Vec<Connection>,
    /// The latest round relayed: each round goes on once (shard 0 says it twice).
    last: Option<u64>,
}

impl Relay {
    fn participants(&mut self, step: u64, relayed: &Participants) {
        if self.to.is_empty() || self.last.is_some_and(|last| step <= last) {
            return;
        }
        self.last = Some(step);
        let frame = Frame::control(Kind::Participants, self.rank, step, relayed);
        for conn in &self.to {
            let (conn, frame) = (conn.clone(), frame.clone());
            // A shard lost is found by its own reader; the relay of another worker may reach it.
            tokio::spawn(async move { send(&conn, frame).await });
        }
    }
}

/// Files every frame a shard sends into the inbox until the connection ends; relays shard
/// 0's participants of each round ([`Relay`]).
async fn read_replies(
    shard: usize,
    conn: Connection,
    limits: Limits,
    link: Link,
    inbox: Arc<Inbox>,
    mut relay: Relay,
) {
    let mut incoming = Incoming::new(conn.clone(), limits, &link);
    let failure = loop {
        match incoming.next().await {
            Ok(Some(frame)) => {
                let filed = match frame.kind {
                    Kind::Reply => {
                        inbox.update(|r| {
                            r.replies.insert((frame.step, frame.key), frame.payload);
                        });
                        Ok(())
                    }
                    Kind::Registered => frame.message::<Registered>().map(|m| {
                        inbox.update(|r| {
                            if let (0, Some(a)) = (shard, &m.assignment) {
                                r.assignments.insert(m.open_step, a.clone());
                            }
                            r.registered.insert(shard, m);
                        })
                    }),
                    Kind::Catchup => frame.message::<Catchup>().map(|m| {
                        inbox.update(|r| {
                            r.catchups.insert(shard, m);
                        })
                    }),
                    Kind::Snapshot => {
                        inbox.update(|r| r.snapshot = Some((frame.step, frame.payload)));
                        Ok(())
                    }
                    // Shard 0 says who took part in a round as soon as it has decided,
                    // and again in the round's summary (which a catch-up replays): both go
                    // on to the other shards, which take the first.
                    Kind::Participants if shard == 0 => frame.message::<Participants>().map(|m| {
                        relay.participants(frame.step, &m);
                    }),
                    Kind::Closed => frame.message::<Closed>().map(|m| {
                        if let (0, Some(relayed)) = (shard, &m.relay) {
                            relay.participants(frame.step, relayed);
                        }
                        inbox.update(|r| {
                            if let (0, Some(a), Some(next)) =
                                (shard, &m.next, frame.step.checked_add(1))
                            {
                                r.assignments.insert(next, a.clone());
                            }
                            r.closed.insert((frame.step, shard), m);
                        })
                    }),
                    other => Err(NetError::Protocol(format!(
                        "a server sent a {other:?} frame"
                    ))),
                };
                if let Err(e) = filed {
                    hang_up(&conn, close::PROTOCOL, &e.to_string());
                    break e.to_string();
                }
            }
            Ok(None) => break "the server closed the connection".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    let addr = conn.remote_address();
    inbox.update(|r| {
        r.failure
            .get_or_insert_with(|| format!("server {shard} ({addr}): {failure}"));
    });
}

impl Collective for QuicCollective {
    fn rank(&self) -> usize {
        self.rank as usize
    }

    fn world(&self) -> usize {
        self.world as usize
    }

    fn register(&mut self, keys: &[KeySpec]) -> murmur_engine::Result<()> {
        let shards = self.shards.len();
        let mut per_shard = vec![Vec::new(); shards];
        for spec in keys {
            let shard = shard_of(spec.key, shards);
            self.owners.insert(spec.key, (shard, spec.numel));
            per_shard[shard].push(spec.clone());
        }
        for (shard, (conn, keys)) in self.shards.iter().zip(per_shard).enumerate() {
            let register = Register {
                keys,
                replica_digests: self.options.replica_digests && shard == 0,
            };
            let frame = Frame::control(Kind::Register, self.rank, 0, &register);
            let conn = conn.clone();
            self.runtime
                .block_on(async move { send(&conn, frame).await })?;
        }
        let registered = self.inbox.wait(
            self.options.start_timeout,
            "waiting for the other workers to register",
            |r| {
                (r.registered.len() == shards)
                    .then(|| r.registered.values().cloned().collect::<Vec<_>>())
            },
        )?;
        self.underway = registered.iter().any(|r| r.underway);
        Ok(())
    }

    fn push(
        &mut self,
        step: u64,
        key: Key,
        samples: u32,
        payload: Vec<u8>,
    ) -> murmur_engine::Result<()> {
        let Some(&(shard, numel)) = self.owners.get(&key) else {
            return Err(NetError::Protocol(format!("push of unregistered key {key:#x}")).into());
        };
        let header = Header {
            kind: Kind::Push,
            rank: self.rank,
            key,
            step,
            numel,
            len: PUSH_PREFIX + payload.len(),
        };
        let conn = self.shards[shard].clone();
        self.in_flight.push(
            self.runtime.spawn(async move {
                send_push(&conn, &header, samples, Bytes::from(payload)).await
            }),
        );
        Ok(())
    }

    fn pull(&mut self, step: u64, keys: &[Key]) -> murmur_engine::Result<Vec<(Key, Vec<u8>)>> {
        self.flush()?;
        let what = format!("waiting for the replies of step {step}");
        let replies = self.inbox.wait(self.options.round_timeout, &what, |r| {
            if !keys.iter().all(|k| r.replies.contains_key(&(step, *k))) {
                return None;
            }
            // Replies, summaries and assignments of rounds before this one are no longer
            // needed.
            r.replies.retain(|(s, _), _| *s >= step);
            r.closed.retain(|(s, _), _| *s >= step);
            r.assignments.retain(|s, _| *s >= step);
            Some(
                keys.iter()
                    .map(|k| (*k, r.replies.remove(&(step, *k)).expect("checked")))
                    .collect::<Vec<_>>(),
            )
        })?;
        Ok(replies)
    }
}

impl Drop for QuicCollective {
    fn drop(&mut self) {
        let _ = self.flush();
        for conn in &self.shards {
            hang_up(conn, close::DONE, "done");
        }
        // Let the close frames leave before the runtime stops.
        let endpoint = self.endpoint.clone();
        self.runtime.block_on(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        });
    }
}
