//! The state of one parameter-server shard, without sockets: who is connected, which keys it
//! owns, which ranks have pushed in the open round, the closed rounds a rejoining worker can
//! replay, and the latest snapshot. The server feeds it events and carries out what it returns,
//! so every rule of the protocol lives here and is tested without a network.
//!
//! Rules:
//! - A peer says `Hello` (its rank and the world size), then `Register`s the keys this shard
//!   owns. Every rank must register the same keys.
//! - Before the first round the shard waits for `world` ranks to register (start barrier). A
//!   rank that registers later is a *listener*: it receives every reply from then on and may
//!   ask for a catch-up; it becomes *active* with its first push for the open round.
//! - A round closes when every active rank has pushed every key, or at its deadline, when the
//!   active ranks that have not finished are evicted (their pushes discarded, their connection
//!   closed) and the round closes over the ranks that did.
//! - An active rank pushing a step that is not the open one breaks the protocol (a replayed old
//!   step, or one from the future); a listener's push for an already closed step is ignored,
//!   because it raced the round it was catching up to.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use murmur_engine::comm::shard::{KeyState, Push, PushDecoder};
use murmur_engine::comm::Key;

use crate::error::{NetError, Result};
use crate::wire::{Catchup, Hello, Limits, Register, Registered};

/// A connection's identity inside the server.
pub type PeerId = usize;

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
}

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
        }
    }

    /// Fixes the world size from the job this shard serves, so that no peer sets it by
    /// connecting first.
    pub fn fix_world(&mut self, world: u16) {
        self.world = Some(world);
    }

    /// A rank for the certificate `identity` (its fingerprint), for a worker that joins
    /// knowing only the servers: the rank it had before if it joined earlier, else the lowest
    /// rank never handed out. A rank stays its certificate's for the server's life (a paused
    /// worker comes back to it), so a job takes at most `world` certificates; freeing the
    /// places of workers that left for good belongs to elastic membership. Needs a fixed world.
    pub fn assign_rank(&mut self, identity: &str) -> Result<u16> {
        let Some(world) = self.world else {
            return protocol("this server was started without a job; it assigns no ranks".into());
        };
        if let Some(&rank) = self.assigned.get(identity) {
            return Ok(rank);
        }
        let taken: Vec<u16> = self.assigned.values().copied().collect();
        let Some(rank) = (0..world).find(|r| !taken.contains(r)) else {
            return protocol(format!(
                "all {world} worker places of this job are taken by other certificates"
            ));
        };
        self.assigned.insert(identity.to_string(), rank);
        Ok(rank)
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

    /// A peer introduces itself. Returns the peer this one replaces (the same rank on an older
    /// connection, which the server must close).
    pub fn hello(&mut self, id: PeerId, hello: &Hello) -> Result<Option<PeerId>> {
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
        if let Some(old) = replaced {
            self.disconnect(old);
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
        register.check(&self.limits)?;
        if !self.keys_fixed {
            let mut keys = BTreeMap::new();
            for spec in &register.keys {
                let state = KeyState::new(spec.clone())
                    .map_err(|e| NetError::Protocol(format!("key {:#x}: {e}", spec.key)))?;
                if keys.insert(spec.key, state).is_some() {
                    return protocol(format!("key {:#x} registered twice", spec.key));
                }
            }
            self.keys = keys;
            self.keys_fixed = true;
        } else {
            let same = register.keys.len() == self.keys.len()
                && register
                    .keys
                    .iter()
                    .all(|s| self.keys.get(&s.key).is_some_and(|k| k.spec == *s));
            if !same {
                return protocol(
                    "keys differ from those the other ranks registered (same model, codecs and seed?)"
                        .into(),
                );
            }
        }
        let started = self.started;
        let peer = self.peers.get_mut(&id).expect("checked above");
        peer.registered = true;
        if started {
            return Ok(vec![(
                id,
                Registered {
                    open_step: self.open_step,
                    underway: true,
                },
            )]);
        }
        let world = self.world.unwrap_or(1) as usize;
        let waiting: Vec<PeerId> = self.listeners();
        if waiting.len() < world {
            return Ok(Vec::new());
        }
        self.started = true;
        for id in &waiting {
            self.peers.get_mut(id).expect("listed").active = true;
        }
        Ok(waiting
            .into_iter()
            .map(|id| {
                (
                    id,
                    Registered {
                        open_step: 0,
                        underway: false,
                    },
                )
            })
            .collect())
    }

    /// Checks a push's header against the protocol; the payload is decoded afterwards.
    pub fn check_push(&self, id: PeerId, key: Key, step: u64, numel: u32) -> Result<PushCheck> {
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
            if !peer.active {
                return Ok(PushCheck::Ignore);
            }
            return protocol(format!(
                "replayed old step {step} (the open round is step {})",
                self.open_step
            ));
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
        let Some(peer) = self.peers.get_mut(&id) else {
            return Ok(false);
        };
        let entry = self.keys.get_mut(&key).expect("checked before decoding");
        entry
            .insert(peer.rank as usize, push)
            .map_err(|e| NetError::Protocol(e.to_string()))?;
        if !peer.active {
            tracing::info!(
                "shard {}: rank {} rejoins the rounds at step {step}",
                self.shard,
                peer.rank
            );
            peer.active = true;
        }
        *self.pushed.entry(peer.rank).or_default() += 1;
        Ok(true)
    }

    /// Whether the open round has its first push (the server starts its deadline then).
    pub fn round_begun(&self) -> bool {
        !self.pushed.is_empty()
    }

    fn active_ranks(&self) -> impl Iterator<Item = u16> + '_ {
        self.peers.values().filter(|p| p.active).map(|p| p.rank)
    }

    fn finished(&self, rank: u16) -> bool {
        self.pushed.get(&rank).copied().unwrap_or(0) == self.keys.len()
    }

    /// Whether every active rank has pushed every key.
    pub fn round_complete(&self) -> bool {
        !self.keys.is_empty()
            && self.active_ranks().next().is_some()
            && self.active_ranks().all(|r| self.finished(r))
    }

    /// At the deadline of round `step`: evicts the active ranks that have not finished and
    /// returns their peers, for the server to close.
    pub fn evict_stragglers(&mut self, step: u64) -> Vec<PeerId> {
        if step != self.open_step {
            return Vec::new();
        }
        let late: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.active && !self.finished(p.rank))
            .map(|(id, _)| *id)
            .collect();
        for id in &late {
            self.disconnect(*id);
        }
        late
    }

    /// Closes the open round if it is complete: sums, compensates and re-encodes every key
    /// (keys in parallel) and logs the replies. Returns the closed round, with the keys that
    /// failed in it (each closed all the same).
    pub fn close_round(&mut self) -> Option<ClosedRound> {
        use rayon::prelude::*;
        if !self.round_complete() {
            return None;
        }
        let step = self.open_step;
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
        let faults: Vec<(Key, murmur_engine::Error)> = faults.into_iter().flatten().collect();
        let round = ClosedRound {
            step,
            replies,
            faults: faults
                .iter()
                .map(|(k, e)| format!("key {k:#x}: {e}"))
                .collect(),
        };
        self.log.push_back(round.clone());
        while self.log.len() > self.max_log_rounds {
            self.log.pop_front();
        }
        self.pushed.clear();
        self.open_step += 1;
        Some(round)
    }

    /// A snapshot of the model after `step` rounds: shard 0 keeps the bytes, every shard drops
    /// the rounds before it from its log. Returns the snapshot kept, if this one was.
    pub fn snapshot(
        &mut self,
        id: PeerId,
        step: u64,
        payload: Vec<u8>,
    ) -> Result<Option<(u64, Bytes)>> {
        self.peer(id)?;
        if step > self.open_step {
            return protocol(format!(
                "snapshot of step {step}, ahead of the open round {}",
                self.open_step
            ));
        }
        let kept = (!payload.is_empty()).then(|| (step, Bytes::from(payload)));
        if kept.is_some() {
            self.snapshot = kept.clone();
        }
        while self.log.front().is_some_and(|r| r.step < step) {
            self.log.pop_front();
        }
        Ok(kept)
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

    /// A peer left: its pushes of the open round no longer count.
    pub fn disconnect(&mut self, id: PeerId) {
        let Some(peer) = self.peers.remove(&id) else {
            return;
        };
        for entry in self.keys.values_mut() {
            entry.discard(peer.rank as usize);
        }
        self.pushed.remove(&peer.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: u16) -> Hello {
        Hello {
            rank,
            world: 2,
            shard: 0,
            shards: 1,
            node: "w".into(),
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
        };
        assert_eq!(state.register(7, &register).unwrap().len(), 1);
        for step in 0..2u64 {
            for key in keys {
                let PushCheck::Decode(decoder) = state.check_push(7, key, step, 3).unwrap() else {
                    panic!("step {step}: the push of key {key:#x} is not taken");
                };
                let push = decoder
                    .decode(bytemuck_f32(&[1.0, -2.0, 0.5]).as_slice())
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

    fn bytemuck_f32(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn ranks_follow_certificates_and_free_places_go_to_newcomers() {
        let mut state = ShardState::new(0, Limits::default(), 10);
        assert!(state.assign_rank("a").is_err(), "no job, no ranks");
        state.fix_world(2);
        assert_eq!(state.assign_rank("a").unwrap(), 0);
        assert_eq!(state.assign_rank("b").unwrap(), 1);
        // The same certificate gets its rank back.
        assert_eq!(state.assign_rank("a").unwrap(), 0);
        // Both ranks are taken: a third certificate is refused.
        state.hello(10, &hello(0)).unwrap();
        state.hello(11, &hello(1)).unwrap();
        assert!(state.assign_rank("c").is_err());
        // Rank 1's worker leaves: its place stays its own, and a newcomer is still refused.
        state.disconnect(11);
        assert!(state.assign_rank("c").is_err());
        assert_eq!(state.assign_rank("b").unwrap(), 1);
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
