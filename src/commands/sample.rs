//! `murmur sample`: text from a trained GPT (a checkpoint or exported weights), continuing a
//! prompt; the same seed gives the same text.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use murmur_node::DeviceKind;

use super::model_file::{self, Model};

#[derive(Args, Debug)]
pub struct SampleArgs {
    /// A gpt checkpoint (`murmur train --model gpt --save`) or its exported weights.
    model: PathBuf,
    /// Bytes to generate after the prompt.
    #[arg(long, default_value_t = 400)]
    bytes: usize,
    /// Sampling temperature; 0 = always the likeliest byte.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Text to continue [default: a new line].
    #[arg(long)]
    prompt: Option<String>,
    /// Seeds the sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
}

pub fn run(a: SampleArgs) -> anyhow::Result<()> {
    if !a.temperature.is_finite() || a.temperature < 0.0 {
        bail!("--temperature must be 0 or more, not {}", a.temperature);
    }
    let device = a.device.open()?;
    let lm = match model_file::read(&a.model, &device)?.model {
        Model::Gpt(lm) => lm,
        Model::Classifier(c) => bail!(
            "{} holds an image classifier ({}); murmur sample needs a gpt",
            a.model.display(),
            c.model.name()
        ),
    };
    let prompt = a.prompt.unwrap_or_default();
    let text = lm
        .sample(prompt.as_bytes(), a.bytes, a.temperature, a.seed)
        .context("sampling")?;
    let mut out = std::io::stdout().lock();
    out.write_all(prompt.as_bytes())?;
    out.write_all(&text)?;
    out.write_all(b"\n")?;
    Ok(())
}
