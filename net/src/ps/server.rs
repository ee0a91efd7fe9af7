//! A parameter-server shard on a QUIC endpoint: one task per connection reads frames and feeds
//! them to the [`ShardState`]; payloads decode on tokio's blocking pool, rounds close on it
//! (keys summed and re-encoded in parallel), and each reply is encoded once and sent as the
//! same bytes to every worker, each on a stream of its own.
//!
//! A frame that breaks the protocol costs the connection that sent it, never the server: the
//! reason is logged with the peer's fingerprint and sent to the peer in the close frame.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::shard::PushDecoder;
use murmur_engine::comm::Key;
use quinn::{Connection, Endpoint};

use super::durable::{job_digest, StateDir};
use super::job_checks::{LayoutCheck, SnapshotDigest};
use super::queue::QueueSpec;
use super::quorum::QuorumRule;
use super::state::{
    CatchupReply, ClosedRound, Departure, PeerId, PushCheck, ShardState, STRIKES_TO_EVICT,
};
use crate::error::{NetError, Result};
use crate::identity::{fingerprint, verify_job, Credentials, RevocationList, Role, REVOKED_FILE};
use crate::log::RateLimitedLog;
use crate::ticket::TicketSigner;
use crate::tls::client_verifier;
use crate::transport::{
    admit, close, expect_peer, hang_up, peer_certificate, receive, send, send_parts, server_config,
    server_endpoint, Incoming, Link,
};
use crate::wire::{
    split_push, CatchupRequest, Frame, Header, Hello, Join, Kind, Limits, Participants, Register,
    ReplicaDigest, Welcome, PROBE_MAX,
};
use crate::word::check_participants;
use rustls::pki_types::CertificateDer;

/// How a shard runs.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// This server's index among the shards, and how many there are.
    pub shard: u16,
    /// How many shards the servers form in all; `shard` is below it, and every worker must list the
    /// shards in the same order.
    pub shards: u16,
    /// What the path to the workers carries, which sizes the QUIC flow-control windows.
    pub link: Link,
    /// Hard limits on the frames and keys a worker may send this shard.
    pub limits: Limits,
    /// How long a round waits for stragglers after its first push before it evicts them
    /// (the hard deadline; rounds that reach their quorum close sooner).
    pub deadline: Duration,
    /// When a round closes without every member ([`super::quorum`]).
    pub quorum: QuorumRule,
    /// Closed rounds kept for rejoining workers (since the latest snapshot).
    pub max_log_rounds: usize,
    /// How the shard combines each key's pushes (mean, or a robust rule the job chose).
    pub aggregate: Aggregate,
    /// Most connections the shard holds at once (handshakes under way included); more are
    /// refused until some end. A job's shard holds at least two per worker, and 64 more.
    pub max_connections: usize,
    /// The job this shard serves: it fixes the world size, and shard 0 hands it, with a rank,
    /// to every worker that joins with [`Kind::Join`].
    pub job: Option<JobOffer>,
    /// The keys the job gives this shard: registrations that differ are refused (without
    /// it, the first registration fixes the keys).
    pub layout: Option<LayoutCheck>,
    /// Shard 0: the digest of a snapshot's parameters, which must be the replicas' majority
    /// digest of its round (without it, any rank's snapshot is kept).
    pub snapshot_digest: Option<SnapshotDigest>,
    /// Where the snapshots this shard keeps (shard 0: the model every few rounds, from the ranks in turn) are
    /// also sent, as (step, bytes): what `murmur server --save` writes to disk.
    pub snapshots: Option<std::sync::mpsc::Sender<(u64, bytes::Bytes)>>,
    /// A folder where the shard saves its state after every round, before replying, and
    /// from which it resumes when started again ([`super::durable`]).
    pub state_dir: Option<PathBuf>,
}

/// How long a new connection may take to send its first frame (a hello, or a join).
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Most connections one certificate may hold on a shard at once: a worker holds one, and
/// briefly a second while it reconnects or a third while it joins.
pub const MAX_CONNECTIONS_PER_CERTIFICATE: usize = 4;

/// A job as the servers offer it to joining workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOffer {
    /// Workers in the job: the places the servers hand out.
    pub world: u16,
    /// How many must have registered before the first round (at most `world`); the other
    /// places can be taken at any round later.
    pub start_with: u16,
    /// The job's description (JSON, written and read by the node library).
    pub description: String,
    /// The swarm authority's signature of `description`, which every worker checks
    /// ([`crate::identity::verify_job`]); [`Server::bind`] refuses a job it does not sign.
    pub signature: Vec<u8>,
    /// The samples shard 0 hands out round by round ([`super::queue`]), if the job has a
    /// queue; without one every worker takes its own equal share of each round.
    pub queue: Option<QueueSpec>,
    /// Whether the job's workers fold a push that came after its round closed into their
    /// error feedback (the queue holds the share until the member's next push is summed)
    /// rather than drop it (the share goes back to the queue at once).
    pub fold_late: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            shard: 0,
            shards: 1,
            link: Link::default(),
            limits: Limits::default(),
            deadline: Duration::from_secs(30),
            quorum: QuorumRule::default(),
            max_log_rounds: 10_000,
            max_connections: 1024,
            aggregate: Aggregate::Mean,
            job: None,
            layout: None,
            snapshot_digest: None,
            snapshots: None,
            state_dir: None,
        }
    }
}

