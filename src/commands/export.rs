//! `murmur export`: rewrites a checkpoint, typically as its weights alone in f16 or bf16 (a
//! model to evaluate, sample from or hand on, half the size and without the optimizer's
//! state).

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, ValueEnum};
use murmur_engine::checkpoint::Precision;
use murmur_engine::Device;

use super::model_file;
use super::train_output::write_checkpoint;

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub enum DtypeArg {
    /// 32-bit floats, exact.
    F32,
    /// IEEE half precision: half the size, about 3 decimal digits, values up to ±65504.
    F16,
    /// bfloat16: half the size, about 2 decimal digits, f32's range.
    Bf16,
}

impl From<DtypeArg> for Precision {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::F32 => Precision::F32,
            DtypeArg::F16 => Precision::F16,
            DtypeArg::Bf16 => Precision::Bf16,
        }
    }
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A checkpoint written by `murmur train --save` (or by `murmur export`).
    input: PathBuf,
    /// Write the parameters alone, without the optimizer's state: a model to evaluate or
    /// sample from, not to resume training from.
    #[arg(long)]
    weights_only: bool,
    /// How the weights are stored; f16 and bf16 need --weights-only (a checkpoint to resume
    /// from stays f32, so that the run continues exactly).
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DtypeArg,
    /// The file to write.
    #[arg(short, long)]
    output: PathBuf,
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    let precision = Precision::from(a.dtype);
    if !a.weights_only && precision != Precision::F32 {
        bail!("--dtype {precision} needs --weights-only: a checkpoint to resume from stays f32 so that the run continues exactly");
    }
    let file = model_file::read(&a.input, &Device::Cpu)?;
    if !a.weights_only && !file.training_state {
        bail!(
            "{} holds weights alone (no optimizer state); add --weights-only",
            a.input.display()
        );
    }
    let bytes = if a.weights_only {
        file.model.save_weights(precision)?
    } else {
        file.model.save_state()?
    };
    write_checkpoint(&a.output, &bytes)?;
    eprintln!(
        "wrote {}: {} of {} parameters after {} steps, {}{}, {} bytes",
        a.output.display(),
        file.model.kind(),
        file.model.parameter_count(),
        file.model.steps(),
        precision,
        if a.weights_only {
            ", weights only"
        } else {
            " with the optimizer's state"
        },
        bytes.len()
    );
    Ok(())
}
