//! `murmur pipeline`: one model cut into E stages, each a process of its own on this machine,
//! neighbours linked over loopback QUIC, training with Clapping (or a baseline) and showing
//! progress; at the end the stages' weights are put back together and tested. The run itself
//! is the node library's ([`murmur_node::pipeline`]); this prints it.

pub mod stage;

use std::path::PathBuf;

use clap::Args;
use murmur_node::pipeline::{run_pipeline, PipelineJob, PipelineProgress, StageEvent};
use murmur_node::swarm::Launch;

#[derive(Args, Debug)]
pub struct PipelineArgs {
    #[command(flatten)]
    job: PipelineJob,
    /// Folder for credentials, logs and the stages' weights (default: a fresh one under the
    /// temp folder, removed after a successful run).
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(a: PipelineArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("murmur-pipeline-{}", std::process::id()))
    });
    let launch = Launch::Processes {
        exe: std::env::current_exe()?,
    };
    let outcome = run_pipeline(&a.job, &dir, launch, |progress| match progress {
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
            a.job.stages,
            sizes,
            dataset.name(),
            variant,
            forward_codec,
            backward_codec,
            a.job.p,
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
    })?;
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
