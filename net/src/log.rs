//! Warnings a peer can cause at will (one per refused connection, per broken frame) are
//! written a few at a time and summarised: a flood costs kilobytes of log, not megabytes, and
//! the summary still says how much was refused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many warnings of one kind are written per [`WINDOW`]; the rest are counted.
pub const BURST: u32 = 10;
/// The span over which [`BURST`] warnings of a kind are written.
pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Window {
    started: Instant,
    written: u32,
    suppressed: u64,
}

/// Warnings by kind, each kind rate-limited on its own.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    kinds: Mutex<HashMap<&'static str, Window>>,
}

impl RateLimitedLog {
    /// Writes the warning `line` makes, unless `kind` has had [`BURST`] in this window; then
    /// counts it, and the first warning of the kind after the window says how many were left
    /// out.
    pub fn warn(&self, kind: &'static str, line: impl FnOnce() -> String) {
        let now = Instant::now();
        let (write, left_out) = {
            let mut kinds = self.kinds.lock().expect("log lock");
            let window = kinds.entry(kind).or_insert(Window {
                started: now,
                written: 0,
                suppressed: 0,
            });
            let mut left_out = None;
            if now.duration_since(window.started) >= WINDOW {
                if window.suppressed > 0 {
                    left_out = Some((window.suppressed, now.duration_since(window.started)));
                }
                *window = Window {
                    started: now,
                    written: 0,
                    suppressed: 0,
                };
            }
            let write = window.written < BURST;
            if write {
                window.written += 1;
            } else {
                window.suppressed += 1;
            }
            (write, left_out)
        };
        if let Some((count, over)) = left_out {
            tracing::warn!("{count} more warnings ({kind}) in {over:.0?} were not written");
        }
        if write {
            let line = line();
            tracing::warn!("{line}");
        }
    }

    /// Says how many warnings of each kind were left out since their last summary (when the
    /// node stops).
    pub fn flush(&self) {
        let mut kinds = self.kinds.lock().expect("log lock");
        for (kind, window) in kinds.iter_mut() {
            if window.suppressed > 0 {
                tracing::warn!(
                    "{} more warnings ({kind}) in {:.0?} were not written",
                    window.suppressed,
                    window.started.elapsed()
                );
                window.suppressed = 0;
            }
        }
    }

    /// Warnings of `kind` left out in the current window.
    #[cfg(test)]
    fn suppressed(&self, kind: &str) -> u64 {
        let kinds = self.kinds.lock().expect("log lock");
        kinds.get(kind).map_or(0, |w| w.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_writes_its_burst_then_counts_and_other_kinds_are_not_held_back() {
        let log = RateLimitedLog::default();
        let mut made = 0;
        for _ in 0..1000 {
            log.warn("flood", || {
                made += 1;
                "line".into()
            });
        }
        assert_eq!(made, BURST, "only written lines are formatted");
        assert_eq!(log.suppressed("flood"), 1000 - u64::from(BURST));
        let mut other = 0;
        log.warn("other", || {
            other += 1;
            "line".into()
        });
        assert_eq!(other, 1);
        log.flush();
        assert_eq!(log.suppressed("flood"), 0);
    }
}
