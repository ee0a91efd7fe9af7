//! `murmur train --model gpt`: a byte-level transformer on the Shakespeare plays, with
//! periodic validation on held-out plays, checkpoints, and a text sample at the end.

use std::time::Instant;

use anyhow::Context;
use murmur_engine::data::{default_root, TextCorpus, HELD_OUT_PLAYS};
use murmur_engine::nn::{GptConfig, Module};
use murmur_engine::train::{LanguageModel, LmConfig, WarmupCosine};
use murmur_engine::Tensor;
use serde::Serialize;

use murmur_node::Metrics;

use super::machine::Machine;
use super::train_args::{LmArgs, TrainArgs};
use super::train_output::{progress_bar, stop_if_interrupted, write_checkpoint, MetricsLog};

/// [`LmArgs`] with the defaults filled in.
struct Lm {
    steps: u64,
    context: usize,
    layers: usize,
    dim: usize,
    heads: usize,
    eval_every: u64,
    eval_windows: usize,
    sample_bytes: usize,
    temperature: f32,
}

impl LmArgs {
    /// The flags that were given, by name (for refusing them for image models).
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("--steps", self.steps.is_some()),
            ("--context", self.context.is_some()),
            ("--layers", self.layers.is_some()),
            ("--dim", self.dim.is_some()),
            ("--heads", self.heads.is_some()),
            ("--eval-every", self.eval_every.is_some()),
            ("--eval-windows", self.eval_windows.is_some()),
            ("--sample-bytes", self.sample_bytes.is_some()),
            ("--temperature", self.temperature.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }

    /// Model sizes not given take [`GptConfig::default`]'s.
    fn resolved(&self) -> Lm {
        let model = GptConfig::default();
        Lm {
            steps: self.steps.unwrap_or(3000),
            context: self.context.unwrap_or(model.context),
            layers: self.layers.unwrap_or(model.layers),
            dim: self.dim.unwrap_or(model.dim),
            heads: self.heads.unwrap_or(model.heads),
            eval_every: self.eval_every.unwrap_or(250),
            eval_windows: self.eval_windows.unwrap_or(256),
            sample_bytes: self.sample_bytes.unwrap_or(400),
            temperature: self.temperature.unwrap_or(0.8),
        }
    }
}

#[derive(Serialize)]
struct Summary {
    model: &'static str,
    dataset: &'static str,
    device: String,
    machine: String,
    parameters: usize,
    config: String,
    steps: u64,
    batch: usize,
    tokens_per_step: usize,
    valid_loss: Vec<(u64, f64)>,
    final_valid_loss: f64,
    final_train_loss: f32,
    seconds: f64,
    tokens_per_second: f64,
    sample: String,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    let dataset = a.dataset.as_deref().unwrap_or("shakespeare");
    if dataset != "shakespeare" {
        return Err(crate::exit::usage(format!(
            "--model gpt trains on --dataset shakespeare, not {dataset:?}"
        )));
    }
    let image_only = a.image_flags_given();
    if !image_only.is_empty() {
        return Err(crate::exit::usage(format!(
            "--model gpt does not use {} (it trains with AdamW on the whole corpus for --steps)",
            image_only.join(", ")
        )));
    }
    let mut metrics = MetricsLog::create(a.metrics.as_deref())?;
    let root = a.data.clone().unwrap_or_else(default_root);
    let corpus = TextCorpus::load_shakespeare(&root)?;
    let l = &a.lm.resolved();
    let mut config = LmConfig::new(l.steps);
    config.model = GptConfig {
        context: l.context,
        layers: l.layers,
        dim: l.dim,
        heads: l.heads,
        ..GptConfig::default()
    };
    config.model.dropout = a.dropout.unwrap_or(config.model.dropout);
    config.batch = a.batch.unwrap_or(config.batch);
    config.schedule = WarmupCosine {
        peak: a.lr.unwrap_or(config.schedule.peak),
        warmup: a.warmup.unwrap_or(config.schedule.warmup),
        ..config.schedule
    };
    config.weight_decay = a.weight_decay.unwrap_or(config.weight_decay);
    config.clip = a.clip.unwrap_or(config.clip);
    config.seed = a.seed;
    let device = a.device.open()?;
    let mut lm = LanguageModel::new(&device, &config)?;
    if let Some(path) = &a.resume {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        lm.load_state(&bytes)
            .with_context(|| format!("resuming from {}", path.display()))?;
        eprintln!("resumed from {} at step {}", path.display(), lm.steps);
    }
    let total = l.steps.min(a.max_steps.unwrap_or(u64::MAX));
    eprintln!(
        "murmur train: gpt ({} layers, width {}, {} heads, context {}) on Shakespeare: {} bytes from {} works, validation {} bytes ({HELD_OUT_PLAYS:?}); {} parameters, device {device}",
        l.layers,
        l.dim,
        l.heads,
        l.context,
        corpus.train.len(),
        corpus.train_files,
        corpus.valid.len(),
        lm.model.parameter_count(),
    );

