//! Figures beside the reproductions' tables, drawn from the JSON the runs write next to them
//! (so that they can be redrawn without the runs, which take 10 to 50 minutes each): the
//! LIEC-SGD error norm over epochs, Clapping's accuracy against p and per arm, and the
//! accuracy per arm of the LoCo and CLAN tables. Each repro command draws its figures after
//! writing its JSON; `murmur repro figures` redraws them all from a results folder.

mod arms;
mod clapping;
mod liec;
mod local_steps;
mod robustness;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::de::DeserializeOwned;

pub use arms::draw as arms;
pub use clapping::draw as clapping;
pub use liec::draw as liec;
pub use local_steps::draw as local_steps;
pub use robustness::draw as robustness;

#[derive(Args, Debug)]
pub struct FiguresArgs {
    /// The results folder whose JSON files to draw (liec-sgd*, clapping* but clapping-gpt*,
    /// loco*, clan*, robustness*, local-steps*).
    #[arg(long, default_value = "docs/results")]
    dir: PathBuf,
}

/// Figures are this wide, in pixels.
const WIDTH: u32 = 1100;

pub fn run(a: FiguresArgs) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&a.dir)
        .with_context(|| format!("reading the folder {}", a.dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    entries.sort();
    let mut written = 0;
    for json in entries {
        let stem = json.file_stem().unwrap_or_default().to_string_lossy();
        let draw: fn(&Path) -> anyhow::Result<Vec<PathBuf>> = if stem.starts_with("liec") {
            liec
        } else if stem.starts_with("clapping-gpt") {
            // Its runs are validation losses of a language model: no figure yet.
            continue;
        } else if stem.starts_with("clapping") {
            clapping
        } else if stem.starts_with("loco") || stem.starts_with("clan") {
            arms
        } else if stem.starts_with("robustness") {
            robustness
        } else if stem.starts_with("local-steps") {
            local_steps
        } else {
            continue;
        };
        for png in draw(&json)? {
            eprintln!("wrote {}", png.display());
            written += 1;
        }
    }
    if written == 0 {
        anyhow::bail!("{} holds no results to draw", a.dir.display());
    }
    Ok(())
}

/// A results file, read as `T`.
fn read_results<T: DeserializeOwned>(path: &Path, what: &str) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a {what} results file", path.display()))
}

/// `json`'s path with its stem followed by `-suffix` and `.png`.
fn beside(json: &Path, suffix: &str) -> PathBuf {
    let stem = json.file_stem().unwrap_or_default().to_string_lossy();
    json.with_file_name(format!("{stem}-{suffix}.png"))
}

/// The best of a run's per-epoch test accuracies, in % (NaN epochs ignored).
fn best_percent(accuracies: impl Iterator<Item = f64>) -> f64 {
    accuracies.map(|a| 100.0 * a).fold(f64::NAN, f64::max)
}

/// Labels in the order they first appear.
fn in_order<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in labels {
        if !out.iter().any(|o| o == l) {
            out.push(l.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests;
