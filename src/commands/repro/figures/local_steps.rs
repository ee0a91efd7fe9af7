//! The local-steps table's figure (`murmur repro local-steps`): each arm's test accuracy per
//! epoch against the bytes its first worker had moved by then, on a log scale, a panel per
//! dataset: accuracy per byte, which is what local steps buy.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{beside, read_results, WIDTH};
use crate::chart::{Figure, Key, Line, Panel};

#[derive(Deserialize)]
struct Results {
    arms: Vec<Arm>,
}

#[derive(Deserialize)]
struct Arm {
    dataset: String,
    local_steps: Option<u32>,
    codec: String,
    curve: Vec<Point>,
}

#[derive(Deserialize)]
struct Point {
    /// Test accuracy in [0, 1], or the GPT's validation loss.
    #[serde(alias = "accuracy")]
    value: f64,
    bytes: u64,
}

/// Draws `<stem>-accuracy.png` beside `json`: each arm's test accuracy per epoch against the
/// bytes its first worker had moved by then (log scale), a panel per dataset.
pub fn draw(json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let results: Results = read_results(json, "local-steps")?;
    let mut keys: Vec<Key> = Vec::new();
    let mut panels: Vec<Panel> = Vec::new();
    for arm in &results.arms {
        let gpt = arm.dataset == "shakespeare";
        let label = match arm.local_steps {
            None => format!("{} every step", arm.codec),
            Some(h) => format!("{} H={h}", arm.codec),
        };
        let key = match keys.iter().position(|k| k.label == label) {
            Some(k) => k,
            None => {
                keys.push(Key {
                    label,
                    colour: keys.len(),
                    dashed: arm.local_steps.is_none(),
                });
                keys.len() - 1
            }
        };
        let panel = match panels.iter().position(|p| p.title == arm.dataset) {
            Some(p) => p,
            None => {
                panels.push(Panel {
                    title: arm.dataset.clone(),
                    x_label: "log10 of the MB a worker moved (both ways)".into(),
                    y_label: if gpt {
                        "validation loss (nats/byte)".into()
                    } else {
                        "test accuracy (%)".into()
                    },
                    ..Panel::default()
                });
                panels.len() - 1
            }
        };
        panels[panel].lines.push(Line {
            key,
            points: arm
                .curve
                .iter()
                .filter(|p| p.bytes > 0)
                .map(|p| {
                    let y = if gpt { p.value } else { 100.0 * p.value };
                    ((p.bytes as f64 / 1e6).log10(), y)
                })
                .collect(),
            markers: true,
            whiskers: Vec::new(),
        });
    }
    let figure = Figure {
        title: "local steps: the model's measure against the bytes moved".into(),
        keys,
        panels,
    };
    let png = beside(json, "accuracy");
    let height = 120 + 380 * figure.panels.len().max(1) as u32;
    figure.save(&png, (WIDTH, height))?;
    Ok(vec![png])
}
