//! A whole swarm on this machine over loopback QUIC: `servers` shards and `job.workers`
//! workers, as threads of this process ([`Launch::Threads`]) or as processes of a `murmur`
//! binary ([`Launch::Processes`]; an app that embeds murmur passes the path of a murmur
//! binary, never its own). Credentials go into the swarm folder; processes log to its
//! `logs/`. Every worker's events come out of one stream, tagged with the worker's index.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use murmur_net::identity::{Role, Swarm};

use crate::attack::Attack;
use serde::{Deserialize, Serialize};

use crate::data::DeviceKind;
use crate::error::{NodeError, Result};
use crate::event::Event;
use crate::job::Job;
use crate::link::LinkConfig;
use crate::process::{log_tail, spawn_logged, Children};
use crate::server::{ServerConfig, ServerHandle, ServerNode};
use crate::worker::{Worker, WorkerConfig, WorkerHandle};

/// A local swarm's settings.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// Parameter-server shards.
    pub servers: u16,
    /// The job (its `workers` says how many workers start).
    pub job: Job,
    /// Where the workers compute.
    pub device: DeviceKind,
    /// The datasets' folder (default: `$MURMUR_DATA`, else `./data`).
    pub data: Option<PathBuf>,
    /// The link every node states.
    pub link: LinkConfig,
    /// Seconds a round waits for a straggler before evicting it.
    pub deadline_s: f64,
    /// The swarm folder: credentials (a new authority unless one is there) and logs.
    pub dir: PathBuf,
    /// Where the first worker writes the trained model (parameters and optimizer state) at
    /// the end or on a stop; the replicas are identical, so one worker's is the swarm's.
    pub save: Option<PathBuf>,
    /// Also write `save` every this many rounds.
    pub save_every: Option<u64>,
    /// Shards and workers save their state every round (in the folder's `state/`), what
    /// [`LocalSwarm::restart_server`] needs and what lets [`LocalSwarm::respawn_worker`]
    /// keep a worker's error-feedback memory. It costs time each round
    /// (docs/benchmarks.md), so a swarm whose nodes are never started again goes without.
    /// Processes only.
    pub durable: bool,
    /// Every worker computes as a device that takes this many seconds a sample
    /// ([`WorkerConfig::emulated_seconds_per_sample`]); `None`: as fast as each goes.
    pub emulated_seconds_per_sample: Option<f64>,
    /// Makes the first worker's emulated device this many times slower than the others' (at
    /// least 1): one slow device in the swarm. Needs `emulated_seconds_per_sample`.
    pub slow_worker: Option<f64>,
    /// Makes the last worker an attacker ([`WorkerConfig::attack`]): what `murmur repro
    /// attack` measures the aggregation rules against. Threads only.
    pub attacker: Option<Attack>,
}

impl SwarmConfig {
    /// A swarm of `servers` shards serving `job`, its credentials and logs in `dir`, with the
    /// defaults of everything else: devices chosen by each worker, the datasets where
    /// `$MURMUR_DATA` says, the default link, a 30 s round deadline, nothing saved, no
    /// emulated devices, no attacker.
    pub fn new(servers: u16, job: Job, dir: PathBuf) -> SwarmConfig {
        SwarmConfig {
            servers,
            job,
            device: DeviceKind::Auto,
            data: None,
            link: LinkConfig::default(),
            deadline_s: 30.0,
            dir,
            save: None,
            save_every: None,
            durable: false,
            emulated_seconds_per_sample: None,
            slow_worker: None,
            attacker: None,
        }
    }

    /// Seconds a sample of worker `index`'s emulated device, if the devices are emulated.
    fn emulated_pace(&self, index: usize) -> Option<f64> {
        let slower = self.slow_worker.filter(|_| index == 0).unwrap_or(1.0);
        self.emulated_seconds_per_sample.map(|pace| pace * slower)
    }
}

/// How the nodes run.
#[derive(Debug, Clone)]
pub enum Launch {
    /// Threads of this process.
    Threads,
    /// Processes of this `murmur` binary. Start the swarm from a thread that outlives it: on
    /// Linux the children stop when the thread that started them ends.
    Processes {
        /// The binary's path.
        exe: PathBuf,
    },
}

/// A server's first line on stdout when it runs as a process: where it listens.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Listening {
    /// Always "listening".
    pub event: String,
    /// The shard's index.
    pub shard: u16,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its key's fingerprint.
    pub fingerprint: String,
}

