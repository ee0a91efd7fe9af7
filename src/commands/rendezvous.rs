//! `murmur rendezvous`: where pipeline stages behind NATs meet, and the relay for those whose
//! NATs let no direct path open. It prints where it listens as a JSON line on stdout, logs
//! every introduction, and serves until interrupted. The node is the library's
//! ([`murmur_node::RendezvousNode`]).

use std::path::PathBuf;

use clap::Args;
use murmur_node::{LinkConfig, RendezvousConfig, RendezvousNode};

#[derive(Args, Debug)]
pub struct RendezvousArgs {
    /// Address stages reach it on, HOST:PORT (QUIC over UDP; port 0 picks a free port). Run
    /// it where every stage can reach it: a server, or any host with a public address.
    #[arg(long, default_value = "0.0.0.0:7500")]
    listen: String,
    /// The relay's UDP port on the same address (default: the listening port plus one).
    /// Open both ports in the host's firewall.
    #[arg(long)]
    relay_port: Option<u16>,
    /// Swarm folder (from `murmur swarm init`).
    #[arg(long, default_value = "swarm")]
    swarm: PathBuf,
    /// This node's name in the swarm folder (`murmur swarm issue ... --role rendezvous`).
    #[arg(long, default_value = "rendezvous")]
    node: String,
    #[command(flatten)]
    link: LinkConfig,
}

pub fn run(a: RendezvousArgs) -> anyhow::Result<()> {
    let node = RendezvousNode::start(RendezvousConfig {
        listen: a.listen,
        relay_port: a.relay_port,
        swarm: a.swarm,
        node: a.node,
        link: a.link,
    })?;
    println!(
        "{}",
        serde_json::json!({
            "event": "listening",
            "addr": node.local_addr(),
            "relay_port": node.relay_port(),
        })
    );
    eprintln!(
        "murmur rendezvous: stages meet at {}, relay on UDP port {}",
        node.local_addr(),
        node.relay_port()
    );
    let stopper = node.stopper();
    crate::signals::on_signal(move |_| stopper.stop());
    let relayed = node.relayed();
    let joined = node.join();
    let (datagrams, bytes) = relayed.get();
    eprintln!(
        "murmur rendezvous: stopped; the relay forwarded {datagrams} datagrams ({bytes} bytes)"
    );
    joined?;
    crate::signals::check()
}
