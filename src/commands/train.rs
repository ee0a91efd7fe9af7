//! `murmur train`: single-machine training with progress, per-epoch evaluation and a final
//! one-line JSON summary on stdout.

use std::time::Instant;

use anyhow::{bail, Context};
use murmur_engine::data::epoch_batches;
use murmur_engine::nn::{Activation, CnnConfig, Module};
use murmur_engine::train::{Classifier, ClassifierConfig, OptimizerKind, WarmupCosine};
use murmur_engine::Tensor;
use serde::Serialize;

use murmur_node::data::{load_sets, Sets};
use murmur_node::Metrics;

use super::machine::Machine;
use super::train_args::{ModelKind, TrainArgs};
use super::train_output::{progress_bar, stop_if_interrupted, write_checkpoint, MetricsLog};

#[derive(Serialize)]
struct Summary {
    model: String,
    dataset: String,
    device: String,
    machine: String,
    epochs: u32,
    steps: u64,
    batch: usize,
    optimizer: String,
    lr: f32,
    /// The MLP's hidden widths (absent for the CNN).
    #[serde(skip_serializing_if = "Option::is_none")]
    hidden: Option<Vec<usize>>,
    parameters: usize,
    seed: u64,
    test_accuracy: Vec<f64>,
    final_test_accuracy: f64,
    epoch_seconds: Vec<f64>,
    mean_epoch_seconds: f64,
    final_train_loss: f32,
    samples_per_second: f64,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    a.validate()?;
    crate::signals::listen();
    if a.model == ModelKind::Gpt {
        return super::train_lm::run(a);
    }
    let dataset_name = a.dataset.clone().unwrap_or_else(|| "mnist".into());
    let mut refused = a.lm.given();
    if a.model == ModelKind::Mlp && a.dropout.is_some() {
        refused.push("--dropout");
    }
    if a.model == ModelKind::Cnn {
        refused.extend(a.hidden.as_ref().map(|_| "--hidden"));
        refused.extend(a.activation.as_ref().map(|_| "--activation"));
    }
    if !refused.is_empty() {
        return Err(crate::exit::usage(format!(
            "--model {} does not use {}",
            format!("{:?}", a.model).to_lowercase(),
            refused.join(", ")
        )));
    }
    // Flags not given take the engine's defaults.
    let defaults = ClassifierConfig::default();
    let epochs = a.epochs.unwrap_or(5);
    let hidden = a.hidden.clone().unwrap_or(defaults.hidden);
    let optim = a.optim.clone().unwrap_or_else(|| "adamw".into());
    let (batch, lr) = (a.batch.unwrap_or(128), a.lr.unwrap_or(defaults.lr));
    let mut metrics = MetricsLog::create(a.metrics.as_deref())?;
    let Sets {
        train,
        test,
        dataset,
        root,
    } = load_sets(&dataset_name, a.data.as_deref(), a.train_limit)?;
    if train.is_empty() {
        bail!("no training samples (--train-limit 0?)");
    }
    let steps_per_epoch = train.len().div_ceil(batch) as u64;
    let device = a.device.open()?;
    let cnn = (a.model == ModelKind::Cnn).then(|| CnnConfig {
        dropout: a.dropout.unwrap_or(CnnConfig::default().dropout),
        ..CnnConfig::default()
    });
    let config = ClassifierConfig {
        hidden: hidden.clone(),
        activation: match &a.activation {
            Some(name) => name.parse::<Activation>()?,
            None => defaults.activation,
        },
        optimizer: optim.parse::<OptimizerKind>()?,
        lr,
        weight_decay: a.weight_decay.unwrap_or(defaults.weight_decay),
        momentum: a.momentum.unwrap_or(defaults.momentum),
        nesterov: defaults.nesterov,
        seed: a.seed,
        cnn,
        // The schedule spans every epoch whatever --max-steps says, so that a run stopped
        // early and resumed follows the same rates as an uninterrupted one.
        schedule: a.warmup.map(|warmup| WarmupCosine {
            peak: lr,
            warmup,
            total: steps_per_epoch * epochs as u64,
            min_ratio: 0.1,
        }),
        clip: a.clip,
    };
    let mut clf = Classifier::new(&device, train.features(), train.classes, &config)?;
    // A resumed run must see the batches the interrupted one would have; `murmur eval`
    // reads the dataset from here.
    clf.data = serde_json::json!({
        "dataset": dataset_name,
        "train_samples": train.len(),
        "batch": batch,
        "epochs": epochs,
    });
    if let Some(path) = &a.resume {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        clf.load_state(&bytes)
            .with_context(|| format!("resuming from {}", path.display()))?;
        eprintln!("resumed from {} at step {}", path.display(), clf.steps);
    }
    eprintln!(
        "murmur train: {:?} {:?} on {} ({} train / {} test samples), {} parameters, device {}",
        a.model,
        dataset.name(),
        root.display(),
        train.len(),
        test.len(),
        clf.model.parameter_count(),
        device
    );

