//! murmur-node: murmur's nodes as a library, for programs that embed one (a desktop app that
//! lends its owner's GPU, a launcher, a research group's orchestration) and for the `murmur`
//! command line, which is a thin layer over it.
//!
//! - [`Job`]: the one description of a data-parallel job (TOML, serde); the servers hold it
//!   and hand it to every worker that joins.
//! - [`Worker`]: starts a worker from a [`WorkerConfig`] (node-local settings only) and
//!   returns a [`WorkerHandle`]: pause, resume, stop, a GPU [`Budget`], and a stream of
//!   [`Event`]s.
//! - [`ServerNode`]: starts a parameter-server shard from a [`ServerConfig`].
//! - [`swarm`]: a whole swarm on this machine, nodes as threads or as processes.
//! - [`pipeline`]: a model cut into stages, one node per stage; stages behind NATs meet
//!   through a [`RendezvousNode`].
//!
//! A node runs on threads of its own, with its own async runtime: its handle works from
//! plain threads and from async code alike (see [`WorkerHandle::join`] for the one blocking
//! call).
//!
//! Starting a worker that joins the servers at `localhost:PORT` with the certificate
//! `swarm/nodes/worker-0.pem`, following its events, pausing it while its owner is busy, and
//! stopping it (here with a one-shard server of its own, so that the example runs):
//!
//! ```
//! use murmur_node::{Budget, DeviceKind, Event, Job, ServerConfig, ServerNode, Worker, WorkerConfig};
//! # let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
//! # if !data.join("mnist").exists() { return Ok(()); } // scripts/fetch-data.sh fetches MNIST
//! # let swarm = std::env::temp_dir().join(format!("murmur-doc-{}", std::process::id()));
//! # murmur_node::swarm::prepare(&swarm, 1, 1)?;
//!
//! // The servers hold the job ...
//! let job = Job { workers: 1, hidden: vec![16], max_steps: Some(1000), ..Job::default() };
//! let server = ServerNode::start(ServerConfig {
//!     listen: "localhost:0".into(),
//!     swarm: swarm.clone(),
//!     node: "server-0".into(),
//!     job,
//!     ..ServerConfig::default()
//! })?;
//! // ... and a worker needs only where they are and who it is.
//! let worker = Worker::start(WorkerConfig {
//!     servers: vec![format!("localhost:{}", server.local_addr().port())],
//!     swarm: swarm.clone(),
//!     node: "worker-0".into(),
//!     device: DeviceKind::Cpu,
//! #   data: Some(data),
//!     ..WorkerConfig::default()
//! })?;
//! let mut events = worker.events(); // blocking_recv() in threads, recv().await in async code
//! worker.set_budget(Budget { duty_cycle: 0.5, max_steps_per_second: None })?;
//! while let Ok(event) = events.blocking_recv() {
//!     match event {
//!         Event::Step { step: 3, .. } => worker.pause(), // the owner came back
//!         Event::Paused { .. } => worker.resume(),        // ... and left again
//!         Event::Rejoined { .. } => worker.stop(),        // the app is closing
//!         Event::Done { .. } | Event::Error { .. } => break,
//!         _ => {}
//!     }
//! }
//! let report = worker.join()?;
//! assert!(report.stopped && report.steps >= 3);
//! # drop(server);
//! # std::fs::remove_dir_all(&swarm).ok();
//! # Ok::<(), murmur_node::NodeError>(())
//! ```
#![warn(missing_docs)]

pub mod address;
pub mod attack;
mod calibration;
mod checks;
mod control;
pub mod data;
pub mod error;
pub mod event;
pub mod files;
pub mod job;
pub mod layout;
pub mod link;
pub mod metrics;
mod node_thread;
pub mod pipeline;
pub mod platform;
pub mod process;
mod push_choice;
pub mod rendezvous;
mod round;
pub mod server;
pub mod swarm;
mod task;
pub mod worker;
mod worker_state;

pub use control::{Budget, Stopper};
pub use data::{tune_matmul, DeviceKind};
pub use error::{NodeError, Result};
pub use event::Event;
pub use job::Job;
pub use link::LinkConfig;
pub use metrics::{Metrics, MetricsFile};
pub use rendezvous::{RendezvousConfig, RendezvousHandle, RendezvousNode};
pub use server::{ServerConfig, ServerHandle, ServerNode};
pub use worker::{Worker, WorkerConfig, WorkerHandle, WorkerReport};