/// A connection the shard holds, with the certificate its peer presented (read once, when
/// it connected).
#[derive(Clone)]
struct Held {
    conn: Connection,
    cert: CertificateDer<'static>,
    fingerprint: String,
    /// The certificate (DER) of the shard 0 that signed the peer's rank ticket, once its
    /// hello showed one (shards other than 0 of a job): shard 0's word on each round, which
    /// the peer relays, must carry that key's signature.
    issuer: Option<Vec<u8>>,
    /// Reply frames handed to the connection and not yet taken by it (see [`deliver`]).
    unsent: Arc<AtomicUsize>,
}

struct Shared {
    state: Mutex<ShardState>,
    conns: Mutex<HashMap<PeerId, Held>>,
    options: ServerOptions,
    next_id: AtomicUsize,
    /// The state folder, and the digest of the job the state belongs to.
    durable: Option<(StateDir, Vec<u8>)>,
    /// The shard's endpoint, closed when the shard cannot go on.
    endpoint: Endpoint,
    /// Why the shard stopped itself (a state it could not save), which [`Server::run`]
    /// returns.
    fatal: Mutex<Option<String>>,
    /// The members the last round closed without.
    last_late: Mutex<Vec<u16>>,
    /// The shard's credentials, whose revocation list [`watch_revocations`] renews.
    creds: Mutex<Credentials>,
    /// Shard 0 of a job signs each rank it hands out ([`crate::ticket`]).
    signer: Option<Arc<TicketSigner>>,
    /// The digest of the job's description (empty without a job), which tickets name.
    job_digest: Vec<u8>,
    /// Connections held, handshakes under way included.
    live: AtomicUsize,
    /// The most connections held at once ([`ServerOptions::max_connections`], raised for a
    /// large job).
    max_connections: usize,
    /// The last word of shard 0 whose signature this shard checked, with its round: the
    /// same word relayed by the other workers is not checked again.
    last_word: Mutex<Option<(u64, Participants)>>,
    /// Repeated warnings, summarised.
    warnings: RateLimitedLog,
}

/// A running shard; [`Server::run`] serves until the endpoint closes.
pub struct Server {
    endpoint: Endpoint,
    shared: Arc<Shared>,
    /// Shard 0's participants of each round, as it decides them ([`announce_participants`]).
    decided: tokio::sync::mpsc::UnboundedReceiver<(u64, Participants, Vec<PeerId>)>,
}

impl Server {
    /// Binds the shard's endpoint. Must be called inside a tokio runtime.
    pub fn bind(addr: SocketAddr, creds: &Credentials, options: ServerOptions) -> Result<Server> {
        if options.shard >= options.shards {
            return Err(NetError::Protocol(format!(
                "shard {} of {}",
                options.shard, options.shards
            )));
        }
        let job = options
            .job
            .as_ref()
            .map_or_else(Vec::new, |j| job_digest(&j.description));
        let durable = match &options.state_dir {
            Some(dir) => Some((StateDir::create(dir)?, job.clone())),
            None => None,
        };
        let loaded = match &durable {
            Some((dir, _)) => dir.load(options.limits.max_payload)?,
            None => None,
        };
        let mut state = match loaded {
            Some(loaded) => {
                let state = ShardState::restore(
                    options.shard,
                    &job,
                    options.limits,
                    options.max_log_rounds,
                    loaded,
                )?;
                tracing::info!(
                    "shard {}: resuming at round {} from {}; waiting for ranks {:?}",
                    options.shard,
                    state.open_step(),
                    options
                        .state_dir
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display(),
                    state.expected()
                );
                state
            }
            None => ShardState::new(options.shard, options.limits, options.max_log_rounds),
        };
        options.quorum.validate().map_err(NetError::Protocol)?;
        let own = Role::Server {
            shard: options.shard,
        };
        match creds.role() {
            Ok(role) if role == own => {}
            Ok(role) => {
                return Err(NetError::Identity(format!(
                    "shard {} needs a certificate issued for it (--role server/{}); this one is a {role}'s",
                    options.shard, options.shard
                )))
            }
            Err(e) => return Err(e),
        }
        state.set_quorum(options.quorum);
        state.set_aggregate(options.aggregate);
        if let Some(layout) = &options.layout {
            state.set_layout(layout.clone());
        }
        // Shard 0 of several says who took part in each round as soon as it knows.
        let (decided_tx, decided_rx) = tokio::sync::mpsc::unbounded_channel();
        if options.shard == 0 && options.shards > 1 {
            state.on_decided(Box::new(move |step, participants, listeners| {
                // The receiver goes with the endpoint.
                let _ = decided_tx.send((step, participants, listeners));
            }));
        }
        let endpoint = server_endpoint(addr, creds, &options.link)?;
        if let Some(job) = &options.job {
            if job.world == 0 {
                return Err(NetError::Protocol("a job of 0 workers".into()));
            }
            if job.description.len() + 64 > options.limits.max_payload {
                return Err(NetError::Protocol(format!(
                    "a {}-byte job description exceeds the {}-byte frame limit",
                    job.description.len(),
                    options.limits.max_payload
                )));
            }
            if job.start_with == 0 || job.start_with > job.world {
                return Err(NetError::Protocol(format!(
                    "a job that starts with {} of its {} workers",
                    job.start_with, job.world
                )));
            }
            verify_job(&creds.ca, &job.description, &job.signature)?;
            state.fix_world(job.world);
            state.start_with(job.start_with);
            state.set_fold_late(job.fold_late);
            if let (0, Some(spec)) = (options.shard, job.queue) {
                if spec.samples == 0 || spec.global == 0 {
                    return Err(NetError::Protocol(format!(
                        "a sample queue of {} samples, {} a round",
                        spec.samples, spec.global
                    )));
                }
                state.set_queue(spec)?;
            }
        }
        let max_connections = options
            .job
            .as_ref()
            .map_or(0, |j| 2 * usize::from(j.world) + 64)
            .max(options.max_connections);
        let signer = match (&options.job, options.shard) {
            (Some(_), 0) => Some(Arc::new(TicketSigner::new(creds)?)),
            _ => None,
        };
        if let (Some(signer), true) = (&signer, options.shards > 1) {
            state.sign_participants_with(signer.clone(), job.clone());
        }
        Ok(Server {
            decided: decided_rx,
            endpoint: endpoint.clone(),
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                conns: Mutex::default(),
                options,
                next_id: AtomicUsize::new(0),
                durable,
                endpoint,
                fatal: Mutex::new(None),
                last_late: Mutex::default(),
                creds: Mutex::new(creds.clone()),
                signer,
                job_digest: job,
                live: AtomicUsize::new(0),
                max_connections,
                last_word: Mutex::default(),
                warnings: RateLimitedLog::default(),
            }),
        })
    }

    /// The address the server's endpoint is bound to, with the real port when it was started on
    /// port 0.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// A handle that stops the server (closing every connection) when dropped or closed.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    /// Accepts peers until the endpoint is closed.
    pub async fn run(self) -> Result<()> {
        let shard = self.shared.options.shard;
        tokio::spawn(announce_participants(self.shared.clone(), self.decided));
        let watch = tokio::spawn(watch_revocations(self.shared.clone()));
        while let Some(incoming) = self.endpoint.accept().await {
            let shared = self.shared.clone();
            let from = incoming.remote_address();
            let live = shared.live.fetch_add(1, Ordering::SeqCst);
            if live >= shared.max_connections {
                shared.live.fetch_sub(1, Ordering::SeqCst);
                incoming.refuse();
                shared.warnings.warn("connection limit", || {
                    format!(
                        "shard {shard}: refused {from}: {} connections held, the most it takes",
                        shared.max_connections
                    )
                });
                continue;
            }
            tokio::spawn(async move {
                match incoming.await {
                    Ok(conn) => serve(shared.clone(), conn).await,
                    // Peers without this swarm's credentials end here.
                    Err(e) => shared.warnings.warn("handshake", || {
                        format!("shard {shard}: refused {from}: {e}")
                    }),
                }
                shared.live.fetch_sub(1, Ordering::SeqCst);
            });
        }
        watch.abort();
        self.shared.warnings.flush();
        // Stopped: let the close frames reach the peers (briefly), so that they learn at
        // once instead of after their idle time-out.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
        {
            let state = lock(&self.shared);
            tracing::info!(
                "shard {shard}: stopped at round {}; {} rounds closed on a quorum without every \
                 member; {} pushes came after their round closed",
                state.open_step(),
                state.quorum_rounds(),
                state.late_pushes()
            );
        }
        match self.shared.fatal.lock().expect("fatal lock").take() {
            Some(why) => Err(NetError::State(why)),
            None => Ok(()),
        }
    }
}

