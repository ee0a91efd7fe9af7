//! What the training commands share for their output: progress bars and checkpoints written
//! so that a crash never leaves a truncated one.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

/// Writes a checkpoint so that a crash mid-write never leaves a truncated checkpoint where
/// a good one was (as the nodes write theirs).
pub(super) fn write_checkpoint(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(murmur_node::files::write_atomically(path, bytes)?)
}

/// Ends a training loop that a signal asked to stop, after writing its state (from `state`)
/// to `save`: a checkpoint taken mid-epoch resumes exactly where the run stopped.
pub(super) fn stop_if_interrupted(
    save: Option<&Path>,
    step: u64,
    state: impl FnOnce() -> murmur_engine::Result<Vec<u8>>,
) -> anyhow::Result<()> {
    let Some(signal) = crate::signals::received() else {
        return Ok(());
    };
    match save {
        Some(path) => {
            write_checkpoint(path, &state()?)?;
            eprintln!(
                "stopped at step {step}; checkpoint written to {} (continue with --resume)",
                path.display()
            );
        }
        None => eprintln!("stopped at step {step}; nothing saved (no --save)"),
    }
    Err(crate::exit::Interrupted { signal }.into())
}

/// A progress bar of `len` steps labelled `label` (hidden with --quiet).
pub(super) fn progress_bar(quiet: bool, len: u64, label: String) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label);
    bar
}
