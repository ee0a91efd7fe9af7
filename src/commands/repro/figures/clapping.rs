//! Clapping's figures: best test accuracy against p for Clapping-FC and -FU, with the
//! methods that do not sample lazily as flat dashed lines (`-accuracy-vs-p`, when the file
//! holds a sweep over p), and every arm's accuracy side by side (`-accuracy`). Accuracies are
//! the best over epochs, mean ± std over seeds, as in the tables.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{beside, best_percent, in_order, read_results, WIDTH};
use crate::chart::{Dot, DotChart, Figure, Key, Line, Panel};
use crate::commands::repro::report::mean_std;

#[derive(Deserialize)]
struct Record {
    arm: Arm,
    runs: Vec<Run>,
}

#[derive(Deserialize)]
struct Arm {
    label: String,
    /// The table the arm is in (older files have none: one table).
    #[serde(default)]
    table: Option<String>,
    variant: String,
    p: f64,
    #[serde(default)]
    stages: Option<usize>,
}

#[derive(Deserialize)]
struct Run {
    epochs: Vec<Epoch>,
}

#[derive(Deserialize)]
struct Epoch {
    test_accuracy: f64,
}

impl Record {
    /// Mean and standard deviation over seeds of the best accuracy, in %.
    fn accuracy(&self) -> (f64, f64) {
        let best: Vec<f64> = self
            .runs
            .iter()
            .map(|r| best_percent(r.epochs.iter().map(|e| e.test_accuracy)))
            .collect();
        mean_std(&best)
    }

    fn lazy(&self) -> bool {
        matches!(self.arm.variant.as_str(), "fc" | "fu")
    }
}

/// Draws the figures beside `json`; returns their paths.
pub fn draw(json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let records: Vec<Record> = read_results(json, "Clapping")?;
    let seeds = records.iter().map(|r| r.runs.len()).max().unwrap_or(0);
    let mut written = Vec::new();
    if let Some(figure) = against_p(&records, seeds) {
        let png = beside(json, "accuracy-vs-p");
        figure.save(&png, (WIDTH, 560))?;
        written.push(png);
    }
    let dots = records
        .iter()
        .map(|r| {
            let (mean, std) = r.accuracy();
            Dot {
                label: r.arm.label.clone(),
                value: mean,
                low: mean - std,
                high: mean + std,
            }
        })
        .collect();
    let chart = DotChart {
        title: "Clapping: best test accuracy per arm".into(),
        x_label: format!("best test accuracy over epochs (%), mean ± std over {seeds} seeds"),
        dots,
    };
    let png = beside(json, "accuracy");
    chart.save(&png, WIDTH)?;
    written.push(png);
    Ok(written)
}

/// The sweep over p of the first table that has one, or `None`.
fn against_p(records: &[Record], seeds: usize) -> Option<Figure> {
    let tables = in_order(records.iter().map(|r| r.arm.table.as_deref().unwrap_or("")));
    let table = tables.into_iter().find(|t| {
        let ps = records
            .iter()
            .filter(|r| r.lazy() && r.arm.table.as_deref().unwrap_or("") == t)
            .map(|r| r.arm.p.to_bits());
        distinct(ps) >= 2
    })?;
    let arms: Vec<&Record> = records
        .iter()
        .filter(|r| r.arm.table.as_deref().unwrap_or("") == table)
        .collect();
    let ps = arms.iter().filter(|r| r.lazy()).map(|r| r.arm.p);
    let (lo, hi) = ps.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p), hi.max(p))
    });
    let mut keys = Vec::new();
    let mut lines = Vec::new();
    for (variant, name) in [("fc", "Clapping-FC"), ("fu", "Clapping-FU")] {
        let mut sweep: Vec<&&Record> = arms.iter().filter(|r| r.arm.variant == variant).collect();
        if sweep.is_empty() {
            continue;
        }
        sweep.sort_by(|a, b| a.arm.p.total_cmp(&b.arm.p));
        let at: Vec<(f64, (f64, f64))> = sweep.iter().map(|r| (r.arm.p, r.accuracy())).collect();
        lines.push(Line {
            key: keys.len(),
            points: at.iter().map(|&(p, (m, _))| (p, m)).collect(),
            markers: true,
            whiskers: at.iter().map(|&(p, (m, s))| (p, m - s, m + s)).collect(),
        });
        keys.push(Key {
            label: name.into(),
            colour: keys.len(),
            dashed: false,
        });
    }
    for r in arms.iter().filter(|r| !r.lazy()) {
        let (mean, _) = r.accuracy();
        lines.push(Line {
            key: keys.len(),
            points: vec![(lo, mean), (hi, mean)],
            ..Line::default()
        });
        keys.push(Key {
            label: r.arm.label.clone(),
            colour: keys.len(),
            dashed: true,
        });
    }
    let stages = arms.iter().find_map(|r| r.arm.stages);
    Some(Figure {
        title: format!(
            "Clapping{}: best test accuracy against p, mean ± std over {seeds} seeds \
             (dashed: no lazy sampling)",
            stages.map_or(String::new(), |e| format!(" at E = {e}"))
        ),
        keys,
        panels: vec![Panel {
            title: String::new(),
            x_label: "p, the probability of a fresh batch at each step".into(),
            y_label: "best test accuracy (%)".into(),
            lines,
            ..Panel::default()
        }],
    })
}

/// How many distinct values.
fn distinct(values: impl Iterator<Item = u64>) -> usize {
    let mut seen: Vec<u64> = values.collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_averages_each_seeds_best_epoch_and_baselines_span_it() {
        let text = r#"[
            {"arm": {"label": "none", "variant": "none", "p": 1.0}, "runs": [
                {"epochs": [{"test_accuracy": 0.8}, {"test_accuracy": 0.86}]},
                {"epochs": [{"test_accuracy": 0.88}, {"test_accuracy": 0.5}]}]},
            {"arm": {"label": "FU 0.8", "variant": "fu", "p": 0.8}, "runs": [
                {"epochs": [{"test_accuracy": 0.84}]}]},
            {"arm": {"label": "FU 0.4", "variant": "fu", "p": 0.4}, "runs": [
                {"epochs": [{"test_accuracy": 0.82}]}]}
        ]"#;
        let records: Vec<Record> = serde_json::from_str(text).unwrap();
        let figure = against_p(&records, 2).unwrap();
        let labels: Vec<&str> = figure.keys.iter().map(|k| k.label.as_str()).collect();
        assert_eq!(labels, ["Clapping-FU", "none"]);
        let lines = &figure.panels[0].lines;
        let close = |a: &[(f64, f64)], b: &[(f64, f64)]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| (x.0 - y.0).abs() + (x.1 - y.1).abs() < 1e-9)
        };
        // Sorted by p; each seed's best epoch, not its last.
        assert!(
            close(&lines[0].points, &[(0.4, 82.0), (0.8, 84.0)]),
            "{:?}",
            lines[0].points
        );
        assert!(
            close(&lines[1].points, &[(0.4, 87.0), (0.8, 87.0)]),
            "{:?}",
            lines[1].points
        );
        assert!(figure.keys[1].dashed);

        // No sweep (one p), no figure.
        assert!(against_p(&records[..2], 2).is_none());
    }
}
