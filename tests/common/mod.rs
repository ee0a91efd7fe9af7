//! Helpers shared by the binary's integration tests.

/// Whether MNIST is in `data/`; a test that needs it skips with a visible notice, or fails
/// under CI, where a missing dataset is a set-up error.
pub fn have_mnist() -> bool {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
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
