//! `murmur server`: one parameter-server shard serving a job. It prints where it listens as a
//! JSON line on stdout, then serves until interrupted, logging every peer by its key
//! fingerprint.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{ArgMatches, Args};
use murmur_node::swarm::Listening;
use murmur_node::{Job, LinkConfig, ServerConfig, ServerNode};

use super::job_flags::job_from;

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on, HOST:PORT (a name, IPv4, or [IPv6]; port 0 picks a free port).
    #[arg(long, default_value = "0.0.0.0:7400")]
    listen: String,
    /// Swarm folder (from `murmur swarm init`).
    #[arg(long, default_value = "swarm")]
    swarm: PathBuf,
    /// This node's name in the swarm folder (`murmur swarm issue`).
    #[arg(long)]
    node: String,
    /// This server's index among the shards; every worker lists the servers in shard order.
    #[arg(long, default_value_t = 0)]
    shard: u16,
    #[arg(long, default_value_t = 1)]
    shards: u16,
    /// Seconds a round waits for stragglers after its first push.
    #[arg(long, default_value_t = 30.0)]
    deadline: f64,
    /// The job, as a TOML file (job flags given here override its fields).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The swarm authority's signature of the job (`murmur swarm sign-job`); default: the job
    /// file's name with .sig added, where it exists. Without one, the shard signs the job with
    /// the swarm folder's ca.key if the folder holds it, and refuses to start otherwise.
    #[arg(long, value_name = "FILE")]
    job_signature: Option<PathBuf>,
    #[command(flatten)]
    link: LinkConfig,
    #[command(flatten)]
    job: Job,
    /// Shard 0: write the model here each time a worker sends its snapshot (the ranks in
    /// turn, every --snapshot-every rounds), so that the newest model is there when the shard stops.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Save this shard's state in DIR after every round (before replying) and resume from it
    /// when started again with the same DIR: a killed shard restarted with the same flags
    /// goes on from its last round, and the workers reconnect on their own.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

pub fn run(a: ServerArgs, matches: &ArgMatches) -> anyhow::Result<()> {
    let job = job_from(a.config.as_deref(), &a.job, matches)?;
    // A shard runs for days: its free pages go back to the system, not to a growing heap.
    murmur_node::platform::trim_free_memory_every(std::time::Duration::from_secs(5));
    if let Some(path) = &a.save {
        super::flag_checks::writable("--save", path)?;
    }
    let signature_file = a.job_signature.clone().or_else(|| {
        let beside = signature_beside(a.config.as_deref()?);
        beside.exists().then_some(beside)
    });
    let job_signature = signature_file
        .map(|path| {
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading the job's signature {}", path.display()))
        })
        .transpose()?;
    let server = ServerNode::start(ServerConfig {
        listen: a.listen,
        swarm: a.swarm,
        node: a.node,
        shard: a.shard,
        shards: a.shards,
        deadline_s: a.deadline,
        link: a.link,
        job: job.clone(),
        job_signature,
        save: a.save,
        state: a.state,
    })?;
    let listening = Listening {
        event: "listening".into(),
        shard: a.shard,
        addr: server.local_addr(),
        fingerprint: server.fingerprint().to_string(),
    };
    println!("{}", serde_json::to_string(&listening)?);
    eprintln!(
        "murmur server: shard {} of {} listening on {} as {}; serving a job of {} workers, codec {}",
        a.shard, a.shards, listening.addr, listening.fingerprint, job.workers, job.codec
    );
    let stopper = server.stopper();
    crate::signals::on_signal(move |_| stopper.stop());
    server.join()?;
    crate::signals::check()
}

/// Where `murmur swarm sign-job` writes the signature of the job file `job`: beside it, `.sig`
/// added to its name.
pub fn signature_beside(job: &Path) -> PathBuf {
    let mut name = job.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}
