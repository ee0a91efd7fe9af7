//! How an embedding program steers a running node: pause, resume, stop and a GPU budget,
//! shared between the handle (any thread, sync or async) and the node's own thread, which
//! looks at it between steps.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{NodeError, Result};

/// Stops a node from anywhere its handle cannot go: a signal handler, another thread. Does
/// what `stop` on the node's handle does; clones stop the same node.
#[derive(Clone)]
pub struct Stopper(Arc<dyn Fn() + Send + Sync>);

impl Stopper {
    pub(crate) fn new(stop: impl Fn() + Send + Sync + 'static) -> Stopper {
        Stopper(Arc::new(stop))
    }

    /// Asks the node to stop gracefully, as its handle's `stop` does.
    pub fn stop(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stopper")
    }
}

/// How much of the machine a node may take: the fraction of wall-clock time it spends
/// stepping, and a cap on steps per second. Changeable while the node runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Fraction of wall-clock time spent in steps, in (0, 1]: at 0.25 a step of 100 ms is
    /// followed by 300 ms of rest.
    pub duty_cycle: f64,
    /// At most this many steps per second, if given.
    pub max_steps_per_second: Option<f64>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            duty_cycle: 1.0,
            max_steps_per_second: None,
        }
    }
}

impl Budget {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if !(self.duty_cycle > 0.0 && self.duty_cycle <= 1.0) {
            return Err(NodeError::Config(format!(
                "the duty cycle must be in (0, 1], not {}",
                self.duty_cycle
            )));
        }
        if let Some(r) = self.max_steps_per_second {
            if !(r.is_finite() && r > 0.0) {
                return Err(NodeError::Config(format!(
                    "max steps per second must be a positive number, not {r}"
                )));
            }
        }
        Ok(())
    }

    /// The rest owed after a step that took `step`.
    pub fn rest_after(&self, step: Duration) -> Duration {
        let duty = step.mul_f64((1.0 - self.duty_cycle) / self.duty_cycle);
        let rate = self.max_steps_per_second.map_or(Duration::ZERO, |r| {
            Duration::from_secs_f64(1.0 / r).saturating_sub(step)
        });
        duty.max(rate)
    }
}

/// What the node should do next, as the control says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Step,
    Pause,
    Stop,
}

#[derive(Debug, Default)]
struct State {
    paused: bool,
    stopped: bool,
    budget: Budget,
}

/// The shared switchboard between a handle and its node.
#[derive(Debug, Default)]
pub(crate) struct Control {
    state: Mutex<State>,
    changed: Condvar,
}

impl Control {
    pub(crate) fn new(budget: Budget) -> Control {
        Control {
            state: Mutex::new(State {
                budget,
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().expect("control lock"));
        self.changed.notify_all();
    }

    pub(crate) fn pause(&self) {
        self.update(|s| s.paused = true);
    }

    pub(crate) fn resume(&self) {
        self.update(|s| s.paused = false);
    }

    pub(crate) fn stop(&self) {
        self.update(|s| s.stopped = true);
    }

    pub(crate) fn set_budget(&self, budget: Budget) {
        self.update(|s| s.budget = budget);
    }

    pub(crate) fn budget(&self) -> Budget {
        self.state.lock().expect("control lock").budget
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.state.lock().expect("control lock").paused
    }

    /// What to do now, without waiting.
    pub(crate) fn next(&self) -> Next {
        let s = self.state.lock().expect("control lock");
        if s.stopped {
            Next::Stop
        } else if s.paused {
            Next::Pause
        } else {
            Next::Step
        }
    }

    /// Rests for what the budget asks after a step of `step`; a pause or stop cuts the rest
    /// short. Returns what to do next.
    pub(crate) fn rest(&self, step: Duration) -> Next {
        self.wait_for(self.budget().rest_after(step), |s| s.stopped || s.paused)
    }

    /// Waits `d` unless a stop comes first. Returns what to do next.
    pub(crate) fn sleep(&self, d: Duration) -> Next {
        self.wait_for(d, |s| s.stopped)
    }

    /// Waits `d`, or until `cut_short` holds. Returns what to do next.
    fn wait_for(&self, d: Duration, cut_short: impl Fn(&State) -> bool) -> Next {
        let until = Instant::now() + d;
        let mut s = self.state.lock().expect("control lock");
        while !cut_short(&s) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self.changed.wait_timeout(s, left).expect("control lock").0;
        }
        drop(s);
        self.next()
    }

    /// While paused: waits for resume or stop. Returns what to do next.
    pub(crate) fn wait_while_paused(&self) -> Next {
        let mut s = self.state.lock().expect("control lock");
        while s.paused && !s.stopped {
            s = self.changed.wait(s).expect("control lock");
        }
        drop(s);
        self.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_rests_in_proportion_and_caps_the_rate() {
        let step = Duration::from_millis(100);
        let quarter = Budget {
            duty_cycle: 0.25,
            max_steps_per_second: None,
        };
        assert_eq!(quarter.rest_after(step), Duration::from_millis(300));
        let capped = Budget {
            duty_cycle: 1.0,
            max_steps_per_second: Some(2.0),
        };
        assert_eq!(capped.rest_after(step), Duration::from_millis(400));
        assert_eq!(Budget::default().rest_after(step), Duration::ZERO);
        for bad in [0.0, 1.5, f64::NAN] {
            let b = Budget {
                duty_cycle: bad,
                max_steps_per_second: None,
            };
            assert!(b.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_pause_cuts_a_rest_short() {
        let control = std::sync::Arc::new(Control::new(Budget {
            duty_cycle: 0.001,
            max_steps_per_second: None,
        }));
        let c = control.clone();
        let t = std::thread::spawn(move || c.rest(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(50));
        let asked = Instant::now();
        control.pause();
        assert_eq!(t.join().unwrap(), Next::Pause);
        assert!(asked.elapsed() < Duration::from_secs(1));
    }
}
