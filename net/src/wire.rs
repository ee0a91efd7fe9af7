//! The wire protocol: every message is one frame on its own QUIC stream.
//!
//! ```text
//! offset size field
//!      0    2 magic 0x4D55 ("MU", little-endian)
//!      2    1 version (4)
//!      3    1 kind (see Kind)
//!      4    2 flags (0; reserved)
//!      6    2 rank of the sender (workers) or shard (servers)
//!      8    8 key
//!     16    8 step
//!     24    4 numel: elements the payload encodes (push, reply), else 0
//!     28    4 payload length, which must equal the bytes that follow
//!     32    - payload: codec bytes (push, reply, snapshot) or a postcard-encoded control
//!             message (hello, register, error, catch-up)
//! ```
//! Decoding checks every field against [`Limits`] and returns an error, never panics: a bad
//! frame costs its connection, never the node.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::engine::comm::{Key, KeySpec};
use crate::error::{NetError, Result};
use crate::ticket::Ticket;

/// The first two bytes of every frame header (little-endian "UM"), which tell a murmur peer from
/// anything else.
pub const MAGIC: u16 = 0x4D55;
/// The protocol version carried in every header; peers refuse frames of any other version.
pub const VERSION: u8 = 8;
/// Size in bytes of a frame header: magic, version, kind, reserved flags, rank, key, step, element
/// count and payload length.
pub const HEADER: usize = 32;

/// What a frame carries, the byte at offset 3 of its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Worker → server, first message: [`Hello`].
    Hello = 1,
    /// Worker → server: the keys this server owns, [`Register`]; the server answers with
    /// [`Registered`] once every rank of a new swarm has registered, at once in a running one.
    Register = 2,
    /// Server → worker: registration is complete and rounds may start, [`Registered`].
    Registered = 3,
    /// Worker → server: one key's payload for one step.
    Push = 4,
    /// Server → worker: the round's reply for one key, identical bytes for every worker.
    Reply = 5,
    // 6 is retired: errors travel as the reason of the connection close.
    /// A worker (the ranks in turn) → servers: a state snapshot after `step` rounds (payload only to shard 0, which
    /// keeps it; every shard drops older rounds from its log). Server → rejoining worker: the
    /// snapshot it holds.
    Snapshot = 7,
    /// Rejoining worker → server: [`CatchupRequest`]; the server answers with its snapshot, the
    /// replies of every round it logged since, and [`Catchup`].
    CatchupRequest = 8,
    /// Server → rejoining worker: the [`Catchup`] summary that ends a catch-up.
    Catchup = 9,
    /// Pipeline stage → neighbouring stage: one step's activations (key 0, forward) or
    /// activation gradients (key 1, backward), on a stage link only (`stage.rs`).
    Stage = 10,
    /// A worker that knows only where the servers are → shard 0: [`Join`]; shard 0 answers
    /// with [`Welcome`] (the job and this certificate's rank) and the worker hangs up, then
    /// says [`Hello`] to every shard with that rank.
    Join = 11,
    /// Shard 0 → joining worker: [`Welcome`], the job and the worker's rank.
    Welcome = 12,
    /// Worker → shard 0, before its pushes of round `step`: [`ReplicaDigest`], the digest of
    /// its replica as it enters the round.
    Digest = 13,
    /// Server → every registered worker, after a round's replies: [`Closed`], who took part
    /// and (shard 0) whether the replicas agreed.
    Closed = 14,
    /// Worker → shards other than 0, on receiving shard 0's [`Closed`] of round `step`:
    /// [`Participants`], the ranks shard 0 summed. Those shards close the round over the same
    /// ranks, so that a worker's push counts on every shard or on none.
    Participants = 15,
    /// Stage → rendezvous node: [`crate::nat::Meet`], which neighbour it wants to reach.
    Meet = 16,
    /// Rendezvous node → stage, once both ends of a cut have met (key: the cut):
    /// [`crate::nat::Introduction`], where the neighbour is and where the relay is.
    Introduce = 17,
    /// Worker → server, after its hello: bytes that measure the worker's path (at most
    /// [`PROBE_MAX`]; any content), which the server reads and drops. The worker times how
    /// long the server takes to acknowledge them (`QuicCollective::probe`).
    Probe = 18,
}

