//! A parameter-server shard as a library node: [`ServerNode::start`] binds the shard, serves
//! on a thread of its own (with its own async runtime) and returns a [`ServerHandle`] that
//! knows where it listens and stops it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use murmur_net::identity::{signature_from_text, signature_text, verify_job, Credentials, Swarm};
use murmur_net::ps::{JobOffer, Server, ServerOptions};
use serde::{Deserialize, Serialize};

use crate::address::resolve;
use crate::checks::{load_credentials, positive_seconds};
use crate::control::Stopper;
use crate::error::{NodeError, Result};
use crate::files::write_atomically;
use crate::job::Job;
use crate::layout::shard_checks;
use crate::link::LinkConfig;
use crate::node_thread::NodeThread;

/// A shard's settings, and the job it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Where to listen, `host:port` (port 0 picks a free port).
    pub listen: String,
    /// The swarm folder holding `ca.pem` and this node's certificate.
    pub swarm: PathBuf,
    /// This node's name in the swarm folder.
    pub node: String,
    /// This shard's index; every worker lists the shards in this order.
    pub shard: u16,
    /// How many shards the job has.
    pub shards: u16,
    /// Seconds a round waits for stragglers after its first push before evicting them.
    pub deadline_s: f64,
    /// Its link to the workers.
    pub link: LinkConfig,
    /// The job: shard 0 hands it to every worker that joins; every shard takes the world
    /// size from it.
    pub job: Job,
    /// The swarm authority's signature of the job (the hex line `murmur swarm sign-job`
    /// writes), which every worker checks. Without it the shard signs the job itself with the
    /// swarm folder's `ca.key`, if the folder holds it (a swarm run from one machine), and
    /// refuses to start otherwise.
    pub job_signature: Option<String>,
    /// Shard 0 only: write the model snapshots it keeps for rejoining workers here (the
    /// ranks send one in turn every `snapshot_every` rounds of the job), each replacing the last, so the
    /// file holds the newest model when the shard stops.
    pub save: Option<PathBuf>,
    /// A folder where the shard saves its state after every round, before replying (keys,
    /// server memories, the round log, snapshot, ranks); started again with the same folder
    /// after a crash or a kill, it goes on from the last round it closed, and the workers
    /// reconnect on their own. Each shard needs a folder of its own.
    pub state: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "0.0.0.0:7400".into(),
            swarm: PathBuf::from("swarm"),
            node: String::new(),
            shard: 0,
            shards: 1,
            deadline_s: 30.0,
            link: LinkConfig::default(),
            job: Job::default(),
            job_signature: None,
            save: None,
            state: None,
        }
    }
}

/// The job's signature: the one the config gives, or one made now with the swarm folder's
/// authority key where the folder holds it.
fn job_signature(config: &ServerConfig, creds: &Credentials, description: &str) -> Result<Vec<u8>> {
    if let Some(text) = &config.job_signature {
        let signature = signature_from_text(text)?;
        // Server::bind checks it too; here the refusal can say what to do.
        verify_job(&creds.ca, description, &signature).map_err(|_| {
            NodeError::Config(
                "the job's signature does not verify against this swarm's ca.pem: the job \
                 differs from the one signed (job flags on top of a signed file change it: \
                 sign it with the same flags), or another swarm signed it"
                    .into(),
            )
        })?;
        return Ok(signature);
    }
    if !config.swarm.join("ca.key").exists() {
        return Err(NodeError::Config(format!(
            "the job is not signed, and {} holds no ca.key to sign it: sign it where the swarm's \
             key is with `murmur swarm sign-job DIR --config JOB.toml` (and the job flags the \
             servers get), then start the servers with --job-signature JOB.toml.sig",
            config.swarm.display()
        )));
    }
    let signature = Swarm::load(&config.swarm)?.sign_job(description)?;
    tracing::info!(
        "shard {}: signed the job with the swarm's key in {} (a swarm across machines keeps \
         ca.key off its servers and gives them the signature: murmur swarm sign-job)",
        config.shard,
        config.swarm.display()
    );
    Ok(signature)
}

/// The authority's signature of `job`, as the hex line a `.sig` file holds: what
/// [`ServerConfig::job_signature`] takes. Needs the swarm folder's `ca.key`.
pub fn sign_job(swarm: &std::path::Path, job: &Job) -> Result<String> {
    job.validate()?;
    let signature = Swarm::load(swarm)?.sign_job(&job.to_wire())?;
    Ok(signature_text(&signature))
}

/// Starts parameter-server shards.
pub struct ServerNode;