    let bar = progress_bar(a.quiet, total, "step".into());
    bar.set_position(lm.steps);
    let started = Instant::now();
    let first_step = lm.steps;
    metrics.start(first_step);
    let (mut valid_loss, mut last_loss) = (vec![], f32::NAN);
    while lm.steps < total {
        stop_if_interrupted(a.save.as_deref(), lm.steps, || lm.save_state())?;
        // Readings stay on the device unless logged: a read waits for the GPU.
        let s = lm.step(&corpus.train)?;
        bar.inc(1);
        let step = lm.steps;
        if step % a.log_every.max(1) == 0 || step == total {
            // One wait on the GPU for both readings.
            let read = Tensor::read_many(&[&s.loss, &s.grad_norm])?;
            let grad_norm = read[1][0];
            last_loss = read[0][0];
            metrics.step(step, None, last_loss, s.lr)?;
            let rate = ((step - first_step) * (config.batch * l.context) as u64) as f64
                / started.elapsed().as_secs_f64();
            bar.set_message(format!(
                "loss {last_loss:.3}  |g| {grad_norm:.2}  lr {:.2e}  {rate:.0} tok/s",
                s.lr
            ));
        }
        if step % l.eval_every.max(1) == 0 || step == total {
            if step % a.log_every.max(1) != 0 {
                // This step's loss was not read for the progress line; the report needs it.
                last_loss = s.loss.item()?;
                metrics.step(step, None, last_loss, s.lr)?;
            }
            let v = lm.evaluate(&corpus.valid, l.eval_windows, 32)?;
            let line =
                format!("step {step}: train loss {last_loss:.4}, validation {v:.4} nats/byte");
            // A hidden bar (--quiet) drops what it is asked to print.
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            metrics.evaluation(Metrics {
                step,
                valid_loss: Some(v),
                ..Metrics::default()
            })?;
            valid_loss.push((step, v));
            if let Some(path) = &a.save {
                write_checkpoint(path, &lm.save_state()?)?;
            }
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let prompt = b"ROMEO:\n";
    let sample = lm.sample(prompt, l.sample_bytes, l.temperature, a.seed)?;
    let sample = format!(
        "{}{}",
        String::from_utf8_lossy(prompt),
        String::from_utf8_lossy(&sample)
    );
    eprintln!(
        "--- sample (temperature {}) ---\n{sample}\n---",
        l.temperature
    );
    let final_valid_loss = match valid_loss.last() {
        Some(&(_, v)) => v,
        None => lm.evaluate(&corpus.valid, l.eval_windows, 32)?,
    };
    let summary = Summary {
        model: "gpt",
        dataset: "shakespeare",
        device: device.to_string(),
        machine: Machine::detect().to_string(),
        parameters: lm.model.parameter_count(),
        config: format!("{:?}", config.model),
        steps: lm.steps,
        batch: config.batch,
        tokens_per_step: config.batch * l.context,
        valid_loss,
        final_valid_loss,
        final_train_loss: last_loss,
        seconds,
        tokens_per_second: ((lm.steps - first_step) * (config.batch * l.context) as u64) as f64
            / seconds.max(1e-9),
        sample,
    };
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
