//! The in-process collective: ranks are threads of one process, the servers a shared state
//! the last rank to arrive at a round closes. Simulations and most tests use it, and it
//! replays a run whose rounds closed without some ranks ([`replay_collectives`]).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rayon::prelude::*;

use super::aggregate::Aggregate;
use super::push::Push;
use super::shard::{KeyState, PushDecoder};
use super::{Collective, Key, KeySpec};
use crate::error::{Error, Result};

#[derive(Default)]
struct Hub {
    keys: HashMap<Key, KeyState>,
    /// Ranks that have pushed in the open round, and the round's replies once closed.
    arrived: usize,
    round: u64,
    replies: HashMap<Key, Vec<u8>>,
    /// Ranks that have collected the closed round's replies.
    collected: usize,
    registered: usize,
    failure: Option<String>,
    /// Keys whose round failed to close, one line each: they closed all the same.
    faults: Vec<String>,
}

/// The ranks whose pushes a round summed, by round and key.
pub type Participants = Box<dyn Fn(u64, Key) -> Vec<usize> + Send + Sync>;

struct Shared {
    hub: Mutex<Hub>,
    changed: Condvar,
    world: usize,
    /// Where a replay takes each round's participants from; every rank otherwise.
    participants: Option<Participants>,
    /// How each key's pushes are combined.
    rule: Aggregate,
}

/// One rank's handle on an in-process collective.
pub struct LocalCollective {
    shared: Arc<Shared>,
    rank: usize,
    /// This round's pushes, delivered to the hub together by `pull`.
    /// This rank's pushes of the open round: key, samples, payload.
    outbox: Vec<(Key, u32, Vec<u8>)>,
}

/// Handles for `world` ranks, to be moved one to each thread.
pub fn local_collectives(world: usize) -> Vec<LocalCollective> {
    collectives(world, None, Aggregate::Mean)
}

/// Handles for `world` ranks whose keys combine pushes by `rule` (as servers started with
/// that rule do).
pub fn aggregating_collectives(world: usize, rule: Aggregate) -> Vec<LocalCollective> {
    collectives(world, None, rule)
}

/// Handles for `world` ranks that replay a run whose rounds closed without some ranks (on a
/// quorum, as the QUIC servers log them): every rank computes and pushes every round, as the
/// late ones did there, but round `step` of `key` sums only the pushes of
/// `participants(step, key)`. Given the servers' participant sets, the replay has the bits of
/// the run it replays.
pub fn replay_collectives(world: usize, participants: Participants) -> Vec<LocalCollective> {
    collectives(world, Some(participants), Aggregate::Mean)
}

fn collectives(
    world: usize,
    participants: Option<Participants>,
    rule: Aggregate,
) -> Vec<LocalCollective> {
    let shared = Arc::new(Shared {
        hub: Mutex::default(),
        changed: Condvar::new(),
        world,
        participants,
        rule,
    });
    (0..world)
        .map(|rank| LocalCollective {
            shared: shared.clone(),
            rank,
            outbox: Vec::new(),
        })
        .collect()
}

/// How long a rank waits for the others before declaring the round failed.
const PATIENCE: Duration = Duration::from_secs(600);

impl LocalCollective {
    /// The keys whose round failed to close so far, one line each (`round N: key K: why`).
    /// Each closed with an update that changed nothing, and the run went on.
    pub fn faults(&self) -> Vec<String> {
        self.shared
            .hub
            .lock()
            .map(|h| h.faults.clone())
            .unwrap_or_default()
    }

