//! [`StageLink`]: the seam between neighbouring pipeline stages (clapping.md §10). A link
//! carries one message per step and direction: activations (or their compressed deltas)
//! forward, activation gradients backward. The engine ships an in-process pair over channels
//! ([`local_links`]); `murmur-net` implements the same trait over QUIC, which is why stages in
//! separate processes give the in-process bits.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use crate::error::{Error, Result};

/// Which way a message travels along the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Stage e to e+1: activations.
    Forward,
    /// Stage e to e−1: activation gradients.
    Backward,
}

impl Direction {
    /// The direction's code on the wire: 0 forward, 1 backward.
    pub fn code(self) -> u8 {
        match self {
            Direction::Forward => 0,
            Direction::Backward => 1,
        }
    }

    /// The direction of wire code `code`, failing on any code but 0 or 1.
    pub fn from_code(code: u8) -> Result<Self> {
        match code {
            0 => Ok(Direction::Forward),
            1 => Ok(Direction::Backward),
            other => Err(Error::Payload {
                codec: "stage message".into(),
                detail: format!("direction {other} is neither 0 (forward) nor 1 (backward)"),
            }),
        }
    }
}

/// One step's message across one cut. The payload's layout is the pipeline's business
/// (`pipeline::message`); the link only moves it and names its step and direction, so that a
/// receiver can refuse a message from another step instead of silently training on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageMessage {
    /// The training step the message belongs to.
    pub step: u64,
    /// Whether it carries activations forward or gradients backward.
    pub direction: Direction,
    /// The encoded activations or gradients.
    pub payload: Vec<u8>,
}

/// One stage's end of the link to a neighbour. Messages arrive in the order they were sent.
pub trait StageLink: Send {
    /// Sends `message` to the neighbour, in order after the previous ones.
    fn send(&mut self, message: StageMessage) -> Result<()>;

    /// The next message from the neighbour; an error when none arrives in the link's time
    /// limit or the neighbour is gone.
    fn recv(&mut self) -> Result<StageMessage>;

    /// Receives the next message and checks that it is the one expected.
    fn expect(&mut self, step: u64, direction: Direction) -> Result<Vec<u8>> {
        let m = self.recv()?;
        if m.step != step || m.direction != direction {
            return Err(Error::Payload {
                codec: "stage message".into(),
                detail: format!(
                    "expected step {step} {direction:?}, got step {} {:?}",
                    m.step, m.direction
                ),
            });
        }
        Ok(m.payload)
    }
}

/// An in-process link: one end of a pair of channels.
pub struct LocalStageLink {
    tx: Sender<StageMessage>,
    rx: Receiver<StageMessage>,
    timeout: Duration,
}

/// Two connected ends (give the first to stage e, the second to stage e+1). A receive waits
/// at most `timeout`, so a stage whose neighbour died reports it instead of hanging.
pub fn local_links(timeout: Duration) -> (LocalStageLink, LocalStageLink) {
    let (a_tx, b_rx) = channel();
    let (b_tx, a_rx) = channel();
    (
        LocalStageLink {
            tx: a_tx,
            rx: a_rx,
            timeout,
        },
        LocalStageLink {
            tx: b_tx,
            rx: b_rx,
            timeout,
        },
    )
}

impl StageLink for LocalStageLink {
    fn send(&mut self, message: StageMessage) -> Result<()> {
        self.tx
            .send(message)
            .map_err(|_| Error::Config("the neighbouring stage has gone".into()))
    }

    fn recv(&mut self) -> Result<StageMessage> {
        self.rx.recv_timeout(self.timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => Error::Config(format!(
                "no message from the neighbouring stage in {:?}",
                self.timeout
            )),
            RecvTimeoutError::Disconnected => {
                Error::Config("the neighbouring stage has gone".into())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_in_order_and_a_wrong_step_is_refused() {
        let (mut a, mut b) = local_links(Duration::from_secs(5));
        for step in 0..3 {
            a.send(StageMessage {
                step,
                direction: Direction::Forward,
                payload: vec![step as u8],
            })
            .unwrap();
        }
        assert_eq!(b.expect(0, Direction::Forward).unwrap(), [0]);
        assert!(b.expect(2, Direction::Forward).is_err(), "step 1 is next");
        assert!(b.expect(2, Direction::Backward).is_err());
        drop(b);
        let sent = a.send(StageMessage {
            step: 9,
            direction: Direction::Backward,
            payload: vec![],
        });
        assert!(sent.is_err(), "the other end is gone");
        assert!(a.recv().is_err());
        assert!(Direction::from_code(2).is_err());
    }

    #[test]
    fn a_silent_neighbour_costs_a_timeout_not_a_hang() {
        let (_a, mut b) = local_links(Duration::from_millis(20));
        assert!(b.recv().is_err());
    }
}