/// Sends each round's participants, as shard 0 decides them, to the round's listeners, who
/// relay them to the other shards ([`Kind::Participants`]).
async fn announce_participants(
    shared: Arc<Shared>,
    mut decided: tokio::sync::mpsc::UnboundedReceiver<(u64, Participants, Vec<PeerId>)>,
) {
    while let Some((step, participants, listeners)) = decided.recv().await {
        let frame = Frame::control(
            Kind::Participants,
            shared.options.shard,
            step,
            &participants,
        );
        for id in listeners {
            if let Some(conn) = conn_of(&shared, id) {
                let frame = frame.clone();
                tokio::spawn(async move { send(&conn, frame).await });
            }
        }
    }
}

/// How often a server looks for a new revocation list in its swarm folder.
pub const REVOCATION_POLL: Duration = Duration::from_secs(2);

/// Rereads the swarm folder's revocation list whenever the file changes: new handshakes are
/// checked against it from then on, and peers it revokes are hung up at once.
async fn watch_revocations(shared: Arc<Shared>) {
    let Some(dir) = shared.creds.lock().expect("creds lock").swarm_dir.clone() else {
        return;
    };
    let shard = shared.options.shard;
    let path = dir.join(REVOKED_FILE);
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut seen = stamp(&path);
    loop {
        tokio::time::sleep(REVOCATION_POLL).await;
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        let list = match RevocationList::load(&dir) {
            Ok(list) => list,
            Err(e) => {
                tracing::error!("shard {shard}: keeping the previous revocation list: {e}");
                continue;
            }
        };
        let config = {
            let mut creds = shared.creds.lock().expect("creds lock");
            creds.revoked = list.clone();
            server_config(&creds, &shared.options.link)
        };
        match config {
            Ok(config) => shared.endpoint.set_server_config(Some(config)),
            Err(e) => {
                tracing::error!("shard {shard}: the new revocation list is not in force: {e}");
                continue;
            }
        }
        let revoked: Vec<Connection> = match &list {
            Some(list) => shared
                .conns
                .lock()
                .expect("conns lock")
                .values()
                .filter(|h| list.revokes(&h.cert))
                .map(|h| h.conn.clone())
                .collect(),
            None => Vec::new(),
        };
        tracing::info!(
            "shard {shard}: revocation list reloaded ({} certificates revoked); hanging up {} \
             connected peers it names",
            list.as_ref().map_or(0, RevocationList::len),
            revoked.len()
        );
        for conn in revoked {
            hang_up(&conn, close::PROTOCOL, "this certificate was revoked");
        }
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, ShardState> {
    shared.state.lock().expect("shard state lock")
}

fn conn_of(shared: &Shared, id: PeerId) -> Option<Connection> {
    held(shared, id).map(|h| h.conn)
}

fn held(shared: &Shared, id: PeerId) -> Option<Held> {
    shared.conns.lock().expect("conns lock").get(&id).cloned()
}

async fn serve(shared: Arc<Shared>, conn: Connection) {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (shard, from) = (shared.options.shard, conn.remote_address());
    let Some(cert) = peer_certificate(&conn) else {
        return;
    };
    let fingerprint = fingerprint(&cert);
    // Only workers push, join or relay; a server's or a stage's certificate has no business here.
    if let Err(e) = expect_peer(&conn, Role::Worker) {
        shared
            .warnings
            .warn("role", || format!("shard {shard}: {e}"));
        return;
    }
    let held = shared
        .conns
        .lock()
        .expect("conns lock")
        .values()
        .filter(|h| h.fingerprint == fingerprint)
        .count();
    if held >= MAX_CONNECTIONS_PER_CERTIFICATE {
        let why =
            format!("this certificate holds {held} connections already, the most a worker needs");
        shared.warnings.warn("connections per certificate", || {
            format!("shard {shard}: refused peer {fingerprint} from {from}: {why}")
        });
        hang_up(&conn, close::PROTOCOL, &why);
        return;
    }
    tracing::info!("shard {shard}: peer {fingerprint} connected from {from}");
    shared.conns.lock().expect("conns lock").insert(
        id,
        Held {
            conn: conn.clone(),
            cert,
            fingerprint: fingerprint.clone(),
            issuer: None,
            unsent: Arc::default(),
        },
    );
    let outcome = match admission(&shared, id, &conn).await {
        Ok(true) => {
            admit(&conn, &shared.options.link);
            let mut incoming =
                Incoming::new(conn.clone(), shared.options.limits, &shared.options.link);
            loop {
                match incoming.next().await {
                    Ok(Some(frame)) => {
                        if let Err(e) = handle(&shared, id, frame).await {
                            break Err(e);
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
        }
        // A join: the answer is on its way, and the worker hangs up once it has it.
        Ok(false) => conn_closed(&conn).await,
        Err(e) => Err(e),
    };
    let rank = lock(&shared)
        .rank_of(id)
        .map_or("no rank".to_string(), |r| format!("rank {r}"));
    match outcome {
        Err(e @ (NetError::Wire(_) | NetError::Protocol(_) | NetError::Identity(_))) => {
            shared.warnings.warn("protocol", || {
                format!("shard {shard}: dropping peer {fingerprint} ({rank}, {from}): {e}")
            });
            hang_up(&conn, close::PROTOCOL, &e.to_string());
        }
        Err(e) => tracing::info!("shard {shard}: peer {fingerprint} ({rank}) left: {e}"),
        Ok(()) => tracing::info!("shard {shard}: peer {fingerprint} ({rank}) left"),
    }
    shared.conns.lock().expect("conns lock").remove(&id);
    lock(&shared).disconnect(id, departure(&conn));
    // Its leaving may complete the round the others were waiting on, or make a quorum of
    // those who pushed.
    arm_quorum(&shared);
    close_round_if_complete(&shared).await;
}

/// Limits on a connection's first frame: a hello or a join, small messages both.
const ADMISSION_LIMITS: Limits = Limits {
    max_payload: 64 << 10,
    max_keys: 0,
    max_numel: 0,
    max_total_numel: 0,
    max_buffered: 64 << 10,
};

/// Reads and handles a connection's first frame, within [`HELLO_DEADLINE`], on the
/// admission windows ([`crate::transport::ADMISSION_WINDOW`]): a hello (returns `true`: the
/// peer is admitted to the link's windows) or a join (`false`: the connection only waits for
/// its answer). Anything else costs the connection.
async fn admission(shared: &Arc<Shared>, id: PeerId, conn: &Connection) -> Result<bool> {
    let first = tokio::time::timeout(HELLO_DEADLINE, receive(conn, &ADMISSION_LIMITS))
        .await
        .map_err(|_| {
            NetError::Protocol(format!("no hello within {HELLO_DEADLINE:?} of connecting"))
        })??;
    let Some(frame) = first else {
        return Err(NetError::Connection("left before saying hello".into()));
    };
    let hello = match frame.kind {
        Kind::Hello => true,
        Kind::Join => false,
        kind => {
            return Err(NetError::Protocol(format!(
                "a {kind:?} frame before the hello"
            )))
        }
    };
    handle(shared, id, frame).await?;
    Ok(hello)
}

/// Waits for a connection to end; a peer that sends anything more breaks the protocol.
async fn conn_closed(conn: &Connection) -> Result<()> {
    match receive(conn, &ADMISSION_LIMITS).await? {
        None => Ok(()),
        Some(frame) => Err(NetError::Protocol(format!(
            "a {:?} frame after a join (join on a connection of its own)",
            frame.kind
        ))),
    }
}

/// Whether the peer hung up to reconnect at once (the open round then waits for its rank).
fn departure(conn: &Connection) -> Departure {
    match conn.close_reason() {
        Some(quinn::ConnectionError::ApplicationClosed(c))
            if c.error_code == quinn::VarInt::from_u32(close::RECONNECTING) =>
        {
            Departure::Reconnecting
        }
        _ => Departure::Left,
    }
}

/// Saves the shard to its state folder, if it has one: `round`'s replies first, then the
/// state that names them. Returns whether the shard may go on: one that cannot save stops
/// (closing every connection, [`Server::run`] returning why) rather than reply past what it
/// saved, so that started again it resumes from its last good save and no worker is ahead
/// of it.
fn persist(shared: &Shared, state: &ShardState, round: Option<&ClosedRound>) -> bool {
    let Some((dir, job)) = &shared.durable else {
        return true;
    };
    let started = std::time::Instant::now();
    let saved = round
        .map_or(Ok(()), |r| {
            dir.write_round(r.step, &r.replies, &r.summary())
        })
        .and_then(|()| state.saved(job))
        .and_then(|s| {
            dir.write_state(&s)?;
            Ok(s.first_logged)
        });
    match saved {
        Ok(first_logged) => {
            dir.prune_rounds_before(first_logged);
            tracing::debug!(
                "shard {}: state of round {} saved in {:?}",
                shared.options.shard,
                state.open_step(),
                started.elapsed()
            );
            true
        }
        Err(e) => {
            let why = format!(
                "the state of round {} could not be saved, so the shard stopped before \
                 replying: {e}",
                state.open_step()
            );
            tracing::error!("shard {}: {why}", shared.options.shard);
            shared.fatal.lock().expect("fatal lock").get_or_insert(why);
            shared
                .endpoint
                .close(quinn::VarInt::from_u32(close::DONE), b"the shard stopped");
            false
        }
    }
}

/// Takes a snapshot (or, on shards other than 0, its notice): a durable shard writes the
/// snapshot before it adopts it, so its state never names a snapshot its folder lacks; one it
/// cannot write is not adopted (the log keeps the rounds it would have covered).
fn keep_snapshot(shared: &Shared, id: PeerId, frame: Frame) -> Result<Option<(u64, Bytes)>> {
    if let Some(digest_of) = &shared.options.snapshot_digest {
        if !check_snapshot_digest(shared, digest_of, &frame)? {
            return Ok(None);
        }
    }
    let mut state = lock(shared);
    state.check_snapshot(id, frame.step)?;
    if let (false, Some((dir, _))) = (frame.payload.is_empty(), &shared.durable) {
        if let Err(e) = dir.write_snapshot(frame.step, &frame.payload) {
            tracing::error!(
                "shard {}: the snapshot of round {} was not saved, nor kept: {e}",
                shared.options.shard,
                frame.step
            );
            return Ok(None);
        }
    }
    let kept = state.snapshot(id, frame.step, frame.payload)?;
    // The log got shorter (on every shard): the state says so (a shard that cannot save
    // stops).
    persist(shared, &state, None);
    Ok(kept)
}

/// Holds a snapshot to the replicas' model: its parameters must hash to the digest more than
/// half of the workers reported entering its round (a snapshot is sent once its round has
/// confirmed the sender's replica). A snapshot of another model, or of other parameters, is
/// refused with an error (the sender is hung up on); one whose round left no majority on
/// record is dropped with a warning (the log keeps the rounds it would have covered).
fn check_snapshot_digest(
    shared: &Shared,
    digest_of: &SnapshotDigest,
    frame: &Frame,
) -> Result<bool> {
    let step = frame.step;
    if frame.payload.is_empty() {
        return Err(NetError::Protocol(format!(
            "an empty snapshot of round {step} (shard {} keeps the model)",
            shared.options.shard
        )));
    }
    let digest = digest_of
        .of(&frame.payload)
        .map_err(|e| NetError::Protocol(format!("the snapshot of round {step}: {e}")))?;
    match lock(shared).majority_digest(step) {
        Some(majority) if majority == digest => Ok(true),
        Some(majority) => Err(NetError::Protocol(format!(
            "the snapshot of round {step} holds parameters with digest {digest:x}, not the \
             replicas' ({majority:x})"
        ))),
        None => {
            shared.warnings.warn("snapshot", || {
                format!(
                    "shard {}: the snapshot of round {step} was dropped: no majority of replica \
                     digests on record for that round",
                    shared.options.shard
                )
            });
            Ok(false)
        }
    }
}

async fn handle(shared: &Arc<Shared>, id: PeerId, frame: Frame) -> Result<()> {
    match frame.kind {
        Kind::Hello => {
            let hello: Hello = frame.message()?;
            let options = &shared.options;
            if (hello.shard, hello.shards) != (options.shard, options.shards) {
                return Err(NetError::Protocol(format!(
                    "the worker takes this server for shard {} of {}; it is shard {} of {} (same --connect order on every worker?)",
                    hello.shard, hello.shards, options.shard, options.shards
                )));
            }
            let peer =
                held(shared, id).ok_or_else(|| NetError::Identity("the peer left".into()))?;
            let identity = peer.fingerprint;
            if options.job.is_some() && options.shard != 0 {
                // Shard 0 gave out the ranks: the hello must show its ticket for this one.
                let ticket = hello.ticket.as_ref().ok_or_else(|| {
                    NetError::Protocol(format!(
                        "rank {} comes without shard 0's ticket: join the job first",
                        hello.rank
                    ))
                })?;
                let verifier = client_verifier(&shared.creds.lock().expect("creds lock"))?;
                ticket.check(
                    verifier.as_ref(),
                    &peer.cert,
                    &shared.job_digest,
                    hello.rank,
                    hello.world,
                )?;
                if let Some(held) = shared.conns.lock().expect("conns lock").get_mut(&id) {
                    held.issuer = Some(ticket.issuer.clone());
                }
            }
            let replaced = {
                let mut state = lock(shared);
                state.check_rank(&identity, hello.rank)?;
                state.hello(id, &hello)?
            };
            tracing::info!(
                "shard {}: peer {} is rank {} of {} ({:?})",
                options.shard,
                identity,
                hello.rank,
                hello.world,
                hello.node
            );
            if let Some(old) = replaced.and_then(|old| conn_of(shared, old)) {
                hang_up(&old, close::REPLACED, "a newer connection took this rank");
            }
        }
        Kind::Register => {
            let register: Register = frame.message()?;
            let answers = lock(shared).register(id, &register)?;
            for (peer, registered) in answers {
                if let Some(conn) = conn_of(shared, peer) {
                    let frame =
                        Frame::control(Kind::Registered, shared.options.shard, 0, &registered);
                    tokio::spawn(async move { send(&conn, frame).await });
                }
            }
        }
        Kind::Push => on_push(shared, id, frame).await?,
        Kind::Digest => {
            let digest: ReplicaDigest = frame.message()?;
            let complete = {
                let mut state = lock(shared);
                state.record_digest(id, frame.step, digest.digest)?;
                state.round_complete()
            };
            // The digest may be the last thing a round waited for.
            if complete {
                let shared = shared.clone();
                tokio::spawn(async move { close_round_if_complete(&shared).await });
            } else {
                arm_quorum(shared);
            }
        }
        Kind::Participants => {
            let relayed: Participants = frame.message()?;
            if shared.options.job.is_some() {
                // The relaying worker's ticket named shard 0's key: its word must carry it.
                let issuer = held(shared, id).and_then(|h| h.issuer).ok_or_else(|| {
                    NetError::Protocol("shard 0's participants relayed before a hello".into())
                })?;
                // Every worker relays the same word: one check of it does for all.
                let mut last = shared.last_word.lock().expect("last_word lock");
                if !last
                    .as_ref()
                    .is_some_and(|(step, word)| *step == frame.step && *word == relayed)
                {
                    check_participants(&issuer, &shared.job_digest, frame.step, &relayed)?;
                    *last = Some((frame.step, relayed.clone()));
                }
            }
            let complete = {
                let mut state = lock(shared);
                state.follow(id, frame.step, &relayed)?;
                state.round_complete()
            };
            // The participants may be the last thing a follower's round waited for.
            if complete {
                let shared = shared.clone();
                tokio::spawn(async move { close_round_if_complete(&shared).await });
            }
        }
        Kind::Snapshot => {
            // Files are written off the runtime's threads.
            let worker = shared.clone();
            let kept = tokio::task::spawn_blocking(move || keep_snapshot(&worker, id, frame))
                .await
                .map_err(|e| NetError::Connection(format!("snapshot task: {e}")))??;
            if let (Some(kept), Some(sink)) = (kept, &shared.options.snapshots) {
                // The receiver writes it to disk; if it has gone, nobody asked.
                let _ = sink.send(kept);
            }
        }
        Kind::CatchupRequest => {
            let _: CatchupRequest = frame.message()?;
            let reply = lock(shared).catchup(id)?;
            if let Some(conn) = conn_of(shared, id) {
                tokio::spawn(send_catchup(shared.options.shard, conn, reply));
            }
        }
        Kind::Join => {
            let join: Join = frame.message()?;
            let options = &shared.options;
            let Some(job) = &options.job else {
                return Err(NetError::Protocol(
                    "this server was started without a job; give the worker the job's flags".into(),
                ));
            };
            if options.shard != 0 {
                return Err(NetError::Protocol(format!(
                    "only shard 0 hands out the job; this is shard {} (list shard 0 first in --connect)",
                    options.shard
                )));
            }
            let peer =
                held(shared, id).ok_or_else(|| NetError::Identity("the peer left".into()))?;
            let identity = &peer.fingerprint;
            let rank = {
                let mut state = lock(shared);
                let (rank, new) = state.assign_rank(identity)?;
                // A rank the shard could not save is not handed out (the shard stops).
                if new && !persist(shared, &state, None) {
                    return Err(NetError::State("the shard could not save its state".into()));
                }
                rank
            };
            tracing::info!(
                "shard 0: {identity} ({:?}) joins the job as rank {rank} of {}",
                join.node.chars().take(128).collect::<String>(),
                job.world
            );
            let signer = shared.signer.as_ref().expect("shard 0 of a job signs");
            let welcome = Welcome {
                rank,
                world: job.world,
                job: job.description.clone(),
                ticket: signer.sign(rank, job.world, &shared.job_digest, &peer.cert)?,
                signature: job.signature.clone(),
            };
            let frame = Frame::control(Kind::Welcome, options.shard, 0, &welcome);
            tokio::spawn(async move { send(&peer.conn, frame).await });
        }
        Kind::Registered | Kind::Reply | Kind::Catchup | Kind::Welcome | Kind::Closed => {
            return Err(NetError::Protocol(format!(
                "a worker sent a {:?} frame, which only servers send",
                frame.kind
            )))
        }
        Kind::Probe => {
            // Read to its end already (which is what the worker timed): only its size counts.
            if frame.payload.len() > PROBE_MAX {
                return Err(NetError::Protocol(format!(
                    "a probe of {} bytes (at most {PROBE_MAX})",
                    frame.payload.len()
                )));
            }
        }
        Kind::Stage | Kind::Meet | Kind::Introduce => {
            return Err(NetError::Protocol(format!(
                "a pipeline's {:?} frame sent to a parameter server",
                frame.kind
            )))
        }
    }
    Ok(())
}

async fn on_push(shared: &Arc<Shared>, id: PeerId, frame: Frame) -> Result<()> {
    let Frame {
        rank,
        key,
        step,
        numel,
        payload,
        ..
    } = frame;
    let decoder = {
        let mut state = lock(shared);
        if state.rank_of(id).is_some_and(|r| r != rank) {
            return Err(NetError::Protocol(format!(
                "a push signed rank {rank} on rank {}'s connection",
                state.rank_of(id).unwrap_or_default()
            )));
        }
        match state.check_push(id, key, step, numel)? {
            PushCheck::Ignore => {
                tracing::debug!(
                    "shard {}: late push for closed step {step} ignored",
                    state.shard
                );
                return Ok(());
            }
            PushCheck::Decode(d) => d,
        }
    };
    // Decode and add up off this connection's reader, so that one worker's partitions are
    // decoded side by side on the blocking pool; the checks above kept the peer's order.
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Err(e) = decode_and_insert(&shared, id, key, step, decoder, payload).await {
            if let Some(peer) = held(&shared, id) {
                shared.warnings.warn("protocol", || {
                    format!(
                        "shard {}: dropping peer {} (rank {rank}): {e}",
                        shared.options.shard, peer.fingerprint
                    )
                });
                hang_up(&peer.conn, close::PROTOCOL, &e.to_string());
            }
        }
    });
    Ok(())
}

async fn decode_and_insert(
    shared: &Arc<Shared>,
    id: PeerId,
    key: Key,
    step: u64,
    decoder: PushDecoder,
    payload: Vec<u8>,
) -> Result<()> {
    let values = tokio::task::spawn_blocking(move || {
        let (samples, codes) = split_push(&payload)?;
        decoder
            .decode(samples, codes)
            .map_err(|e| NetError::Protocol(format!("key {key:#x}: {e}")))
    })
    .await
    .map_err(|e| NetError::Connection(format!("decoding task: {e}")))??;
    let (attempt, complete) = {
        let mut state = lock(shared);
        let before = state.attempt();
        let counted = state.insert_push(id, key, step, values)?;
        let began = (state.attempt() != before).then(|| state.attempt());
        (began, counted && state.round_complete())
    };
    if let Some(attempt) = attempt {
        start_deadline(shared.clone(), step, attempt);
    }
    if complete {
        close_round_if_complete(shared).await;
    } else {
        arm_quorum(shared);
    }
    Ok(())
}

/// Arms the open round's quorum deadline if it has just reached its quorum: when it passes,
/// the round closes over the members that pushed.
fn arm_quorum(shared: &Arc<Shared>) {
    let (step, armed) = {
        let mut state = lock(shared);
        (state.open_step(), state.arm_quorum(shared.options.deadline))
    };
    let Some((ticket, wait)) = armed else {
        return;
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        close_round_by(&shared, move |state| state.close_on_quorum(step, ticket)).await;
    });
}

/// Evicts whoever has not finished round `step` when its deadline passes.
fn start_deadline(shared: Arc<Shared>, step: u64, attempt: u64) {
    tokio::spawn(async move {
        tokio::time::sleep(shared.options.deadline).await;
        // A round with its quorum closes over those who pushed, whatever its quorum wait
        // has left; only a round without one drops its stragglers.
        close_round_by(&shared, move |s| s.close_at_deadline(step, attempt)).await;
        let late = lock(&shared).evict_stragglers(step, attempt);
        for id in late {
            if let Some(peer) = held(&shared, id) {
                tracing::warn!(
                    "shard {}: evicting {} for missing the {:?} deadline of step {step}",
                    shared.options.shard,
                    peer.fingerprint,
                    shared.options.deadline
                );
                hang_up(
                    &peer.conn,
                    close::DEADLINE,
                    &format!("missed the deadline of step {step}; rejoin to catch up"),
                );
            }
        }
        close_round_if_complete(&shared).await;
        // Still open with pushes in it: the next deadline, so a begun round always has one.
        let again = lock(&shared).rearm(step);
        if let Some(next) = again {
            start_deadline(shared, step, next);
        }
    });
}

/// Closes the open round if every active rank has pushed, on the blocking pool, and sends the
/// replies to every registered peer.
async fn close_round_if_complete(shared: &Arc<Shared>) {
    close_round_by(shared, ShardState::close_round).await
}

/// Closes the open round if `close` does (under the state's lock, on the blocking pool),
/// saves it, and sends the replies to every registered peer.
async fn close_round_by(
    shared: &Arc<Shared>,
    close: impl FnOnce(&mut ShardState) -> Option<ClosedRound> + Send + 'static,
) {
    let worker = shared.clone();
    let closed = tokio::task::spawn_blocking(move || {
        let mut state = lock(&worker);
        let round = close(&mut state);
        // Saved before any worker sees the reply: no worker gets ahead of the saved state.
        // A shard that cannot save replies to nobody.
        let round = round.filter(|r| persist(&worker, &state, Some(r)));
        (round, state.listeners())
    })
    .await;
    match closed {
        Ok((Some(round), listeners)) => {
            report_late(shared, &round);
            if !round.diverged.is_empty() {
                let majority = round.replicas.and_then(|v| v.majority);
                tracing::error!(
                    "shard {}: replicas differ entering round {}: ranks and digests {:x?} against \
                     {}; those workers stop",
                    shared.options.shard,
                    round.step,
                    round.diverged,
                    majority.map_or("no majority".into(), |d| format!("the majority's {d:x}"))
                );
            }
            for fault in &round.faults {
                tracing::error!(
                    "shard {}: round {} of {fault}; the key closed with no update",
                    shared.options.shard,
                    round.step
                );
            }
            report_outliers(shared, &round);
            deliver(shared, &round, &listeners)
        }
        Ok((None, _)) => {}
        // The shard is stopping: its runtime cancels what is still running.
        Err(e) if e.is_cancelled() => {}
        Err(e) => tracing::error!("shard {}: closing task failed: {e}", shared.options.shard),
    }
}

/// Names the workers whose pushes stood out in the round (rate-limited), and hangs up on
/// those it evicted.
fn report_outliers(shared: &Shared, round: &ClosedRound) {
    let shard = shared.options.shard;
    let identity = |rank: u16| {
        let peer = lock(shared).peer_of(rank).and_then(|id| held(shared, id));
        match peer {
            Some(h) => (h.fingerprint, Some(h.conn)),
            None => ("?".to_string(), None),
        }
    };
    for &(rank, ratio) in &round.outliers {
        let (who, _) = identity(rank);
        shared.warnings.warn("outlier", || {
            format!(
                "shard {shard}: round {}: rank {rank} ({who}) pushed {ratio:.1} times as far \
                 from the result as the median push",
                round.step
            )
        });
    }
    for &(rank, cosine) in &round.misaligned {
        let (who, _) = identity(rank);
        shared.warnings.warn("misaligned", || {
            format!(
                "shard {shard}: round {}: rank {rank} ({who}) has pushed against the others \
                 lately (cosine {cosine:.2} between its recent pushes and theirs)",
                round.step
            )
        });
    }
    for &rank in &round.evicted {
        let (who, conn) = identity(rank);
        tracing::warn!(
            "shard {shard}: evicting rank {rank} ({who}): its pushes stood out (far from the others', or against them) \
             in {STRIKES_TO_EVICT} more rounds than not"
        );
        if let Some(conn) = conn {
            hang_up(
                &conn,
                close::PROTOCOL,
                "evicted: your pushes kept standing far from the other workers'",
            );
        }
    }
}

/// Says which members the rounds close without, when that changes (not every round: a slow
/// worker would fill the log).
fn report_late(shared: &Shared, round: &ClosedRound) {
    let shard = shared.options.shard;
    let mut last = shared.last_late.lock().expect("last_late lock");
    if *last == round.late {
        return;
    }
    if round.late.is_empty() {
        tracing::info!(
            "shard {shard}: round {} closed with every member again",
            round.step
        );
    } else {
        tracing::info!(
            "shard {shard}: round {} closed on a quorum of {} without ranks {:?}, whose pushes \
             came too late (so do the next rounds until this changes)",
            round.step,
            round.participants.len(),
            round.late
        );
    }
    last.clone_from(&round.late);
}

/// The header of each of a round's replies; the payloads are shared, never copied.
fn reply_headers(shard: u16, round: &ClosedRound) -> Vec<(Header, Bytes)> {
    round
        .replies
        .iter()
        .map(|(key, numel, payload)| {
            let header = Header {
                kind: Kind::Reply,
                rank: shard,
                key: *key,
                step: round.step,
                numel: *numel,
                len: payload.len(),
            };
            (header, payload.clone())
        })
        .collect()
}

/// The round's [`crate::wire::Closed`] summary as a frame to send after its replies.
fn summary_frame(shard: u16, round: &ClosedRound) -> (Header, Bytes) {
    let frame = Frame::control(Kind::Closed, shard, round.step, &round.summary());
    (frame.header(), Bytes::from(frame.payload))
}

/// Rounds of replies a listener may leave untaken (its flow control full) before the shard
/// drops it. An honest worker takes a round's replies before it pushes the next round, and
/// catching up it takes the logged rounds first: this leaves it far more than it needs,
/// while a peer that pushes and never reads can pin no more than this many rounds' reply
/// buffers (each send holds its round's bytes until the peer takes them).
pub const MAX_UNSENT_ROUNDS: usize = 64;

/// Sends one round's replies to every listener, the same bytes to each: one stream per reply,
/// then the round's [`crate::wire::Closed`] summary. A listener that has left
/// [`MAX_UNSENT_ROUNDS`] rounds untaken is dropped instead.
fn deliver(shared: &Shared, round: &ClosedRound, listeners: &[PeerId]) {
    let shard = shared.options.shard;
    let mut replies = reply_headers(shard, round);
    replies.push(summary_frame(shard, round));
    for id in listeners {
        let Some((conn, unsent)) = shared
            .conns
            .lock()
            .expect("conns lock")
            .get(id)
            .map(|h| (h.conn.clone(), h.unsent.clone()))
        else {
            continue;
        };
        let waiting = unsent.load(Ordering::Relaxed);
        if waiting >= MAX_UNSENT_ROUNDS * replies.len() {
            let rank = lock(shared).rank_of(*id);
            shared.warnings.warn("not reading", || {
                format!(
                    "shard {shard}: dropping rank {rank:?} from {}: it has not taken \
                     {waiting} reply frames of its last {MAX_UNSENT_ROUNDS} rounds",
                    conn.remote_address()
                )
            });
            hang_up(
                &conn,
                close::PROTOCOL,
                &format!("{MAX_UNSENT_ROUNDS} rounds of replies not taken"),
            );
            continue;
        }
        unsent.fetch_add(replies.len(), Ordering::Relaxed);
        for (header, payload) in &replies {
            let (conn, header, payload) = (conn.clone(), *header, payload.clone());
            let unsent = unsent.clone();
            tokio::spawn(async move {
                let sent = send_parts(&conn, &header, payload).await;
                unsent.fetch_sub(1, Ordering::Relaxed);
                sent
            });
        }
    }
}

async fn send_catchup(shard: u16, conn: Connection, reply: CatchupReply) -> Result<()> {
    let CatchupReply {
        snapshot,
        rounds,
        summary,
    } = reply;
    if let Some((step, bytes)) = snapshot {
        let header = Header {
            kind: Kind::Snapshot,
            rank: shard,
            key: 0,
            step,
            numel: 0,
            len: bytes.len(),
        };
        send_parts(&conn, &header, bytes).await?;
    }
    for round in &rounds {
        let summary = summary_frame(shard, round);
        for (header, payload) in reply_headers(shard, round).into_iter().chain([summary]) {
            send_parts(&conn, &header, payload).await?;
        }
    }
    send(&conn, Frame::control(Kind::Catchup, shard, 0, &summary)).await
}
