//! The attack table's figure (`murmur repro attack`): one dot per codec, rule and attack, its
//! final test accuracy, so that a rule's column of attacks reads as a cluster and the mean's
//! collapses stand out.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{beside, read_results, WIDTH};
use crate::chart::{Dot, DotChart};

#[derive(Deserialize)]
struct Results {
    arms: Vec<Arm>,
}

#[derive(Deserialize)]
struct Arm {
    codec: String,
    rule: String,
    attack: String,
    accuracy: f64,
}

/// Draws `<stem>-accuracy.png` beside `json`; returns its path.
pub fn draw(json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let results: Results = read_results(json, "attack")?;
    let dots = results
        .arms
        .iter()
        .map(|a| {
            let percent = 100.0 * a.accuracy;
            Dot {
                label: format!("{} · {} · {}", a.codec, a.rule, a.attack),
                value: percent,
                low: percent,
                high: percent,
            }
        })
        .collect();
    let chart = DotChart {
        title: "one attacker in four: final test accuracy per codec, rule and attack".into(),
        x_label: "test accuracy (%) of the first honest worker's model".into(),
        dots,
    };
    let png = beside(json, "accuracy");
    chart.save(&png, WIDTH)?;
    Ok(vec![png])
}
