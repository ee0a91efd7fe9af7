//! The state of one parameter-server shard, without sockets: who is connected, which keys it
//! owns, which ranks have pushed in the open round, the closed rounds a rejoining worker can
//! replay, and the latest snapshot. The server feeds it events and carries out what it returns,
//! so every rule of the protocol lives here and is tested without a network.
//!
//! Rules:
//! - A peer says `Hello` (its rank and the world size), then `Register`s the keys this shard
//!   owns. Every rank must register the same keys.
//! - Before the first round the shard waits for `world` ranks (or the job's `start_with`) to
//!   register (start barrier). A rank that registers later is a *listener*: it receives every reply from then on and may
//!   ask for a catch-up; it becomes *active* with its first push for the open round.
//! - A round closes when every member (active or expected rank) has pushed every key; or
//!   once a quorum of members has, after the quorum's adaptive wait ([`super::quorum`]), over
//!   the ranks that did (the others' pushes of the round are discarded; they stay members);
//!   or at its hard deadline, when the active ranks that have not finished are evicted
//!   (their pushes discarded, their connection closed), the expected ones are given up on, and
//!   the round closes over the ranks that did.
//! - A shard other than 0 is a *follower*: it never closes a round on a quorum of its own.
//!   It closes each round over shard 0's participants, which the workers relay to it
//!   ([`ShardState::follow`]), once each of them has pushed every key there; the pushes of
//!   other ranks are discarded, as late. So a worker's push counts on every shard or on none,
//!   and shard 0's count of the samples seen holds for every key. At its hard deadline a
//!   follower with shard 0's participants closes over those of them that finished (logged:
//!   then a participant's push is missing here).
//! - Expected ranks are those the round waits for without a connection: an active rank that
//!   hung up to reconnect at once (it lost another shard) or whose connection a newer one
//!   replaced, and, after a restart from the state folder, the ranks of the last saved round.
//!   A rank that said goodbye, or went silent past the peer timeout, is not waited for.
//! - A push for a step after the open one breaks the protocol; a push for a closed step is
//!   ignored and counted (a worker that missed the reply sends its round again).
//! - With a state folder ([`super::durable`]) the shard saves itself after every round closes,
//!   before replying, and [`ShardState::restore`] takes it back.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::durable::{Loaded, SavedShard};
use super::job_checks::LayoutCheck;
use super::queue::{QueueSpec, SampleQueue};
use super::quorum::{PushTimes, QuorumRule};
use crate::ticket::TicketSigner;
use bytes::Bytes;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::history::Alignment;
use murmur_engine::comm::push::Push;
use murmur_engine::comm::shard::{KeyState, PushDecoder};
use murmur_engine::comm::Key;
use std::sync::Arc;

use crate::error::{NetError, Result};
use crate::wire::{
    Assignment, Catchup, Closed, Hello, Limits, Participants, Register, Registered, ReplicaVerdict,
};

/// A connection's identity inside the server.
pub type PeerId = usize;

/// What shard 0 does with a round's participants once it has decided them: (the round, its
/// participants as the followers get them, the peers listening).
pub type Decided = Box<dyn Fn(u64, Participants, Vec<PeerId>) + Send>;

/// Shard 0's key, with the digest of the job, to sign each round's participants
/// ([`TicketSigner::sign_participants`]).
pub type RelaySigner = (Arc<TicketSigner>, Vec<u8>);

#[derive(Debug, Clone)]
struct Peer {
    rank: u16,
    registered: bool,
    active: bool,
}

/// A round the shard has closed: the reply payload of each key, identical for every rank.
#[derive(Debug, Clone)]
pub struct ClosedRound {
    /// The round this is: the step that every push of it carried.
    pub step: u64,
    /// One entry per key owned by this shard: the key, its element count and the encoded reply
    /// payload.
    pub replies: Vec<(Key, u32, Bytes)>,
    /// Keys whose arithmetic failed this round, with why: they closed with an update that
    /// changes nothing ([`KeyState::close_or_skip`]), and the server reports them.
    pub faults: Vec<String>,
    /// The ranks whose pushes the round summed, ascending.
    pub participants: Vec<u16>,
    /// Members the round closed without, on its quorum: their pushes were discarded.
    pub late: Vec<u16>,
    /// How the replica digests of the round compared, if any arrived (shard 0).
    pub replicas: Option<ReplicaVerdict>,
    /// The ranks whose replica digest was not the majority's (all that sent one when no
    /// digest had a majority): their replicas went astray.
    pub diverged: Vec<(u16, u64)>,
    /// The next round's assignment (shard 0 of a job with a sample queue).
    pub next: Option<Assignment>,
    /// Shard 0 of several: the participants it sent the followers (signed where it serves a
    /// job), for the workers to relay.
    pub relay: Option<Participants>,
    /// Ranks whose pushes stood out on some key (robust aggregation rules), with the largest
    /// multiple of the median push's distance.
    pub outliers: Vec<(u16, f32)>,
    /// Ranks whose push history (over the shard's keys) points against the other ranks'
    /// ([`murmur_engine::comm::history`]), with the cosine: a strike each, as for outliers.
    pub misaligned: Vec<(u16, f32)>,
    /// Ranks evicted this round: their pushes stood out in [`STRIKES_TO_EVICT`] more rounds
    /// than not, or their histories pointed against the others' in
    /// [`MISALIGNED_STRIKES_TO_EVICT`] more rounds than not. The server hangs up on them; their hellos are refused from now on.
    pub evicted: Vec<u16>,
}

impl ClosedRound {
    /// What the workers are told of the round after its replies.
    pub fn summary(&self) -> Closed {
        Closed {
            participants: self.participants.clone(),
            replicas: self.replicas,
            next: self.next.clone(),
            relay: self.relay.clone(),
        }
    }
}

/// What a rejoining peer is sent: the snapshot this shard holds, every logged round since,
/// and the summary that ends the catch-up.
pub struct CatchupReply {
    /// The latest snapshot this shard holds as (step, bytes), if rank 0 has sent one.
    pub snapshot: Option<(u64, Bytes)>,
    /// Every round logged since the snapshot, oldest first.
    pub rounds: Vec<ClosedRound>,
    /// The summary frame that ends the catch-up, naming the snapshot step and the range of logged
    /// rounds.
    pub summary: Catchup,
}

/// How a connection ended, which decides whether the open round waits for its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Goodbye, a pause, a protocol error or silence past the peer timeout: the rounds go on
    /// without the rank.
    Left,
    /// It hung up to reconnect at once: the open round waits for it (up to its deadline).
    Reconnecting,
}

/// What the server must do with a push once it has checked it.
pub enum PushCheck {
    /// A listener's push for a round that already closed: drop it quietly.
    Ignore,
    /// Decode the payload (off the state lock) with this, then [`ShardState::insert_push`].
    Decode(PushDecoder),
}

/// The whole state of one shard.
pub struct ShardState {
    /// This shard's index among the parameter servers.
    pub shard: u16,
    limits: Limits,
    world: Option<u16>,
    keys: BTreeMap<Key, KeyState>,
    /// Set by the first registration; later ones must match it.
    keys_fixed: bool,
    peers: BTreeMap<PeerId, Peer>,
    started: bool,
    open_step: u64,
    /// Keys each rank has pushed in the open round.
    pushed: BTreeMap<u16, usize>,
    /// Closed rounds since the latest snapshot, oldest first, at most `max_log_rounds`.
    log: VecDeque<ClosedRound>,
    max_log_rounds: usize,
    snapshot: Option<(u64, Bytes)>,
    /// Ranks handed out by [`ShardState::assign_rank`], by certificate fingerprint.
    assigned: BTreeMap<String, u16>,
    /// Ranks the open round waits for that have no active connection (see the rules above).
    expected: BTreeSet<u16>,
    /// Pushes for rounds that had closed, ignored.
    late_pushes: u64,
    /// Counts deadlines: each first push of a round that had none (again, after leavers
    /// took theirs away) begins an attempt, whose deadline is the only one that counts.
    attempt: u64,
    /// When a round may close without every member.
    quorum: QuorumRule,
    /// Counts quorum deadlines: only the latest one armed may close the round.
    quorum_ticket: u64,
    /// Whether the open round has a quorum deadline pending.
    quorum_armed: bool,
    /// How long ranks took to push in recent rounds.
    push_times: PushTimes,
    /// When the open round opened, if its push times count (not the first round after a
    /// restart, whose pushes wait on reconnections).
    opened: Option<Instant>,
    /// Rounds closed on a quorum, without every member.
    quorum_rounds: u64,
    /// The replica digests of the open round, by rank (workers send them to shard 0).
    digests: BTreeMap<u16, u64>,
    /// Ranks that registered to send a digest each round: theirs counts as pushed only with it.
    digest_senders: BTreeSet<u16>,
    /// Registered ranks that start the first round (the world's size if not set).
    start_with: Option<u16>,
    /// The job's sample positions, handed out round by round (shard 0 of a job with one).
    queue: Option<SampleQueue>,
    /// Whether the job's workers fold a push that came too late into their error feedback
    /// (the queue then counts a late member's share as seen) rather than drop it (its share
    /// goes back to the queue). Set from the job on every start, not saved.
    fold_late: bool,
    /// Shard 0's participants of the open round, as the first worker relayed them (a
    /// follower's rounds close over them).
    decided: Option<BTreeSet<u16>>,
    /// The samples shard 0 counted for each of `decided`: a follower weighs each
    /// participant's pushes by these.
    decided_samples: BTreeMap<u16, u32>,
    /// Shard 0 of a job across several shards: signs the participants it decides.
    relay_signer: Option<RelaySigner>,
    /// Shard 0 of several: told each round's participants (with the listeners) as soon as
    /// they are decided, before the round's sums, to send them on ([`ShardState::on_decided`]).
    on_decided: Option<Decided>,
    /// The samples each rank's pushes of the open round stand for.
    samples: BTreeMap<u16, u32>,
    /// How long after the open round's opening each rank finished it.
    finished_after: BTreeMap<u16, Duration>,
    /// How the keys combine their pushes.
    rule: Aggregate,
    /// Per rank, rounds whose pushes stood out (one more each such round, one less each round
    /// it took part in without), at most [`STRIKES_TO_EVICT`].
    strikes: BTreeMap<u16, u32>,
    /// Per rank, the same count for rounds in which its push history pointed against the
    /// others' ([`MISALIGNED_BELOW`]).
    misalignment_strikes: BTreeMap<u16, u32>,
    /// Ranks evicted for pushes that kept standing out: their hellos are refused.
    evicted: BTreeSet<u16>,
    /// Ranks that left this shard for good (not to reconnect) during the open round before
    /// finishing it: a follower closes without them rather than wait ([`ShardState::follow`]).
    departed: BTreeSet<u16>,
    /// The keys the job says this shard owns: a registration that differs is refused before
    /// anything is built from it, so no peer fixes the layout by registering first.
    layout: Option<LayoutCheck>,
}

