//! A worker: one rank of a data-parallel job through parameter-server shards over QUIC, as a
//! library node. [`Worker::start`] takes a [`WorkerConfig`] (only node-local settings: the job
//! comes from the servers), runs the worker on a thread of its own and returns a
//! [`WorkerHandle`] to pause, resume, budget and stop it and to subscribe to its [`Event`]s.
//!
//! The rank trains on its slice of each global batch and applies the servers' replies, so all
//! replicas stay bit-identical. A pause finishes the current round, leaves the rounds (the
//! servers drop the rank at once, and the others go on without it), and on resume the worker
//! reconnects, replays the rounds it missed from the servers' log — keeping its error-feedback
//! memory and optimizer state — and takes part again. A lost link is handled the same way,
//! with back-off.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use murmur_engine::train::{
    Classifier, CodeStats, DataParallel, LanguageModel, Learner, RoundBytes, RoundTiming,
    MAX_EMULATED_SECONDS_PER_SAMPLE,
};
use murmur_engine::Device;
use murmur_net::identity::Credentials;
use murmur_net::ps::{catch_up, join_job, ClientOptions, QuicCollective};
use murmur_net::ticket::Ticket;

use crate::attack::Attack;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::address::resolve_all;
use crate::calibration::calibrate_loco;
use crate::checks::{load_credentials, positive_seconds};
use crate::control::{Budget, Control, Next, Stopper};
use crate::data::{load_sets, DeviceKind};
use crate::error::{NodeError, Result};
use crate::event::{Event, Events};
use crate::files::write_atomically;
use crate::job::Job;
use crate::link::LinkConfig;
use crate::round::{play_round, RoundFailure};
use crate::task::{ImageTask, Measure, Task, TextTask};
use crate::worker_state;

/// A worker's own settings: who it is, where the servers are, and what it lends. Everything
/// about the training itself is the job's, which the servers send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// The server shards as `host:port`, in shard order (shard 0 first).
    pub servers: Vec<String>,
    /// The swarm folder holding `ca.pem` and this node's certificate.
    pub swarm: PathBuf,
    /// This node's name in the swarm folder (`nodes/NAME.pem`).
    pub node: String,
    /// Where it computes.
    pub device: DeviceKind,
    /// The folder holding the datasets (default: `$MURMUR_DATA`, else `./data`).
    pub data: Option<PathBuf>,
    /// Its link to the servers.
    pub link: LinkConfig,
    /// The codec of its own pushes: one the job allows (its `codec`, or one of its
    /// `push_codecs`), e.g. a harder top-k for a slow link; or `auto`, which measures the
    /// path to the shards and takes the least compressed that moves a round's pushes in the
    /// job's `push_budget_ms`. `None`: the job's `codec`.
    pub push_codec: Option<String>,
    /// How much of the machine it may take (changeable with [`WorkerHandle::set_budget`]).
    pub budget: Budget,
    /// Reconnections tried after losing the servers before the worker gives up, with
    /// back-off from 1 s doubling to 30 s.
    pub rejoin_attempts: u32,
    /// How long to keep trying to reach the servers at the start, in seconds.
    pub join_timeout_s: f64,
    /// Where to write the model and optimizer state (a checkpoint `murmur train --resume`
    /// and `murmur eval` read) when the worker stops or finishes, and every `save_every`
    /// rounds.
    pub save: Option<PathBuf>,
    /// Also write `save` every this many rounds (at rounds that are multiples of it).
    pub save_every: Option<u64>,
    /// A file where the worker keeps its own state after every round (parameters, optimizer
    /// state, error-feedback memories). Started again with the same file and certificate
    /// after dying, it takes them back and catches up from there, losing nothing the servers
    /// still log; a state of another job or rank is refused.
    pub state: Option<PathBuf>,
    /// Also print every event as a JSON line on stdout (what a process launcher reads).
    pub json_events: bool,
    /// Computes as a device that takes this many seconds a sample would (the thread asleep
    /// for what the real compute leaves; [`DataParallel::emulate_device`]): for benchmarks and
    /// tests of swarms of uneven devices on one machine. `None` (the default): as fast as
    /// the device goes.
    pub emulated_seconds_per_sample: Option<f64>,
    /// Makes this worker an attacker (`murmur repro attack`): what it does to its pushes or
    /// its learning rate. `None` for every honest worker; never written to a config file nor
    /// passed to a worker process (attacks run in process, in benchmarks).
    #[serde(skip)]
    pub attack: Option<Attack>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            servers: Vec::new(),
            swarm: PathBuf::from("swarm"),
            node: String::new(),
            device: DeviceKind::Auto,
            data: None,
            link: LinkConfig::default(),
            push_codec: None,
            budget: Budget::default(),
            rejoin_attempts: 5,
            join_timeout_s: 120.0,
            save: None,
            save_every: None,
            state: None,
            json_events: false,
            emulated_seconds_per_sample: None,
            attack: None,
        }
    }
}

