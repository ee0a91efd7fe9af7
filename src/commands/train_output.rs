//! What the training commands share for their output: progress bars, checkpoints written
//! so that a crash never leaves a truncated one, and `--metrics` lines.

use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use murmur_node::{Metrics, MetricsFile};

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

/// `--metrics` of `murmur train`: the file (none without the flag), and the step and time of
/// its previous step line, which a step line's mean seconds per step are counted from.
pub(super) struct MetricsLog {
    file: Option<MetricsFile>,
    since_step: u64,
    since: Instant,
}

impl MetricsLog {
    /// Creates the file, if a path is given: a path that cannot be written fails here, before
    /// any work.
    pub(super) fn create(path: Option<&Path>) -> anyhow::Result<MetricsLog> {
        Ok(MetricsLog {
            file: path.map(MetricsFile::create).transpose()?,
            since_step: 0,
            since: Instant::now(),
        })
    }

    /// Training starts (or resumes) at `step`.
    pub(super) fn start(&mut self, step: u64) {
        (self.since_step, self.since) = (step, Instant::now());
    }

    /// A step line: `step`'s loss and learning rate, no traffic (one machine), and the mean
    /// seconds per step since the previous line.
    pub(super) fn step(
        &mut self,
        step: u64,
        epoch: Option<u32>,
        loss: f32,
        lr: f32,
    ) -> anyhow::Result<()> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let steps = step.saturating_sub(self.since_step).max(1);
        file.write(&Metrics {
            step,
            epoch,
            loss: Some(loss),
            bytes_up: Some(0),
            bytes_down: Some(0),
            step_seconds: Some(self.since.elapsed().as_secs_f64() / steps as f64),
            lr: Some(lr),
            ..Metrics::default()
        })?;
        (self.since_step, self.since) = (step, Instant::now());
        Ok(())
    }

    /// An evaluation line. The time it took is not counted in the next step line.
    pub(super) fn evaluation(&mut self, metrics: Metrics) -> anyhow::Result<()> {
        if let Some(file) = &mut self.file {
            file.write(&metrics)?;
        }
        self.since = Instant::now();
        Ok(())
    }
}
