//! `murmur worker`: one rank of a data-parallel run through parameter-server shards over QUIC.
//! Rank `r` of `N` trains on its slice of each global batch; all ranks apply the same replies,
//! so their replicas stay bit-identical. If its servers drop it (a missed deadline, a network
//! failure) it reconnects, catches up from the newest snapshot and carries on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use murmur_engine::comm::Collective;
use murmur_engine::data::{epoch_batches, ImageSet};
use murmur_engine::nn::Module;
use murmur_engine::train::{rank_slice, Classifier, ClassifierConfig, DataParallel};
use murmur_engine::Device;
use murmur_net::identity::Credentials;
use murmur_net::ps::{catch_up, ClientOptions, QuicCollective};

use super::swarm::args::{CompressionArgs, JobArgs, LinkArgs, WorkerEvent};
use super::train::{load_sets, Sets};

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The server shards, in shard order, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    connect: Vec<SocketAddr>,
    /// Swarm folder (from `murmur swarm init`).
    #[arg(long, default_value = "swarm")]
    swarm: PathBuf,
    /// This node's name in the swarm folder.
    #[arg(long)]
    node: String,
    #[arg(long)]
    rank: u16,
    #[arg(long)]
    world: u16,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    compression: CompressionArgs,
    #[command(flatten)]
    link: LinkArgs,
    /// Rank 0 sends the servers a snapshot every this many rounds, for workers that rejoin.
    #[arg(long, default_value_t = 50)]
    snapshot_every: u64,
    /// How often to reconnect and catch up after losing the servers before giving up.
    #[arg(long, default_value_t = 3)]
    rejoin_attempts: u32,
    /// Report progress every this many rounds.
    #[arg(long, default_value_t = 10)]
    log_every: u64,
    /// Report events as JSON lines on stdout (what `murmur swarm` reads) instead of a
    /// progress bar.
    #[arg(long)]
    json: bool,
}

/// Running totals of one worker.
#[derive(Default)]
struct Totals {
    pushed: u64,
    pulled: u64,
    f32_each_way: u64,
    samples: usize,
}

struct Job {
    train: ImageSet,
    test: ImageSet,
    device: Device,
    config: ClassifierConfig,
    steps_per_epoch: u64,
    total_steps: u64,
}

impl Job {
    fn load(a: &WorkerArgs) -> anyhow::Result<Job> {
        let job = &a.job;
        let Sets { train, test, .. } = load_sets(
            &job.dataset,
            job.data.as_deref(),
            job.train_limit,
            job.batch,
            job.epochs,
        )?;
        let device = job.device.open()?;
        let global = job.batch * a.world as usize;
        let steps_per_epoch = (train.len() / global).max(1) as u64;
        let total_steps =
            (steps_per_epoch * job.epochs as u64).min(job.max_steps.unwrap_or(u64::MAX));
        let config = ClassifierConfig {
            hidden: job.hidden.clone(),
            lr: job.lr,
            seed: job.seed,
            ..ClassifierConfig::default()
        };
        Ok(Job {
            train,
            test,
            device,
            config,
            steps_per_epoch,
            total_steps,
        })
    }
}