/// What a worker did, when it ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The rank the servers gave it.
    pub rank: u16,
    /// Rounds its replica went through.
    pub steps: u64,
    /// The last test accuracy it measured (the ranks evaluate epochs in turn, and every
    /// worker the last round); image models.
    pub final_accuracy: Option<f64>,
    /// The last validation loss it measured, in nats per byte (the ranks in turn, and every
    /// worker the last round); the language model.
    #[serde(default)]
    pub final_valid_loss: Option<f64>,
    /// Bytes pushed in all.
    pub bytes_pushed: u64,
    /// Bytes pulled in all.
    pub bytes_pulled: u64,
    /// The same rounds' traffic each way in f32.
    pub f32_bytes_each_way: u64,
    /// Whether a stop ended it rather than the job's end.
    pub stopped: bool,
    /// The job it ran.
    pub job: Job,
}

/// Starts workers.
pub struct Worker;

impl Worker {
    /// Checks the config, resolves the servers' addresses, loads the credentials and starts
    /// the worker on a thread of its own. Returns at once; the worker then fetches the job,
    /// joins and trains, reporting through events.
    ///
    /// Works from any thread, inside an async runtime too: the worker's own runtime lives on
    /// its thread, never nested in the caller's.
    pub fn start(config: WorkerConfig) -> Result<WorkerHandle> {
        config.budget.validate()?;
        config.link.validate()?;
        positive_seconds("join_timeout_s", config.join_timeout_s)?;
        if let Some(pace) = config.emulated_seconds_per_sample {
            if !(pace > 0.0 && pace <= MAX_EMULATED_SECONDS_PER_SAMPLE) {
                return Err(NodeError::Config(format!(
                    "emulated_seconds_per_sample is above 0 and at most \
                     {MAX_EMULATED_SECONDS_PER_SAMPLE}, not {pace}"
                )));
            }
        }
        if config.save_every == Some(0) {
            return Err(NodeError::Config("save_every must be at least 1".into()));
        }
        let servers = resolve_all(&config.servers)
            .map_err(|e| NodeError::Address(format!("of the servers: {e}")))?;
        let creds = load_credentials(&config.swarm, &config.node)?;
        let control = Arc::new(Control::new(config.budget));
        let (events, first) = Events::new(config.json_events);
        let device = Arc::new(OnceLock::new());
        let run = Run {
            config,
            servers,
            creds,
            control: control.clone(),
            events: events.clone(),
            device: device.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("murmur-worker".into())
            .spawn(move || run.run())
            .map_err(|e| NodeError::io("starting the worker thread", e))?;
        Ok(WorkerHandle {
            control,
            events,
            first: Mutex::new(Some(first)),
            device,
            thread: Some(thread),
        })
    }
}

/// A running worker. Every method but [`WorkerHandle::join`] returns at once and may be
/// called from any thread or async task. Dropping the handle stops the worker and waits for
/// it.
pub struct WorkerHandle {
    control: Arc<Control>,
    events: Events,
    first: Mutex<Option<broadcast::Receiver<Event>>>,
    device: Arc<OnceLock<Device>>,
    thread: Option<JoinHandle<Result<WorkerReport>>>,
}

impl WorkerHandle {
    /// The worker's events. The first call gets every event since the start; later calls
    /// get those from then on. Read with `blocking_recv` from threads, `recv().await` from
    /// async code.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.first
            .lock()
            .expect("events lock")
            .take()
            .unwrap_or_else(|| self.events.subscribe())
    }

