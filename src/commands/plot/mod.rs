//! `murmur plot`: training curves from metrics files (`--metrics run.jsonl`), one line per
//! file: loss (and validation loss), test accuracy where measured, and the bytes moved so
//! far, against the step or (`--against seconds`) the training time: a time-to-accuracy
//! figure.

mod read;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, ValueEnum};
use murmur_node::Metrics;

use crate::chart::{Figure, Key, Line, Panel};
use read::read_metrics;

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Metrics files written by --metrics (JSON lines), one curve each.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The figure to write: .png, or .svg.
    #[arg(short, long)]
    out: PathBuf,
    /// The legend's name for each file, in order [default: the files' names].
    #[arg(long)]
    label: Vec<String>,
    /// A title above the panels.
    #[arg(long, default_value = "Training curves")]
    title: String,
    /// Width in pixels.
    #[arg(long, default_value_t = 1100)]
    width: u32,
    /// Height in pixels [default: 300 per panel].
    #[arg(long)]
    height: Option<u32>,
    /// What the curves are drawn against: the step, or the seconds of training so far (the
    /// steps' times added up; time to accuracy).
    #[arg(long, value_enum, default_value_t = Against::Step)]
    against: Against,
}

/// The horizontal axis of every panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Against {
    /// The step (a swarm's round).
    Step,
    /// Seconds of training: each line's mean seconds per step over the steps since the
    /// previous line, added up (evaluations between epochs are not counted).
    Seconds,
}

