//! What the training commands share for their output: progress bars and checkpoints written
//! so that a crash never leaves a truncated one.

use std::path::Path;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

/// Writes a checkpoint through a temporary file, so that a crash mid-write never leaves a
/// truncated checkpoint where a good one was.
pub(super) fn write_checkpoint(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
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