    /// Finishes the current round, leaves the rounds (without stalling the others) and
    /// waits; [`Event::Paused`] says when it took effect. No GPU work is issued while paused.
    pub fn pause(&self) {
        self.control.pause();
    }

    /// Rejoins the rounds after a pause: catches up on the rounds missed and trains on.
    pub fn resume(&self) {
        self.control.resume();
    }

    /// Whether a pause has been asked for (and not undone by a resume).
    pub fn is_paused(&self) -> bool {
        self.control.is_paused()
    }

    /// Ends the worker gracefully after the current round: writes the checkpoint, if one is
    /// configured, and says goodbye to the servers. [`WorkerHandle::join`] returns then.
    pub fn stop(&self) {
        self.control.stop();
    }

    /// A [`Stopper`] for this worker, to stop it from where the handle cannot go (a signal
    /// handler, another thread that does not own the handle).
    pub fn stopper(&self) -> Stopper {
        let control = self.control.clone();
        Stopper::new(move || control.stop())
    }

    /// Changes the GPU budget, effective from the next round.
    pub fn set_budget(&self, budget: Budget) -> Result<()> {
        budget.validate()?;
        self.control.set_budget(budget);
        Ok(())
    }

    /// The budget in force.
    pub fn budget(&self) -> Budget {
        self.control.budget()
    }

    /// The device the worker computes on, once it has opened it.
    pub fn device(&self) -> Option<Device> {
        self.device.get().cloned()
    }

    /// Whether the worker's thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the worker to end and returns what it did. Blocks: from async code, call it
    /// through `tokio::task::spawn_blocking`, or wait for [`Event::Done`] first.
    pub fn join(mut self) -> Result<WorkerReport> {
        self.join_thread()
    }

    fn join_thread(&mut self) -> Result<WorkerReport> {
        let Some(thread) = self.thread.take() else {
            return Err(NodeError::Thread("already joined".into()));
        };
        thread
            .join()
            .map_err(|p| NodeError::Thread(panic_message(&p)))?
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.control.stop();
            let _ = self.join_thread();
        }
    }
}

pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Everything the worker's thread holds.
struct Run {
    config: WorkerConfig,
    servers: Vec<SocketAddr>,
    creds: Credentials,
    control: Arc<Control>,
    events: Events,
    device: Arc<OnceLock<Device>>,
}

/// Running totals of one worker.
#[derive(Default)]
struct Totals {
    pushed: u64,
    pulled: u64,
    f32_each_way: u64,
    samples: usize,
}

/// What one round did, as [`Event::Step`] reports it.
struct Round {
    step: u64,
    /// From 1.
    epoch: u32,
    /// The samples of this worker's share.
    samples: usize,
    loss: f32,
    bytes: RoundBytes,
    codes: CodeStats,
    timing: RoundTiming,
    seconds: f64,
    lr: f32,
    late: bool,
}

/// The job once joined, and the rank the servers gave this worker.
struct Joined {
    job: Job,
    rank: u16,
    world: u16,
    /// Shard 0's signature on the rank, which every other shard asks for.
    ticket: Ticket,
}

/// What the rounds ended with.
struct Ending {
    totals: Totals,
    measured: Option<Measure>,
    stopped: bool,
}

impl Run {
    fn run(self) -> Result<WorkerReport> {
        // A panic must still end the event stream with an error, or subscribers wait forever.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.train()))
            .unwrap_or_else(|p| Err(NodeError::Thread(panic_message(&p))));
        if let Err(e) = &outcome {
            self.events.emit(Event::Error {
                rank: None,
                message: e.to_string(),
            });
        }
        outcome
    }

    fn client_options(&self) -> ClientOptions {
        ClientOptions {
            link: self.config.link.link(),
            replica_digests: true,
            ..ClientOptions::default()
        }
    }

    fn wait(&self, what: String) {
        self.events.emit(Event::Waiting { what });
    }