impl ServerNode {
    /// Checks the config and the job, binds the shard and starts serving. Returns once the
    /// shard listens.
    pub fn start(config: ServerConfig) -> Result<ServerHandle> {
        config.job.validate()?;
        config.link.validate()?;
        positive_seconds("the round deadline", config.deadline_s)?;
        if config.shard >= config.shards {
            return Err(NodeError::Config(format!(
                "shard {} of {}: shards count from 0",
                config.shard, config.shards
            )));
        }
        if config.save.is_some() && config.shard != 0 {
            return Err(NodeError::Config(
                "only shard 0 keeps the model's snapshots: give --save to shard 0".into(),
            ));
        }
        let listen = resolve(&config.listen)
            .map_err(|e| NodeError::Address(format!("to listen on: {e}")))?;
        let creds = load_credentials(&config.swarm, &config.node)?;
        let fingerprint = creds.fingerprint();
        let description = config.job.to_wire();
        let signature = job_signature(&config, &creds, &description)?;
        let snapshots = config.save.clone().map(save_snapshots).transpose()?;
        let (layout, snapshot_digest) = shard_checks(&config.job, config.shard, config.shards)?;
        let options = ServerOptions {
            shard: config.shard,
            shards: config.shards,
            link: config.link.link(),
            deadline: Duration::from_secs_f64(config.deadline_s.max(0.01)),
            quorum: config.job.quorum_rule(),
            aggregate: config.job.aggregate_rule()?,
            job: Some(JobOffer {
                world: config.job.workers,
                start_with: config.job.start_with.unwrap_or(config.job.workers),
                description,
                signature,
                queue: Some(config.job.queue_spec()?),
                fold_late: config.job.folds_late_pushes(),
            }),
            layout: Some(layout),
            snapshot_digest,
            snapshots,
            state_dir: config.state.clone(),
            ..ServerOptions::default()
        };
        let (bound_tx, bound_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("murmur-server-{}", config.shard))
            .spawn(move || -> Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("murmur-server")
                    .build()
                    .map_err(|e| NodeError::io("starting the server's runtime", e))?;
                runtime.block_on(async move {
                    let bound = Server::bind(listen, &creds, options).and_then(|server| {
                        let addr = server.local_addr()?;
                        Ok((server, addr))
                    });
                    let server = match bound {
                        Ok((server, addr)) => {
                            let _ = bound_tx.send(Ok((addr, server.endpoint())));
                            server
                        }
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    server.run().await?;
                    Ok(())
                })
            })
            .map_err(|e| NodeError::io("starting the server thread", e))?;
        let (addr, endpoint) = bound_rx
            .recv()
            .map_err(|_| NodeError::Thread("the server thread ended before binding".into()))?
            .map_err(|e| NodeError::from(e).at(format!("listening on {listen}")))?;
        Ok(ServerHandle {
            addr,
            fingerprint,
            shard: config.shard,
            endpoint,
            thread: NodeThread::new(thread),
        })
    }
}

/// A running shard. Dropping it stops the shard.
pub struct ServerHandle {
    addr: SocketAddr,
    fingerprint: String,
    shard: u16,
    endpoint: quinn::Endpoint,
    thread: NodeThread,
}

impl ServerHandle {
    /// Where the shard listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The fingerprint of the shard's key, as peers log it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// This shard's index.
    pub fn shard(&self) -> u16 {
        self.shard
    }

    /// Closes every connection and stops serving.
    pub fn stop(&self) {
        self.endpoint
            .close(quinn::VarInt::from_u32(0), b"server stopped");
    }

    /// A [`Stopper`] for this shard, to stop it from where the handle cannot go.
    pub fn stopper(&self) -> Stopper {
        let endpoint = self.endpoint.clone();
        Stopper::new(move || endpoint.close(quinn::VarInt::from_u32(0), b"server stopped"))
    }

    /// Waits for the shard to stop (after [`ServerHandle::stop`], or a fatal error).
    pub fn join(mut self) -> Result<()> {
        self.thread.join()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop();
        let _ = self.thread.join();
    }
}

/// A thread that writes every snapshot it is sent to `path` (atomically, newest last); it
/// ends when the shard drops the sender.
fn save_snapshots(path: PathBuf) -> Result<mpsc::Sender<(u64, bytes::Bytes)>> {
    let (tx, rx) = mpsc::channel::<(u64, bytes::Bytes)>();
    std::thread::Builder::new()
        .name("murmur-server-save".into())
        .spawn(move || {
            for (step, bytes) in rx {
                if let Err(e) = write_atomically(&path, &bytes) {
                    tracing::error!("the snapshot of step {step}: {e}");
                }
            }
        })
        .map_err(|e| NodeError::io("starting the snapshot writer", e))?;
    Ok(tx)
}