/// What the swarm's stream carries.
#[derive(Debug, Clone)]
pub enum SwarmEvent {
    /// Worker `index` (the order it was started in; its rank is in its events) said something.
    Worker {
        /// The worker's index.
        index: usize,
        /// What it said.
        event: Event,
    },
    /// Worker `index` ended; `error` says why if it failed.
    Ended {
        /// The worker's index.
        index: usize,
        /// Its failure, with the end of its log for a process.
        error: Option<String>,
    },
}

enum Nodes {
    // Fields drop in order: the workers (stopped and joined) before the servers they talk to.
    Threads {
        workers: Vec<WorkerHandle>,
        servers: Vec<ServerHandle>,
    },
    Processes(Processes),
}

/// The nodes as processes, with what starts each again.
struct Processes {
    children: Children,
    exe: PathBuf,
    logs: PathBuf,
    /// Each shard's arguments but `--listen`, and the address it listens on.
    servers: Vec<(Vec<String>, SocketAddr)>,
    /// Each worker's arguments.
    workers: Vec<Vec<String>>,
    /// Whether the nodes save their state (see [`SwarmConfig::durable`]).
    durable: bool,
    tx: mpsc::Sender<SwarmEvent>,
}

/// A running local swarm.
pub struct LocalSwarm {
    nodes: Nodes,
    events: mpsc::Receiver<SwarmEvent>,
    logs: PathBuf,
}

/// How long the certificates of a local swarm are valid: longer than any run.
pub const LOCAL_DAYS: u32 = 30;

/// Writes credentials for every node of a local swarm into `dir`: a fresh authority unless
/// `dir` holds one (a folder the user named and made a swarm in).
pub fn prepare(dir: &Path, servers: u16, workers: u16) -> Result<()> {
    let swarm = if dir.join("ca.key").exists() {
        Swarm::load(dir)?
    } else {
        let swarm = Swarm::generate("local")?;
        swarm.save(dir)?;
        swarm
    };
    for s in 0..servers {
        swarm.issue_to(
            dir,
            &format!("server-{s}"),
            Role::Server { shard: s },
            LOCAL_DAYS,
        )?;
    }
    for r in 0..workers {
        swarm.issue_to(dir, &format!("worker-{r}"), Role::Worker, LOCAL_DAYS)?;
    }
    std::fs::create_dir_all(dir.join("logs"))
        .map_err(|e| NodeError::io(format!("creating {}/logs", dir.display()), e))?;
    Ok(())
}

impl LocalSwarm {
    /// Writes the credentials, starts the shards, waits until they listen, then starts the
    /// workers.
    pub fn start(config: SwarmConfig, launch: Launch) -> Result<LocalSwarm> {
        if config.servers == 0 {
            return Err(NodeError::Config("a swarm needs at least 1 server".into()));
        }
        config.job.validate()?;
        match (config.slow_worker, config.emulated_seconds_per_sample) {
            (Some(factor), _) if !(factor >= 1.0 && factor.is_finite()) => {
                return Err(NodeError::Config(format!(
                    "slow_worker is a factor of at least 1, not {factor}"
                )))
            }
            (Some(_), None) => {
                return Err(NodeError::Config(
                    "slow_worker needs emulated_seconds_per_sample: the slow device is \
                     emulated beside emulated others"
                        .into(),
                ))
            }
            _ => {}
        }
        if config.attacker.is_some() && !matches!(launch, Launch::Threads) {
            return Err(NodeError::Config(
                "an attacking worker runs as a thread (Launch::Threads)".into(),
            ));
        }
        prepare(&config.dir, config.servers, config.job.workers)?;
        let logs = config.dir.join("logs");
        let (tx, events) = mpsc::channel();
        let nodes = match launch {
            Launch::Threads => start_threads(&config, tx)?,
            Launch::Processes { exe } => start_processes(&config, &exe, tx)?,
        };
        Ok(LocalSwarm {
            nodes,
            events,
            logs,
        })
    }

    /// The next event, or `None` once every worker has ended or `timeout` passed.
    pub fn next_event(&self, timeout: Duration) -> Option<SwarmEvent> {
        self.events.recv_timeout(timeout).ok()
    }

    /// Worker `index`'s handle, when the nodes are threads.
    pub fn worker(&self, index: usize) -> Option<&WorkerHandle> {
        match &self.nodes {
            Nodes::Threads { workers, .. } => workers.get(index),
            Nodes::Processes(_) => None,
        }
    }

