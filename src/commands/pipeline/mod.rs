//! `murmur pipeline`: one model cut into E stages, each a process of its own on this machine,
//! neighbours linked over loopback QUIC, training with Clapping (or a baseline) and showing
//! progress; at the end the stages' weights are put back together and tested.

mod job;
pub mod stage;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use murmur_engine::nn::{Activation, Mlp, Module};
use murmur_engine::pipeline::image_accuracy;
use murmur_engine::{Device, Tensor};
use murmur_net::identity::Swarm;

use job::PipelineJob;
use murmur_node::process::{log_tail, spawn_logged, Children};
use stage::StageEvent;

#[derive(Args, Debug)]
pub struct PipelineArgs {
    #[command(flatten)]
    job: PipelineJob,
    /// Folder for credentials, logs and the stages' weights (default: a fresh one under the
    /// temp folder, removed after a successful run).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Reads a stage's weights file: exactly `expected` finite f32 values.
fn read_weights(path: &Path, expected: usize) -> anyhow::Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() != 4 * expected {
        bail!(
            "{} holds {} bytes; the stage has {expected} parameters ({} bytes)",
            path.display(),
            bytes.len(),
            4 * expected
        );
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if values.iter().any(|v| !v.is_finite()) {
        bail!("{} holds non-finite parameters", path.display());
    }
    Ok(values)
}

pub fn run(a: PipelineArgs) -> anyhow::Result<()> {
    let (dataset, train, test) = a.job.load()?;
    let config = a.job.config(&train)?;
    let sizes = a.job.sizes(&train);
    let steps = a.job.steps(&train);
    let e_count = config.stages;
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("murmur-pipeline-{}", std::process::id()))
    });
    let swarm = Swarm::generate("pipeline")?;
    swarm.save(&dir)?;
    for e in 0..e_count {
        swarm.issue_to(&dir, &format!("stage-{e}"))?;
    }
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    eprintln!(
        "murmur pipeline: {e_count} stages of an MLP {:?} on {}, {} with activations `{}` and \
         gradients `{}`, p = {}, {steps} steps; logs in {}",
        sizes,
        dataset.name(),
        config.variant,
        config.forward_codec,
        config.backward_codec,
        a.job.p,
        logs.display()
    );
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut children = Children(Vec::new());
    let (tx, rx) = mpsc::channel::<(usize, Option<StageEvent>)>();
    let mut prev_addr: Option<String> = None;
    for e in 0..e_count {
        let mut args: Vec<String> = vec![
            "pipeline-stage".into(),
            format!("--index={e}"),
            format!("--swarm={}", dir.display()),
            format!("--node=stage-{e}"),
            format!(
                "--weights-out={}",
                dir.join(format!("stage-{e}.weights")).display()
            ),
        ];
        if e + 1 < e_count {
            args.push("--listen=127.0.0.1:0".into());
        }
        if let Some(addr) = &prev_addr {
            args.push(format!("--connect={addr}"));
        }
        args.extend(a.job.to_args());
        let log = logs.join(format!("stage-{e}.log"));
        let mut child = spawn_logged(&exe, &args, &log)?;
        let stdout = child.stdout.take().expect("piped");
        children.0.push((format!("stage {e}"), child));
        let (addr_tx, addr_rx) = mpsc::channel();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str::<StageEvent>(&line) {
                    Ok(StageEvent::Listening { addr, .. }) => {
                        let _ = addr_tx.send(addr);
                    }
                    Ok(event) => {
                        let _ = tx.send((e, Some(event)));
                    }
                    Err(_) => {}
                }
            }
            let _ = tx.send((e, None));
        });
        if e + 1 < e_count {
            let addr = addr_rx
                .recv_timeout(Duration::from_secs(120))
                .with_context(|| format!("stage {e} did not start:\n{}", log_tail(&log)))?;
            prev_addr = Some(addr.to_string());
        }
    }
    drop(tx);

    let mut done = vec![None; e_count];
    let mut finished = 0;
    let mut last_loss = f64::NAN;
    while finished < e_count {
        let (e, event) = rx.recv().context("stage output")?;
        match event {
            Some(StageEvent::Progress {
                step,
                steps,
                loss: Some(loss),
                seconds,
                ..
            }) => {
                last_loss = loss;
                // About twenty lines per run.
                if step % (steps / 20).max(1) == 0 || step == steps {
                    eprintln!("step {step}/{steps}: loss {loss:.4} ({seconds:.0} s)");
                }
            }
            Some(StageEvent::Done {
                bytes_sent,
                memory_floats,
                ..
            }) => done[e] = Some((bytes_sent, memory_floats)),
            Some(_) => {}
            None => {
                finished += 1;
                if done[e].is_none() {
                    let log = logs.join(format!("stage-{e}.log"));
                    bail!(
                        "stage {e} exited before finishing; the end of its log:\n{}",
                        log_tail(&log)
                    );
                }
            }
        }
    }
    for (name, child) in &mut children.0 {
        let status = child.wait()?;
        if !status.success() {
            bail!("{name} failed with {status}");
        }
    }

    // Put the stages' weights back into one model and test it.
    let mut mlp = Mlp::new(&Device::Cpu, &sizes, Activation::Relu, config.seed)?;
    let mut weights = Vec::new();
    for e in 0..e_count {
        let count: usize = mlp.layers[config.layers_of(e)]
            .iter()
            .map(|l| l.parameter_count())
            .sum();
        weights.extend(read_weights(
            &dir.join(format!("stage-{e}.weights")),
            count,
        )?);
    }
    let mut offset = 0;
    for p in mlp.parameters_mut() {
        let n = p.numel();
        *p = Tensor::from_vec(
            &Device::Cpu,
            p.shape(),
            weights[offset..offset + n].to_vec(),
        )?;
        offset += n;
    }
    let accuracy = image_accuracy(&Device::Cpu, &test, 1000, |g, x| mlp.forward(g, g.input(x)))?;
    let bytes: u64 = done.iter().flatten().map(|d| d.0).sum();
    let memory: usize = done.iter().flatten().map(|d| d.1).sum();
    let widths: usize = (0..e_count - 1).map(|e| config.cut_width(e)).sum();
    let f32_per_step = 2 * 4 * config.batch * widths;
    let per_step = bytes as f64 / steps.max(1) as f64;
    eprintln!(
        "pipeline done in {:.1} s: test accuracy {:.2}%, final loss {last_loss:.4}; {per_step:.0} \
         bytes per step over every cut against {f32_per_step} in f32 ({:.1}x less); \
         error-feedback state {memory} floats",
        started.elapsed().as_secs_f64(),
        100.0 * accuracy,
        f32_per_step as f64 / per_step.max(1.0),
    );
    println!(
        "{}",
        serde_json::json!({
            "test_accuracy": accuracy,
            "final_loss": last_loss,
            "bytes_per_step": per_step,
            "f32_bytes_per_step": f32_per_step,
            "memory_floats": memory,
        })
    );
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