/// The largest probe a server takes.
pub const PROBE_MAX: usize = 4 << 20;

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Register,
            3 => Kind::Registered,
            4 => Kind::Push,
            5 => Kind::Reply,
            7 => Kind::Snapshot,
            8 => Kind::CatchupRequest,
            9 => Kind::Catchup,
            10 => Kind::Stage,
            11 => Kind::Join,
            12 => Kind::Welcome,
            13 => Kind::Digest,
            14 => Kind::Closed,
            15 => Kind::Participants,
            16 => Kind::Meet,
            17 => Kind::Introduce,
            18 => Kind::Probe,
            _ => return None,
        })
    }
}

/// Hard limits on what a peer may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload in bytes a frame may announce; larger headers are refused before anything is
    /// buffered.
    pub max_payload: usize,
    /// Most keys a worker may register with one server.
    pub max_keys: usize,
    /// Most elements one key or one frame may hold.
    pub max_numel: u32,
    /// Elements over all registered keys (what the server allocates for them).
    pub max_total_numel: u64,
    /// Bytes of frames a connection may hold read but not yet handled, partly read ones
    /// included ([`crate::transport::Incoming`]): a peer that sends faster than it is served
    /// loses its connection instead of growing the receiver's memory.
    pub max_buffered: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload: 256 << 20,
            max_keys: 1 << 16,
            max_numel: 1 << 28,
            max_total_numel: 1 << 30,
            // The largest frame twice: an honest peer has one round in flight.
            max_buffered: 512 << 20,
        }
    }
}

/// A checked frame header: readers validate it before they buffer the payload it announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// The sending worker's rank, or the shard index when a server sends.
    pub rank: u16,
    /// The parameter key the payload belongs to (0 for control frames).
    pub key: Key,
    /// The training step (round) the frame belongs to.
    pub step: u64,
    /// Elements of the tensor the payload encodes (0 for control frames), checked against
    /// [`Limits::max_numel`].
    pub numel: u32,
    /// Payload bytes that follow the header.
    pub len: usize,
}

impl Header {
    /// Parses and checks a header: magic, version, a known kind, no reserved flags, and element
    /// count and payload length within `limits`; fails with [`NetError::Wire`] otherwise.
    pub fn decode(bytes: &[u8; HEADER], limits: &Limits) -> Result<Header> {
        let bad = |m: String| Err(NetError::Wire(m));
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        if u16_at(0) != MAGIC {
            return bad(format!("magic {:#06x}, expected {MAGIC:#06x}", u16_at(0)));
        }
        if bytes[2] != VERSION {
            return bad(format!(
                "protocol version {}, this node speaks {VERSION}",
                bytes[2]
            ));
        }
        let Some(kind) = Kind::from_u8(bytes[3]) else {
            return bad(format!("unknown frame kind {}", bytes[3]));
        };
        if u16_at(4) != 0 {
            return bad(format!("reserved flags {:#x} set", u16_at(4)));
        }
        let (numel, len) = (u32_at(24), u32_at(28) as usize);
        if numel > limits.max_numel {
            return bad(format!(
                "{numel} elements exceed the limit of {}",
                limits.max_numel
            ));
        }
        if len > limits.max_payload {
            return bad(format!(
                "payload of {len} bytes exceeds the limit of {}",
                limits.max_payload
            ));
        }
        Ok(Header {
            kind,
            rank: u16_at(6),
            key: u64_at(8),
            step: u64_at(16),
            numel,
            len,
        })
    }

    /// The 32 header bytes, for senders that pass the payload on without copying it.
    pub fn encode(&self) -> [u8; HEADER] {
        let len = u32::try_from(self.len).expect("senders keep payloads under the limits");
        let mut out = [0u8; HEADER];
        out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[6..8].copy_from_slice(&self.rank.to_le_bytes());
        out[8..16].copy_from_slice(&self.key.to_le_bytes());
        out[16..24].copy_from_slice(&self.step.to_le_bytes());
        out[24..28].copy_from_slice(&self.numel.to_le_bytes());
        out[28..32].copy_from_slice(&len.to_le_bytes());
        out
    }

    /// The frame, once exactly the announced payload has arrived.
    pub fn with_payload(self, payload: Vec<u8>) -> Result<Frame> {
        if payload.len() != self.len {
            return Err(NetError::Wire(format!(
                "header announces {} payload bytes, {} follow",
                self.len,
                payload.len()
            )));
        }
        Ok(Frame::new(
            self.kind, self.rank, self.key, self.step, self.numel, payload,
        ))
    }
}

