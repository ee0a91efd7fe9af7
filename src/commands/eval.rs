//! `murmur eval`: a trained model's score on held-out data — test accuracy for a classifier,
//! validation loss in nats per byte for the GPT — from a checkpoint or from weights alone.
//! The human line goes to stderr, a one-line JSON summary to stdout (as `murmur train`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use murmur_engine::data::{default_root, ImageDataset, Split, TextCorpus};
use murmur_node::DeviceKind;
use serde::Serialize;

use super::model_file::{self, Model};

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// A checkpoint (`murmur train --save`) or exported weights (`murmur export`).
    model: PathBuf,
    /// mnist or fashion-mnist for a classifier [default: the dataset it was trained on];
    /// shakespeare for a gpt.
    #[arg(long)]
    dataset: Option<String>,
    /// Folder holding mnist/, fashion-mnist/ and text/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// gpt: validation windows, spread over the held-out plays as `murmur train` spreads
    /// them [default: 256, as murmur train].
    #[arg(long)]
    eval_windows: Option<usize>,
    /// Samples (windows for gpt) evaluated at once [default: 1000, or 32 for gpt].
    #[arg(long)]
    batch: Option<usize>,
}

#[derive(Serialize)]
struct Summary {
    model: &'static str,
    dataset: String,
    parameters: usize,
    steps: u64,
    /// Classifier: test images evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    test_samples: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    test_accuracy: Option<f64>,
    /// gpt: at most this many validation windows (--eval-windows).
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_windows: Option<usize>,
    /// Mean next-byte loss in nats per byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    valid_loss: Option<f64>,
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    if a.batch == Some(0) || a.eval_windows == Some(0) {
        bail!("--batch and --eval-windows must be at least 1");
    }
    let device = a.device.open()?;
    let file = model_file::read(&a.model, &device)?;
    let root = a.data.clone().unwrap_or_else(default_root);
    let (parameters, steps) = (file.model.parameter_count(), file.model.steps());
    let summary = match file.model {
        Model::Classifier(clf) => {
            if a.eval_windows.is_some() {
                bail!(
                    "--eval-windows is for a gpt; {} holds a classifier ({})",
                    a.model.display(),
                    clf.model.name()
                );
            }
            let dataset = match (&a.dataset, clf.data.get("dataset").and_then(|d| d.as_str())) {
                (Some(d), _) => d.clone(),
                (None, Some(d)) => d.to_string(),
                (None, None) => bail!(
                    "{} does not say which dataset it was trained on; give --dataset",
                    a.model.display()
                ),
            };
            let test = dataset.parse::<ImageDataset>()?.load(&root, Split::Test)?;
            if test.features() != clf.inputs || test.classes != clf.classes {
                bail!(
                    "{} takes {} features into {} classes; {dataset} has {} and {}",
                    a.model.display(),
                    clf.inputs,
                    clf.classes,
                    test.features(),
                    test.classes
                );
            }
            let accuracy = clf
                .accuracy(&test, a.batch.unwrap_or(1000))
                .context("evaluating on the test set")?;
            eprintln!(
                "{}: {} on {dataset}, test accuracy {:.2}% over {} images",
                a.model.display(),
                clf.model.name(),
                100.0 * accuracy,
                test.len()
            );
            Summary {
                model: clf.model.name(),
                dataset,
                parameters,
                steps,
                test_samples: Some(test.len()),
                test_accuracy: Some(accuracy),
                eval_windows: None,
                valid_loss: None,
            }
        }
        Model::Gpt(lm) => {
            if let Some(d) = a.dataset.as_deref().filter(|d| *d != "shakespeare") {
                bail!("a gpt is evaluated on --dataset shakespeare, not {d:?}");
            }
            let corpus = TextCorpus::load_shakespeare(&root)?;
            let windows = a.eval_windows.unwrap_or(256);
            let loss = lm
                .evaluate(&corpus.valid, windows, a.batch.unwrap_or(32))
                .context("evaluating on the held-out plays")?;
            eprintln!(
                "{}: gpt, validation loss {loss:.4} nats/byte on the held-out plays",
                a.model.display()
            );
            Summary {
                model: "gpt",
                dataset: "shakespeare".into(),
                parameters,
                steps,
                test_samples: None,
                test_accuracy: None,
                eval_windows: Some(windows),
                valid_loss: Some(loss),
            }
        }
    };
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
