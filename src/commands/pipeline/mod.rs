//! `murmur pipeline`: one model cut into E stages, each a process of its own on this machine,
//! neighbours linked over loopback QUIC, training with Clapping (or a baseline) and showing
//! progress; at the end the stages' weights are put back together and tested. The run itself
//! is the node library's ([`murmur_node::pipeline`]); this prints it.

pub mod stage;

use std::path::PathBuf;

use clap::Args;
use murmur_node::pipeline::{run_pipeline, PipelineJob, PipelineProgress, StageEvent};
use murmur_node::swarm::Launch;
use murmur_node::{Metrics, MetricsFile};

#[derive(Args, Debug)]
pub struct PipelineArgs {
    #[command(flatten)]
    job: PipelineJob,
    /// Folder for credentials, logs and the stages' weights (default: a fresh one under the
    /// temp folder, removed after a successful run).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write metrics here as JSON lines (created at the start; `murmur plot` draws them):
    /// each stage's progress reports, about a hundred per run, with step, stage, bytes the
    /// stage sent (up) and mean seconds per step since its previous line, learning rate, and
    /// the mean loss since then (the last stage).
    #[arg(long)]
    metrics: Option<PathBuf>,
}

pub fn run(a: PipelineArgs) -> anyhow::Result<()> {
    if let Some(path) = &a.metrics {
        super::flag_checks::writable("--metrics", path)?;
    }
    if let Some(path) = &a.job.save {
        super::flag_checks::writable("--save", path)?;
    }
    let mut metrics = a.metrics.as_deref().map(MetricsFile::create).transpose()?;
    // A write that fails inside the progress callback ends the run with its error.
    let mut failed = None;
    let dir = match &a.dir {
        Some(dir) => dir.clone(),
        None => crate::commands::fresh_temp_dir("murmur-pipeline-")?,
    };
    let launch = Launch::Processes {
        exe: std::env::current_exe()?,
    };
    let outcome = run_pipeline(&a.job, &dir, launch, |progress| {
        if let (Some(file), PipelineProgress::Stage(event), None) =
            (&mut metrics, &progress, &failed)
        {
            if let Some(line) = Metrics::from_stage_event(event) {
                failed = file.write(&line).err();
            }
        }
        show(&a.job, progress)
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    eprintln!(
        "pipeline done in {:.1} s: test accuracy {:.2}%, final loss {:.4}; {:.0} bytes per \
         step over every cut against {} in f32 ({:.1}x less); error-feedback state {} floats",
        outcome.seconds,
        100.0 * outcome.test_accuracy,
        outcome.final_loss,
        outcome.bytes_per_step,
        outcome.f32_bytes_per_step,
        outcome.f32_bytes_per_step as f64 / outcome.bytes_per_step.max(1.0),
        outcome.memory_floats,
    );
    println!(
        "{}",
        serde_json::json!({
            "test_accuracy": outcome.test_accuracy,
            "final_loss": outcome.final_loss,
            "bytes_per_step": outcome.bytes_per_step,
            "f32_bytes_per_step": outcome.f32_bytes_per_step,
            "memory_floats": outcome.memory_floats,
        })
    );
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Prints the run's progress: what it trains, then about twenty loss lines.
fn show(job: &PipelineJob, progress: PipelineProgress) {
    match progress {
        PipelineProgress::Started {
            sizes,
            dataset,
            variant,
            forward_codec,
            backward_codec,
            steps,
            logs,
        } => eprintln!(
            "murmur pipeline: {} stages of an MLP {:?} on {}, {} with activations `{}` and \
             gradients `{}`, p = {}, {steps} steps; logs in {}",
            job.stages,
            sizes,
            dataset.name(),
            variant,
            forward_codec,
            backward_codec,
            job.p,
            logs.unwrap_or_default().display()
        ),
        PipelineProgress::Stage(StageEvent::Progress {
            step,
            steps,
            loss: Some(loss),
            seconds,
            ..
        }) => {
            // About twenty lines per run.
            if step % (steps / 20).max(1) == 0 || step == steps {
                eprintln!("step {step}/{steps}: loss {loss:.4} ({seconds:.0} s)");
            }
        }
        PipelineProgress::Stage(_) => {}
    }
}
