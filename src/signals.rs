//! SIGINT and SIGTERM, turned into a graceful stop where the running command knows how to
//! stop: the first signal is recorded and handed to whatever the command registered (a
//! worker's stop) or seen by its loop (a training run saves its checkpoint); the command then
//! ends with [`crate::exit::Interrupted`]. A command that registered nothing ends at once, as
//! without a handler (its child processes, if any, die with it). A second signal always ends
//! the process at once, for when the graceful stop itself hangs.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Mutex;

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::exit::signal_name as name;
use signal_hook::iterator::Signals;

/// The first signal received, or 0.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

type Handler = Box<dyn FnOnce(i32) + Send>;

/// Whether the running command looks at [`received`] and stops by itself.
static LISTENING: AtomicBool = AtomicBool::new(false);

/// What runs on the first signal, in the order registered.
static HANDLERS: Mutex<Vec<Handler>> = Mutex::new(Vec::new());

/// Starts listening for SIGINT and SIGTERM (once per process).
pub fn install() -> anyhow::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if RECEIVED
                    .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    eprintln!("murmur: {} again: stopping at once", name(signal));
                    std::process::exit(128 + signal);
                }
                let handlers = std::mem::take(&mut *HANDLERS.lock().expect("not poisoned"));
                if handlers.is_empty() && !LISTENING.load(Ordering::SeqCst) {
                    eprintln!("murmur: stopped by {}", name(signal));
                    std::process::exit(128 + signal);
                }
                eprintln!(
                    "murmur: {}: stopping gracefully (send it again to stop at once)",
                    name(signal)
                );
                for handler in handlers {
                    handler(signal);
                }
            }
        })?;
    Ok(())
}

/// Declares that the running command looks at [`received`] (or [`check`]) often and stops
/// gracefully by itself.
pub fn listen() {
    LISTENING.store(true, Ordering::SeqCst);
}

/// Runs `handler` on the first signal (at once, if one has already come).
pub fn on_signal(handler: impl FnOnce(i32) + Send + 'static) {
    let mut handlers = HANDLERS.lock().expect("not poisoned");
    match received() {
        Some(signal) => {
            drop(handlers);
            handler(signal)
        }
        None => handlers.push(Box::new(handler)),
    }
}

/// The first signal received, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// An [`crate::exit::Interrupted`] error if a signal came.
pub fn check() -> anyhow::Result<()> {
    match received() {
        Some(signal) => Err(crate::exit::Interrupted { signal }.into()),
        None => Ok(()),
    }
}