    /// Where process logs go.
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    fn processes(&mut self, what: &str) -> Result<&mut Processes> {
        match &mut self.nodes {
            Nodes::Processes(p) => Ok(p),
            Nodes::Threads { .. } => Err(NodeError::Config(format!(
                "{what} needs nodes that are processes (Launch::Processes)"
            ))),
        }
    }

    /// Kills worker `index` with SIGKILL, as a crash would, and forgets it: [`LocalSwarm::finish`]
    /// no longer waits for it. Its [`SwarmEvent::Ended`] follows. Processes only; also how a
    /// launcher lets go of a worker that exited early.
    pub fn kill_worker(&mut self, index: usize) -> Result<()> {
        let p = self.processes("killing a worker")?;
        p.children.kill(&format!("worker {index}"));
        Ok(())
    }

    /// Starts worker `index` again, with its certificate and flags: the servers give it its
    /// rank back, and it catches up from the newest snapshot. Call it from the thread that
    /// started the swarm (on Linux a child dies with the thread that started it). Processes
    /// only.
    pub fn respawn_worker(&mut self, index: usize) -> Result<()> {
        let p = self.processes("respawning a worker")?;
        if index >= p.workers.len() {
            return Err(NodeError::Config(format!(
                "no worker {index} in a swarm of {}",
                p.workers.len()
            )));
        }
        p.children.kill(&format!("worker {index}"));
        p.spawn_worker(index, true)
    }

    /// The shards whose processes have ended, with how (each said once: the shard is
    /// forgotten until [`LocalSwarm::restart_server`] starts it again). Threads: none.
    pub fn ended_servers(&mut self) -> Vec<(u16, String)> {
        let Nodes::Processes(p) = &mut self.nodes else {
            return Vec::new();
        };
        let mut ended = Vec::new();
        for shard in 0..p.servers.len() as u16 {
            let name = format!("server {shard}");
            if let Some(status) = p.children.exited(&name) {
                p.children.kill(&name);
                let log = p.logs.join(format!("server-{shard}.log"));
                ended.push((
                    shard,
                    format!("{status}; the end of its log:\n{}", log_tail(&log)),
                ));
            }
        }
        ended
    }

    /// Kills server shard `shard` with SIGKILL, as a crash would. Processes only.
    pub fn kill_server(&mut self, shard: u16) -> Result<()> {
        let p = self.processes("killing a server")?;
        p.children.kill(&format!("server {shard}"));
        Ok(())
    }

    /// Starts shard `shard` again on its address, from its state folder: it goes on from the
    /// last round it saved, and the workers reconnect on their own. Processes of a durable
    /// swarm only; call it from the thread that started the swarm.
    pub fn restart_server(&mut self, shard: u16) -> Result<()> {
        let p = self.processes("restarting a server")?;
        if !p.durable {
            return Err(NodeError::Config(
                "restarting a server needs a durable swarm (SwarmConfig::durable): without \
                 its state a shard starts from nothing and the workers cannot catch up"
                    .into(),
            ));
        }
        p.children.kill(&format!("server {shard}"));
        let addr = p.servers.get(shard as usize).map(|s| s.1).ok_or_else(|| {
            NodeError::Config(format!(
                "no shard {shard} in a swarm of {}",
                p.servers.len()
            ))
        })?;
        p.spawn_server(shard, &addr.to_string(), true)?;
        Ok(())
    }

    /// Stops the swarm early and gracefully: every worker finishes its round (and writes
    /// its checkpoint, if it has one), then the servers stop. Nodes still running `grace`
    /// after being asked are killed; returns how many were.
    pub fn stop(self, grace: Duration) -> usize {
        match self.nodes {
            Nodes::Threads { workers, servers } => {
                for w in &workers {
                    w.stop();
                }
                // Threads cannot be killed: a worker's stop takes effect after its round.
                for w in workers {
                    let _ = w.join();
                }
                drop(servers);
                0
            }
            Nodes::Processes(mut p) => {
                p.children.terminate("worker", grace) + p.children.terminate("server", grace)
            }
        }
    }

    /// Waits for every worker to end, then stops the servers. The first worker failure is
    /// the error.
    pub fn finish(self) -> Result<()> {
        match self.nodes {
            Nodes::Threads { workers, servers } => {
                let mut first = Ok(());
                for w in workers {
                    if let Err(e) = w.join() {
                        first = first.and(Err(e));
                    }
                }
                drop(servers);
                first
            }
            Nodes::Processes(mut p) => p.children.wait_for("worker"),
        }
    }
}