/// One message between peers: a header's fields and the payload that follows it on a QUIC stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the frame carries.
    pub kind: Kind,
    /// The sending worker's rank, or the shard index when a server sends.
    pub rank: u16,
    /// The parameter key the payload belongs to (0 for control frames).
    pub key: Key,
    /// The training step (round) the frame belongs to.
    pub step: u64,
    /// Elements of the tensor the payload encodes (0 for control frames).
    pub numel: u32,
    /// The payload: an encoded tensor, or a postcard-serialised control message.
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame from its fields; the payload length in the header is taken from `payload`.
    pub fn new(kind: Kind, rank: u16, key: Key, step: u64, numel: u32, payload: Vec<u8>) -> Frame {
        Frame {
            kind,
            rank,
            key,
            step,
            numel,
            payload,
        }
    }

    /// A control frame carrying `message`.
    pub fn control<T: Serialize>(kind: Kind, rank: u16, step: u64, message: &T) -> Frame {
        Frame::new(
            kind,
            rank,
            0,
            step,
            0,
            postcard::to_allocvec(message).expect("control messages serialise"),
        )
    }

    /// The frame as it travels: the 32-byte header followed by the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.payload.len());
        out.extend(self.header().encode());
        out.extend(&self.payload);
        out
    }

    /// The frame's header.
    pub fn header(&self) -> Header {
        Header {
            kind: self.kind,
            rank: self.rank,
            key: self.key,
            step: self.step,
            numel: self.numel,
            len: self.payload.len(),
        }
    }

    /// Parses a whole frame from `bytes`, checking the header against `limits` and that exactly the
    /// announced payload follows.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Frame> {
        if bytes.len() < HEADER {
            return Err(NetError::Wire(format!(
                "{} bytes is shorter than the {HEADER}-byte header",
                bytes.len()
            )));
        }
        let header = Header::decode(bytes[..HEADER].try_into().expect("32 bytes"), limits)?;
        header.with_payload(bytes[HEADER..].to_vec())
    }

    /// The control message in the payload.
    pub fn message<T: DeserializeOwned>(&self) -> Result<T> {
        postcard::from_bytes(&self.payload)
            .map_err(|e| NetError::Wire(format!("{:?} message does not decode: {e}", self.kind)))
    }
}

/// Bytes before a push's codec payload: the samples the push stands for, u32 little-endian.
pub const PUSH_PREFIX: usize = 4;

/// Splits a push frame's payload into the samples it stands for and the codec payload; fails
/// on a payload too short to hold the count.
pub fn split_push(payload: &[u8]) -> Result<(u32, &[u8])> {
    match payload.split_first_chunk::<PUSH_PREFIX>() {
        Some((samples, rest)) => Ok((u32::from_le_bytes(*samples), rest)),
        None => Err(NetError::Wire(format!(
            "a push of {} bytes has no sample count",
            payload.len()
        ))),
    }
}

/// A worker introduces itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The worker's rank, below `world`.
    pub rank: u16,
    /// Workers in the swarm, which every worker and server must agree on.
    pub world: u16,
    /// Which shard the worker believes this server is, of how many: every worker must list
    /// the servers in the same order.
    pub shard: u16,
    /// How many shards the worker believes there are.
    pub shards: u16,
    /// The worker's node name for logs, at most 128 characters.
    pub node: String,
    /// The ticket shard 0 signed when it gave this certificate its rank (in its
    /// [`Welcome`]): the other shards of a job accept the hello only with it.
    pub ticket: Option<Ticket>,
}

/// The keys a worker will push to this server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    /// Every key the worker will push to this server, with its element count.
    pub keys: Vec<KeySpec>,
    /// Whether the worker sends this server (shard 0 only) the digest of its replica before
    /// each round's pushes: its round then counts as pushed only once the digest is in too.
    /// Frames on separate streams arrive in any order, so without this a round could close
    /// before a digest sent ahead of the pushes, and its verdict miss that replica.
    pub replica_digests: bool,
}

impl Register {
    /// Checks the list against the limits before anything is built from it.
    pub fn check(&self, limits: &Limits) -> Result<()> {
        if self.keys.len() > limits.max_keys {
            return Err(NetError::Protocol(format!(
                "{} keys exceed the limit of {}",
                self.keys.len(),
                limits.max_keys
            )));
        }
        if let Some(k) = self.keys.iter().find(|k| k.numel > limits.max_numel) {
            return Err(NetError::Protocol(format!(
                "key {:#x} has {} elements, over the limit",
                k.key, k.numel
            )));
        }
        let total: u64 = self.keys.iter().map(|k| u64::from(k.numel)).sum();
        if total > limits.max_total_numel {
            return Err(NetError::Protocol(format!(
                "{total} elements over all keys exceed the limit of {}",
                limits.max_total_numel
            )));
        }
        Ok(())
    }
}

