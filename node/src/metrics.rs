//! Per-step metrics as JSON lines (`--metrics run.jsonl` on every training command): the one
//! record type that `murmur train`, `murmur worker`, `murmur swarm` and `murmur pipeline`
//! write and `murmur plot` reads, and the file that writes it line by line.
//!
//! It lives in the node library because the nodes' events are what the swarm and pipeline
//! commands turn into these lines ([`Metrics::from_event`], [`Metrics::from_stage_event`]),
//! and the CLI, which writes and reads them, sits above it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{NodeError, Result};
use crate::event::Event;
use crate::pipeline::StageEvent;

/// One line of a metrics file. A step line has `loss` (JSON null when it was NaN), the bytes
/// moved each way since the previous line of the same node (0 on one machine), the mean
/// seconds per step since then, and the learning rate; an evaluation line has `accuracy`
/// (image models) or `valid_loss` (the language model) at the step it was measured after.
/// Fields that do not apply are left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Steps done (rounds, for a swarm worker).
    pub step: u64,
    /// The epoch the step belongs to, from 1 (image models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u32>,
    /// The worker's rank (swarm nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u16>,
    /// The pipeline stage the line is from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<usize>,
    /// Training loss: the step's, or the mean since the previous line (a pipeline's last
    /// stage). `Some(NaN)` is written as null and read back as NaN.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nan_from_null"
    )]
    pub loss: Option<f32>,
    /// Test accuracy in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Validation loss in nats per byte (the language model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_loss: Option<f64>,
    /// Bytes sent since the previous line: pushed to the servers by a worker, sent to its
    /// neighbours by a pipeline stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Bytes received since the previous line (pulled from the servers by a worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    /// Mean wall-clock seconds per step since the previous line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<f64>,
    /// The learning rate of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// Present (true) when a shard closed the round without this worker's push, which came
    /// after the round's quorum deadline: its samples did not count there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<bool>,
    /// The samples of the worker's share of the round (swarm workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
}

/// A present loss that JSON wrote as null (serde_json writes NaN so) is NaN, not absent.
fn nan_from_null<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<f32>, D::Error> {
    Ok(Some(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN)))
}

impl Metrics {
    /// The line a worker's event makes, if it makes one: a step line for [`Event::Step`], an
    /// accuracy line for [`Event::Evaluated`].
    pub fn from_event(event: &Event) -> Option<Metrics> {
        match *event {
            Event::Step {
                rank,
                step,
                epoch,
                loss,
                pushed,
                pulled,
                seconds,
                lr,
                late,
                samples,
                ..
            } => Some(Metrics {
                step,
                epoch: (epoch > 0).then_some(epoch),
                rank: Some(rank),
                loss: Some(loss),
                bytes_up: Some(pushed as u64),
                bytes_down: Some(pulled as u64),
                step_seconds: Some(seconds),
                lr: Some(lr),
                late: late.then_some(true),
                samples: Some(samples as u64),
                ..Metrics::default()
            }),
            Event::Evaluated {
                rank,
                step,
                epoch,
                accuracy,
                ..
            } => Some(Metrics {
                step,
                epoch: Some(epoch),
                rank: Some(rank),
                accuracy: Some(accuracy),
                ..Metrics::default()
            }),
            Event::Validated {
                rank,
                step,
                valid_loss,
                ..
            } => Some(Metrics {
                step,
                rank: Some(rank),
                valid_loss: Some(valid_loss),
                ..Metrics::default()
            }),
            _ => None,
        }
    }

    /// The line a pipeline stage's progress report makes: what the stage sent and how long
    /// its steps took since its previous report, and the mean loss (last stage only).
    pub fn from_stage_event(event: &StageEvent) -> Option<Metrics> {
        match *event {
            StageEvent::Progress {
                stage,
                step,
                loss,
                bytes_sent,
                step_seconds,
                lr,
                ..
            } => Some(Metrics {
                step,
                stage: Some(stage),
                loss: loss.map(|l| l as f32),
                bytes_up: Some(bytes_sent),
                step_seconds: Some(step_seconds),
                lr: Some(lr),
                ..Metrics::default()
            }),
            _ => None,
        }
    }
}