fn start_threads(config: &SwarmConfig, tx: mpsc::Sender<SwarmEvent>) -> Result<Nodes> {
    let mut servers = Vec::new();
    for shard in 0..config.servers {
        servers.push(ServerNode::start(ServerConfig {
            listen: "127.0.0.1:0".into(),
            swarm: config.dir.clone(),
            node: format!("server-{shard}"),
            shard,
            shards: config.servers,
            deadline_s: config.deadline_s,
            link: config.link,
            job: config.job.clone(),
            ..ServerConfig::default()
        })?);
    }
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let mut workers = Vec::new();
    let mut forwarding = Vec::new();
    for index in 0..config.job.workers as usize {
        let attack = config
            .attacker
            .filter(|_| index + 1 == usize::from(config.job.workers));
        if attack.is_some() {
            // Ranks go to workers in the order they reach shard 0: the attacker starts once
            // every honest worker holds its rank, so that it always takes the last one and
            // an arm's bits do not depend on which thread was faster.
            for forward in forwarding.drain(..) {
                forward_until_assigned(forward, &tx);
            }
        }
        let worker = Worker::start(WorkerConfig {
            servers: addrs.clone(),
            swarm: config.dir.clone(),
            node: format!("worker-{index}"),
            device: config.device,
            data: config.data.clone(),
            link: config.link,
            save: config.save.clone().filter(|_| index == 0),
            save_every: config.save_every,
            emulated_seconds_per_sample: config.emulated_pace(index),
            attack,
            // An evicted attacker stops at once instead of knocking again.
            rejoin_attempts: if attack.is_some() {
                0
            } else {
                WorkerConfig::default().rejoin_attempts
            },
            ..WorkerConfig::default()
        })?;
        forwarding.push(Forward {
            index,
            events: worker.events(),
            error: None,
        });
        workers.push(worker);
    }
    for forward in forwarding {
        let tx = tx.clone();
        std::thread::spawn(move || forward.rest(&tx));
    }
    Ok(Nodes::Threads { workers, servers })
}

/// A worker's events on their way to the swarm's stream.
struct Forward {
    index: usize,
    events: tokio::sync::broadcast::Receiver<Event>,
    /// The worker's error, once it said one.
    error: Option<String>,
}

/// What the event [`Forward::one`] passed on said.
#[derive(PartialEq)]
enum Passed {
    Assigned,
    Other,
    /// The worker is done, failed or gone: nothing more will come.
    End,
}

impl Forward {
    /// Passes on the worker's next event.
    fn one(&mut self, tx: &mpsc::Sender<SwarmEvent>) -> Passed {
        let event = loop {
            match self.events.blocking_recv() {
                Ok(event) => break event,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return Passed::End,
            }
        };
        if let Event::Error { message, .. } = &event {
            self.error = Some(message.clone());
        }
        let passed = match event {
            Event::Done { .. } | Event::Error { .. } => Passed::End,
            Event::Assigned { .. } => Passed::Assigned,
            _ => Passed::Other,
        };
        let _ = tx.send(SwarmEvent::Worker {
            index: self.index,
            event,
        });
        passed
    }

    /// Passes on every event to the worker's end, then says it ended.
    fn rest(mut self, tx: &mpsc::Sender<SwarmEvent>) {
        while self.one(tx) != Passed::End {}
        self.ended(tx);
    }

    fn ended(self, tx: &mpsc::Sender<SwarmEvent>) {
        let _ = tx.send(SwarmEvent::Ended {
            index: self.index,
            error: self.error,
        });
    }
}

/// Passes on `forward`'s events until its worker holds a rank (or has ended), and the rest
/// from a thread of its own.
fn forward_until_assigned(mut forward: Forward, tx: &mpsc::Sender<SwarmEvent>) {
    loop {
        match forward.one(tx) {
            Passed::Assigned => break,
            Passed::Other => {}
            Passed::End => return forward.ended(tx),
        }
    }
    let tx = tx.clone();
    std::thread::spawn(move || forward.rest(&tx));
}