/// A rank whose push history has a cosine below this with the other ranks' histories, on a
/// shard's keys, points against them ([`murmur_engine::comm::history`]). Measured with
/// `murmur repro attack` (top-1%, seed 0, the three robust rules, both shards): honest ranks
/// fell below it in at most 4.3% of rounds (their medians are +0.11 to +0.61), a
/// sign-flipping rank in every round (median -0.8), a rank replaying its gradients of 10
/// rounds before in 12-33% (median near 0: with AdamW the model has moved past where those
/// pointed), which the strikes then add up.
pub const MISALIGNED_BELOW: f32 = -0.2;

/// A rank whose history points against the others' in this many more rounds than not is
/// evicted: twice the history's span ([`murmur_engine::comm::history::HISTORY_DECAY`]), since
/// the history of one round is mostly that of the round before, and an honest worker's can
/// point the wrong way for a few rounds running (seen after an attacker's eviction left three:
/// five rounds in a row below the threshold, late in training).
pub const MISALIGNED_STRIKES_TO_EVICT: u32 = 20;

/// A rank whose pushes stand out ([`murmur_engine::comm::aggregate::OUTLIER_RATIO`] times the
/// median push's distance) in this many more rounds than not is evicted.
pub const STRIKES_TO_EVICT: u32 = 5;

fn protocol<T>(message: String) -> Result<T> {
    Err(NetError::Protocol(message))
}

impl ShardState {
    /// An empty shard numbered `shard`, with no keys, peers or world size yet, that keeps at most
    /// `max_log_rounds` closed rounds (at least one) for rejoining workers.
    pub fn new(shard: u16, limits: Limits, max_log_rounds: usize) -> Self {
        ShardState {
            shard,
            limits,
            world: None,
            keys: BTreeMap::new(),
            keys_fixed: false,
            peers: BTreeMap::new(),
            started: false,
            open_step: 0,
            pushed: BTreeMap::new(),
            log: VecDeque::new(),
            max_log_rounds: max_log_rounds.max(1),
            snapshot: None,
            assigned: BTreeMap::new(),
            expected: BTreeSet::new(),
            late_pushes: 0,
            attempt: 0,
            quorum: QuorumRule::default(),
            quorum_ticket: 0,
            quorum_armed: false,
            push_times: PushTimes::default(),
            opened: None,
            quorum_rounds: 0,
            digests: BTreeMap::new(),
            digest_senders: BTreeSet::new(),
            start_with: None,
            queue: None,
            fold_late: false,
            decided: None,
            decided_samples: BTreeMap::new(),
            relay_signer: None,
            on_decided: None,
            samples: BTreeMap::new(),
            finished_after: BTreeMap::new(),
            rule: Aggregate::Mean,
            strikes: BTreeMap::new(),
            misalignment_strikes: BTreeMap::new(),
            evicted: BTreeSet::new(),
            departed: BTreeSet::new(),
            layout: None,
        }
    }

    /// Holds every registration to the job's layout for this shard.
    pub fn set_layout(&mut self, layout: LayoutCheck) {
        self.layout = Some(layout);
    }

    /// Combines every key's pushes by `rule` from the next round on.
    pub fn set_aggregate(&mut self, rule: Aggregate) {
        self.rule = rule;
        for key in self.keys.values_mut() {
            key.set_aggregate(rule);
        }
    }

    /// Hands the job's samples out round by round ([`super::queue`]), unless a restored
    /// state already does. Shard 0 only: refused elsewhere.
    pub fn set_queue(&mut self, spec: QueueSpec) -> Result<()> {
        if self.shard != 0 {
            return protocol(format!(
                "shard {} cannot keep the sample queue: shard 0 does",
                self.shard
            ));
        }
        if self.queue.is_none() {
            self.queue = Some(SampleQueue::new(spec));
        }
        Ok(())
    }

    /// The open round's assignment, where the shard keeps the queue.
    pub fn assignment(&self) -> Option<&Assignment> {
        self.queue.as_ref().map(SampleQueue::open)
    }

    /// The queue's epoch and the positions of it seen so far, where the shard keeps it.
    pub fn queue_progress(&self) -> Option<(u32, u64)> {
        self.queue.as_ref().map(SampleQueue::progress)
    }

    /// Sets when rounds may close without every member (the default is
    /// [`QuorumRule::default`]).
    pub fn set_quorum(&mut self, rule: QuorumRule) {
        self.quorum = rule;
    }

    /// Says whether the job's workers fold their late pushes into their error feedback
    /// (`true`) or drop them (`false`, the default): what the queue does with a late member's
    /// share ([`super::queue::SampleQueue::settle_folding`]).
    pub fn set_fold_late(&mut self, fold: bool) {
        self.fold_late = fold;
    }

