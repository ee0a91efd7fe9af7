//! A rendezvous node as a library node: [`RendezvousNode::start`] serves pipeline stages that
//! meet through it (behind NATs, [`murmur_net::nat`]) on a thread of its own, with the pair
//! relay for those that cannot reach each other directly, and returns a handle that knows
//! where it listens and stops it. Run it on a machine that stages can reach: a server, or
//! any host with a public address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use murmur_net::nat::pair_relay::RelayCounts;
use murmur_net::nat::rendezvous::Rendezvous;
use serde::{Deserialize, Serialize};

use crate::address::resolve;
use crate::checks::load_credentials;
use crate::control::Stopper;
use crate::error::{NodeError, Result};
use crate::link::LinkConfig;
use crate::node_thread::NodeThread;

/// A rendezvous node's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RendezvousConfig {
    /// Where stages reach it, `host:port` (QUIC; port 0 picks a free port).
    pub listen: String,
    /// The relay's UDP port, on the same address (default: the listening port plus one, or
    /// a free port when that is 0). Stages learn it from their introductions.
    pub relay_port: Option<u16>,
    /// The swarm folder holding the credentials.
    pub swarm: PathBuf,
    /// This node's name in the swarm (a certificate issued with `--role rendezvous`).
    pub node: String,
    /// The QUIC settings of its connections.
    pub link: LinkConfig,
}

impl Default for RendezvousConfig {
    fn default() -> Self {
        RendezvousConfig {
            listen: "0.0.0.0:7500".into(),
            relay_port: None,
            swarm: "swarm".into(),
            node: "rendezvous".into(),
            link: LinkConfig::default(),
        }
    }
}

/// Starts rendezvous nodes.
pub struct RendezvousNode;

impl RendezvousNode {
    /// Binds the rendezvous and its relay and starts serving; returns once both listen.
    pub fn start(config: RendezvousConfig) -> Result<RendezvousHandle> {
        config.link.validate()?;
        let listen = resolve(&config.listen)
            .map_err(|e| NodeError::Address(format!("to listen on: {e}")))?;
        let relay_port = config.relay_port.unwrap_or(if listen.port() == 0 {
            0
        } else {
            listen.port().wrapping_add(1)
        });
        let relay = SocketAddr::new(listen.ip(), relay_port);
        let creds = load_credentials(&config.swarm, &config.node)?;
        let link = config.link.link();
        let (bound_tx, bound_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("murmur-rendezvous".into())
            .spawn(move || -> Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .thread_name("murmur-rendezvous")
                    .build()
                    .map_err(|e| NodeError::io("starting the rendezvous's runtime", e))?;
                runtime.block_on(async move {
                    let started = Rendezvous::start(listen, relay, &creds, &link)
                        .and_then(|r| Ok((r.local_addr()?, r.relay_port()?, Arc::new(r))));
                    match started {
                        Ok((addr, port, rendezvous)) => {
                            let _ = bound_tx.send(Ok((addr, port, rendezvous.clone())));
                            rendezvous.run().await;
                        }
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                        }
                    }
                });
                Ok(())
            })
            .map_err(|e| NodeError::io("starting the rendezvous thread", e))?;
        let (addr, relay_port, rendezvous) = bound_rx
            .recv()
            .map_err(|_| NodeError::Thread("the rendezvous thread ended before binding".into()))?
            .map_err(|e| NodeError::from(e).at(format!("listening on {listen}")))?;
        Ok(RendezvousHandle {
            addr,
            relay_port,
            rendezvous,
            thread: NodeThread::new(thread),
        })
    }
}

/// A running rendezvous. Dropping it stops it.
pub struct RendezvousHandle {
    addr: SocketAddr,
    relay_port: u16,
    rendezvous: Arc<Rendezvous>,
    thread: NodeThread,
}

impl RendezvousHandle {
    /// Where stages reach it.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The relay's UDP port.
    pub fn relay_port(&self) -> u16 {
        self.relay_port
    }

    /// What the relay forwards, counted as it goes (also after the node stops).
    pub fn relayed(&self) -> Arc<RelayCounts> {
        self.rendezvous.relay().counts.clone()
    }

    /// Stops serving (links already made through the relay stop too).
    pub fn stop(&self) {
        self.rendezvous.close();
    }

    /// A [`Stopper`] for this node.
    pub fn stopper(&self) -> Stopper {
        let rendezvous = self.rendezvous.clone();
        Stopper::new(move || rendezvous.close())
    }

    /// Waits for the node to stop (after [`RendezvousHandle::stop`]).
    pub fn join(mut self) -> Result<()> {
        self.thread.join()
    }
}

impl Drop for RendezvousHandle {
    fn drop(&mut self) {
        self.stop();
        let _ = self.thread.join();
    }
}