fn start_processes(
    config: &SwarmConfig,
    exe: &Path,
    tx: mpsc::Sender<SwarmEvent>,
) -> Result<Nodes> {
    let dir = &config.dir;
    let job_file = dir.join("job.toml");
    std::fs::write(&job_file, config.job.to_toml())
        .map_err(|e| NodeError::io(format!("writing {}", job_file.display()), e))?;
    // Shards and workers keep their state here, so that one killed mid-run starts again
    // where it was; a new run starts from nothing.
    let states = dir.join("state");
    if states.exists() {
        std::fs::remove_dir_all(&states)
            .map_err(|e| NodeError::io(format!("clearing {}", states.display()), e))?;
    }
    if config.durable {
        std::fs::create_dir_all(&states)
            .map_err(|e| NodeError::io(format!("creating {}", states.display()), e))?;
    }
    let mut p = Processes {
        children: Children(Vec::new()),
        exe: exe.to_path_buf(),
        logs: dir.join("logs"),
        servers: Vec::new(),
        workers: Vec::new(),
        durable: config.durable,
        tx,
    };
    for shard in 0..config.servers {
        let mut args: Vec<String> = vec![
            "server".into(),
            format!("--swarm={}", dir.display()),
            format!("--node=server-{shard}"),
            format!("--shard={shard}"),
            format!("--shards={}", config.servers),
            format!("--deadline={}", config.deadline_s),
            format!("--config={}", job_file.display()),
        ];
        if config.durable {
            let state = states.join(format!("shard-{shard}"));
            args.push(format!("--state={}", state.display()));
        }
        args.extend(config.link.to_args());
        p.servers
            .push((args, SocketAddr::from(([127, 0, 0, 1], 0))));
        let addr = p.spawn_server(shard, "127.0.0.1:0", false)?;
        p.servers[shard as usize].1 = addr;
    }
    let addrs: Vec<String> = p.servers.iter().map(|s| s.1.to_string()).collect();
    for index in 0..config.job.workers as usize {
        let mut args: Vec<String> = vec![
            "worker".into(),
            format!("--connect={}", addrs.join(",")),
            format!("--swarm={}", dir.display()),
            format!("--node=worker-{index}"),
            format!("--device={}", config.device.name()),
            "--json".into(),
        ];
        if let Some(d) = &config.data {
            args.push(format!("--data={}", d.display()));
        }
        if let (Some(path), 0) = (&config.save, index) {
            args.push(format!("--save={}", path.display()));
            args.extend(config.save_every.map(|n| format!("--save-every={n}")));
        }
        if let Some(pace) = config.emulated_pace(index) {
            args.push(format!("--emulate-device-ms={}", pace * 1e3));
        }
        // A worker started again after dying takes its own state back.
        if config.durable {
            let state = states.join(format!("worker-{index}"));
            args.push(format!("--state={}", state.display()));
        }
        args.extend(config.link.to_args());
        p.workers.push(args);
        p.spawn_worker(index, false)?;
    }
    Ok(Nodes::Processes(p))
}

impl Processes {
    /// Starts shard `shard` listening on `listen` (`again`: after it died); returns the
    /// address it listens on, read from its first line.
    fn spawn_server(&mut self, shard: u16, listen: &str, again: bool) -> Result<SocketAddr> {
        let mut args = self.servers[shard as usize].0.clone();
        args.push(format!("--listen={listen}"));
        let log = self.logs.join(format!("server-{shard}.log"));
        let mut child = spawn_logged(&self.exe, &args, &log, again)?;
        let stdout = child.stdout.take().expect("piped");
        self.children.0.push((format!("server {shard}"), child));
        let (line_tx, line_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = line_tx.send(line);
        });
        let line = line_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_default();
        let listening: Listening = serde_json::from_str(line.trim()).map_err(|_| {
            NodeError::Thread(format!(
                "server {shard} did not start within 30 s; the end of its log:\n{}",
                log_tail(&log)
            ))
        })?;
        Ok(listening.addr)
    }

    /// Starts worker `index` (`again`: after it died), whose events go to the swarm's stream
    /// until it ends.
    fn spawn_worker(&mut self, index: usize, again: bool) -> Result<()> {
        let log = self.logs.join(format!("worker-{index}.log"));
        let mut child = spawn_logged(&self.exe, &self.workers[index], &log, again)?;
        let stdout = child.stdout.take().expect("piped");
        self.children.0.push((format!("worker {index}"), child));
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            let mut done = false;
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if let Ok(event) = serde_json::from_str::<Event>(&line) {
                    done |= matches!(event, Event::Done { .. });
                    let _ = tx.send(SwarmEvent::Worker { index, event });
                }
            }
            let error = (!done).then(|| {
                format!(
                    "worker {index} exited before finishing; the end of its log:\n{}",
                    log_tail(&log)
                )
            });
            let _ = tx.send(SwarmEvent::Ended { index, error });
        });
        Ok(())
    }
}