    fn wait<'a>(
        &'a self,
        mut hub: std::sync::MutexGuard<'a, Hub>,
        done: impl Fn(&Hub) -> bool,
    ) -> Result<std::sync::MutexGuard<'a, Hub>> {
        while !done(&hub) {
            if let Some(f) = &hub.failure {
                return Err(Error::Data(format!("in-process collective: {f}")));
            }
            let (h, timeout) = self
                .shared
                .changed
                .wait_timeout(hub, PATIENCE)
                .expect("hub lock");
            hub = h;
            if timeout.timed_out() && !done(&hub) {
                return Err(Error::Data(
                    "in-process collective: a rank did not arrive in 10 minutes".into(),
                ));
            }
        }
        Ok(hub)
    }

    /// Passes `result` on; an error also fails the round for every rank, so that none waits
    /// for a round that cannot close.
    fn fail_on_error<T>(&self, hub: &mut Hub, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            hub.failure = Some(e.to_string());
            self.shared.changed.notify_all();
        }
        result
    }
}

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn register(&mut self, keys: &[KeySpec]) -> Result<()> {
        let mut hub = self.shared.hub.lock().expect("hub lock");
        for spec in keys {
            match hub.keys.get(&spec.key) {
                Some(existing) if existing.spec != *spec => {
                    return Err(Error::Config(format!(
                        "rank {} registers key {:#x} differently from another rank",
                        self.rank, spec.key
                    )));
                }
                Some(_) => {}
                None => {
                    let state = KeyState::new(spec.clone(), self.shared.rule)?;
                    hub.keys.insert(spec.key, state);
                }
            }
        }
        hub.registered += 1;
        self.shared.changed.notify_all();
        let world = self.shared.world;
        drop(self.wait(hub, |h| h.registered >= world)?);
        Ok(())
    }

    fn server_error(&self, key: Key) -> Option<Vec<f32>> {
        let hub = self.shared.hub.lock().ok()?;
        hub.keys.get(&key)?.server_error().ok()
    }

    fn push(&mut self, _step: u64, key: Key, samples: u32, payload: Vec<u8>) -> Result<()> {
        self.outbox.push((key, samples, payload));
        Ok(())
    }

    fn pull(&mut self, step: u64, keys: &[Key]) -> Result<Vec<(Key, Vec<u8>)>> {
        let pushes = std::mem::take(&mut self.outbox);
        let (rank, world) = (self.rank, self.shared.world);
        let hub = self.shared.hub.lock().expect("hub lock");
        // The previous round's replies must have been collected by everyone.
        let mut hub = self.wait(hub, |h| h.arrived < world && h.replies.is_empty())?;
        if hub.round != step {
            return Err(Error::Data(format!(
                "rank {rank} pushes step {step} while the round is {}",
                hub.round
            )));
        }
        let decoders: Result<Vec<PushDecoder>> = pushes
            .iter()
            .map(|(key, _, _)| {
                hub.keys
                    .get(key)
                    .ok_or_else(|| Error::Data(format!("unknown key {key:#x}")))?
                    .push_decoder(rank, step)
            })
            .collect();
        let decoders = self.fail_on_error(&mut hub, decoders)?;
        // Decoding needs no state: every rank decodes its pushes at once, outside the lock.
        drop(hub);
        let decoded: Result<Vec<Push>> = decoders
            .par_iter()
            .zip(&pushes)
            .map(|(d, (_, samples, payload))| d.decode(*samples, payload))
            .collect();
        let mut hub = self.shared.hub.lock().expect("hub lock");
        let decoded = self.fail_on_error(&mut hub, decoded)?;
        // A key pushed twice in one round is refused, not overwritten.
        let inserted: Result<()> =
            pushes
                .iter()
                .zip(decoded)
                .try_for_each(|((key, _, _), values)| {
                    hub.keys
                        .get_mut(key)
                        .expect("checked above")
                        .insert(rank, values)
                });
        self.fail_on_error(&mut hub, inserted)?;
        hub.arrived += 1;
        if hub.arrived == world {
            if let Some(participants) = &self.shared.participants {
                for (key, state) in hub.keys.iter_mut() {
                    let summed = participants(step, *key);
                    (0..world)
                        .filter(|r| !summed.contains(r))
                        .for_each(|r| state.discard(r));
                }
            }
            // Last to arrive: close every key's round; keys are independent. A key whose
            // arithmetic fails closes all the same, with an update that changes nothing, as
            // the QUIC servers' keys do (KeyState::close_or_skip): the round goes on and the
            // fault is logged, so one bad key neither ends the run nor leaves others open.
            let closed: Vec<(Key, Vec<u8>, Option<Error>)> = hub
                .keys
                .par_iter_mut()
                .filter(|(_, state)| state.count() > 0)
                .map(|(key, state)| {
                    let (reply, fault) = state.close_or_skip();
                    (*key, reply, fault)
                })
                .collect();
            let mut replies = HashMap::with_capacity(closed.len());
            for (key, reply, fault) in closed {
                if let Some(e) = fault {
                    tracing::error!("round {step}: key {key:#x} failed to close: {e}");
                    hub.faults.push(format!("round {step}: key {key:#x}: {e}"));
                }
                replies.insert(key, reply);
            }
            hub.replies = replies;
            hub.collected = 0;
        }
        self.shared.changed.notify_all();
        let mut hub = self.wait(hub, |h| {
            h.arrived == world && !h.replies.is_empty() || h.failure.is_some()
        })?;
        let out = keys
            .iter()
            .map(|key| {
                hub.replies
                    .get(key)
                    .map(|r| (*key, r.clone()))
                    .ok_or_else(|| Error::Data(format!("no reply for key {key:#x}")))
            })
            .collect::<Result<Vec<_>>>()?;
        hub.collected += 1;
        if hub.collected == world {
            hub.replies.clear();
            hub.arrived = 0;
            hub.round += 1;
            self.shared.changed.notify_all();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::codec_context;
    use crate::compress::parse;

    fn spec(key: Key, numel: u32, codec: &str, memory: &str) -> KeySpec {
        KeySpec {
            key,
            numel,
            push: codec.into(),
            pull: codec.into(),
            server_memory: memory.into(),
            seed: 3,
            sync_every: 0,
            owner: String::new(),
        }
    }

    #[test]
    fn a_replay_sums_only_the_rounds_participants() {
        let world = 3;
        // Round 0: everyone; round 1: ranks 0 and 1 on key 1, rank 2 alone on key 2.
        let participants: Participants = Box::new(|step, key| match (step, key) {
            (1, 1) => vec![0, 1],
            (1, _) => vec![2],
            _ => vec![0, 1, 2],
        });
        let f32s = parse("f32").unwrap();
        let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let joins: Vec<_> = replay_collectives(world, participants)
                .into_iter()
                .map(|mut c| {
                    let f32s = &f32s;
                    s.spawn(move || {
                        c.register(&[spec(1, 1, "f32", "none"), spec(2, 1, "f32", "none")])
                            .unwrap();
                        (0..2u64)
                            .map(|step| {
                                let r = c.rank() as f32;
                                let push = |v: f32| f32s.encode(&[v], &Default::default());
                                let replies =
                                    c.push_pull(step, 1, vec![(1, push(r)), (2, push(10.0 * r))]);
                                replies
                                    .unwrap()
                                    .iter()
                                    .map(|(_, b)| {
                                        f32s.decode(b, 1, &Default::default()).unwrap()[0]
                                    })
                                    .collect()
                            })
                            .collect()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for got in &results {
            assert_eq!(got, &[vec![1.0, 10.0], vec![0.5, 20.0]]);
        }
    }

    #[test]
    fn identity_codec_returns_the_exact_mean_to_every_rank() {
        let world = 4;
        let handles = local_collectives(world);
        let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let joins: Vec<_> = handles
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        c.register(&[spec(1, 3, "f32", "none"), spec(2, 2, "f32", "none")])
                            .unwrap();
                        (0..3u64)
                            .map(|step| {
                                let r = c.rank() as f32;
                                let pushes = vec![
                                    (
                                        1,
                                        parse("f32")
                                            .unwrap()
                                            .encode(&[r, step as f32, 1.0], &Default::default()),
                                    ),
                                    (
                                        2,
                                        parse("f32")
                                            .unwrap()
                                            .encode(&[r * 2.0, -r], &Default::default()),
                                    ),
                                ];
                                let replies = c.push_pull(step, 1, pushes).unwrap();
                                let mut v = parse("f32")
                                    .unwrap()
                                    .decode(&replies[0].1, 3, &Default::default())
                                    .unwrap();
                                v.extend(
                                    parse("f32")
                                        .unwrap()
                                        .decode(&replies[1].1, 2, &Default::default())
                                        .unwrap(),
                                );
                                v
                            })
                            .collect()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for (step, got) in results[0].iter().enumerate() {
            assert_eq!(
                got,
                &vec![1.5, step as f32, 1.0, 3.0, -1.5],
                "mean of ranks 0..4"
            );
        }
        assert!(
            results.iter().all(|r| *r == results[0]),
            "every rank gets the same reply"
        );
    }

    #[test]
    fn server_error_feedback_is_the_two_way_ef_recursion() {
        // One rank, top-1 of 3 with server EF: the server's residual carries what it did not send.
        let mut c = local_collectives(1).pop().unwrap();
        c.register(&[spec(7, 3, "topk:k=1", "ef")]).unwrap();
        let codec = parse("topk:k=1").unwrap();
        let ctx = |step| codec_context(3, step, 7);
        let push = codec.encode(&[0.5, -2.0, 1.0], &ctx(0)); // sends -2.0 at index 1
        let reply = codec
            .decode(
                &c.push_pull(0, 1, vec![(7, push)]).unwrap()[0].1,
                3,
                &ctx(0),
            )
            .unwrap();
        assert_eq!(reply, [0.0, -2.0, 0.0]);
        let push = codec.encode(&[0.0, 0.0, 0.6], &ctx(1)); // mean 0.6 at index 2; server adds nothing yet
        let reply = codec
            .decode(
                &c.push_pull(1, 1, vec![(7, push)]).unwrap()[0].1,
                3,
                &ctx(1),
            )
            .unwrap();
        assert_eq!(reply, [0.0, 0.0, 0.6]);
        let push = codec.encode(&[0.0, 0.0, 0.0], &ctx(2));
        // Nothing new: still nothing held back by the server (both sends were exact).
        let reply = codec
            .decode(
                &c.push_pull(2, 1, vec![(7, push)]).unwrap()[0].1,
                3,
                &ctx(2),
            )
            .unwrap();
        assert_eq!(reply.iter().filter(|v| **v != 0.0).count(), 0);
    }

    #[test]
    fn a_sync_round_is_plain_both_ways_and_flushes_the_server_memory() {
        // Top-2 up, top-1 down with server EF, every third round a sync round (LIEC-SGD's
        // averaging step).
        let mut c = local_collectives(1).pop().unwrap();
        let key = KeySpec {
            sync_every: 3,
            owner: String::new(),
            push: "topk:k=2".into(),
            ..spec(5, 3, "topk:k=1", "ef")
        };
        c.register(std::slice::from_ref(&key)).unwrap();
        let (topk, plain) = (parse("topk:k=2").unwrap(), parse("f32").unwrap());
        let ctx = |step| codec_context(3, step, 5);
        assert!(!key.is_sync_round(0) && !key.is_sync_round(1) && key.is_sync_round(2));
        for step in 0..2 {
            let push = topk.encode(&[1.0, 0.5, 0.25], &ctx(step));
            c.push_pull(step, 1, vec![(5, push)]).unwrap();
        }
        // What the server held back after two compressed rounds comes back in the sync round.
        let held = c.server_error(5).unwrap();
        assert!(held.iter().any(|v| *v != 0.0), "the server holds an error");
        let push = plain.encode(&[2.0, -1.0, 4.0], &ctx(2));
        let reply = c.push_pull(2, 1, vec![(5, push)]).unwrap().remove(0).1;
        let expected: Vec<f32> = [2.0f32, -1.0, 4.0]
            .iter()
            .zip(&held)
            .map(|(x, e)| x + e)
            .collect();
        assert_eq!(plain.decode(&reply, 3, &ctx(2)).unwrap(), expected);
        assert_eq!(c.server_error(5).unwrap(), [0.0; 3], "memory reset");
        // A compressed push in a sync round is refused (wrong length for f32).
        let push = topk.encode(&[1.0, 0.0, 0.0], &ctx(5));
        for step in 3..5 {
            let ok = topk.encode(&[1.0, 0.0, 0.0], &ctx(step));
            c.push_pull(step, 1, vec![(5, ok)]).unwrap();
        }
        assert!(c.push_pull(5, 1, vec![(5, push)]).is_err());
    }

    #[test]
    fn a_key_that_fails_to_close_leaves_the_round_and_the_run_going() {
        use crate::comm::shard::FAILING_KEY_FOR_TESTS;
        let handles = local_collectives(2);
        let good = 7;
        let results: Vec<(Vec<f32>, Vec<f32>, Vec<String>)> = std::thread::scope(|s| {
            let joins: Vec<_> = handles
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        c.register(&[
                            spec(good, 4, "f32", "none"),
                            spec(FAILING_KEY_FOR_TESTS, 4, "f32", "none"),
                        ])
                        .unwrap();
                        let codec = parse("f32").unwrap();
                        let ctx = codec_context(3, 0, good);
                        let mine = vec![c.rank() as f32 + 1.0; 4];
                        let mut last = (vec![], vec![]);
                        for step in 0..2 {
                            let out = c
                                .push_pull(
                                    step,
                                    1,
                                    vec![
                                        (good, codec.encode(&mine, &ctx)),
                                        (FAILING_KEY_FOR_TESTS, codec.encode(&mine, &ctx)),
                                    ],
                                )
                                .expect("the round goes on");
                            let value = |k: Key| {
                                let (_, bytes) = out.iter().find(|(key, _)| *key == k).unwrap();
                                codec.decode(bytes, 4, &ctx).unwrap()
                            };
                            last = (value(good), value(FAILING_KEY_FOR_TESTS));
                        }
                        (last.0, last.1, c.faults())
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for (good_mean, failed, faults) in results {
            assert_eq!(good_mean, [1.5; 4], "the other key closed with the mean");
            assert_eq!(failed, [0.0; 4], "the failing key closed with no change");
            assert_eq!(faults.len(), 2, "one fault per round: {faults:?}");
            assert!(
                faults[1].starts_with("round 1: key 0xdead0000"),
                "{faults:?}"
            );
        }
    }

    #[test]
    fn a_bad_push_fails_the_round_for_everyone_instead_of_hanging() {
        let handles = local_collectives(2);
        let outcomes: Vec<bool> = std::thread::scope(|s| {
            let joins: Vec<_> = handles
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        c.register(&[spec(1, 4, "f32", "none")]).unwrap();
                        let payload = if c.rank() == 0 {
                            vec![0u8; 16]
                        } else {
                            vec![1, 2, 3]
                        };
                        c.push_pull(0, 1, vec![(1, payload)]).is_ok()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(outcomes, [false, false]);
    }
}
