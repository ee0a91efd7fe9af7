//! The local-steps table's figure (`murmur repro local-steps`): each arm's final measure
//! against the bytes a worker moved, on a log scale, a panel per dataset. A codec's arms of
//! local steps are joined in the order of H (more local steps, fewer bytes: H rises
//! leftwards); its step-wise arm is a lone marker of the same colour, in the dashed key.
//! Accuracy per byte is what local steps buy.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{beside, in_order, read_results, WIDTH};
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
    accuracy: Option<f64>,
    #[serde(default)]
    valid_loss: Option<f64>,
    bytes_per_worker: f64,
}

impl Arm {
    /// The final measure as the panel plots it: accuracy in %, or nats per byte.
    fn measure(&self) -> Option<f64> {
        self.accuracy.map(|a| 100.0 * a).or(self.valid_loss)
    }

    fn point(&self) -> Option<(f64, f64)> {
        let mb = self.bytes_per_worker / 1e6;
        (mb > 0.0).then_some((mb.log10(), self.measure()?))
    }
}

/// Draws `<stem>-accuracy.png` beside `json`; returns its path.
pub fn draw(json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let results: Results = read_results(json, "local-steps")?;
    let arms = &results.arms;
    let codecs = in_order(arms.iter().map(|a| a.codec.as_str()));
    let mut keys = Vec::new();
    for (colour, codec) in codecs.iter().enumerate() {
        keys.push(Key {
            label: format!("{codec}, local steps"),
            colour,
            dashed: false,
        });
        keys.push(Key {
            label: format!("{codec}, every step"),
            colour,
            dashed: true,
        });
    }
    let mut panels = Vec::new();
    for dataset in in_order(arms.iter().map(|a| a.dataset.as_str())) {
        let gpt = arms
            .iter()
            .any(|a| a.dataset == dataset && a.valid_loss.is_some() && a.accuracy.is_none());
        let mut lines = Vec::new();
        for (c, codec) in codecs.iter().enumerate() {
            let of = |a: &&Arm| a.dataset == dataset && &a.codec == codec;
            let mut outer: Vec<&Arm> = arms
                .iter()
                .filter(|a| of(a) && a.local_steps.is_some())
                .collect();
            outer.sort_by_key(|a| a.local_steps);
            lines.push(Line {
                key: 2 * c,
                points: outer.iter().filter_map(|a| a.point()).collect(),
                markers: true,
                whiskers: Vec::new(),
            });
            lines.push(Line {
                key: 2 * c + 1,
                points: arms
                    .iter()
                    .filter(|a| of(a) && a.local_steps.is_none())
                    .filter_map(Arm::point)
                    .collect(),
                markers: true,
                whiskers: Vec::new(),
            });
        }
        lines.retain(|l| !l.points.is_empty());
        panels.push(Panel {
            title: dataset.clone(),
            x_label: "log10 of the MB a worker moved over the run (both ways)".into(),
            y_label: if gpt {
                "final validation loss (nats/byte)".into()
            } else {
                "final test accuracy (%)".into()
            },
            lines,
            ..Panel::default()
        });
    }
    let figure = Figure {
        title: "local steps: the final model against the bytes moved, per codec".into(),
        keys,
        panels,
    };
    let png = beside(json, "accuracy");
    let height = 120 + 380 * figure.panels.len().max(1) as u32;
    figure.save(&png, (WIDTH, height))?;
    Ok(vec![png])
}