    /// The shard as a state folder keeps it ([`super::durable`]), for the job whose
    /// description has the digest `job`. Fails only where a key's memory cannot be read.
    pub fn saved(&self, job: &[u8]) -> Result<SavedShard> {
        let keys = self
            .keys
            .values()
            .map(|k| Ok((k.spec.clone(), k.saved()?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(SavedShard {
            shard: self.shard,
            job: job.to_vec(),
            world: self.world,
            started: self.started,
            open_step: self.open_step,
            keys,
            members: self
                .active_ranks()
                .chain(self.expected.iter().copied())
                .collect(),
            assigned: self.assigned.iter().map(|(f, r)| (f.clone(), *r)).collect(),
            first_logged: self.log.front().map_or(self.open_step, |r| r.step),
            snapshot_step: self.snapshot.as_ref().map(|(s, _)| *s),
            queue: self.queue.clone(),
        })
    }

    /// A shard as its state folder left it: no connections yet, the open round waiting for
    /// the ranks of the last saved one. Refuses a state of another shard or job, or one that
    /// does not hold together.
    pub fn restore(
        shard: u16,
        job: &[u8],
        limits: Limits,
        max_log_rounds: usize,
        loaded: Loaded,
    ) -> Result<Self> {
        let Loaded {
            shard: saved,
            rounds,
            snapshot,
        } = loaded;
        let refuse = |why: String| Err(NetError::State(why));
        if saved.shard != shard {
            return refuse(format!(
                "the folder holds shard {}'s state, not {shard}'s",
                saved.shard
            ));
        }
        if saved.job != job {
            return refuse("the folder holds the state of another job: give this job a folder of its own, or remove the old one".into());
        }
        let specs: Vec<_> = saved.keys.iter().map(|(s, _)| s.clone()).collect();
        Register {
            keys: specs,
            replica_digests: false,
        }
        .check(&limits)?;
        let mut state = ShardState::new(shard, limits, max_log_rounds);
        for (spec, key) in saved.keys {
            let id = spec.key;
            let restored = KeyState::restore(spec, Aggregate::Mean, key)
                .map_err(|e| NetError::State(format!("key {id:#x}: {e}")))?;
            if restored.step != saved.open_step || state.keys.insert(id, restored).is_some() {
                return refuse(format!(
                    "key {id:#x} is not at the open round, or saved twice"
                ));
            }
        }
        state.keys_fixed = !state.keys.is_empty();
        state.world = saved.world;
        state.started = saved.started;
        state.open_step = saved.open_step;
        state.log = rounds
            .into_iter()
            .map(|(step, replies, summary)| ClosedRound {
                step,
                replies,
                faults: Vec::new(),
                participants: summary.participants,
                late: Vec::new(),
                replicas: summary.replicas,
                diverged: Vec::new(),
                next: summary.next,
                relay: summary.relay,
                outliers: Vec::new(),
                misaligned: Vec::new(),
                evicted: Vec::new(),
            })
            .collect();
        if let Some(queue) = &saved.queue {
            queue
                .check()
                .map_err(|why| NetError::State(format!("the sample queue: {why}")))?;
        }
        state.queue = saved.queue;
        state.snapshot = snapshot;
        state.assigned = saved.assigned.into_iter().collect();
        state.expected = saved.members.into_iter().collect();
        Ok(state)
    }

    /// Pushes for rounds that had already closed, ignored since the shard started.
    pub fn late_pushes(&self) -> u64 {
        self.late_pushes
    }

    /// Rounds closed on a quorum, without every member, since the shard started.
    pub fn quorum_rounds(&self) -> u64 {
        self.quorum_rounds
    }

    /// Fixes the world size from the job this shard serves, so that no peer sets it by
    /// connecting first.
    pub fn fix_world(&mut self, world: u16) {
        self.world = Some(world);
    }

    /// Starts the first round once `workers` ranks have registered, instead of the whole
    /// world: the others join the running job when they come.
    pub fn start_with(&mut self, workers: u16) {
        self.start_with = Some(workers);
    }

    /// A rank for the certificate `identity` (its fingerprint), for a worker that joins
    /// knowing only the servers: the rank it had before if it joined earlier, else the lowest
    /// rank never handed out (then with `true`: the assignment is new). A rank stays its certificate's for the server's life (a paused
    /// worker comes back to it), so a job takes at most `world` certificates; freeing the
    /// places of workers that left for good belongs to elastic membership. Needs a fixed world.
    pub fn assign_rank(&mut self, identity: &str) -> Result<(u16, bool)> {
        let Some(world) = self.world else {
            return protocol("this server was started without a job; it assigns no ranks".into());
        };
        if let Some(&rank) = self.assigned.get(identity) {
            return Ok((rank, false));
        }
        let taken: Vec<u16> = self.assigned.values().copied().collect();
        let Some(rank) = (0..world).find(|r| !taken.contains(r)) else {
            return protocol(format!(
                "all {world} worker places of this job are taken by other certificates"
            ));
        };
        self.assigned.insert(identity.to_string(), rank);
        Ok((rank, true))
    }

    /// The open round.
    pub fn open_step(&self) -> u64 {
        self.open_step
    }

    /// Checks that the certificate `identity` may say hello as `rank`: where this shard hands
    /// out ranks, only as the rank it was given, so no certificate takes another's place.
    pub fn check_rank(&self, identity: &str, rank: u16) -> Result<()> {
        if self.assigned.is_empty() {
            return Ok(());
        }
        match self.assigned.get(identity) {
            Some(&r) if r == rank => Ok(()),
            Some(&r) => protocol(format!("this certificate holds rank {r}, not {rank}")),
            None => protocol(format!(
                "rank {rank} was not given to this certificate: join first"
            )),
        }
    }

    /// The peer connected as `rank`, if any.
    pub fn peer_of(&self, rank: u16) -> Option<PeerId> {
        self.peers
            .iter()
            .find(|(_, p)| p.rank == rank)
            .map(|(id, _)| *id)
    }

    /// The rank that peer `id` registered with, or `None` if it is not connected to this shard.
    pub fn rank_of(&self, id: PeerId) -> Option<u16> {
        self.peers.get(&id).map(|p| p.rank)
    }

    /// Registered peers: they receive every reply.
    pub fn listeners(&self) -> Vec<PeerId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.registered)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Counts a strike for each rank of `outliers` and takes one back from every other rank
    /// that took part in the open round; returns the ranks that reached
    /// [`STRIKES_TO_EVICT`], evicted from now on.
    fn strike(&mut self, outliers: &BTreeSet<u16>, misaligned: &BTreeSet<u16>) -> Vec<u16> {
        let mut evicted = Vec::new();
        for &rank in self.pushed.keys() {
            // Two kinds of evidence, counted apart: an honest worker now and then stands
            // out of one round, or points against the others for a round, but not both in
            // turn for long.
            let mut struck_out = false;
            for (counts, stood_out, limit) in [
                (
                    &mut self.strikes,
                    outliers.contains(&rank),
                    STRIKES_TO_EVICT,
                ),
                (
                    &mut self.misalignment_strikes,
                    misaligned.contains(&rank),
                    MISALIGNED_STRIKES_TO_EVICT,
                ),
            ] {
                let strikes = counts.entry(rank).or_insert(0);
                if stood_out {
                    *strikes += 1;
                    struck_out |= *strikes >= limit;
                } else {
                    *strikes = strikes.saturating_sub(1);
                }
            }
            if struck_out && self.evicted.insert(rank) {
                evicted.push(rank);
            }
        }
        evicted
    }

    /// A peer introduces itself. Returns the peer this one replaces (the same rank on an older
    /// connection, which the server must close).
    pub fn hello(&mut self, id: PeerId, hello: &Hello) -> Result<Option<PeerId>> {
        if self.evicted.contains(&hello.rank) {
            return protocol(format!(
                "rank {} was evicted: its pushes stood out (far from the others', or against them) in {STRIKES_TO_EVICT} \
                 more rounds than not",
                hello.rank
            ));
        }
        if self.peers.contains_key(&id) {
            return protocol("a second hello on one connection".into());
        }
        if hello.world == 0 || hello.rank >= hello.world {
            return protocol(format!("rank {} of a world of {}", hello.rank, hello.world));
        }
        if hello.node.len() > 128 {
            return protocol("node name longer than 128 bytes".into());
        }
        match self.world {
            Some(w) if w != hello.world => {
                return protocol(format!("world of {} while this swarm has {w}", hello.world))
            }
            _ => self.world = Some(hello.world),
        }
        let replaced = self
            .peers
            .iter()
            .find(|(_, p)| p.rank == hello.rank)
            .map(|(id, _)| *id);
        if self.is_follower() && replaced.is_none() {
            // Pushes a follower kept after the rank's last connection ended: the rank pushes
            // the open round again if it plays it, and those count instead.
            self.drop_pushes_of(hello.rank);
        }
        self.departed.remove(&hello.rank);
        if let Some(old) = replaced {
            // The newer connection goes on where the old one was: the round waits for it.
            self.disconnect(old, Departure::Reconnecting);
        }
        self.peers.insert(
            id,
            Peer {
                rank: hello.rank,
                registered: false,
                active: false,
            },
        );
        Ok(replaced)
    }

    fn peer(&self, id: PeerId) -> Result<&Peer> {
        match self.peers.get(&id) {
            Some(p) => Ok(p),
            None => protocol("a message before hello".into()),
        }
    }

    /// A peer registers its keys. Returns the peers to answer now, with the answer: the peer
    /// itself once the swarm is underway, everyone waiting at the start barrier when this
    /// registration completes it, or nobody yet.
    pub fn register(
        &mut self,
        id: PeerId,
        register: &Register,
    ) -> Result<Vec<(PeerId, Registered)>> {
        let peer = self.peer(id)?;
        if peer.registered {
            return protocol("registered twice".into());
        }
        let rank = usize::from(peer.rank);
        register.check(&self.limits)?;
        if let Some(layout) = &self.layout {
            layout
                .check(&register.keys)
                .map_err(|e| NetError::Protocol(format!("keys other than the job's: {e}")))?;
        }
        if register.replica_digests && self.shard != 0 {
            return protocol(format!(
                "replica digests go to shard 0, not to shard {}",
                self.shard
            ));
        }
        if !self.keys_fixed {
            let mut keys = BTreeMap::new();
            for spec in &register.keys {
                let state = KeyState::new(spec.clone(), self.rule)
                    .map_err(|e| NetError::Protocol(format!("key {:#x}: {e}", spec.key)))?;
                if keys.insert(spec.key, state).is_some() {
                    return protocol(format!("key {:#x} registered twice", spec.key));
                }
            }
            self.keys = keys;
            self.keys_fixed = true;
        } else {
            // Everything but the push codec must be the first registration's: a worker may
            // compress its own pushes harder (its link), but the replies, the memories and
            // the seed are the swarm's.
            let same = register.keys.len() == self.keys.len()
                && register.keys.iter().all(|s| {
                    self.keys
                        .get(&s.key)
                        .is_some_and(|k| k.spec.same_but_push(s))
                });
            if !same {
                return protocol(
                    "keys differ from those the other ranks registered (same model, codecs and seed?)"
                        .into(),
                );
            }
        }
        // Each push decodes with its sender's codec (the first registration's included: a
        // rank registering again may have changed its own).
        for spec in &register.keys {
            let key = self.keys.get_mut(&spec.key).expect("checked above");
            key.push_codec_of(rank, &spec.push)
                .map_err(|e| NetError::Protocol(e.to_string()))?;
        }
        let started = self.started;
        let peer = self.peers.get_mut(&id).expect("checked above");
        peer.registered = true;
        if register.replica_digests {
            self.digest_senders.insert(peer.rank);
        }
        if started {
            return Ok(vec![(
                id,
                Registered {
                    open_step: self.open_step,
                    underway: true,
                    assignment: self.assignment().cloned(),
                },
            )]);
        }
        let needed = self.start_with.or(self.world).unwrap_or(1) as usize;
        let waiting: Vec<PeerId> = self.listeners();
        if waiting.len() < needed {
            return Ok(Vec::new());
        }
        self.started = true;
        self.opened = Some(Instant::now());
        for id in &waiting {
            self.peers.get_mut(id).expect("listed").active = true;
        }
        let starting: Vec<u16> = self
            .active_ranks()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if let Some(queue) = &mut self.queue {
            queue.assign(&starting);
        }
        let assignment = self.assignment().cloned();
        Ok(waiting
            .into_iter()
            .map(|id| {
                (
                    id,
                    Registered {
                        open_step: 0,
                        underway: false,
                        assignment: assignment.clone(),
                    },
                )
            })
            .collect())
    }

    /// Checks a push's header against the protocol; the payload is decoded afterwards.
    pub fn check_push(&mut self, id: PeerId, key: Key, step: u64, numel: u32) -> Result<PushCheck> {
        let peer = self.peer(id)?;
        if !peer.registered || !self.started {
            return protocol("push before registration completed".into());
        }
        let Some(entry) = self.keys.get(&key) else {
            return protocol(format!("unknown key {key:#x}"));
        };
        if numel != entry.spec.numel {
            return protocol(format!(
                "wrong size: {numel} elements for key {key:#x}, which has {}",
                entry.spec.numel
            ));
        }
        if step < self.open_step {
            self.late_pushes += 1;
            return Ok(PushCheck::Ignore);
        }
        if step > self.open_step {
            return protocol(format!(
                "push for step {step}, ahead of the open round {}",
                self.open_step
            ));
        }
        // push_decoder refuses a second push of the round.
        let decoder = entry
            .push_decoder(peer.rank as usize, step)
            .map_err(|e| NetError::Protocol(e.to_string()))?;
        Ok(PushCheck::Decode(decoder))
    }

    /// Keeps a decoded push. Returns false when the push no longer counts (the round closed or
    /// the peer left while it was being decoded).
    pub fn insert_push(&mut self, id: PeerId, key: Key, step: u64, push: Push) -> Result<bool> {
        if step != self.open_step {
            return Ok(false);
        }
        let Some(rank) = self.peers.get(&id).map(|p| p.rank) else {
            return Ok(false);
        };
        let samples = push.samples;
        match (self.samples.get(&rank), &self.queue) {
            (Some(&before), _) if before != samples => {
                return protocol(format!(
                    "rank {rank}'s pushes of step {step} stand for {before} and {samples} samples"
                ));
            }
            // The rank's first push of the round is checked against its share; the others
            // against the first.
            (None, Some(queue)) => {
                let share = queue.open().share_of(rank).map_or(0, |(s, _)| s.samples());
                if samples != 0 && u64::from(samples) != share {
                    return protocol(format!(
                        "rank {rank}'s push of step {step} stands for {samples} samples, its share is {share}"
                    ));
                }
            }
            _ => {}
        }
        let peer = self.peers.get_mut(&id).expect("found above");
        let entry = self.keys.get_mut(&key).expect("checked before decoding");
        entry
            .insert(peer.rank as usize, push)
            .map_err(|e| NetError::Protocol(e.to_string()))?;
        self.samples.insert(rank, samples);
        if !peer.active {
            tracing::info!(
                "shard {}: rank {} rejoins the rounds at step {step}",
                self.shard,
                peer.rank
            );
            peer.active = true;
            self.expected.remove(&peer.rank);
        }
        if self.pushed.is_empty() {
            self.attempt += 1;
        }
        *self.pushed.entry(rank).or_default() += 1;
        if let (true, Some(opened)) = (self.finished(rank), self.opened) {
            let after = opened.elapsed();
            self.push_times.record(after);
            self.finished_after.insert(rank, after);
        }
        Ok(true)
    }

    /// Keeps the digest of the replica with which peer `id` enters round `step`, to compare
    /// with the others' when the round closes. A digest for a closed round is ignored.
    pub fn record_digest(&mut self, id: PeerId, step: u64, digest: u64) -> Result<()> {
        let peer = self.peer(id)?;
        if !peer.registered || !self.started {
            return protocol("a replica digest before registration completed".into());
        }
        if step > self.open_step {
            return protocol(format!(
                "replica digest for step {step}, ahead of the open round {}",
                self.open_step
            ));
        }
        if step == self.open_step {
            let rank = peer.rank;
            let first = self.digests.insert(rank, digest).is_none();
            if let (true, true, Some(opened)) = (first, self.finished(rank), self.opened) {
                let after = opened.elapsed();
                self.push_times.record(after);
                self.finished_after.insert(rank, after);
            }
        }
        Ok(())
    }

    /// Has `decided` called with each round's participants the moment this shard decides
    /// them, before it sums the round's pushes: shard 0 of several sends them to the workers,
    /// who relay them to the other shards, so that those close the round beside this one
    /// rather than after its sums.
    pub fn on_decided(&mut self, decided: Decided) {
        self.on_decided = Some(decided);
    }

    /// Shard 0 signs the participants it decides with `signer`, for the job of digest `job`.
    pub fn sign_participants_with(&mut self, signer: Arc<TicketSigner>, job: Vec<u8>) {
        self.relay_signer = Some((signer, job));
    }

    /// Whether this shard closes its rounds over shard 0's participants (every shard but 0).
    pub fn is_follower(&self) -> bool {
        self.shard != 0
    }

    /// Shard 0's participants of round `step`, relayed by peer `id` (a worker that received
    /// shard 0's summary of it; the server checked shard 0's signature): the open round of a
    /// follower closes over them, weighing each participant's pushes by the samples shard 0
    /// counted, and the rounds before shard 0's snapshot leave the log. The first relay of
    /// the open round counts; one naming other ranks is logged and ignored, as are relays of
    /// other rounds (the replayed summaries of a catch-up) and those of peers not yet
    /// registered. Shard 0 refuses them.
    pub fn follow(&mut self, id: PeerId, step: u64, relayed: &Participants) -> Result<()> {
        if !self.is_follower() {
            return protocol(
                "shard 0's participants relayed to shard 0, which decides them".into(),
            );
        }
        if relayed.samples.len() != relayed.ranks.len() {
            return protocol(format!(
                "shard 0's participants of round {step}: {} ranks, {} sample counts",
                relayed.ranks.len(),
                relayed.samples.len()
            ));
        }
        // Frames travel on streams of their own: a relay may overtake the sender's hello or
        // registration, and another worker's relay of the round will do.
        let Some(peer) = self.peers.get(&id).filter(|p| p.registered) else {
            return Ok(());
        };
        if step != self.open_step || !self.started {
            return Ok(());
        }
        let ranks: BTreeSet<u16> = relayed.ranks.iter().copied().collect();
        match &self.decided {
            Some(first) if *first != ranks => tracing::warn!(
                "shard {}: rank {} relayed shard 0's participants of round {step} as {:?}, \
                 another worker as {:?}; the first stands",
                self.shard,
                peer.rank,
                ranks,
                first
            ),
            Some(_) => {}
            None => {
                self.decided = Some(ranks);
                self.decided_samples = relayed
                    .ranks
                    .iter()
                    .copied()
                    .zip(relayed.samples.iter().copied())
                    .collect();
                if let Some(snapshot) = relayed.snapshot.filter(|s| *s <= self.open_step) {
                    self.drop_log_before(snapshot);
                }
            }
        }
        self.give_up_on_departed();
        Ok(())
    }

    /// Forgets `rank`'s pushes of the open round.
    fn drop_pushes_of(&mut self, rank: u16) {
        for entry in self.keys.values_mut() {
            entry.discard(rank as usize);
        }
        self.pushed.remove(&rank);
        self.samples.remove(&rank);
        self.finished_after.remove(&rank);
    }

    /// Takes out of the relayed participants the ranks that left this shard for good during
    /// the open round without finishing it: they cannot finish it here any more, so the round
    /// closes without them at once rather than at its deadline (their pushes count on shard 0
    /// and not here; logged). A rank that has not connected yet, or hung up to reconnect, is
    /// waited for as before.
    fn give_up_on_departed(&mut self) {
        let Some(decided) = &self.decided else {
            return;
        };
        let gone: Vec<u16> = decided
            .iter()
            .copied()
            .filter(|r| self.departed.contains(r) && !self.finished(*r))
            .collect();
        if gone.is_empty() {
            return;
        }
        tracing::warn!(
            "shard {}: round {} closes without shard 0's participants {gone:?}, which left this \
             shard before their pushes were in",
            self.shard,
            self.open_step
        );
        if let Some(decided) = &mut self.decided {
            decided.retain(|r| !gone.contains(r));
        }
    }

    /// Whether the open round has its first push (the server starts its deadline then).
    pub fn round_begun(&self) -> bool {
        !self.pushed.is_empty()
    }

    /// The open round's current attempt: the server arms a deadline for each, and only the
    /// current one's deadline evicts ([`ShardState::evict_stragglers`]).
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// After a deadline, if round `step` is still open and has pushes (someone pushed
    /// between the eviction and the close, or a rank became expected again), begins a new
    /// attempt and returns it, for the server to arm the next deadline: a begun round always
    /// has one pending.
    pub fn rearm(&mut self, step: u64) -> Option<u64> {
        (step == self.open_step && self.round_begun()).then(|| {
            self.attempt += 1;
            self.attempt
        })
    }

    fn active_ranks(&self) -> impl Iterator<Item = u16> + '_ {
        self.peers.values().filter(|p| p.active).map(|p| p.rank)
    }

    /// Whether `rank` has pushed every key of the open round, and its replica digest if it
    /// registered to send one.
    fn finished(&self, rank: u16) -> bool {
        self.pushed.get(&rank).copied().unwrap_or(0) == self.keys.len()
            && (!self.digest_senders.contains(&rank) || self.digests.contains_key(&rank))
    }

    /// The members of the open round: its active ranks and those it expects back.
    fn members(&self) -> BTreeSet<u16> {
        self.active_ranks()
            .chain(self.expected.iter().copied())
            .collect()
    }

    /// Whether a quorum of the members has pushed every key of the open round.
    fn has_quorum(&self) -> bool {
        let members = self.members();
        let finished = members.iter().filter(|r| self.finished(**r)).count();
        !self.keys.is_empty() && finished >= self.quorum.size(members.len())
    }

    /// If the open round has just reached its quorum without being complete, arms its
    /// quorum deadline: returns the ticket [`ShardState::close_on_quorum`] takes and how long
    /// to wait, at most `ceiling` (the hard deadline).
    pub fn arm_quorum(&mut self, ceiling: Duration) -> Option<(u64, Duration)> {
        if self.is_follower() || self.quorum_armed || self.round_complete() || !self.has_quorum() {
            return None;
        }
        self.quorum_armed = true;
        self.quorum_ticket += 1;
        let wait = self
            .quorum
            .wait_after_quorum(self.push_times.median(), ceiling);
        Some((self.quorum_ticket, wait))
    }

    /// At the quorum deadline `ticket` of round `step`: closes the round over the members
    /// that finished, if they still make a quorum, discarding the pushes of those that did
    /// not (they stay members) and giving up on the expected ones. A stale ticket does
    /// nothing; a lost quorum lets the next push arm a new deadline.
    pub fn close_on_quorum(&mut self, step: u64, ticket: u64) -> Option<ClosedRound> {
        if step != self.open_step || ticket != self.quorum_ticket || !self.quorum_armed {
            return None;
        }
        self.quorum_armed = false;
        if !self.has_quorum() {
            return None;
        }
        Some(self.close_over_finished())
    }

    /// At the hard deadline of attempt `attempt` of round `step`, a round that has its
    /// quorum closes as at the quorum's deadline (nobody is evicted): the quorum's wait may
    /// end after the hard deadline, which counts from the round's first push. Without a
    /// quorum, nothing: [`ShardState::evict_stragglers`] follows.
    pub fn close_at_deadline(&mut self, step: u64, attempt: u64) -> Option<ClosedRound> {
        if step != self.open_step || attempt != self.attempt || !self.round_begun() {
            return None;
        }
        if self.is_follower() {
            // Without shard 0's participants, nothing: evictions follow, and the round
            // waits for a relay.
            let decided = self.decided.clone()?;
            let keep: BTreeSet<u16> = decided
                .iter()
                .copied()
                .filter(|r| self.finished(*r))
                .collect();
            if keep.len() < decided.len() {
                tracing::warn!(
                    "shard {}: round {step} closes at its deadline without shard 0's \
                     participants {:?}, whose pushes did not come here",
                    self.shard,
                    decided.difference(&keep).collect::<Vec<_>>()
                );
            }
            return Some(self.close_over(&keep));
        }
        if !self.has_quorum() {
            return None;
        }
        self.quorum_armed = false;
        Some(self.close_over_finished())
    }

    /// Closes the open round over the members that finished: the others' pushes are
    /// discarded (they stay members), the expected ranks given up on.
    fn close_over_finished(&mut self) -> ClosedRound {
        let keep: BTreeSet<u16> = self
            .members()
            .into_iter()
            .filter(|r| self.finished(*r))
            .collect();
        self.close_over(&keep)
    }

    /// Closes the open round over the ranks `keep` (each has finished it): every other
    /// rank's pushes are discarded (members stay members, counted late), the expected ranks
    /// given up on.
    fn close_over(&mut self, keep: &BTreeSet<u16>) -> ClosedRound {
        let late: Vec<u16> = self
            .members()
            .into_iter()
            .filter(|r| !keep.contains(r))
            .collect();
        let strays: Vec<u16> = self
            .pushed
            .keys()
            .copied()
            .filter(|r| !keep.contains(r))
            .collect();
        for rank in late.iter().chain(&strays) {
            for entry in self.keys.values_mut() {
                entry.discard(*rank as usize);
            }
            self.pushed.remove(rank);
            self.samples.remove(rank);
            self.finished_after.remove(rank);
        }
        self.expected.clear();
        if self.is_follower() {
            self.weigh_as_shard_0(keep);
        }
        let mut round = self.close_now(&late);
        round.late = late;
        self.quorum_rounds += u64::from(!round.late.is_empty());
        round
    }

    /// Weighs each of `ranks`' pushes by the samples shard 0 counted for it, where its pushes
    /// here claimed others: a worker cannot weigh more on a follower than its share.
    fn weigh_as_shard_0(&mut self, ranks: &BTreeSet<u16>) {
        for rank in ranks {
            let (Some(&counted), Some(&claimed)) =
                (self.decided_samples.get(rank), self.samples.get(rank))
            else {
                continue;
            };
            if counted == claimed {
                continue;
            }
            tracing::warn!(
                "shard {}: rank {rank}'s pushes of round {} claim {claimed} samples, shard 0 \
                 counted {counted}: weighed as {counted}",
                self.shard,
                self.open_step
            );
            for entry in self.keys.values_mut() {
                entry.reweigh(usize::from(*rank), counted);
            }
            self.samples.insert(*rank, counted);
        }
    }

    /// Whether every active rank has pushed every key and no expected rank is missing.
    pub fn round_complete(&self) -> bool {
        if self.is_follower() {
            return !self.keys.is_empty()
                && self
                    .decided
                    .as_ref()
                    .is_some_and(|d| d.iter().all(|r| self.finished(*r)));
        }
        !self.keys.is_empty()
            && self.expected.is_empty()
            && self.active_ranks().next().is_some()
            && self.active_ranks().all(|r| self.finished(r))
    }

    /// The ranks the open round waits for without a connection.
    pub fn expected(&self) -> &BTreeSet<u16> {
        &self.expected
    }

    /// At the deadline of attempt `attempt` of round `step`, without a quorum
    /// ([`ShardState::close_at_deadline`] comes first): gives up on the expected ranks,
    /// evicts the active ranks that have not finished and returns their peers, for the server
    /// to close. The deadline of a closed round, or of an earlier attempt, does nothing.
    pub fn evict_stragglers(&mut self, step: u64, attempt: u64) -> Vec<PeerId> {
        if step != self.open_step || attempt != self.attempt || !self.round_begun() {
            return Vec::new();
        }
        if !self.expected.is_empty() {
            tracing::warn!(
                "shard {}: round {step} closes without ranks {:?}, which did not come back in time",
                self.shard,
                self.expected
            );
            self.expected.clear();
        }
        let late: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.active && !self.finished(p.rank))
            .map(|(id, _)| *id)
            .collect();
        for id in &late {
            self.disconnect(*id, Departure::Left);
        }
        late
    }

