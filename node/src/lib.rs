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
//!
//! A node runs on threads of its own, with its own async runtime: its handle works from
//! plain threads and from async code alike (see [`WorkerHandle::join`] for the one blocking
//! call).
//!
//! Starting a worker that joins the servers at `localhost:7400` with the certificate
//! `swarm/nodes/worker-0.pem`, pausing it while its owner is busy, and stopping it:
//!
//! ```no_run
//! use murmur_node::{Budget, Event, Worker, WorkerConfig};
//!
//! let worker = Worker::start(WorkerConfig {
//!     servers: vec!["localhost:7400".into()],
//!     swarm: "swarm".into(),
//!     node: "worker-0".into(),
//!     ..WorkerConfig::default()
//! })?;
//! let mut events = worker.events();
//! worker.set_budget(Budget { duty_cycle: 0.5, max_steps_per_second: None })?;
//! while let Ok(event) = events.blocking_recv() {
//!     match event {
//!         Event::Step { step, loss, .. } if step == 100 => {
//!             println!("step {step}: loss {loss}");
//!             worker.pause();
//!         }
//!         Event::Paused { .. } => worker.resume(),
//!         Event::Done { .. } => break,
//!         _ => {}
//!     }
//! }
//! let report = worker.join()?;
//! println!("{} rounds", report.steps);
//! # Ok::<(), murmur_node::NodeError>(())
//! ```
#![warn(missing_docs)]

pub mod address;
mod control;
pub mod data;
pub mod error;
pub mod event;
pub mod job;
pub mod link;
pub mod platform;
pub mod process;
pub mod server;
pub mod swarm;
pub mod worker;

pub use control::Budget;
pub use data::DeviceKind;
pub use error::{NodeError, Result};
pub use event::Event;
pub use job::Job;
pub use link::LinkConfig;
pub use server::{ServerConfig, ServerHandle, ServerNode};
pub use worker::{Worker, WorkerConfig, WorkerHandle, WorkerReport};