/// Positions `start..start + len` of one epoch's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// The first position.
    pub start: u64,
    /// How many follow it, itself included.
    pub len: u32,
}

/// One member's share of a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The member.
    pub rank: u16,
    /// Its positions, in order.
    pub spans: Vec<Span>,
}

impl Share {
    /// The positions in the share.
    pub fn samples(&self) -> u64 {
        self.spans.iter().map(|s| u64::from(s.len)).sum()
    }

    /// Every position of the share, in order.
    pub fn positions(&self) -> impl Iterator<Item = u64> + '_ {
        // Saturating: a span from a peer may name any start.
        self.spans
            .iter()
            .flat_map(|s| s.start..s.start.saturating_add(u64::from(s.len)))
    }
}

/// A round's global batch as shard 0 cut it: the epoch of its positions, which of the
/// epoch's rounds it is, and each member's share in the order they were cut (members with no
/// share are not listed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The epoch (from 0) whose positions the round covers.
    pub epoch: u32,
    /// Rounds of the epoch cut before this one (0: the epoch's first).
    pub round: u64,
    /// The members' shares, in the order they were cut: the members that took part in the
    /// round before first, each group ascending by rank.
    pub shares: Vec<Share>,
}

impl Assignment {
    /// The share of `rank`, and how many positions the shares before it hold (where its
    /// samples start in the round's global batch); `None` when the rank has no share.
    pub fn share_of(&self, rank: u16) -> Option<(&Share, u64)> {
        let mut before = 0;
        for share in &self.shares {
            if share.rank == rank {
                return Some((share, before));
            }
            before += share.samples();
        }
        None
    }

    /// The positions of the whole round.
    pub fn samples(&self) -> u64 {
        self.shares.iter().map(Share::samples).sum()
    }
}

/// A server's answer to [`Register`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// The round now open.
    pub open_step: u64,
    /// Whether the swarm had started without this worker (it must catch up first).
    pub underway: bool,
    /// From shard 0 of a job with a sample queue: the open round's assignment (a worker that
    /// comes back within the round finds its share in it).
    pub assignment: Option<Assignment>,
}

/// A worker asks shard 0 for the job it serves and for its rank in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// The node's name, for the servers' logs (its identity is its certificate).
    pub node: String,
}

/// The digest of a worker's replica as it enters a round: the 64-bit XXH3 hash of its
/// parameters' bits, as little-endian f32 in the model's parameter order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDigest {
    /// The digest.
    pub digest: u64,
}

/// What a server says of a round it closed, after the round's replies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Closed {
    /// The ranks whose pushes the round summed on this shard, ascending: a worker not among
    /// them was late, and its push changed nothing here.
    pub participants: Vec<u16>,
    /// The replica digests the shard received for the round (shard 0 only): the one held by
    /// more than half of the workers that sent one, if any, and whether any differed.
    pub replicas: Option<ReplicaVerdict>,
    /// From shard 0 of a job with a sample queue: the next round's assignment, cut when this
    /// one closed.
    pub next: Option<Assignment>,
    /// From shard 0 of several shards: the round's [`Participants`] as it signed them, which
    /// the worker relays to the other shards (if shard 0's early word did not reach it).
    pub relay: Option<Participants>,
}

/// Shard 0's participants of a round, as a worker relays them to the other shards
/// ([`Kind::Participants`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participants {
    /// The ranks whose pushes shard 0 summed into the round, ascending.
    pub ranks: Vec<u16>,
    /// The samples shard 0 counted for each of `ranks`, in order (each rank's assigned
    /// share): the other shards weigh each participant's pushes by these, whatever its pushes
    /// there claim.
    pub samples: Vec<u32>,
    /// The round of the snapshot shard 0 holds, if any: the other shards drop the rounds
    /// before it from their logs (a rejoining worker starts from that snapshot).
    pub snapshot: Option<u64>,
    /// Shard 0's signature of the round's step and the fields above, with the key of its
    /// certificate, the issuer of every rank ticket (`crate::word`); empty where the
    /// shards serve no job (and check no tickets).
    pub signature: Vec<u8>,
}