    /// Closes the open round if it is complete: sums, compensates and re-encodes every key
    /// (keys in parallel) and logs the replies. Returns the closed round, with the keys that
    /// failed in it (each closed all the same).
    pub fn close_round(&mut self) -> Option<ClosedRound> {
        if !self.round_complete() {
            return None;
        }
        if let Some(decided) = self.decided.clone() {
            return Some(self.close_over(&decided));
        }
        Some(self.close_now(&[]))
    }

    /// Shard 0's word on round `step` for the followers: who took part, the samples each
    /// stands for, and the snapshot it holds; signed where it serves a job.
    fn participants_to_relay(&self, step: u64) -> Participants {
        let ranks: Vec<u16> = self.pushed.keys().copied().collect();
        let mut participants = Participants {
            samples: ranks
                .iter()
                .map(|r| self.samples.get(r).copied().unwrap_or(0))
                .collect(),
            ranks,
            snapshot: self.snapshot.as_ref().map(|(s, _)| *s),
            signature: Vec::new(),
        };
        if let Some((signer, job)) = &self.relay_signer {
            match signer.sign_participants(job, step, &participants) {
                Ok(signature) => participants.signature = signature,
                // Signing with a key that signed the tickets does not fail; if it did, the
                // followers refuse the relay and close the round at its deadline.
                Err(e) => tracing::error!("shard 0: signing round {step}'s participants: {e}"),
            }
        }
        participants
    }

