//! `murmur pipeline-stage`: one stage of a pipeline as a process of its own, linked to its
//! neighbours over QUIC. The launcher (`murmur pipeline`) starts one per stage; it reads the
//! JSON events this process prints, one per line, on stdout. Stages on machines of their own,
//! behind NATs, meet through a `murmur rendezvous` (`--rendezvous`, `--session`). The stage
//! itself is the node library's ([`murmur_node::pipeline::run_stage`]).

use std::path::PathBuf;

use clap::Args;
use murmur_node::pipeline::{run_stage, PipelineJob, StageConfig};

#[derive(Args, Debug)]
pub struct StageArgs {
    /// This stage's index, from 0.
    #[arg(long)]
    pub index: usize,
    /// Where to listen for the next stage (every stage but the last; with --rendezvous, only
    /// the address this stage's endpoint binds, default any).
    #[arg(long)]
    pub listen: Option<String>,
    /// The previous stage's address (every stage but the first, unless --rendezvous).
    #[arg(long, conflicts_with = "rendezvous")]
    pub connect: Option<String>,
    /// A `murmur rendezvous` node, HOST:PORT, through which the stages find each other
    /// (behind NATs, without port forwarding): each link goes directly where the NATs let
    /// it, through the rendezvous's relay otherwise; the stage prints which.
    #[arg(long, requires = "session")]
    pub rendezvous: Option<String>,
    /// The pipeline's name at the rendezvous, the same for every one of its stages.
    #[arg(long, requires = "rendezvous")]
    pub session: Option<String>,
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

pub fn run(a: StageArgs) -> anyhow::Result<()> {
    let config = StageConfig {
        index: a.index,
        listen: a.listen,
        connect: a.connect,
        rendezvous: a.rendezvous,
        session: a.session,
        swarm: a.swarm,
        node: a.node,
        weights_out: a.weights_out,
        job: a.job,
        json_events: true,
    };
    Ok(run_stage(&config, |_| {})?)
}
