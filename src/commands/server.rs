//! `murmur server`: one parameter-server shard. It prints where it listens as a JSON line on
//! stdout, then serves until interrupted, logging every peer by its key fingerprint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use murmur_net::identity::Credentials;
use murmur_net::ps::{Server, ServerOptions};

use super::swarm::args::{LinkArgs, Listening};

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "0.0.0.0:7400")]
    listen: SocketAddr,
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
    #[command(flatten)]
    link: LinkArgs,
}

pub fn run(a: ServerArgs) -> anyhow::Result<()> {
    let creds = Credentials::load(&a.swarm, &a.node)
        .with_context(|| format!("loading node {:?} from {}", a.node, a.swarm.display()))?;
    let options = ServerOptions {
        shard: a.shard,
        shards: a.shards,
        link: a.link.link(),
        deadline: Duration::from_secs_f64(a.deadline.max(0.01)),
        ..ServerOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("murmur-server")
        .build()?;
    runtime.block_on(async {
        let server = Server::bind(a.listen, &creds, options)
            .with_context(|| format!("listening on {}", a.listen))?;
        let listening = Listening {
            event: "listening".into(),
            shard: a.shard,
            addr: server.local_addr()?,
            fingerprint: creds.fingerprint(),
        };
        println!("{}", serde_json::to_string(&listening)?);
        eprintln!(
            "murmur server: shard {} of {} listening on {} as {}",
            a.shard, a.shards, listening.addr, listening.fingerprint
        );
        server.run().await?;
        Ok(())
    })
}
