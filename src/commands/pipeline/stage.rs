//! `murmur pipeline-stage`: one stage of a pipeline as a process of its own, linked to its
//! neighbours over QUIC. The launcher (`murmur pipeline`) starts one per stage; it reads the
//! JSON events this process prints, one per line, on stdout.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use murmur_engine::comm::stage::StageLink;
use murmur_engine::pipeline::Stage;
use murmur_net::identity::Credentials;
use murmur_net::stage::{connect_stage, StageListener, StageOptions};
use serde::{Deserialize, Serialize};

use super::job::PipelineJob;
use crate::commands::repro::open_device;

#[derive(Args, Debug)]
pub struct StageArgs {
    /// This stage's index, from 0.
    #[arg(long)]
    pub index: usize,
    /// Where to listen for the next stage (every stage but the last).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// The previous stage's address (every stage but the first).
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// Swarm folder holding the credentials.
    #[arg(long)]
    pub swarm: PathBuf,
    /// This node's name in the swarm (its certificate).
    #[arg(long)]
    pub node: String,
    /// Where to write this stage's trained parameters (f32, little-endian, layer by layer).
    #[arg(long)]
    pub weights_out: PathBuf,
    #[command(flatten)]
    pub job: PipelineJob,
}

/// What a stage reports.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StageEvent {
    Listening {
        stage: usize,
        addr: SocketAddr,
    },
    Progress {
        stage: usize,
        step: u64,
        steps: u64,
        /// Mean loss since the last report (the last stage only).
        loss: Option<f64>,
        seconds: f64,
    },
    Done {
        stage: usize,
        steps: u64,
        bytes_sent: u64,
        memory_floats: usize,
        seconds: f64,
    },
}

fn emit(event: &StageEvent) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(event)?)?;
    out.flush()?;
    Ok(())
}

pub fn run(a: StageArgs) -> anyhow::Result<()> {
    let creds = Credentials::load(&a.swarm, &a.node)?;
    let (_, train, _) = a.job.load()?;
    let config = Arc::new(a.job.config(&train)?);
    let steps = a.job.steps(&train);
    let (device, _) = open_device(a.job.device)?;
    let e = a.index;
    let last = config.stages - 1;
    let options = StageOptions::default();
    // Listen first, so that the next stage can be started while this one connects back.
    let listener = match (e < last, a.listen) {
        (true, Some(addr)) => {
            let l = StageListener::bind(addr, &creds, e, options)?;
            emit(&StageEvent::Listening {
                stage: e,
                addr: l.local_addr()?,
            })?;
            Some(l)
        }
        (true, None) => anyhow::bail!("stage {e} of {} needs --listen", config.stages),
        (false, _) => None,
    };
    let prev: Option<Box<dyn StageLink>> = match (e > 0, a.connect) {
        (true, Some(addr)) => Some(Box::new(
            connect_stage(addr, &creds, e, options).context("connecting to the previous stage")?,
        )),
        (true, None) => anyhow::bail!("stage {e} needs --connect"),
        (false, _) => None,
    };
    let next: Option<Box<dyn StageLink>> = match listener {
        Some(l) => Some(Box::new(l.accept().context("waiting for the next stage")?)),
        None => None,
    };
    let mut stage = Stage::new(e, config, &device, Arc::new(train.into()), prev, next)?;
    let started = Instant::now();
    let every = (steps / 100).max(1);
    let (mut bytes, mut loss_sum, mut losses) = (0u64, 0f64, 0u64);
    for step in 0..steps {
        let s = stage
            .step()
            .with_context(|| format!("stage {e}, step {step}"))?;
        bytes += s.bytes_sent as u64;
        if let Some(l) = s.loss {
            loss_sum += l as f64;
            losses += 1;
        }
        if (step + 1) % every == 0 || step + 1 == steps {
            emit(&StageEvent::Progress {
                stage: e,
                step: step + 1,
                steps,
                loss: (losses > 0).then(|| loss_sum / losses as f64),
                seconds: started.elapsed().as_secs_f64(),
            })?;
            (loss_sum, losses) = (0.0, 0);
        }
    }
    let weights: Vec<u8> = stage
        .weights()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    std::fs::write(&a.weights_out, weights)
        .with_context(|| format!("writing {}", a.weights_out.display()))?;
    let memory_floats = stage.memory_floats();
    // Closing the links waits for the last messages to arrive.
    drop(stage);
    emit(&StageEvent::Done {
        stage: e,
        steps,
        bytes_sent: bytes,
        memory_floats,
        seconds: started.elapsed().as_secs_f64(),
    })
}
