//! What a node tells whoever holds it: typed events, one stream per subscriber. The same
//! events travel as JSON lines on stdout when a node runs as a process (`murmur worker
//! --json`), which is how the process launcher reads them.

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// Something that happened in a worker. Serialised with an `event` tag, snake case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
// New kinds of event will come (the node library grows): an app that matches on them keeps
// a wildcard arm, so that a new kind is not a breaking change.
#[non_exhaustive]
pub enum Event {
    /// The node is waiting for something it needs (the servers, the other workers).
    Waiting {
        /// What it waits for, in words.
        what: String,
    },
    /// Shard 0 took the worker into the job and gave it its rank; it trains once the job
    /// starts (or, in a running swarm, once it has caught up: then [`Event::Joined`]).
    Assigned {
        /// Its rank, assigned by the servers.
        rank: u16,
        /// Workers in the job.
        world: u16,
    },
    /// The worker joined the job (and caught up, in a running swarm).
    Joined {
        /// Its rank, assigned by the servers.
        rank: u16,
        /// Workers in the job.
        world: u16,
        /// Rounds in the whole job.
        steps: u64,
        /// Rounds per epoch (an mlp job), or between validations (a gpt job).
        steps_per_epoch: u64,
        /// Parameters of the model.
        parameters: usize,
        /// Keys (partitions) the model travels in.
        keys: usize,
        /// The round it starts at (above 0 after catching up with a running swarm).
        from_step: u64,
        /// The round of the worker's own saved state it took back (a worker started again
        /// after dying), before catching up to `from_step`.
        #[serde(default)]
        resumed_from: Option<u64>,
        /// The codec of its compressed pushes, with every parameter named (LoCo's calibrated
        /// scale included).
        #[serde(default)]
        codec: String,
    },
    /// A round this worker took part in closed and was applied.
    Step {
        /// The worker's rank.
        rank: u16,
        /// Rounds done.
        step: u64,
        /// The epoch the round belongs to, from 1.
        #[serde(default)]
        epoch: u32,
        /// This worker's loss on its share of the round's batch (NaN travels as JSON null).
        #[serde(deserialize_with = "nan_from_null")]
        loss: f32,
        /// Bytes it pushed in the round.
        pushed: usize,
        /// Bytes it pulled in the round.
        pulled: usize,
        /// What the round would move each way in f32.
        f32_each_way: usize,
        /// This worker's samples per second since it started.
        samples_per_second: f64,
        /// The samples of its share of the round (0: shard 0 gave it none, and it pushed zeros
        /// standing for none).
        #[serde(default)]
        samples: usize,
        /// Seconds the round took here, from taking its batch to applying the reply.
        #[serde(default)]
        seconds: f64,
        /// The learning rate the round applied.
        #[serde(default)]
        lr: f32,
        /// Fraction of its pushed LoCo codes clipped at either end of their range (LoCo
        /// codecs only): most of them means the scale s is too large.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        saturated: Option<f64>,
        /// Fraction of its error-feedback memory's entries that are nonzero (with error
        /// feedback only): none means the memory does nothing, nearly all that it is pinned.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_nonzero: Option<f64>,
        /// A shard closed the round on its quorum before this worker's push arrived: its
        /// samples changed nothing there (it applied the round's reply all the same).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        late: bool,
        /// Seconds spent computing the round's gradients (an outer round's local steps
        /// included).
        #[serde(default)]
        computing: f64,
        /// Seconds from the round's first push to its replies: communication, waiting for
        /// the other workers and the servers included.
        #[serde(default)]
        communicating: f64,
        /// The part of `communicating` that ran while the gradients were still being
        /// computed (the last layers' pushes leave during the backward pass of the first).
        #[serde(default)]
        hidden: f64,
    },
    /// The model was evaluated on the test set (rank 0, at the end of every epoch).
    Evaluated {
        /// The worker's rank.
        rank: u16,
        /// Rounds done when it was measured.
        #[serde(default)]
        step: u64,
        /// The epoch just finished (from 1).
        epoch: u32,
        /// Test accuracy in [0, 1].
        accuracy: f64,
        /// Seconds the epoch took.
        seconds: f64,
    },
    /// The language model was measured on the held-out text (one rank every `eval_every`
    /// rounds, in turn, and every worker at the last round).
    Validated {
        /// The worker's rank.
        rank: u16,
        /// Rounds done when it was measured.
        step: u64,
        /// Mean next-byte loss in nats per byte.
        valid_loss: f64,
        /// Seconds since the previous measurement.
        seconds: f64,
    },
    /// Every worker moved LoCo's scale at an epoch's first round, as the job asks
    /// (`loco_recalibrate_every`).
    Recalibrated {
        /// The worker's rank.
        rank: u16,
        /// The round that is the first at the new scale.
        step: u64,
        /// The new scale, `log2 s`.
        log2s: i32,
        /// The scale before, `log2 s`.
        was: Option<i32>,
    },
    /// The worker left the rounds and waits for [`crate::WorkerHandle::resume`].
    Paused {
        /// The worker's rank.
        rank: u16,
        /// Rounds done when it left.
        step: u64,
    },
    /// The worker is back in the rounds after a pause or a lost link.
    Rejoined {
        /// The worker's rank.
        rank: u16,
        /// The round it rejoined at.
        step: u64,
        /// Why it had left.
        reason: String,
    },
    /// Something failed; [`Event::Done`] or the end of the stream follows.
    Error {
        /// The worker's rank, if it had one.
        rank: Option<u16>,
        /// What went wrong.
        message: String,
    },
    /// The worker finished (the job's last round, or a stop).
    Done {
        /// The worker's rank.
        rank: u16,
        /// Rounds done.
        steps: u64,
        /// The last test accuracy it measured (image models).
        final_accuracy: Option<f64>,
        /// The last validation loss it measured, in nats per byte (the language model).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        final_valid_loss: Option<f64>,
        /// Bytes pushed in all.
        bytes_pushed: u64,
        /// Bytes pulled in all.
        bytes_pulled: u64,
        /// The same rounds' traffic each way in f32.
        f32_bytes_each_way: u64,
        /// Seconds from start to end.
        seconds: f64,
        /// Whether it ended by a stop rather than the job's end.
        stopped: bool,
    },
}

