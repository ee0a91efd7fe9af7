//! One stage of a pipeline, linked to its neighbours over QUIC: [`run_stage`] trains it to the
//! end and reports [`StageEvent`]s. The launcher runs one per stage, on a thread of its own or
//! as a process (`murmur pipeline-stage`, which prints the events as JSON lines on stdout for
//! the launcher to read).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use murmur_engine::comm::stage::StageLink;
use murmur_engine::pipeline::Stage;
use murmur_net::identity::Credentials;
use murmur_net::nat::Route;
use murmur_net::stage::{
    connect_stage, meet_neighbours, QuicStageLink, StageListener, StageOptions,
};
use murmur_net::NetError;
use serde::{Deserialize, Serialize};

use super::job::PipelineJob;
use crate::address::resolve;
use crate::checks::load_credentials;
use crate::error::{NodeError, Result};

/// One stage's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// This stage's index, from 0.
    pub index: usize,
    /// Where to listen for the next stage, `host:port` (every stage but the last; port 0
    /// picks a free port, which [`StageEvent::Listening`] tells).
    #[serde(default)]
    pub listen: Option<String>,
    /// The previous stage's address, `host:port` (every stage but the first).
    #[serde(default)]
    pub connect: Option<String>,
    /// A rendezvous node, `host:port`, through which the stages find each other instead of
    /// `connect` (for stages behind NATs, which cannot be connected to): each link is made
    /// directly where a path opens, through the rendezvous's relay otherwise
    /// ([`StageEvent::Linked`] says which). `listen`, if given, is then only the address the
    /// stage's one endpoint binds.
    #[serde(default)]
    pub rendezvous: Option<String>,
    /// The pipeline's name at the rendezvous, the same for every stage of it.
    #[serde(default)]
    pub session: Option<String>,
    /// The swarm folder holding the credentials.
    pub swarm: PathBuf,
    /// This node's name in the swarm (its certificate).
    pub node: String,
    /// Where to write this stage's trained parameters (f32, little-endian, layer by layer).
    pub weights_out: PathBuf,
    /// The job every stage shares.
    pub job: PipelineJob,
    /// Also print every event as a JSON line on stdout (what a process launcher reads).
    #[serde(default)]
    pub json_events: bool,
}

/// What a stage reports. Serialised with an `event` tag, snake case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
// New kinds of event will come (the node library grows): an app that matches on them keeps
// a wildcard arm, so that a new kind is not a breaking change.
#[non_exhaustive]
pub enum StageEvent {
    /// The stage listens for the next one.
    Listening {
        /// The stage's index.
        stage: usize,
        /// Where it listens.
        addr: SocketAddr,
    },
    /// The stage linked to a neighbour.
    Linked {
        /// The stage's index.
        stage: usize,
        /// The neighbour's index.
        neighbour: usize,
        /// Straight to it, or through a rendezvous's relay.
        route: Route,
        /// The address the link goes to (the relay's, when relayed).
        addr: SocketAddr,
    },
    /// Steps went by.
    Progress {
        /// The stage's index.
        stage: usize,
        /// Steps done.
        step: u64,
        /// Steps in the whole run.
        steps: u64,
        /// Mean loss since the last report (the last stage only).
        loss: Option<f64>,
        /// Seconds since the stage started training.
        seconds: f64,
        /// Bytes it sent to its neighbours since the last report.
        #[serde(default)]
        bytes_sent: u64,
        /// Mean seconds per step since the last report.
        #[serde(default)]
        step_seconds: f64,
        /// The learning rate of the report's step.
        #[serde(default)]
        lr: f32,
    },
    /// The stage finished and wrote its weights.
    Done {
        /// The stage's index.
        stage: usize,
        /// Steps done.
        steps: u64,
        /// Bytes it sent to its neighbours in all.
        bytes_sent: u64,
        /// Floats of error-feedback state it holds.
        memory_floats: usize,
        /// Seconds it trained.
        seconds: f64,
    },
}

