//! LIEC-SGD's figure: the norm of the error the methods carry, `|avg_i e_i + e_server|` at the
//! end of each epoch (liec-sgd.md Fig. 8), per method, mean over seeds, one panel per
//! blocking, on a log axis.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{beside, in_order, read_results, WIDTH};
use crate::chart::{Figure, Key, Line, Panel};
use crate::commands::repro::report::mean_std;

#[derive(Deserialize)]
struct Record {
    method: String,
    blocking: String,
    epochs: Vec<Epoch>,
}

#[derive(Deserialize)]
struct Epoch {
    /// Counted from 0.
    epoch: u32,
    error_norm: f64,
}

/// Draws `<stem>-error-norm.png` beside `json`; returns its path.
pub fn draw(json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let records: Vec<Record> = read_results(json, "LIEC-SGD")?;
    // A method that keeps no error (P-SGD) has nothing to draw on a log axis.
    let carries_error = |m: &str| {
        records
            .iter()
            .any(|r| r.method == m && r.epochs.iter().any(|e| e.error_norm > 0.0))
    };
    let methods = in_order(records.iter().map(|r| r.method.as_str()));
    let (drawn, none): (Vec<String>, Vec<String>) =
        methods.into_iter().partition(|m| carries_error(m));
    let keys = drawn
        .iter()
        .enumerate()
        .map(|(colour, m)| Key {
            label: m.clone(),
            colour,
            dashed: false,
        })
        .collect();
    let mut seeds = 0;
    let panels = in_order(records.iter().map(|r| r.blocking.as_str()))
        .into_iter()
        .map(|blocking| {
            let lines = drawn
                .iter()
                .enumerate()
                .map(|(key, method)| {
                    let runs: Vec<&Record> = records
                        .iter()
                        .filter(|r| &r.method == method && r.blocking == blocking)
                        .collect();
                    seeds = seeds.max(runs.len());
                    Line {
                        key,
                        points: mean_per_epoch(&runs),
                        markers: true,
                        ..Line::default()
                    }
                })
                .collect();
            Panel {
                title: match blocking.as_str() {
                    "whole" => "sign over the whole model".to_string(),
                    b => format!("block-wise sign ({b})"),
                },
                x_label: "epoch".into(),
                y_label: "error norm (log scale)".into(),
                log_y: true,
                lines,
                ..Panel::default()
            }
        })
        .collect();
    let mut title =
        format!("LIEC-SGD: error norm at the end of each epoch, mean over {seeds} seeds");
    if !none.is_empty() {
        title.push_str(&format!(" ({} keeps none)", none.join(", ")));
    }
    let figure = Figure {
        title,
        keys,
        panels,
    };
    let png = beside(json, "error-norm");
    let height = 60 + 330 * figure.panels.len().max(1) as u32;
    figure.save(&png, (WIDTH, height))?;
    Ok(vec![png])
}

/// The mean over runs of each epoch's error norm, against the epoch counted from 1.
fn mean_per_epoch(runs: &[&Record]) -> Vec<(f64, f64)> {
    let epochs = runs.iter().map(|r| r.epochs.len()).max().unwrap_or(0);
    (0..epochs)
        .filter_map(|i| {
            let at: Vec<&Epoch> = runs.iter().filter_map(|r| r.epochs.get(i)).collect();
            let norms: Vec<f64> = at.iter().map(|e| e.error_norm).collect();
            let epoch = at.first()?.epoch;
            Some((epoch as f64 + 1.0, mean_std(&norms).0))
        })
        .collect()
}