    /// Closes the open round over the pushes it holds; `late` are the members it closes
    /// without.
    fn close_now(&mut self, late: &[u16]) -> ClosedRound {
        use rayon::prelude::*;
        let step = self.open_step;
        let closed_after = self.opened.map(|o| o.elapsed().as_secs_f64());
        let relay = self
            .on_decided
            .is_some()
            .then(|| self.participants_to_relay(step));
        if let (Some(decided), Some(relay)) = (&self.on_decided, &relay) {
            // Before the sums: the followers close their share of the round beside this one.
            decided(step, relay.clone(), self.listeners());
        }
        // Every key closes, even when another fails: one bad key must not leave the others
        // open (a key left behind would refuse every later push as the wrong step).
        let closed: Vec<_> = self
            .keys
            .par_iter_mut()
            .map(|(key, entry)| {
                let (reply, fault) = entry.close_or_skip();
                (
                    (*key, entry.spec.numel, Bytes::from(reply)),
                    fault.map(|e| (*key, e)),
                )
            })
            .collect();
        let (replies, faults): (Vec<_>, Vec<_>) = closed.into_iter().unzip();
        let mut outliers: BTreeMap<u16, f32> = BTreeMap::new();
        for key in self.keys.values() {
            for &(rank, ratio) in key.outliers() {
                let worst = outliers.entry(rank as u16).or_insert(0.0);
                *worst = worst.max(ratio);
            }
        }
        // Histories that point against the others' count as standing out too.
        let mut alignment: BTreeMap<u16, Alignment> = BTreeMap::new();
        for key in self.keys.values() {
            for &(rank, a) in key.alignment() {
                alignment
                    .entry(rank as u16)
                    .and_modify(|sum| *sum = sum.and(a))
                    .or_insert(a);
            }
        }
        let cosines: Vec<(u16, f32)> = alignment
            .into_iter()
            .filter_map(|(rank, a)| Some((rank, a.judged_cosine()? as f32)))
            .collect();
        if !cosines.is_empty() {
            // What MISALIGNED_BELOW was measured from (RUST_LOG=murmur_net::ps::state=debug).
            tracing::debug!(
                "shard {}: round {step}: push history cosines {cosines:?}",
                self.shard
            );
        }
        let misaligned: Vec<(u16, f32)> = cosines
            .into_iter()
            .filter(|&(_, cosine)| cosine < MISALIGNED_BELOW)
            .collect();
        let evicted = self.strike(
            &outliers.keys().copied().collect(),
            &misaligned.iter().map(|(r, _)| *r).collect(),
        );
        let faults: Vec<(Key, murmur_engine::Error)> = faults.into_iter().flatten().collect();
        let mut round = ClosedRound {
            step,
            replies,
            faults: faults
                .iter()
                .map(|(k, e)| format!("key {k:#x}: {e}"))
                .collect(),
            participants: self.pushed.keys().copied().collect(),
            late: Vec::new(),
            replicas: None,
            diverged: Vec::new(),
            next: None,
            relay,
            outliers: outliers.into_iter().collect(),
            misaligned,
            evicted,
        };
        (round.replicas, round.diverged) = compare_digests(&std::mem::take(&mut self.digests));
        let samples = std::mem::take(&mut self.samples);
        let finished_after = std::mem::take(&mut self.finished_after);
        let members: Vec<u16> = self
            .active_ranks()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if let (Some(queue), Some(closed_after)) = (&mut self.queue, closed_after) {
            // How fast each member went on its share, for the next cut (by speed); a member
            // that left is not measured. A member late in this round also starts the next one
            // late, and is measured slow again: its share shrinks until it keeps up.
            let shares: Vec<(u16, u64)> = queue
                .open()
                .shares
                .iter()
                .map(|s| (s.rank, s.samples()))
                .collect();
            for (rank, share) in shares {
                match finished_after.get(&rank) {
                    Some(after) if samples.get(&rank).map(|&n| u64::from(n)) == Some(share) => {
                        queue.observe(rank, share, after.as_secs_f64(), false)
                    }
                    Some(_) => {}
                    None if members.contains(&rank) => {
                        queue.observe(rank, share, closed_after, true)
                    }
                    None => {}
                }
            }
        }
        if let Some(queue) = &mut self.queue {
            let folding: &[u16] = if self.fold_late { late } else { &[] };
            queue.settle_folding(&round.participants, folding, |r| {
                samples.get(&r).copied().map_or(0, u64::from)
            });
            round.next = Some(queue.assign(&members).clone());
        }
        self.log.push_back(round.clone());
        while self.log.len() > self.max_log_rounds {
            self.log.pop_front();
        }
        self.pushed.clear();
        self.decided = None;
        self.decided_samples.clear();
        self.departed.clear();
        self.open_step += 1;
        self.quorum_armed = false;
        self.opened = Some(Instant::now());
        round
    }

    /// A snapshot of the model after `step` rounds: shard 0 keeps the bytes, every shard drops
    /// the rounds before it from its log. Returns the snapshot kept, if this one was.
    pub fn snapshot(
        &mut self,
        id: PeerId,
        step: u64,
        payload: Vec<u8>,
    ) -> Result<Option<(u64, Bytes)>> {
        self.check_snapshot(id, step)?;
        let kept = (!payload.is_empty()).then(|| (step, Bytes::from(payload)));
        if kept.is_some() {
            self.snapshot = kept.clone();
            self.drop_log_before(step);
        }
        Ok(kept)
    }

    /// Drops the logged rounds before `step` (a snapshot covers them).
    fn drop_log_before(&mut self, step: u64) {
        while self.log.front().is_some_and(|r| r.step < step) {
            self.log.pop_front();
        }
    }

    /// Checks that peer `id` may send a snapshot of round `step` (before a durable shard
    /// writes it to disk).
    pub fn check_snapshot(&self, id: PeerId, step: u64) -> Result<()> {
        self.peer(id)?;
        if self.is_follower() {
            return protocol(format!(
                "a snapshot sent to shard {}: snapshots go to shard 0, whose word on each \
                 round tells the other shards which rounds to keep",
                self.shard
            ));
        }
        if step > self.open_step {
            return protocol(format!(
                "snapshot of step {step}, ahead of the open round {}",
                self.open_step
            ));
        }
        Ok(())
    }

    /// The digest more than half of the workers reported entering round `step`, if that
    /// round is still in the log and had one.
    pub fn majority_digest(&self, step: u64) -> Option<u64> {
        self.log
            .iter()
            .find(|r| r.step == step)
            .and_then(|r| r.replicas)
            .and_then(|v| v.majority)
    }

    /// What a rejoining peer is sent.
    pub fn catchup(&self, id: PeerId) -> Result<CatchupReply> {
        if !self.peer(id)?.registered {
            return protocol("catch-up before registration".into());
        }
        let summary = Catchup {
            snapshot_step: self.snapshot.as_ref().map(|(s, _)| *s),
            first_step: self.log.front().map_or(self.open_step, |r| r.step),
            open_step: self.open_step,
        };
        Ok(CatchupReply {
            snapshot: self.snapshot.clone(),
            rounds: self.log.iter().cloned().collect(),
            summary,
        })
    }

