//! Helpers shared by the binary's integration tests.
#![allow(dead_code)] // each test binary uses a different part

use murmur::node::Event;

/// Whether MNIST is in `data/`; a test that needs it skips with a visible notice, or fails
/// under CI, where a missing dataset is a set-up error.
pub fn have_mnist() -> bool {
    have_data("MNIST", |root| {
        let mnist = root.join("mnist");
        mnist.join("train-images-idx3-ubyte").exists()
            || mnist.join("train-images-idx3-ubyte.gz").exists()
    })
}

/// Whether the Shakespeare plays are in `data/text`, with the same rule as [`have_mnist`].
pub fn have_shakespeare() -> bool {
    have_data("the Shakespeare texts", |root| {
        std::fs::read_dir(root.join("text")).is_ok_and(|mut d| d.next().is_some())
    })
}

fn have_data(name: &str, present: impl Fn(&std::path::Path) -> bool) -> bool {
    // Where the binary looks: tests run from the package root, and MURMUR_DATA overrides it.
    let ok = present(&murmur::engine::data::default_root());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} missing under CI: run scripts/fetch-data.sh"
        );
        eprintln!("NOTICE: skipping: {name} not fetched (scripts/fetch-data.sh)");
    }
    ok
}

/// A folder deleted when the test ends, pass or fail.
pub struct RemovedOnDrop(pub std::path::PathBuf);

impl RemovedOnDrop {
    /// A fresh path under the temp folder, unique to this process and `name`.
    pub fn temp(name: &str) -> Self {
        RemovedOnDrop(std::env::temp_dir().join(format!("murmur-{name}-{}", std::process::id())))
    }
}

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits for the first event `want` accepts; panics on an error event or after `timeout`.
pub fn wait_for<T>(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    timeout: std::time::Duration,
    mut want: impl FnMut(&Event) -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no such event within {timeout:?}"
        );
        match events.try_recv() {
            Ok(Event::Error { message, .. }) => panic!("worker failed: {message}"),
            Ok(e) => {
                if let Some(t) = want(&e) {
                    return t;
                }
            }
            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            Err(e) => panic!("events: {e}"),
        }
    }
}