    /// Asks shard 0 for the job and a rank, trying again every few seconds until the join
    /// time-out: servers may come up after their workers.
    fn fetch_job(&self) -> Result<(Job, u16, u16, Ticket)> {
        let timeout = Duration::from_secs_f64(self.config.join_timeout_s);
        let deadline = Instant::now() + timeout;
        let shard0 = self.servers[0];
        self.wait(format!(
            "the job from shard 0 at {shard0} (giving up after {timeout:?})"
        ));
        let mut options = self.client_options();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            options.connect_timeout =
                left.clamp(Duration::from_millis(100), Duration::from_secs(10));
            match join_job(shard0, &self.creds, &self.config.node, &options) {
                Ok(welcome) => {
                    let job = Job::from_wire(&welcome.job)?;
                    if job.workers != welcome.world {
                        return Err(NodeError::Job(format!(
                            "the servers say {} workers but their job says {}",
                            welcome.world, job.workers
                        )));
                    }
                    return Ok((job, welcome.rank, welcome.world, welcome.ticket));
                }
                // The server answered and refused: trying again would not help.
                Err(e @ murmur_net::NetError::Protocol(_)) => return Err(e.into()),
                Err(e) if Instant::now() + Duration::from_secs(2) >= deadline => {
                    return Err(NodeError::Net(murmur_net::NetError::Timeout(format!(
                        "no job from {shard0} within {timeout:?} (last: {e})"
                    ))))
                }
                Err(e) => {
                    self.wait(format!("shard 0 at {shard0} ({e}); trying again in 2 s"));
                    if self.control.sleep(Duration::from_secs(2)) == Next::Stop {
                        return Err(NodeError::Stopped);
                    }
                }
            }
        }
    }

    /// How this worker cuts and compresses the model: the job's plan, with its own push
    /// codec where it chose one of those the job allows.
    fn partition_plan(
        &self,
        job: &Job,
        sizes: &[usize],
        collective: &mut QuicCollective,
    ) -> Result<murmur_engine::comm::partition::PartitionPlan> {
        let mut plan = job.partition_plan();
        if self.config.push_codec.as_deref() == Some("auto") {
            let shards = self.servers.len();
            let probe = crate::push_choice::probe_size(job, sizes, shards)?;
            // The first probe opens the congestion window, as the rounds before will have
            // by the time pushes go; the second measures the path.
            collective.probe(probe)?;
            let samples = collective.probe(probe)?;
            let (codec, seconds) = crate::push_choice::choose(job, sizes, &samples)?;
            let rates: Vec<String> = samples
                .iter()
                .map(|s| format!("{:.1} Mbit/s at {:.0} ms", s.rate() * 8e-6, s.rtt * 1e3))
                .collect();
            tracing::info!(
                "measured the path to the shards ({}): pushing {codec}, about {:.0} ms a round",
                rates.join(", "),
                seconds * 1e3
            );
            plan.push = codec;
            return Ok(plan);
        }
        if let Some(codec) = &self.config.push_codec {
            let allowed = job.allowed_push_codecs();
            if !allowed.contains(&codec.as_str()) {
                return Err(NodeError::Config(format!(
                    "push codec {codec:?}: the job allows {} (its codec and push_codecs), or \
                     auto",
                    allowed.join(", ")
                )));
            }
            plan.push = codec.clone();
        }
        Ok(plan)
    }

    fn connect(&self, joined: &Joined) -> Result<QuicCollective> {
        Ok(QuicCollective::connect(
            &self.servers,
            &self.creds,
            joined.rank,
            joined.world,
            &self.config.node,
            ClientOptions {
                ticket: Some(joined.ticket.clone()),
                ..self.client_options()
            },
        )?)
    }

    fn train(&self) -> Result<WorkerReport> {
        let (job, rank, world, ticket) = self.fetch_job()?;
        self.events.emit(Event::Assigned { rank, world });
        let data = self.config.data.as_deref();
        if job.is_gpt() {
            let task = TextTask::load(&job, world, data)?;
            let device = self.open_device()?;
            let lm = LanguageModel::new(&device, &job.lm_config())?;
            let joined = Joined {
                job,
                rank,
                world,
                ticket,
            };
            return self.train_with(joined, task, lm);
        }
        let sets = load_sets(&job.dataset, data, job.train_limit)?;
        let (_, total_steps) = job.steps(sets.train.len());
        let job = calibrate_loco(job, &sets, world as usize, total_steps)?;
        let device = self.open_device()?;
        if let Some(gpu) = device.as_gpu() {
            let limits = &gpu.info().limits;
            job.check_fits(
                sets.train.features(),
                sets.train.classes,
                limits
                    .max_storage_buffer_binding_size
                    .min(limits.max_buffer_size),
            )?;
        }
        let mut config = job.classifier_config(total_steps)?;
        if let Some(attack) = &self.config.attack {
            attack.configure(&mut config);
        }
        let mut clf = Classifier::new(&device, sets.train.features(), sets.train.classes, &config)?;
        // What `murmur eval` reads from a saved model: the data it was trained on. Every
        // worker writes the same, so snapshots from any rank load on any other.
        clf.data = serde_json::json!({
            "dataset": job.dataset,
            "train_samples": sets.train.len(),
            "batch": job.batch * world as usize,
            "epochs": job.epochs,
        });
        let task = ImageTask::new(job.clone(), sets)?;
        let joined = Joined {
            job,
            rank,
            world,
            ticket,
        };
        self.train_with(joined, task, clf)
    }

    /// Opens the worker's device, and keeps it for [`WorkerHandle::device`].
    fn open_device(&self) -> Result<Device> {
        let device = self.config.device.open()?;
        let _ = self.device.set(device.clone());
        Ok(device)
    }

    /// Joins the rounds with `replica` and trains it through `task` to the job's end or a
    /// stop: the model-independent half of a worker.
    fn train_with<T: Task>(
        &self,
        joined: Joined,
        mut task: T,
        replica: T::Model,
    ) -> Result<WorkerReport> {
        let (job, rank, world) = (&joined.job, joined.rank, joined.world);
        // A shard may be restarting: keep trying, as after losing the swarm.
        let collective = self.with_backoff(|| self.connect(&joined))?;
        let starters = job.start_with.unwrap_or(job.workers);
        self.wait(format!(
            "{starters} of the {world} workers to register, if the job has not started (this one is rank {rank}; giving up after {:?})",
            self.client_options().start_timeout
        ));
        let parameters = replica.parameters().iter().map(|p| p.numel()).sum();
        let sizes: Vec<usize> = replica.parameters().iter().map(|p| p.numel()).collect();
        let mut collective = collective;
        let plan = self.partition_plan(job, &sizes, &mut collective)?;
        let mut dp = DataParallel::new(replica, collective, &plan, &job.memory)?;
        if let Some(outer) = job.outer_config() {
            dp.take_local_steps(outer)?;
        }
        dp.emulate_device(self.config.emulated_seconds_per_sample);
        if let Some(attack) = self.config.attack {
            tracing::warn!("rank {rank} attacks the swarm: {attack}");
            dp.tamper_with(attack.tamper(job.seed ^ u64::from(rank)));
        }
        // A job already under way may hold this worker's earlier life: take its state back.
        let job_text = job.to_wire();
        let resumed_from = match &self.config.state {
            Some(path) if dp.collective.underway() => {
                worker_state::resume(path, &job_text, rank, &mut dp)?
            }
            _ => None,
        };
        catch_up(&mut dp)?;
        self.events.emit(Event::Joined {
            rank,
            world,
            steps: task.total_steps(),
            steps_per_epoch: task.period(),
            parameters,
            keys: dp.partitions().len(),
            from_step: dp.round(),
            resumed_from,
            codec: plan
                .push
                .parse::<murmur_engine::compress::CodecSpec>()
                .map(|c| c.to_string())
                .unwrap_or_else(|_| plan.push.clone()),
        });
        let started = Instant::now();
        // The same job identity takes the state back and writes it.
        let state_writer = match &self.config.state {
            Some(path) => Some(worker_state::StateWriter::start(path, &job_text, rank)?),
            None => None,
        };
        let ending = self.train_rounds(&joined, &mut task, &mut dp, state_writer.as_ref())?;
        if dp.emulation_overruns() > 0 {
            tracing::warn!(
                "{} of {} rounds computed longer than the emulated device would have: its \
                 rounds were the machine's, not the device's",
                dp.emulation_overruns(),
                dp.round()
            );
        }
        if let Some(path) = &self.config.save {
            write_atomically(path, &dp.replica.save_state()?)?;
        }
        let (final_accuracy, final_valid_loss) = match ending.measured {
            Some(Measure::Accuracy(a)) => (Some(a), None),
            Some(Measure::ValidLoss(l)) => (None, Some(l)),
            None => (None, None),
        };
        let totals = &ending.totals;
        let report = WorkerReport {
            rank,
            steps: dp.round(),
            final_accuracy,
            final_valid_loss,
            bytes_pushed: totals.pushed,
            bytes_pulled: totals.pulled,
            f32_bytes_each_way: totals.f32_each_way,
            stopped: ending.stopped,
            job: joined.job.clone(),
        };
        // Say goodbye to the servers before reporting the end.
        drop(dp);
        self.events.emit(Event::Done {
            rank,
            steps: report.steps,
            final_accuracy,
            final_valid_loss,
            bytes_pushed: totals.pushed,
            bytes_pulled: totals.pulled,
            f32_bytes_each_way: totals.f32_each_way,
            seconds: started.elapsed().as_secs_f64(),
            stopped: ending.stopped,
        });
        Ok(report)
    }

    /// Trains until the job's last round or a stop.
    fn train_rounds<T: Task>(
        &self,
        joined: &Joined,
        task: &mut T,
        dp: &mut DataParallel<QuicCollective, T::Model>,
        state_writer: Option<&worker_state::StateWriter>,
    ) -> Result<Ending> {
        let (job, rank, world) = (&joined.job, joined.rank, joined.world);
        let (epochs, max_rounds) = (job.queue_epochs(), job.max_steps.unwrap_or(u64::MAX));
        let mut totals = Totals::default();
        let mut measured = None;
        // The round after which this worker measured last.
        let mut measured_at = None;
        let stop = |totals, measured| {
            Ok(Ending {
                totals,
                measured,
                stopped: true,
            })
        };
        let started = Instant::now();
        let mut period_started = Instant::now();
        let mut failures = 0;
        // The round whose preparation (LoCo's recalibration) was done, so that a retried round
        // does not redo it.
        let mut prepared = None;
        // A snapshot due, of the state after this many rounds, held until that state's digest
        // has been compared with the others'.
        let mut unchecked_snapshot: Option<(u64, Vec<u8>)> = None;
        // The epoch of the last round this worker knew the assignment of.
        let mut epoch = 0;
        let attacking = self.config.attack.is_some();
        loop {
            // Shard 0 cuts each round from the job's samples; the job is done when it has
            // handed out every epoch. A round it cut before this worker came (or whose cut
            // this worker missed) is played without a share.
            let assigned = dp.collective.assignment(dp.round());
            if let Some(a) = &assigned {
                epoch = a.epoch;
            }
            if epoch >= epochs || dp.round() >= max_rounds {
                break;
            }
            match self.control.next() {
                Next::Stop => return stop(totals, measured),
                Next::Pause => {
                    dp.collective.leave();
                    self.events.emit(Event::Paused {
                        rank,
                        step: dp.round(),
                    });
                    if self.control.wait_while_paused() == Next::Stop {
                        return stop(totals, measured);
                    }
                    self.rejoin(joined, dp, "paused")?;
                    continue;
                }
                Next::Step => {}
            }
            let step_started = Instant::now();
            let round_index = dp.round();
            if let (Some(a), false) = (&assigned, prepared == Some(round_index)) {
                task.before_round(dp, &self.events, rank, a)?;
                prepared = Some(round_index);
            }
            let share = assigned.as_ref().and_then(|a| a.share_of(rank));
            let (played, samples) = match share {
                Some((share, first)) => task.with_share(epoch, share, first as usize, |b, f| {
                    play_round(dp, rank, Some((b, f)), attacking)
                })?,
                None => (play_round(dp, rank, None, attacking), 0),
            };
            let played = match played {
                Ok(played) => played,
                Err(RoundFailure::Fatal(e)) => return Err(e),
                Err(RoundFailure::Lost(e)) => {
                    failures += 1;
                    if failures > self.config.rejoin_attempts {
                        return Err(NodeError::Net(murmur_net::NetError::Connection(e)));
                    }
                    let reason = format!("lost the swarm ({e})");
                    dp.collective.leave_to_reconnect();
                    self.rejoin(joined, dp, &reason)?;
                    continue;
                }
            };
            let late = played.counted() == Some(false);
            let (loss, bytes, lost_after) = (played.loss, played.bytes, played.lost_after);
            // A push a shard closed the round without: dropped (its samples are trained
            // again), or folded back into the error feedback, as the job says.
            if job.folds_late_pushes() && !played.late_on.is_empty() {
                let late = dp.collective.keys_on(&played.late_on);
                let folded = dp.take_back_late_pushes(round_index, |k| late.contains(&k))?;
                tracing::debug!(
                    "round {round_index}: {folded} late partitions folded into error feedback"
                );
            }
            // A snapshot waits for the check of the replica it holds: the digest of the state
            // after round s is compared in round s + 1, and a replica gone astray must not
            // replace the servers' good snapshot.
            if let Some((step, state)) = unchecked_snapshot.take() {
                if step == round_index && played.confirmed {
                    dp.collective.snapshot(step, state)?;
                }
            }
            // Only failures in a row count against the rejoin attempts.
            failures = 0;
            totals.pushed += bytes.pushed as u64;
            totals.pulled += bytes.pulled as u64;
            totals.f32_each_way += bytes.f32_each_way as u64;
            totals.samples += samples;
            let round = Round {
                step: dp.round(),
                epoch: task.shown_epoch(epoch),
                samples,
                loss,
                bytes,
                codes: dp.code_stats(),
                timing: dp.round_timing(),
                seconds: step_started.elapsed().as_secs_f64(),
                lr: dp.replica.lr(),
                late,
            };
            self.report_step(rank, round, &totals, started);
            if let Some(writer) = state_writer {
                writer.save(dp)?;
            }
            if let (Some(path), Some(every)) = (&self.config.save, self.config.save_every) {
                if dp.round().is_multiple_of(every.max(1)) {
                    write_atomically(path, &dp.replica.save_state()?)?;
                }
            }
            if snapshot_duty(dp.round(), job.snapshot_every, &played.participants) == Some(rank) {
                unchecked_snapshot = Some((dp.round(), dp.save_state()?));
            }
            let next = dp.collective.assignment(dp.round()).map(|a| a.epoch);
            let last = next.is_some_and(|e| e >= epochs) || dp.round() >= max_rounds;
            let due = task.measurement(dp.round(), epoch, next);
            if let Some(index) = due.or(last.then_some(0)) {
                let seconds = period_started.elapsed().as_secs_f64();
                period_started = Instant::now();
                // The replicas are identical: one rank measures for all, in turn, so that no
                // worker's leaving stops the measurements; the last round, every worker.
                let turn = index % u64::from(world.max(1));
                if last || turn == u64::from(rank) {
                    measured = Some(self.measure(task, dp, rank, epoch, seconds)?);
                    measured_at = Some(dp.round());
                }
            }
            // The round went through, but a shard's link failed before its summary came.
            if let Some(e) = lost_after.filter(|_| !last) {
                dp.collective.leave_to_reconnect();
                self.rejoin(joined, dp, &format!("lost the swarm after a round ({e})"))?;
            }
            self.control.rest(step_started.elapsed());
        }
        // Every worker measures the final replica: where the last round's summary was lost,
        // this worker learnt that the job was over only after it reconnected.
        if measured_at != Some(dp.round()) && dp.round() > 0 {
            let seconds = period_started.elapsed().as_secs_f64();
            measured = Some(self.measure(task, dp, rank, epoch, seconds)?);
        }
        Ok(Ending {
            totals,
            measured,
            stopped: false,
        })
    }

    /// Measures the replica and reports it (after round `dp.round()`, of the queue's epoch
    /// `epoch`, `seconds` after the last measurement).
    fn measure<T: Task>(
        &self,
        task: &T,
        dp: &DataParallel<QuicCollective, T::Model>,
        rank: u16,
        epoch: u32,
        seconds: f64,
    ) -> Result<Measure> {
        let measure = task.measure(&dp.replica)?;
        self.events.emit(match measure {
            Measure::Accuracy(accuracy) => Event::Evaluated {
                rank,
                step: dp.round(),
                epoch: task.shown_epoch(epoch),
                accuracy,
                seconds,
            },
            Measure::ValidLoss(valid_loss) => Event::Validated {
                rank,
                step: dp.round(),
                valid_loss,
                seconds,
            },
        });
        Ok(measure)
    }

    fn report_step(&self, rank: u16, round: Round, totals: &Totals, started: Instant) {
        self.events.emit(Event::Step {
            rank,
            step: round.step,
            epoch: round.epoch,
            loss: round.loss,
            pushed: round.bytes.pushed,
            pulled: round.bytes.pulled,
            f32_each_way: round.bytes.f32_each_way,
            samples_per_second: totals.samples as f64 / started.elapsed().as_secs_f64().max(1e-9),
            samples: round.samples,
            seconds: round.seconds,
            lr: round.lr,
            saturated: round.codes.saturated,
            error_nonzero: round.codes.error_nonzero,
            late: round.late,
            computing: round.timing.computing.as_secs_f64(),
            communicating: round.timing.communicating().as_secs_f64(),
            hidden: round.timing.hidden().as_secs_f64(),
        });
    }

    /// Connects again and catches up on the rounds missed, keeping the replica's state,
    /// with back-off ([`Run::with_backoff`]).
    fn rejoin<M: Learner>(
        &self,
        joined: &Joined,
        dp: &mut DataParallel<QuicCollective, M>,
        reason: &str,
    ) -> Result<()> {
        self.with_backoff(|| {
            dp.reconnect(self.connect(joined)?)?;
            catch_up(dp)?;
            Ok(())
        })?;
        self.events.emit(Event::Rejoined {
            rank: joined.rank,
            step: dp.round(),
            reason: reason.to_string(),
        });
        Ok(())
    }

    /// Tries `attempt` up to `rejoin_attempts` times, waiting 1 s, 2 s, 4 s ... (at most
    /// 30 s) between tries and saying so; a stop ends the waiting.
    fn with_backoff<T>(&self, mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
        let mut delay = Duration::from_secs(1);
        let mut tries = 0;
        loop {
            tries += 1;
            match attempt() {
                Ok(done) => return Ok(done),
                Err(e) if tries >= self.config.rejoin_attempts.max(1) => {
                    return Err(NodeError::Net(murmur_net::NetError::Connection(format!(
                        "reaching the servers failed {tries} times (last: {e})"
                    ))))
                }
                Err(e) => {
                    self.wait(format!(
                        "the servers again in {delay:?} (try {tries} of {}: {e})",
                        self.config.rejoin_attempts
                    ));
                    if self.control.sleep(delay) == Next::Stop {
                        return Err(NodeError::Stopped);
                    }
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

/// The rank that sends the servers a snapshot after `round` rounds, if one is due: every
/// `every` rounds, in turn, one of the ranks whose pushes shard 0 summed into the round just
/// played (`participants`, the same list on every worker). A turn never falls to a worker that
/// has left or stopped: each skipped turn would keep `every` more rounds in every shard's log
/// (shard 1's memory stepped by 22 MB a frozen worker in the churn benchmark when turns went
/// to the ranks by number), and a rejoining worker would replay them.
fn snapshot_duty(round: u64, every: u64, participants: &[u16]) -> Option<u16> {
    let every = every.max(1);
    if !round.is_multiple_of(every) || participants.is_empty() {
        return None;
    }
    let turn = (round / every) % participants.len() as u64;
    Some(participants[turn as usize])
}

#[cfg(test)]
mod tests {
    use super::snapshot_duty;

    #[test]
    fn snapshots_fall_to_the_round_participants_in_turn() {
        let all = [0, 1, 2];
        let duties: Vec<_> = (0..=8).map(|r| snapshot_duty(r, 2, &all)).collect();
        assert_eq!(
            duties,
            [
                Some(0),
                None,
                Some(1),
                None,
                Some(2),
                None,
                Some(0),
                None,
                Some(1)
            ]
        );
        // Rank 0 has left (or was late): its turns go to the ranks that took part.
        let without_0 = [1, 2];
        let duties: Vec<_> = (0..=6)
            .step_by(2)
            .map(|r| snapshot_duty(r, 2, &without_0))
            .collect();
        assert_eq!(duties, [Some(1), Some(2), Some(1), Some(2)]);
        assert_eq!(snapshot_duty(4, 2, &[]), None, "no summary, no duty");
        assert_eq!(
            snapshot_duty(5, 0, &[3]),
            Some(3),
            "degenerate settings still snapshot"
        );
    }
}