    /// A peer left: its pushes of the open round no longer count, and the round waits for
    /// its rank only if it was active and is `Reconnecting`.
    pub fn disconnect(&mut self, id: PeerId, how: Departure) {
        let Some(peer) = self.peers.remove(&id) else {
            return;
        };
        // A follower counts what shard 0 counts: the pushes of a rank that finished the open
        // round stay (shard 0 may have summed its pushes there) until the relayed
        // participants say whether they count.
        let kept = self.is_follower() && self.finished(peer.rank);
        if !kept {
            self.drop_pushes_of(peer.rank);
            if how == Departure::Left {
                self.departed.insert(peer.rank);
                self.give_up_on_departed();
            }
        }
        if let (Some(queue), Departure::Left) = (&mut self.queue, how) {
            queue.forget(peer.rank);
        }
        // One connection per rank (a newer one replaces the older before it registers).
        self.digest_senders.remove(&peer.rank);
        if peer.active && how == Departure::Reconnecting {
            self.expected.insert(peer.rank);
        }
    }
}

/// Compares a round's replica digests: the verdict the workers are sent, and the ranks whose
/// replicas went astray with their digests (every rank, when no digest has a majority).
fn compare_digests(digests: &BTreeMap<u16, u64>) -> (Option<ReplicaVerdict>, Vec<(u16, u64)>) {
    if digests.is_empty() {
        return (None, Vec::new());
    }
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for digest in digests.values() {
        *counts.entry(*digest).or_default() += 1;
    }
    let majority = counts
        .iter()
        .find(|(_, n)| **n * 2 > digests.len())
        .map(|(d, _)| *d);
    let diverged = digests
        .iter()
        .filter(|(_, d)| counts.len() > 1 && majority != Some(**d))
        .map(|(r, d)| (*r, *d))
        .collect();
    let verdict = ReplicaVerdict {
        majority,
        disagreed: counts.len() > 1,
    };
    (Some(verdict), diverged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::queue::QueueSpec;

    fn hello(rank: u16) -> Hello {
        Hello {
            rank,
            world: 2,
            shard: 0,
            shards: 1,
            node: "w".into(),
            ticket: None,
        }
    }

    #[test]
    fn one_failing_key_leaves_no_other_key_of_the_round_open() {
        use murmur_engine::comm::shard::FAILING_KEY_FOR_TESTS;
        use murmur_engine::comm::KeySpec;
        let spec = |key: Key| KeySpec {
            key,
            numel: 3,
            push: "f32".into(),
            pull: "sign".into(),
            server_memory: "ef".into(),
            seed: 1,
            sync_every: 0,
            owner: String::new(),
        };
        let keys = [1, FAILING_KEY_FOR_TESTS, 0xffff_0000];
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(1);
        let mut solo = hello(0);
        solo.world = 1;
        state.hello(7, &solo).unwrap();
        let register = Register {
            keys: keys.iter().map(|&k| spec(k)).collect(),
            replica_digests: false,
        };
        assert_eq!(state.register(7, &register).unwrap().len(), 1);
        for step in 0..2u64 {
            for key in keys {
                let PushCheck::Decode(decoder) = state.check_push(7, key, step, 3).unwrap() else {
                    panic!("step {step}: the push of key {key:#x} is not taken");
                };
                let push = decoder
                    .decode(1, bytemuck_f32(&[1.0, -2.0, 0.5]).as_slice())
                    .unwrap();
                assert!(state.insert_push(7, key, step, push).unwrap());
            }
            let round = state.close_round().expect("the round is complete");
            assert_eq!(round.step, step);
            assert_eq!(round.replies.len(), keys.len(), "every key replies");
            assert_eq!(round.faults.len(), 1, "{:?}", round.faults);
            // The failed key's reply is an update that changes nothing; the others carry theirs.
            for (key, numel, reply) in &round.replies {
                let values = murmur_engine::compress::parse("sign")
                    .unwrap()
                    .decode(reply, *numel as usize, &Default::default())
                    .unwrap();
                let moved = values.iter().any(|v| *v != 0.0);
                assert_eq!(
                    moved,
                    *key != FAILING_KEY_FOR_TESTS,
                    "key {key:#x}: {values:?}"
                );
            }
        }
    }

    /// A shard of one 2-element f32 key for a world of 2, with ranks 0 and 1 registered
    /// as peers 0 and 1.
    fn two_ranks() -> ShardState {
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(2);
        join(&mut state, 0..2, 2);
        state
    }

    /// Ranks `ranks` of a world of `world` say hello (each as the peer of its number) and
    /// register [`one_key`].
    fn join(state: &mut ShardState, ranks: std::ops::Range<u16>, world: u16) {
        for rank in ranks {
            come(state, rank as PeerId, rank, world);
        }
    }

    /// Rank `rank` of `world` says hello on connection `id` and registers the one key.
    fn come(state: &mut ShardState, id: PeerId, rank: u16, world: u16) {
        let hello = Hello {
            world,
            ..hello(rank)
        };
        state.hello(id, &hello).unwrap();
        state.register(id, &one_key()).unwrap();
    }

    fn one_key() -> Register {
        Register {
            keys: vec![murmur_engine::comm::KeySpec {
                key: 1,
                numel: 2,
                push: "f32".into(),
                pull: "f32".into(),
                server_memory: "none".into(),
                seed: 1,
                sync_every: 0,
                owner: String::new(),
            }],
            replica_digests: false,
        }
    }

    /// The values of a round's first reply (an f32 key's).
    fn f32_reply(replies: &[(Key, u32, Bytes)]) -> Vec<f32> {
        replies[0]
            .2
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Peer `id` pushes `value` twice for `step`; whether the push counted.
    /// Shard 0's word on a round whose participants pushed one sample each.
    fn word(ranks: &[u16]) -> Participants {
        Participants {
            ranks: ranks.to_vec(),
            samples: vec![1; ranks.len()],
            snapshot: None,
            signature: Vec::new(),
        }
    }

    fn push(state: &mut ShardState, id: PeerId, step: u64, value: f32) -> bool {
        match state.check_push(id, 1, step, 2).unwrap() {
            PushCheck::Ignore => false,
            PushCheck::Decode(d) => {
                let push = d.decode(1, &bytemuck_f32(&[value, value])).unwrap();
                state.insert_push(id, 1, step, push).unwrap()
            }
        }
    }

    #[test]
    fn a_push_for_a_closed_round_is_ignored_and_counted() {
        let mut state = two_ranks();
        assert!(push(&mut state, 0, 0, 1.0) && push(&mut state, 1, 0, 3.0));
        assert_eq!(state.close_round().unwrap().step, 0);
        // Rank 0 missed the reply and sends round 0 again: it changes nothing.
        assert!(!push(&mut state, 0, 0, 1.0));
        assert_eq!(state.late_pushes(), 1);
        assert!(push(&mut state, 0, 1, 1.0) && push(&mut state, 1, 1, 3.0));
        assert_eq!(state.close_round().unwrap().step, 1);
        // A push from the future still breaks the protocol.
        assert!(state.check_push(0, 1, 5, 2).is_err());
    }

    #[test]
    fn a_quorum_closes_the_round_over_those_who_pushed_and_the_late_stay_members() {
        use super::super::quorum::WAIT_FLOOR;
        let ceiling = Duration::from_secs(30);
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(3);
        join(&mut state, 0..3, 3);
        // Round 0: everyone, so that the shard has push times.
        for rank in 0..3 {
            assert!(push(&mut state, rank, 0, 1.0));
        }
        assert_eq!(
            state.arm_quorum(ceiling),
            None,
            "a complete round needs none"
        );
        assert_eq!(state.close_round().unwrap().participants, [0, 1, 2]);
        // Round 1: one of three is no quorum; two are, and the wait is the floor (these
        // pushes took microseconds).
        assert!(push(&mut state, 0, 1, 1.0));
        assert_eq!(state.arm_quorum(ceiling), None);
        assert!(push(&mut state, 1, 1, 3.0));
        let (ticket, wait) = state.arm_quorum(ceiling).expect("two of three pushed");
        assert_eq!(wait, WAIT_FLOOR);
        assert_eq!(state.arm_quorum(ceiling), None, "armed once per round");
        assert!(state.close_round().is_none(), "rank 2 has not pushed");
        assert!(
            state.close_on_quorum(1, ticket + 1).is_none(),
            "a stale ticket"
        );
        let round = state.close_on_quorum(1, ticket).expect("the quorum holds");
        assert_eq!(
            (round.step, round.participants, round.late),
            (1, vec![0, 1], vec![2])
        );
        let reply = f32_reply(&round.replies);
        assert_eq!(reply, [2.0, 2.0], "the mean of the two who pushed");
        assert_eq!(state.quorum_rounds(), 1);
        // Rank 2's push for round 1 comes too late: ignored and counted.
        assert!(!push(&mut state, 2, 1, 100.0));
        assert_eq!(state.late_pushes(), 1);
        // It is still a member: round 2 waits for it, and closes with it.
        assert!(push(&mut state, 0, 2, 1.0) && push(&mut state, 1, 2, 1.0));
        assert!(!state.round_complete());
        assert!(push(&mut state, 2, 2, 1.0));
        assert_eq!(state.close_round().unwrap().participants, [0, 1, 2]);
        assert!(
            state.close_on_quorum(1, ticket).is_none(),
            "the deadline of a closed round does nothing"
        );
        // Round 3: the hard deadline comes before the quorum's wait ends (after a restart
        // the wait is the deadline itself): with a quorum it closes over those who pushed,
        // evicting nobody; without one it does nothing and the stragglers go.
        assert!(push(&mut state, 0, 3, 1.0) && push(&mut state, 1, 3, 1.0));
        assert!(state.arm_quorum(ceiling).is_some());
        let attempt = state.attempt();
        let round = state
            .close_at_deadline(3, attempt)
            .expect("a quorum pushed");
        assert_eq!((round.participants, round.late), (vec![0, 1], vec![2]));
        assert_eq!(state.listeners().len(), 3, "nobody evicted");
        assert!(push(&mut state, 0, 4, 1.0));
        let attempt = state.attempt();
        assert!(
            state.close_at_deadline(4, attempt).is_none(),
            "one of three"
        );
        assert_eq!(state.evict_stragglers(4, attempt).len(), 2);
    }

    /// A follower takes shard 0's word for what it cannot know: a participant's pushes
    /// weigh the samples shard 0 counted for it (not the thousand rank 1 claims here), and
    /// the log keeps the rounds from shard 0's snapshot on; a snapshot sent to the follower
    /// itself is refused.
    #[test]
    fn a_follower_weighs_and_prunes_by_shard_0s_word() {
        let mut state = ShardState::new(1, Limits::default(), 10);
        state.fix_world(2);
        join(&mut state, 0..2, 2);
        for step in 0..3 {
            let claims = [(0, 1.0, 1), (1, 5.0, if step == 2 { 1000 } else { 1 })];
            for (id, value, samples) in claims {
                let PushCheck::Decode(d) = state.check_push(id, 1, step, 2).unwrap() else {
                    panic!("round {step} is open");
                };
                let push = d.decode(samples, &bytemuck_f32(&[value, value])).unwrap();
                state.insert_push(id, 1, step, push).unwrap();
            }
            let mut said = word(&[0, 1]);
            said.snapshot = (step == 2).then_some(1);
            state.follow(0, step, &said).unwrap();
            let round = state.close_round().expect("both pushed");
            // Equal weights: the mean of 1 and 5, rank 1's claim of 1000 notwithstanding.
            assert_eq!(f32_reply(&round.replies), [3.0, 3.0], "round {step}");
        }
        let catchup = state.catchup(0).unwrap();
        assert_eq!(
            catchup.rounds.iter().map(|r| r.step).collect::<Vec<_>>(),
            [1, 2]
        );
        let refused = state.check_snapshot(0, 2).unwrap_err().to_string();
        assert!(refused.contains("snapshots go to shard 0"), "{refused}");
        let mut torn = word(&[0, 1]);
        torn.samples.pop();
        assert!(state.follow(0, 3, &torn).is_err());
    }

    /// Shard 1 of a swarm follows shard 0: it closes on no quorum of its own, not even with
    /// every member's push in, until a worker relays shard 0's participants; then over those
    /// exactly, the others' pushes discarded as late, and the first relay stands. Its hard
    /// deadline closes over the relayed ranks that finished; without a relay it closes
    /// nothing. Shard 0 refuses a relay.
    #[test]
    fn a_follower_closes_each_round_over_shard_0s_participants() {
        let ceiling = Duration::from_secs(30);
        let mut state = ShardState::new(1, Limits::default(), 10);
        state.fix_world(3);
        join(&mut state, 0..3, 3);
        // Round 0: everyone pushed here, but shard 0 closed without rank 2 (late there).
        for rank in 0..3 {
            assert!(push(&mut state, rank, 0, rank as f32));
        }
        assert!(!state.round_complete(), "no relay yet");
        assert_eq!(state.arm_quorum(ceiling), None, "never on its own quorum");
        assert!(state.close_round().is_none());
        state.follow(0, 1, &word(&[0, 1, 2])).unwrap();
        assert!(!state.round_complete(), "a relay of another round");
        state.follow(1, 0, &word(&[0, 1])).unwrap();
        state.follow(2, 0, &word(&[0, 1, 2])).unwrap();
        let round = state.close_round().expect("shard 0's participants pushed");
        assert_eq!((round.participants, round.late), (vec![0, 1], vec![2]));
        let reply = f32_reply(&round.replies);
        assert_eq!(
            reply,
            [0.5, 0.5],
            "rank 2's push is left out, as on shard 0"
        );
        // Round 1: the relay comes first; rank 1's push is still on its way.
        state.follow(0, 1, &word(&[0, 1])).unwrap();
        assert!(push(&mut state, 0, 1, 1.0));
        assert!(!state.round_complete());
        assert!(push(&mut state, 1, 1, 1.0));
        assert_eq!(state.close_round().unwrap().participants, [0, 1]);
        // Round 2: a participant's push never comes here; the deadline closes over the rest.
        state.follow(0, 2, &word(&[0, 1])).unwrap();
        assert!(push(&mut state, 0, 2, 1.0));
        let attempt = state.attempt();
        let round = state.close_at_deadline(2, attempt).expect("relayed");
        assert_eq!((round.participants, round.late), (vec![0], vec![1, 2]));
        // Round 3: no relay by the deadline: nothing closes.
        assert!(push(&mut state, 0, 3, 1.0));
        let attempt = state.attempt();
        assert!(state.close_at_deadline(3, attempt).is_none());
        // Shard 0 decides its own rounds.
        let mut shard_0 = two_ranks();
        assert!(shard_0.follow(0, 0, &word(&[0, 1])).is_err());
    }

    /// A participant that leaves a follower: its finished pushes still count (shard 0 summed
    /// them), and one that left before finishing cannot hold the round to its deadline.
    #[test]
    fn a_follower_counts_a_departed_participants_pushes_and_does_not_wait_for_one_that_never_pushed(
    ) {
        let mut state = ShardState::new(1, Limits::default(), 10);
        state.fix_world(3);
        join(&mut state, 0..3, 3);
        // Round 0: rank 2 pushes and leaves (shard 0 evicted it after summing its push).
        for rank in 0..3 {
            assert!(push(&mut state, rank, 0, rank as f32));
        }
        state.disconnect(2, Departure::Left);
        state.follow(0, 0, &word(&[0, 1, 2])).unwrap();
        let round = state
            .close_round()
            .expect("every participant's pushes are here");
        assert_eq!(round.participants, [0, 1, 2]);
        assert_eq!(f32_reply(&round.replies), [1.0, 1.0]);
        // Round 1: rank 1 leaves before pushing; shard 0 had counted it. The round closes
        // over rank 0 at once, not at the deadline.
        assert!(push(&mut state, 0, 1, 4.0));
        state.follow(0, 1, &word(&[0, 1])).unwrap();
        assert!(!state.round_complete());
        state.disconnect(1, Departure::Left);
        let round = state.close_round().expect("rank 1 cannot push any more");
        assert_eq!(round.participants, [0]);
        // A rank that finished, hung up to reconnect and pushes the round again (as a worker
        // retrying a round does): its new push counts, not "pushed twice".
        let mut state = ShardState::new(1, Limits::default(), 10);
        state.fix_world(2);
        join(&mut state, 0..2, 2);
        assert!(push(&mut state, 0, 0, 1.0) && push(&mut state, 1, 0, 3.0));
        state.disconnect(1, Departure::Reconnecting);
        come(&mut state, 7, 1, 2);
        assert!(push(&mut state, 7, 0, 5.0));
        state.follow(0, 0, &word(&[0, 1])).unwrap();
        assert_eq!(f32_reply(&state.close_round().unwrap().replies), [3.0, 3.0]);
        // A rank that hung up to reconnect (as after a shard restart) is waited for: only
        // one that left for good is given up on.
        let mut state = ShardState::new(1, Limits::default(), 10);
        state.fix_world(2);
        join(&mut state, 0..2, 2);
        assert!(push(&mut state, 0, 0, 1.0));
        state.disconnect(1, Departure::Reconnecting);
        state.follow(0, 0, &word(&[0, 1])).unwrap();
        assert!(!state.round_complete(), "rank 1 is on its way back");
        come(&mut state, 11, 1, 2);
        assert!(push(&mut state, 11, 0, 1.0));
        assert_eq!(state.close_round().unwrap().participants, [0, 1]);
        // And when it leaves for good before the relay comes.
        let mut state = ShardState::new(1, Limits::default(), 10);
        state.fix_world(2);
        join(&mut state, 0..2, 2);
        assert!(push(&mut state, 0, 0, 1.0));
        state.disconnect(1, Departure::Left);
        state.follow(0, 0, &word(&[0, 1])).unwrap();
        assert_eq!(state.close_round().expect("closed").participants, [0]);
    }

    #[test]
    fn the_majority_digest_names_the_replicas_that_went_astray() {
        let digests = |pairs: &[(u16, u64)]| pairs.iter().copied().collect::<BTreeMap<_, _>>();
        assert_eq!(compare_digests(&digests(&[])), (None, vec![]));
        let agreed = compare_digests(&digests(&[(0, 5), (1, 5), (2, 5)]));
        assert_eq!(
            agreed,
            (
                Some(ReplicaVerdict {
                    majority: Some(5),
                    disagreed: false
                }),
                vec![]
            )
        );
        let one_astray = compare_digests(&digests(&[(0, 5), (1, 9), (2, 5)]));
        assert_eq!(
            one_astray,
            (
                Some(ReplicaVerdict {
                    majority: Some(5),
                    disagreed: true
                }),
                vec![(1, 9)]
            )
        );
        // Two against two: no majority, and nobody can say which replica is right.
        let split = compare_digests(&digests(&[(0, 5), (1, 9), (2, 5), (3, 9)]));
        assert_eq!(split.0.unwrap().majority, None);
        assert_eq!(split.1.len(), 4);
    }

    #[test]
    fn digests_count_for_the_open_round_only() {
        let mut state = two_ranks();
        state.record_digest(0, 0, 5).unwrap();
        state.record_digest(1, 0, 6).unwrap();
        assert!(
            state.record_digest(1, 1, 6).is_err(),
            "a digest from the future"
        );
        assert!(push(&mut state, 0, 0, 1.0) && push(&mut state, 1, 0, 3.0));
        let round = state.close_round().unwrap();
        assert_eq!(round.diverged, [(0, 5), (1, 6)]);
        assert_eq!(round.summary().replicas.unwrap().majority, None);
        // A digest for the closed round is ignored; round 1 starts with none.
        state.record_digest(0, 0, 5).unwrap();
        assert!(push(&mut state, 0, 1, 1.0) && push(&mut state, 1, 1, 3.0));
        let round = state.close_round().unwrap();
        assert_eq!((round.replicas, round.participants), (None, vec![0, 1]));
    }

    /// Peer `id` pushes `value` for `step`, standing for `samples`; whether it counted, or
    /// the refusal.
    fn push_samples(state: &mut ShardState, id: PeerId, step: u64, samples: u32) -> Result<bool> {
        match state.check_push(id, 1, step, 2)? {
            PushCheck::Ignore => Ok(false),
            PushCheck::Decode(d) => {
                let push = d.decode(samples, &bytemuck_f32(&[1.0, 1.0])).unwrap();
                state.insert_push(id, 1, step, push)
            }
        }
    }

    /// Shard 0 cuts each round from the job's samples over its members, takes pushes that
    /// stand for the whole share or for none, and gives the share of a member the round
    /// closed without (on its quorum) to the next round, ahead of fresh samples; a newcomer
    /// pushes for none until it gets a share of the round after.
    #[test]
    fn shard_0_hands_out_samples_and_takes_back_the_shares_of_the_late() {
        let shares = |a: &Assignment| -> Vec<(u16, Vec<u64>)> {
            a.shares
                .iter()
                .map(|s| (s.rank, s.positions().collect()))
                .collect()
        };
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(3);
        state.start_with(2);
        state
            .set_queue(QueueSpec {
                samples: 10,
                global: 4,
                per_member: 4,
                by_speed: false,
            })
            .unwrap();
        join(&mut state, 0..2, 3);
        let round_0 = state.assignment().unwrap().clone();
        assert_eq!(shares(&round_0), [(0, vec![0, 1]), (1, vec![2, 3])]);
        assert!(
            push_samples(&mut state, 0, 0, 3).is_err(),
            "3 samples for a share of 2"
        );
        assert!(push_samples(&mut state, 1, 0, 2).unwrap());
        // Rank 0 was dropped for its lie; rank 1's round closes without it.
        state.disconnect(0, Departure::Left);
        let round = state.close_round().expect("rank 1 is the only member");
        assert_eq!(round.participants, [1]);
        let round_1 = round.next.expect("shard 0 cuts the next round");
        assert_eq!(
            shares(&round_1),
            [(1, vec![0, 1, 4, 5])],
            "rank 0's share first, then fresh samples"
        );
        // A newcomer registers within round 1: it has no share there and pushes for none.
        let newcomer = Hello {
            world: 3,
            ..hello(2)
        };
        state.hello(2, &newcomer).unwrap();
        let registered = state.register(2, &one_key()).unwrap();
        assert_eq!(registered[0].1.assignment.as_ref(), Some(&round_1));
        assert!(push_samples(&mut state, 2, 1, 0).unwrap());
        assert!(push_samples(&mut state, 1, 1, 4).unwrap());
        let round_2 = state.close_round().unwrap().next.unwrap();
        assert_eq!(shares(&round_2), [(1, vec![6, 7]), (2, vec![8, 9])]);
        assert_eq!(state.queue_progress(), Some((0, 6)));
    }

    /// Frames travel on streams of their own and arrive in any order: a digest sent ahead of
    /// the pushes may come after them. A rank that registered to send digests has finished
    /// its round only with its digest, so that the round's verdict compares its replica.
    #[test]
    fn a_rank_that_sends_digests_finishes_its_round_only_with_its_digest() {
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(2);
        let with_digests = Register {
            replica_digests: true,
            ..one_key()
        };
        for rank in 0..2u16 {
            state.hello(rank as PeerId, &hello(rank)).unwrap();
            state.register(rank as PeerId, &with_digests).unwrap();
        }
        state.record_digest(0, 0, 5).unwrap();
        assert!(push(&mut state, 0, 0, 1.0) && push(&mut state, 1, 0, 3.0));
        assert!(!state.round_complete(), "rank 1's digest is not in");
        assert!(state.close_round().is_none());
        state.record_digest(1, 0, 9).unwrap();
        let round = state.close_round().expect("both ranks finished");
        assert_eq!(round.participants, [0, 1]);
        assert_eq!(round.diverged, [(0, 5), (1, 9)], "both replicas compared");
        // Only shard 0 compares digests: another shard refuses a worker that would send them.
        let mut other = ShardState::new(1, Limits::default(), 10);
        other.fix_world(2);
        let mut on_shard_1 = hello(0);
        on_shard_1.shard = 1;
        on_shard_1.shards = 2;
        other.hello(0, &on_shard_1).unwrap();
        assert!(other.register(0, &with_digests).is_err());
    }

    #[test]
    fn a_rank_that_reconnects_is_waited_for_and_one_that_left_is_not() {
        let mut state = two_ranks();
        assert!(push(&mut state, 0, 0, 1.0) && push(&mut state, 1, 0, 3.0));
        state.close_round().unwrap();
        // Rank 1 hangs up to reconnect: round 1 waits for it.
        state.disconnect(1, Departure::Reconnecting);
        assert!(push(&mut state, 0, 1, 1.0));
        assert!(
            !state.round_complete(),
            "closed without the reconnecting rank"
        );
        state.hello(2, &hello(1)).unwrap();
        state.register(2, &one_key()).unwrap();
        assert!(!state.round_complete());
        assert!(push(&mut state, 2, 1, 3.0));
        let round = state.close_round().expect("both ranks pushed");
        assert_eq!(round.step, 1);
        // A newer connection for rank 1 replaces the old one: also waited for.
        state.hello(3, &hello(1)).unwrap();
        state.register(3, &one_key()).unwrap();
        assert!(push(&mut state, 0, 2, 1.0));
        assert!(!state.round_complete());
        assert!(push(&mut state, 3, 2, 3.0));
        state.close_round().unwrap();
        // Rank 1 leaves (a pause, silence past the peer timeout): not waited for.
        state.disconnect(3, Departure::Left);
        assert!(push(&mut state, 0, 3, 1.0));
        assert_eq!(state.close_round().unwrap().step, 3);
        // A rank waited for that never comes back is given up on at the deadline.
        state.disconnect(0, Departure::Reconnecting);
        state.hello(4, &hello(1)).unwrap();
        state.register(4, &one_key()).unwrap();
        assert!(push(&mut state, 4, 4, 3.0));
        assert!(!state.round_complete());
        // Only the current attempt's deadline counts.
        assert!(state.evict_stragglers(4, state.attempt() - 1).is_empty());
        assert!(!state.round_complete());
        assert!(state.evict_stragglers(4, state.attempt()).is_empty());
        assert_eq!(state.close_round().unwrap().step, 4);
    }

    #[test]
    fn a_restored_shard_waits_for_the_last_rounds_members_and_serves_its_log() {
        let mut state = two_ranks();
        assert_eq!(state.assign_rank("fingerprint").unwrap(), (0, true));
        let mut replies = Vec::new();
        for step in 0..3 {
            assert!(push(&mut state, 0, step, 1.0) && push(&mut state, 1, step, step as f32));
            replies.push(state.close_round().unwrap().replies);
        }
        let job = b"job digest";
        let saved = state.saved(job).unwrap();
        assert_eq!((saved.open_step, saved.first_logged), (3, 0));
        assert_eq!(saved.members, [0, 1]);
        let loaded = |saved: SavedShard| Loaded {
            shard: saved,
            rounds: state
                .log
                .iter()
                .map(|r| (r.step, r.replies.clone(), r.summary()))
                .collect(),
            snapshot: None,
        };
        assert!(ShardState::restore(1, job, Limits::default(), 10, loaded(saved.clone())).is_err());
        assert!(
            ShardState::restore(0, b"other", Limits::default(), 10, loaded(saved.clone())).is_err()
        );
        let mut back = ShardState::restore(0, job, Limits::default(), 10, loaded(saved)).unwrap();
        assert_eq!(back.open_step(), 3);
        assert_eq!(back.assign_rank("fingerprint").unwrap(), (0, false));
        // A worker behind reconnects and catches up from the log.
        back.hello(10, &hello(0)).unwrap();
        let registered = back.register(10, &one_key()).unwrap();
        assert!(registered[0].1.underway);
        let catchup = back.catchup(10).unwrap();
        assert_eq!(catchup.summary.first_step, 0);
        let logged: Vec<_> = catchup.rounds.iter().map(|r| r.replies.clone()).collect();
        assert_eq!(logged, replies);
        // Round 3 waits for both ranks of round 2, then closes as the original would.
        assert!(push(&mut back, 10, 3, 1.0));
        assert!(!back.round_complete());
        back.hello(11, &hello(1)).unwrap();
        back.register(11, &one_key()).unwrap();
        assert!(push(&mut back, 11, 3, 3.0));
        assert!(push(&mut state, 0, 3, 1.0) && push(&mut state, 1, 3, 3.0));
        assert_eq!(
            back.close_round().unwrap().replies,
            state.close_round().unwrap().replies
        );
    }

    fn bytemuck_f32(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn each_push_decodes_with_its_senders_codec_and_only_the_push_codec_may_differ() {
        use murmur_engine::comm::KeySpec;
        use murmur_engine::compress::{parse, CodecContext};
        let spec = |push: &str, pull: &str| KeySpec {
            key: 1,
            numel: 4,
            push: push.into(),
            pull: pull.into(),
            server_memory: "none".into(),
            seed: 1,
            sync_every: 0,
            owner: String::new(),
        };
        let register = |push: &str, pull: &str| Register {
            keys: vec![spec(push, pull)],
            replica_digests: false,
        };
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(2);
        state.hello(0, &hello(0)).unwrap();
        state.register(0, &register("f32", "f32")).unwrap();
        state.hello(1, &hello(1)).unwrap();
        // Another reply codec would give this rank other replicas: refused.
        let refused = state.register(1, &register("topk:0.5", "f16"));
        assert!(refused.unwrap_err().to_string().contains("keys differ"));
        let mut state = ShardState::new(0, Limits::default(), 10);
        state.fix_world(2);
        state.hello(0, &hello(0)).unwrap();
        state.register(0, &register("f32", "f32")).unwrap();
        state.hello(1, &hello(1)).unwrap();
        state.register(1, &register("topk:0.5", "f32")).unwrap();
        let values = [
            [1.0f32, -2.0, 0.5, 4.0],
            [3.0f32, 0.25, -6.0, 1.0], // its top half: 3 and -6
        ];
        for (rank, codec) in [(0u16, "f32"), (1, "topk:0.5")] {
            let ctx = CodecContext::default();
            let payload = parse(codec).unwrap().encode(&values[rank as usize], &ctx);
            let PushCheck::Decode(decoder) = state.check_push(rank as PeerId, 1, 0, 4).unwrap()
            else {
                panic!("rank {rank}'s push is not taken");
            };
            let push = decoder.decode(1, &payload).unwrap();
            state.insert_push(rank as PeerId, 1, 0, push).unwrap();
        }
        let round = state.close_round().expect("both ranks pushed");
        let reply = parse("f32")
            .unwrap()
            .decode(&round.replies[0].2, 4, &Default::default())
            .unwrap();
        assert_eq!(reply, [2.0, -1.0, -2.75, 2.0]);
    }

    #[test]
    fn ranks_follow_certificates_and_free_places_go_to_newcomers() {
        let mut state = ShardState::new(0, Limits::default(), 10);
        assert!(state.assign_rank("a").is_err(), "no job, no ranks");
        state.fix_world(2);
        assert_eq!(state.assign_rank("a").unwrap(), (0, true));
        assert_eq!(state.assign_rank("b").unwrap(), (1, true));
        // The same certificate gets its rank back.
        assert_eq!(state.assign_rank("a").unwrap(), (0, false));
        // Both ranks are taken: a third certificate is refused.
        state.hello(10, &hello(0)).unwrap();
        state.hello(11, &hello(1)).unwrap();
        assert!(state.assign_rank("c").is_err());
        // Rank 1's worker leaves: its place stays its own, and a newcomer is still refused.
        state.disconnect(11, Departure::Left);
        assert!(state.assign_rank("c").is_err());
        assert_eq!(state.assign_rank("b").unwrap(), (1, false));
        // No certificate may say hello as another's rank.
        assert!(state.check_rank("b", 1).is_ok());
        assert!(state.check_rank("b", 0).is_err());
        assert!(state.check_rank("c", 1).is_err());
        // The world is the job's, whatever a peer says.
        let mut liar = hello(0);
        liar.world = 3;
        assert!(state.hello(12, &liar).is_err());
    }
}
