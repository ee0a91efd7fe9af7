//! The accuracy per arm of a table written by the shared arms runner (`murmur repro loco`,
//! `murmur repro clan`): one dot per arm, its best test accuracy over epochs, mean ± std over
//! seeds.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{beside, best_percent, in_order, read_results, WIDTH};
use crate::chart::{Dot, DotChart};
use crate::commands::repro::report::mean_std;

#[derive(Deserialize)]
struct Record {
    arm: String,
    epochs: Vec<Epoch>,
}

#[derive(Deserialize)]
struct Epoch {
    test_accuracy: f64,
}

/// Draws `<stem>-accuracy.png` beside `json`; returns its path.
pub fn draw(json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let records: Vec<Record> = read_results(json, "per-arm")?;
    let arms = in_order(records.iter().map(|r| r.arm.as_str()));
    let mut seeds = 0;
    let dots = arms
        .into_iter()
        .map(|arm| {
            let best: Vec<f64> = records
                .iter()
                .filter(|r| r.arm == arm)
                .map(|r| best_percent(r.epochs.iter().map(|e| e.test_accuracy)))
                .collect();
            seeds = seeds.max(best.len());
            let (mean, std) = mean_std(&best);
            Dot {
                label: arm,
                value: mean,
                low: mean - std,
                high: mean + std,
            }
        })
        .collect();
    let stem = json.file_stem().unwrap_or_default().to_string_lossy();
    let chart = DotChart {
        title: format!("{stem}: best test accuracy per arm"),
        x_label: format!("best test accuracy over epochs (%), mean ± std over {seeds} seeds"),
        dots,
    };
    let png = beside(json, "accuracy");
    chart.save(&png, WIDTH)?;
    Ok(vec![png])
}
