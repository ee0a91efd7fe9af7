//! Helpers shared by the binary's integration tests.

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