/// The replica digests of one round, as shard 0 compared them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaVerdict {
    /// The digest more than half of the round's digests carried, if one did.
    pub majority: Option<u64>,
    /// Whether any digest of the round differed from another.
    pub disagreed: bool,
}

/// Shard 0's answer to [`Join`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The rank the servers assigned to the worker's certificate: the same one every time the
    /// same certificate joins while the server runs.
    pub rank: u16,
    /// Workers in the job, the world size every rank's `Hello` must carry.
    pub world: u16,
    /// The job's description as the node library serialises it (JSON); this crate carries it
    /// without reading it, and its size is bounded by the frame limit.
    pub job: String,
    /// The rank, signed by shard 0 for the worker's certificate, to show every other shard.
    pub ticket: Ticket,
    /// The swarm authority's signature of `job` ([`crate::identity::verify_job`]): a worker
    /// trains no job without it.
    pub signature: Vec<u8>,
}

/// A rejoining worker asks for what it missed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchupRequest {}

/// The summary that ends a catch-up: the server has sent its snapshot (if it holds one) and the
/// replies of every logged round, `first_step` to `open_step - 1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catchup {
    /// The step of the snapshot the server sent, or `None` if it holds none (the worker then starts
    /// from step 0).
    pub snapshot_step: Option<u64>,
    /// The step of the oldest round whose replies the server sent.
    pub first_step: u64,
    /// The round the server has open: the worker resumes pushing at this step.
    pub open_step: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let limits = Limits {
            max_payload: 100,
            max_keys: 4,
            max_numel: 1000,
            max_total_numel: 10_000,
            max_buffered: 1000,
        };
        let f = Frame::new(Kind::Push, 3, 0x2_0001, 42, 10, vec![1, 2, 3]);
        let bytes = f.encode();
        assert_eq!(bytes.len(), HEADER + 3);
        assert_eq!(Frame::decode(&bytes, &limits).unwrap(), f);
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (bytes[..10].to_vec(), "shorter"),
            (bytes[..HEADER + 2].to_vec(), "announces"),
            ([bytes.clone(), vec![0]].concat(), "announces"),
        ];
        let mut b = bytes.clone();
        b[0] = 0;
        cases.push((b, "magic"));
        let mut b = bytes.clone();
        b[2] = 9;
        cases.push((b, "version"));
        let mut b = bytes.clone();
        b[3] = 77;
        cases.push((b, "kind"));
        let mut b = bytes.clone();
        b[4] = 1;
        cases.push((b, "flags"));
        cases.push((
            Frame::new(Kind::Push, 0, 0, 0, 5000, vec![]).encode(),
            "elements",
        ));
        cases.push((
            Frame::new(Kind::Push, 0, 0, 0, 1, vec![0; 101]).encode(),
            "exceeds",
        ));
        for (bytes, want) in cases {
            let err = Frame::decode(&bytes, &limits).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn control_messages_round_trip_and_garbage_is_an_error() {
        let hello = Hello {
            rank: 2,
            world: 4,
            shard: 1,
            shards: 2,
            node: "w2".into(),
            ticket: Some(Ticket {
                rank: 2,
                world: 4,
                job: vec![1; 32],
                holder: vec![2; 32],
                issuer: vec![3; 500],
                signature: vec![4; 70],
            }),
        };
        let f = Frame::control(Kind::Hello, 2, 0, &hello);
        assert_eq!(f.message::<Hello>().unwrap(), hello);
        let junk = Frame::new(Kind::Register, 0, 0, 0, 0, vec![0xff; 7]);
        assert!(junk.message::<Register>().is_err());
        let too_many = Register {
            keys: vec![
                KeySpec {
                    key: 1,
                    numel: 1,
                    push: "f32".into(),
                    pull: "f32".into(),
                    server_memory: "none".into(),
                    seed: 0,
                    sync_every: 0,
                    owner: String::new(),
                };
                5
            ],
            replica_digests: false,
        };
        let limits = |max_keys, max_total_numel| Limits {
            max_keys,
            max_total_numel,
            ..Limits::default()
        };
        assert!(too_many.check(&limits(5, 5)).is_ok());
        assert!(too_many.check(&limits(4, 5)).is_err(), "too many keys");
        assert!(too_many.check(&limits(5, 4)).is_err(), "too many elements");
    }
}