/// Reads a loss that JSON wrote as null (serde_json writes NaN so) back as NaN, so that a
/// diverging run's steps still reach a process launcher.
fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

/// Events kept for a subscriber that falls behind; older ones are dropped (it learns how
/// many from the receiver's `Lagged` error).
pub const EVENT_BUFFER: usize = 4096;

/// The sending side, held by a node's thread.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    sender: broadcast::Sender<Event>,
    json: bool,
}

impl Events {
    /// A stream, and its first receiver (which sees every event from the start).
    pub(crate) fn new(json: bool) -> (Events, broadcast::Receiver<Event>) {
        let (sender, first) = broadcast::channel(EVENT_BUFFER);
        (Events { sender, json }, first)
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }

    /// Sends an event to every subscriber (and as a JSON line on stdout in JSON mode).
    pub(crate) fn emit(&self, event: Event) {
        if self.json {
            use std::io::Write;
            let line = serde_json::to_string(&event).expect("events serialise");
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        // No subscriber is not an error: nobody asked.
        let _ = self.sender.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_loss_survives_json() {
        let step = Event::Step {
            rank: 0,
            step: 1,
            epoch: 1,
            loss: f32::NAN,
            pushed: 0,
            pulled: 0,
            f32_each_way: 0,
            samples_per_second: 0.0,
            samples: 0,
            seconds: 0.0,
            lr: 0.0,
            saturated: None,
            error_nonzero: Some(0.25),
            late: false,
            computing: 0.0,
            communicating: 0.0,
            hidden: 0.0,
        };
        let line = serde_json::to_string(&step).unwrap();
        match serde_json::from_str::<Event>(&line).unwrap() {
            Event::Step { loss, .. } => assert!(loss.is_nan()),
            other => panic!("{other:?}"),
        }
    }
}