pub fn run(a: WorkerArgs) -> anyhow::Result<()> {
    if a.rank >= a.world {
        bail!("--rank {} is not below --world {}", a.rank, a.world);
    }
    let creds = Credentials::load(&a.swarm, &a.node)
        .with_context(|| format!("loading node {:?} from {}", a.node, a.swarm.display()))?;
    let job = Job::load(&a)?;
    let started = Instant::now();
    let mut totals = Totals::default();
    let mut attempts = 0;
    let mut dp = join(&a, &creds, &job)?;
    let mut reporter = Reporter::new(&a, &job, &dp);
    let mut final_accuracy = None;
    while dp.round() < job.total_steps {
        match train_until_done(
            &a,
            &job,
            &mut dp,
            &mut totals,
            &mut reporter,
            &mut final_accuracy,
        ) {
            Ok(()) => break,
            Err(e) if attempts < a.rejoin_attempts => {
                let reason = format!("{e:#}");
                eprintln!(
                    "murmur worker {}: lost the swarm ({reason}); rejoining",
                    a.rank
                );
                drop(dp);
                // Every try counts, failed connections included: a server that is down for
                // a while costs attempts, not the worker.
                dp = loop {
                    attempts += 1;
                    std::thread::sleep(Duration::from_secs(1));
                    match join(&a, &creds, &job) {
                        Ok(dp) => break dp,
                        Err(e) if attempts < a.rejoin_attempts => eprintln!(
                            "murmur worker {}: rejoining failed ({e:#}); trying again",
                            a.rank
                        ),
                        Err(e) => {
                            return Err(e.context(format!("rejoining failed {attempts} times")))
                        }
                    }
                };
                reporter.emit(&WorkerEvent::Rejoined {
                    rank: a.rank,
                    step: dp.round(),
                    reason,
                });
            }
            Err(e) => return Err(e),
        }
    }
    reporter.finish();
    reporter.emit(&WorkerEvent::Done {
        rank: a.rank,
        steps: dp.round(),
        final_accuracy,
        bytes_pushed: totals.pushed,
        bytes_pulled: totals.pulled,
        f32_bytes_each_way: totals.f32_each_way,
        seconds: started.elapsed().as_secs_f64(),
    });
    Ok(())
}

/// Connects, registers and, in a running swarm, catches up.
fn join(
    a: &WorkerArgs,
    creds: &Credentials,
    job: &Job,
) -> anyhow::Result<DataParallel<QuicCollective>> {
    let options = ClientOptions {
        link: a.link.link(),
        ..ClientOptions::default()
    };
    let collective = QuicCollective::connect(&a.connect, creds, a.rank, a.world, &a.node, options)
        .context("connecting to the servers")?;
    let clf = Classifier::new(
        &job.device,
        job.train.features(),
        job.train.classes,
        &job.config,
    )?;
    let mut plan = a.compression.plan();
    plan.seed = a.job.seed;
    let mut dp = DataParallel::new(clf, collective, &plan, &a.compression.memory)
        .context("registering with the servers")?;
    if let Some(plan) = catch_up(&mut dp).context("catching up with the swarm")? {
        eprintln!(
            "murmur worker {}: caught up from {} to step {}",
            a.rank,
            plan.snapshot
                .as_ref()
                .map_or("the initial model".to_string(), |(s, _)| format!(
                    "the snapshot of step {s}"
                )),
            plan.to
        );
    }
    Ok(dp)
}

fn train_until_done(
    a: &WorkerArgs,
    job: &Job,
    dp: &mut DataParallel<QuicCollective>,
    totals: &mut Totals,
    reporter: &mut Reporter,
    final_accuracy: &mut Option<f64>,
) -> anyhow::Result<()> {
    let (rank, world) = (dp.collective.rank(), dp.collective.world());
    let mut epoch_started = Instant::now();
    let mut batches = Vec::new();
    let mut batches_epoch = None;
    while dp.round() < job.total_steps {
        let epoch = (dp.round() / job.steps_per_epoch) as u32;
        if batches_epoch != Some(epoch) {
            batches = epoch_batches(job.train.len(), a.job.batch * world, a.job.seed, epoch);
            batches_epoch = Some(epoch);
        }
        let global = &batches[(dp.round() % job.steps_per_epoch) as usize];
        let slice = rank_slice(global, rank, world);
        let (x, y) = job.train.batch(slice);
        let (loss, bytes) = dp.step(&x, &y)?;
        totals.pushed += bytes.pushed as u64;
        totals.pulled += bytes.pulled as u64;
        totals.f32_each_way += bytes.f32_each_way as u64;
        totals.samples += slice.len();
        if rank == 0 && dp.round().is_multiple_of(a.snapshot_every.max(1)) {
            let state = dp.clf.save_state()?;
            let step = dp.round();
            dp.collective.snapshot(step, state)?;
        }
        if dp.round().is_multiple_of(a.log_every.max(1)) || dp.round() == job.total_steps {
            reporter.progress(dp.round(), loss.item()?, bytes, totals);
        }
        let epoch_done =
            dp.round().is_multiple_of(job.steps_per_epoch) || dp.round() == job.total_steps;
        if epoch_done {
            let seconds = epoch_started.elapsed().as_secs_f64();
            epoch_started = Instant::now();
            // The replicas are identical: one rank evaluates for all.
            if rank == 0 {
                let accuracy = dp.clf.accuracy(&job.test, 1000)?;
                *final_accuracy = Some(accuracy);
                reporter.emit(&WorkerEvent::Epoch {
                    rank: rank as u16,
                    epoch: epoch + 1,
                    accuracy,
                    seconds,
                });
            }
        }
    }
    Ok(())
}

