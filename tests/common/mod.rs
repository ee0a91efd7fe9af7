//! Helpers shared by the binary's integration tests.
#![allow(dead_code)] // each test binary uses a different part

/// Whether MNIST is in `data/`; a test that needs it skips with a visible notice, or fails
/// under CI, where a missing dataset is a set-up error.
pub fn have_mnist() -> bool {
    // Where the binary looks: tests run from the package root, and MURMUR_DATA overrides it.
    let root = murmur::engine::data::default_root().join("mnist");
    let ok = root.join("train-images-idx3-ubyte").exists()
        || root.join("train-images-idx3-ubyte.gz").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "MNIST missing under CI: run scripts/fetch-data.sh"
        );
        eprintln!("NOTICE: skipping: MNIST not fetched (scripts/fetch-data.sh)");
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