    let total_steps = (steps_per_epoch * epochs as u64).min(a.max_steps.unwrap_or(u64::MAX));
    let first_epoch = (clf.steps / steps_per_epoch) as u32;
    if first_epoch >= epochs {
        bail!(
            "the checkpoint is at step {}, past the {} epochs asked for; raise --epochs",
            clf.steps,
            epochs
        );
    }
    let (mut epoch_seconds, mut accuracies) = (vec![], vec![]);
    let mut last_loss = f32::NAN;
    let mut samples = 0usize;
    let started = Instant::now();
    metrics.start(clf.steps);
    let mut train_seconds = 0.0;
    'epochs: for epoch in first_epoch..epochs {
        let bar = progress_bar(
            a.quiet,
            steps_per_epoch.min(total_steps.saturating_sub(clf.steps)),
            format!("epoch {}/{epochs}", epoch + 1),
        );
        // A resumed run skips the batches its checkpoint had already taken this epoch.
        let done_in_epoch = (clf.steps - epoch as u64 * steps_per_epoch) as usize;
        let epoch_start = Instant::now();
        let mut epoch_samples = 0usize;
        // The newest loss, read back only every --log-every steps: a read waits for the GPU.
        let mut latest: Option<Tensor> = None;
        for batch in epoch_batches(train.len(), batch, a.seed, epoch)
            .into_iter()
            .skip(done_in_epoch)
        {
            if clf.steps >= total_steps {
                break;
            }
            stop_if_interrupted(a.save.as_deref(), clf.steps, || clf.save_state())?;
            let (x, y) = train.batch(&batch);
            latest = Some(clf.step(&x, &y)?);
            samples += batch.len();
            epoch_samples += batch.len();
            bar.inc(1);
            if clf.steps % a.log_every.max(1) == 0 || clf.steps == total_steps {
                if let Some(loss) = latest.take() {
                    last_loss = loss.item()?;
                    metrics.step(clf.steps, Some(epoch + 1), last_loss, clf.optimizer.lr())?;
                }
                let rate = samples as f64 / (train_seconds + epoch_start.elapsed().as_secs_f64());
                bar.set_message(format!("loss {last_loss:.4}  {rate:.0} samples/s"));
            }
        }
        // The epoch's last steps, if no line read them.
        if let Some(loss) = latest.take() {
            last_loss = loss.item()?;
            metrics.step(clf.steps, Some(epoch + 1), last_loss, clf.optimizer.lr())?;
        }
        device.sync()?;
        let seconds = epoch_start.elapsed().as_secs_f64();
        train_seconds += seconds;
        bar.finish_and_clear();
        let accuracy = clf
            .accuracy(&test, 1000)
            .context("evaluating on the test set")?;
        eprintln!(
            "epoch {}/{}: train loss {last_loss:.4}, test accuracy {:.2}%, {seconds:.1} s ({:.0} samples/s)",
            epoch + 1,
            epochs,
            100.0 * accuracy,
            epoch_samples as f64 / seconds
        );
        metrics.evaluation(Metrics {
            step: clf.steps,
            epoch: Some(epoch + 1),
            accuracy: Some(accuracy),
            ..Metrics::default()
        })?;
        epoch_seconds.push(seconds);
        accuracies.push(accuracy);
        if let Some(path) = &a.save {
            write_checkpoint(path, &clf.save_state()?)?;
        }
        if clf.steps >= total_steps {
            break 'epochs;
        }
    }
    let summary = Summary {
        model: clf.model.name().to_string(),
        dataset: dataset_name,
        device: device.to_string(),
        machine: Machine::detect().to_string(),
        epochs: epoch_seconds.len() as u32,
        steps: clf.steps,
        batch,
        optimizer: optim,
        lr,
        hidden: (a.model == ModelKind::Mlp).then_some(hidden),
        parameters: clf.model.parameter_count(),
        seed: a.seed,
        final_test_accuracy: *accuracies.last().unwrap_or(&0.0),
        test_accuracy: accuracies,
        mean_epoch_seconds: epoch_seconds.iter().sum::<f64>() / epoch_seconds.len().max(1) as f64,
        epoch_seconds,
        final_train_loss: last_loss,
        samples_per_second: samples as f64 / train_seconds.max(1e-9),
    };
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