/// Progress as JSON lines (for `murmur swarm`) or a progress bar and plain lines.
struct Reporter {
    json: bool,
    rank: u16,
    bar: ProgressBar,
    started: Instant,
}

impl Reporter {
    fn new(a: &WorkerArgs, job: &Job, dp: &DataParallel<QuicCollective>) -> Reporter {
        let bar = if a.json {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(job.total_steps);
            bar.set_style(
                ProgressStyle::with_template(
                    "rank {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(a.rank.to_string());
            bar.set_position(dp.round());
            bar
        };
        let reporter = Reporter {
            json: a.json,
            rank: a.rank,
            bar,
            started: Instant::now(),
        };
        reporter.emit(&WorkerEvent::Started {
            rank: a.rank,
            world: a.world,
            steps: job.total_steps,
            steps_per_epoch: job.steps_per_epoch,
            parameters: dp.clf.model.parameter_count(),
            keys: dp.partitions().len(),
            from_step: dp.round(),
        });
        reporter
    }

    fn emit(&self, event: &WorkerEvent) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string(event).expect("events serialise")
            );
            return;
        }
        match event {
            WorkerEvent::Epoch {
                epoch,
                accuracy,
                seconds,
                ..
            } => self.bar.println(format!(
                "epoch {epoch}: test accuracy {:.2}% ({seconds:.1} s)",
                100.0 * accuracy
            )),
            WorkerEvent::Rejoined { step, reason, .. } => self
                .bar
                .println(format!("rejoined at step {step} after: {reason}")),
            WorkerEvent::Done {
                final_accuracy,
                bytes_pushed,
                bytes_pulled,
                f32_bytes_each_way,
                seconds,
                ..
            } => {
                let saved = 2.0 * *f32_bytes_each_way as f64
                    / (*bytes_pushed + *bytes_pulled).max(1) as f64;
                eprintln!(
                    "rank {} done in {seconds:.1} s: pushed {:.1} MB, pulled {:.1} MB, {saved:.1}x less than f32{}",
                    self.rank,
                    *bytes_pushed as f64 / 1e6,
                    *bytes_pulled as f64 / 1e6,
                    final_accuracy.map_or(String::new(), |a| format!(", test accuracy {:.2}%", 100.0 * a))
                );
            }
            WorkerEvent::Started {
                parameters,
                keys,
                from_step,
                steps,
                ..
            } => eprintln!(
                "rank {}: {parameters} parameters in {keys} keys, rounds {from_step}..{steps}",
                self.rank
            ),
            WorkerEvent::Progress { .. } => {}
        }
    }

    fn progress(
        &mut self,
        step: u64,
        loss: f32,
        bytes: murmur_engine::train::RoundBytes,
        totals: &Totals,
    ) {
        let samples_per_second =
            totals.samples as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_position(step);
        self.bar.set_message(format!(
            "loss {loss:.4}  {:.0} KB up / {:.0} KB down per step  {samples_per_second:.0} samples/s",
            bytes.pushed as f64 / 1e3,
            bytes.pulled as f64 / 1e3
        ));
        if self.json {
            self.emit(&WorkerEvent::Progress {
                rank: self.rank,
                step,
                loss,
                pushed: bytes.pushed,
                pulled: bytes.pulled,
                f32_each_way: bytes.f32_each_way,
                samples_per_second,
            });
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