/// A metrics file being written: created (emptied) when opened, so that a path that cannot
/// be written fails before any work starts, and written one whole line per call, so that a
/// crash loses at most the line being written and `tail -f` shows every step as it comes.
#[derive(Debug)]
pub struct MetricsFile {
    file: std::fs::File,
    path: PathBuf,
}

impl MetricsFile {
    /// Creates (or empties) the file at `path`.
    pub fn create(path: &Path) -> Result<MetricsFile> {
        let file = std::fs::File::create(path)
            .map_err(|e| NodeError::io(format!("cannot write metrics to {}", path.display()), e))?;
        Ok(MetricsFile {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Appends one line. The file is unbuffered: the line reaches the system in one write.
    pub fn write(&mut self, metrics: &Metrics) -> Result<()> {
        let mut line = serde_json::to_string(metrics).expect("metrics serialise");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| NodeError::io(format!("writing metrics to {}", self.path.display()), e))
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_loss_is_written_as_null_and_read_back_as_nan_while_absent_stays_absent() {
        let step = Metrics {
            step: 3,
            loss: Some(f32::NAN),
            bytes_up: Some(0),
            bytes_down: Some(0),
            step_seconds: Some(0.5),
            lr: Some(1e-3),
            ..Metrics::default()
        };
        let line = serde_json::to_string(&step).unwrap();
        assert!(line.contains("\"loss\":null"), "{line}");
        assert!(
            !line.contains("accuracy"),
            "absent fields are left out: {line}"
        );
        let back: Metrics = serde_json::from_str(&line).unwrap();
        assert!(back.loss.unwrap().is_nan());
        let eval: Metrics = serde_json::from_str(r#"{"step":3,"accuracy":0.5}"#).unwrap();
        assert_eq!((eval.loss, eval.accuracy), (None, Some(0.5)));
    }

    #[test]
    fn events_become_lines_and_the_file_holds_one_line_per_write() {
        let step = Event::Step {
            rank: 1,
            step: 7,
            epoch: 2,
            loss: 0.25,
            pushed: 100,
            pulled: 300,
            f32_each_way: 4000,
            samples_per_second: 1.0,
            samples: 32,
            seconds: 0.125,
            lr: 0.5,
            saturated: None,
            error_nonzero: None,
            late: false,
            computing: 0.01,
            communicating: 0.1,
            hidden: 0.005,
        };
        let line = Metrics::from_event(&step).unwrap();
        assert_eq!(
            (line.rank, line.epoch, line.bytes_up, line.bytes_down),
            (Some(1), Some(2), Some(100), Some(300))
        );
        let eval = Event::Evaluated {
            rank: 0,
            step: 7,
            epoch: 2,
            accuracy: 0.75,
            seconds: 1.0,
        };
        assert_eq!(Metrics::from_event(&eval).unwrap().accuracy, Some(0.75));
        assert_eq!(
            Metrics::from_event(&Event::Paused { rank: 0, step: 7 }),
            None
        );

        let path =
            std::env::temp_dir().join(format!("murmur-metrics-{}.jsonl", std::process::id()));
        let mut file = MetricsFile::create(&path).unwrap();
        file.write(&line).unwrap();
        // Readable at once, before the file is closed: nothing waits in a buffer.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert_eq!(serde_json::from_str::<Metrics>(text.trim()).unwrap(), line);
        drop(file);
        std::fs::remove_file(&path).unwrap();
        let missing = Path::new("/nonexistent-murmur-dir/run.jsonl");
        let err = MetricsFile::create(missing).unwrap_err().to_string();
        assert!(
            err.contains("cannot write metrics to /nonexistent-murmur-dir/run.jsonl"),
            "{err}"
        );
    }
}