/// Trains one stage to the end: loads the data and the device, links to the neighbours
/// (by address, or through a rendezvous),
/// steps, writes the weights to `weights_out`, and reports every event to `report` (and
/// prints it, with `json_events`). Blocks until the stage is done.
pub fn run_stage(config: &StageConfig, mut report: impl FnMut(StageEvent)) -> Result<()> {
    let mut emit = |event: StageEvent| -> Result<()> {
        if config.json_events {
            let line = serde_json::to_string(&event).expect("stage events serialise");
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}")
                .and_then(|()| out.flush())
                .map_err(|e| NodeError::io("writing an event to stdout", e))?;
        }
        report(event);
        Ok(())
    };
    let creds = load_credentials(&config.swarm, &config.node)?;
    let job = &config.job;
    let sets = job.load()?;
    let pipeline = Arc::new(job.config(&sets.train)?);
    let steps = job.steps(&sets.train);
    let device = job.device.open()?;
    let e = config.index;
    let (prev, next) = link_neighbours(config, &creds, pipeline.stages, &mut emit)?;
    let mut stage = Stage::new(
        e,
        pipeline.clone(),
        &device,
        Arc::new(sets.train.into()),
        prev,
        next,
    )?;
    let started = Instant::now();
    let every = (steps / 100).max(1);
    let (mut bytes, mut loss_sum, mut losses) = (0u64, 0f64, 0u64);
    // What went by since the last report: bytes sent, and when it was.
    let (mut reported_bytes, mut reported_at, mut reported_step) = (0u64, 0f64, 0u64);
    for step in 0..steps {
        let s = stage
            .step()
            .map_err(|err| NodeError::from(err).at(format!("stage {e}, step {step}")))?;
        bytes += s.bytes_sent as u64;
        if let Some(l) = s.loss {
            loss_sum += l as f64;
            losses += 1;
        }
        if (step + 1) % every == 0 || step + 1 == steps {
            let seconds = started.elapsed().as_secs_f64();
            emit(StageEvent::Progress {
                stage: e,
                step: step + 1,
                steps,
                loss: (losses > 0).then(|| loss_sum / losses as f64),
                seconds,
                bytes_sent: bytes - reported_bytes,
                step_seconds: (seconds - reported_at) / (step + 1 - reported_step) as f64,
                lr: pipeline.lr_at(step),
            })?;
            (loss_sum, losses) = (0.0, 0);
            (reported_bytes, reported_at, reported_step) = (bytes, seconds, step + 1);
        }
    }
    let weights: Vec<u8> = stage
        .weights()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    std::fs::write(&config.weights_out, weights)
        .map_err(|err| NodeError::io(format!("writing {}", config.weights_out.display()), err))?;
    let memory_floats = stage.memory_floats();
    // Closing the links waits for the last messages to arrive.
    drop(stage);
    emit(StageEvent::Done {
        stage: e,
        steps,
        bytes_sent: bytes,
        memory_floats,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One of a stage's links, none at the ends of the pipeline.
type Link = Option<Box<dyn StageLink>>;

/// The stage's links to its neighbours: through a rendezvous when the config names one,
/// otherwise by listening for the next stage (first, so that it can be started while this one
/// connects back) and connecting to the previous one.
fn link_neighbours(
    config: &StageConfig,
    creds: &Credentials,
    stages: usize,
    emit: &mut impl FnMut(StageEvent) -> Result<()>,
) -> Result<(Link, Link)> {
    let e = config.index;
    let last = stages - 1;
    let options = StageOptions::default();
    // Reports a link and boxes it.
    let linked = |emit: &mut dyn FnMut(StageEvent) -> Result<()>,
                  link: QuicStageLink,
                  neighbour: usize,
                  route: Route| {
        emit(StageEvent::Linked {
            stage: e,
            neighbour,
            route,
            addr: link.remote_address(),
        })?;
        Ok::<Link, NodeError>(Some(Box::new(link)))
    };
    if let Some(rendezvous) = &config.rendezvous {
        let at = resolve(rendezvous)
            .map_err(|err| NodeError::Address(format!("of the rendezvous: {err}")))?;
        let session = config.session.as_deref().ok_or_else(|| {
            NodeError::Config("a stage that meets through a rendezvous needs a session".into())
        })?;
        if config.connect.is_some() {
            return Err(NodeError::Config(
                "a stage finds its neighbours through the rendezvous or by address, not both: \
                 drop connect"
                    .into(),
            ));
        }
        let bind = match &config.listen {
            Some(addr) => {
                resolve(addr).map_err(|err| NodeError::Address(format!("to listen on: {err}")))?
            }
            None => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let neighbours = meet_neighbours(at, session, bind, creds, (e, stages), options)
            .map_err(|err| net_context("meeting the neighbours through the rendezvous", err))?;
        let prev = match neighbours.prev {
            Some((link, route)) => linked(emit, link, e - 1, route)?,
            None => None,
        };
        let next = match neighbours.next {
            Some((link, route)) => linked(emit, link, e + 1, route)?,
            None => None,
        };
        return Ok((prev, next));
    }
    // Listen first, so that the next stage can be started while this one connects back.
    let listener = match (e < last, &config.listen) {
        (true, Some(addr)) => {
            let addr =
                resolve(addr).map_err(|err| NodeError::Address(format!("to listen on: {err}")))?;
            let l = StageListener::bind(addr, creds, e, options)?;
            emit(StageEvent::Listening {
                stage: e,
                addr: l.local_addr()?,
            })?;
            Some(l)
        }
        (true, None) => {
            return Err(NodeError::Config(format!(
                "stage {e} of {stages} needs an address to listen on, or a rendezvous"
            )))
        }
        (false, _) => None,
    };
    let prev = match (e > 0, &config.connect) {
        (true, Some(addr)) => {
            let addr = resolve(addr)
                .map_err(|err| NodeError::Address(format!("of the previous stage: {err}")))?;
            let link = connect_stage(addr, creds, e, options)
                .map_err(|err| net_context("connecting to the previous stage", err))?;
            linked(emit, link, e - 1, Route::Direct)?
        }
        (true, None) => {
            return Err(NodeError::Config(format!(
                "stage {e} needs the previous stage's address, or a rendezvous"
            )))
        }
        (false, _) => None,
    };
    let next = match listener {
        Some(l) => {
            let link = l
                .accept()
                .map_err(|err| net_context("waiting for the next stage", err))?;
            linked(emit, link, e + 1, Route::Direct)?
        }
        None => None,
    };
    Ok((prev, next))
}

/// A link failure, saying which link.
fn net_context(what: &str, err: NetError) -> NodeError {
    NodeError::Net(NetError::Connection(format!("{what}: {err}")))
}