pub fn run(a: PlotArgs) -> anyhow::Result<()> {
    if !a.label.is_empty() && a.label.len() != a.files.len() {
        bail!(
            "{} --label for {} files: give one per file, or none",
            a.label.len(),
            a.files.len()
        );
    }
    let mut runs = Vec::new();
    for (i, path) in a.files.iter().enumerate() {
        let label = a.label.get(i).cloned().unwrap_or_else(|| file_label(path));
        runs.push((label, read_metrics(path)?));
    }
    let figure = curves(&a.title, &runs, a.against);
    let height = a.height.unwrap_or(40 + 300 * figure.panels.len() as u32);
    figure.save(&a.out, (a.width, height))?;
    eprintln!(
        "wrote {} ({} panels, {} run{})",
        a.out.display(),
        figure.panels.len(),
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

/// A file's name without its extension.
fn file_label(path: &Path) -> String {
    path.file_stem()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// The figure of labelled runs: a loss panel, an accuracy panel if any run measured one, and
/// a traffic panel, against the step or the seconds of training.
fn curves(title: &str, runs: &[(String, Vec<Metrics>)], against: Against) -> Figure {
    let mut keys = Vec::new();
    let (mut loss, mut accuracy, mut traffic) = (vec![], vec![], vec![]);
    for (colour, (label, records)) in runs.iter().enumerate() {
        let clock = (against == Against::Seconds).then(|| training_clock(records));
        // Points are made against the step, then moved to the step's time where asked.
        let x = |points: Vec<(f64, f64)>| match &clock {
            None => points,
            Some(clock) => points
                .into_iter()
                .filter_map(|(step, y)| clock.get(&(step as u64)).map(|&t| (t, y)))
                .collect(),
        };
        let key = keys.len();
        keys.push(Key {
            label: label.clone(),
            colour,
            dashed: false,
        });
        loss.push(Line {
            key,
            points: x(mean_per_step(records, |m| m.loss.map(f64::from))),
            ..Line::default()
        });
        let valid = x(mean_per_step(records, |m| m.valid_loss));
        if !valid.is_empty() {
            keys.push(Key {
                label: format!("{label} (validation)"),
                colour,
                dashed: true,
            });
            loss.push(Line {
                key: keys.len() - 1,
                points: valid,
                markers: true,
                ..Line::default()
            });
        }
        let acc = x(mean_per_step(records, |m| m.accuracy.map(|a| 100.0 * a)));
        if !acc.is_empty() {
            // Evaluations are few (one per epoch): dots show where they were taken.
            accuracy.push(Line {
                key,
                markers: acc.len() < 50,
                points: acc,
                ..Line::default()
            });
        }
        traffic.push(Line {
            key,
            points: x(cumulative_megabytes(records)),
            ..Line::default()
        });
    }
    let x_label = match against {
        Against::Step => "step",
        Against::Seconds => "seconds of training",
    };
    let mut panels = vec![Panel {
        title: "Loss".into(),
        x_label: x_label.into(),
        y_label: "loss (nats)".into(),
        lines: loss,
        ..Panel::default()
    }];
    if !accuracy.is_empty() {
        panels.push(Panel {
            title: "Test accuracy".into(),
            x_label: x_label.into(),
            y_label: "accuracy (%)".into(),
            lines: accuracy,
            ..Panel::default()
        });
    }
    panels.push(Panel {
        title: "Bytes between nodes (none for murmur train)".into(),
        x_label: x_label.into(),
        y_label: "MB sent + received so far".into(),
        y_from_zero: true,
        lines: traffic,
        ..Panel::default()
    });
    Figure {
        title: title.into(),
        keys,
        panels,
    }
}

/// The mean of `value` over the records of each step that have it (the ranks of a swarm, the
/// stages of a pipeline), by step.
fn mean_per_step(records: &[Metrics], value: impl Fn(&Metrics) -> Option<f64>) -> Vec<(f64, f64)> {
    let mut sums: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
    for m in records {
        if let Some(v) = value(m) {
            let s = sums.entry(m.step).or_default();
            *s = (s.0 + v, s.1 + 1);
        }
    }
    sums.into_iter()
        .map(|(step, (sum, n))| (step as f64, sum / n as f64))
        .collect()
}

/// The seconds of training by the end of each step that has a time: every line's mean
/// seconds per step (the ranks' mean, where several wrote one) times the steps since the
/// previous such line, added up.
fn training_clock(records: &[Metrics]) -> BTreeMap<u64, f64> {
    let (mut previous, mut elapsed) = (0u64, 0.0);
    mean_per_step(records, |m| m.step_seconds)
        .into_iter()
        .map(|(step, seconds)| {
            let step = step as u64;
            elapsed += seconds * step.saturating_sub(previous) as f64;
            previous = step;
            (step, elapsed)
        })
        .collect()
}

/// Bytes sent and received by every node so far, in MB, after each step that has a record.
fn cumulative_megabytes(records: &[Metrics]) -> Vec<(f64, f64)> {
    let mut per_step: BTreeMap<u64, u64> = BTreeMap::new();
    for m in records {
        let bytes = m
            .bytes_up
            .unwrap_or(0)
            .saturating_add(m.bytes_down.unwrap_or(0));
        let b = per_step.entry(m.step).or_default();
        *b = b.saturating_add(bytes);
    }
    let mut total = 0u64;
    per_step
        .into_iter()
        .map(|(step, bytes)| {
            total = total.saturating_add(bytes);
            (step as f64, total as f64 / 1e6)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, rank: u16, loss: f32, up: u64, down: u64) -> Metrics {
        Metrics {
            step,
            rank: Some(rank),
            loss: Some(loss),
            bytes_up: Some(up),
            bytes_down: Some(down),
            ..Metrics::default()
        }
    }

    #[test]
    fn ranks_average_into_one_loss_and_their_bytes_add_up() {
        let records = vec![
            step(1, 0, 1.0, 1_000_000, 2_000_000),
            step(1, 1, 3.0, 1_000_000, 2_000_000),
            step(2, 1, 1.0, 500_000, 0),
            step(2, 0, 2.0, 500_000, 0),
            Metrics {
                step: 2,
                rank: Some(0),
                accuracy: Some(0.5),
                ..Metrics::default()
            },
        ];
        assert_eq!(
            mean_per_step(&records, |m| m.loss.map(f64::from)),
            [(1.0, 2.0), (2.0, 1.5)]
        );
        assert_eq!(cumulative_megabytes(&records), [(1.0, 6.0), (2.0, 7.0)]);
        let figure = curves("t", &[("a".into(), records.clone())], Against::Step);
        let titles: Vec<&str> = figure.panels.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(titles.len(), 3, "{titles:?}");
        assert_eq!(figure.panels[1].lines[0].points, [(2.0, 50.0)]);
        assert!(
            figure.panels[1].lines[0].markers,
            "a lone accuracy shows as a dot"
        );
        // Against time, a step sits at the seconds its lines add up to; the accuracy after
        // step 2 is at the end of step 2.
        let timed: Vec<Metrics> = records
            .into_iter()
            .map(|mut m| {
                m.step_seconds = m.loss.map(|_| 0.5 * m.step as f64);
                m
            })
            .collect();
        assert_eq!(training_clock(&timed), BTreeMap::from([(1, 0.5), (2, 1.5)]));
        let figure = curves("t", &[("a".into(), timed)], Against::Seconds);
        assert_eq!(figure.panels[1].lines[0].points, [(1.5, 50.0)]);
        assert_eq!(figure.panels[0].x_label, "seconds of training");
    }
}
