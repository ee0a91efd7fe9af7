//! `murmur swarm` without a subcommand: a whole swarm on this machine through the node
//! library's launcher (servers and workers as processes of this binary over loopback QUIC),
//! with the dashboard of [`super::progress`]. A failure shows the end of the failing
//! process's log.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::{ArgMatches, Args};
use murmur_node::swarm::{Launch, LocalSwarm, SwarmConfig, SwarmEvent};
use murmur_node::{DeviceKind, Job, LinkConfig, Metrics, MetricsFile};

use super::progress::Dashboard;
use crate::commands::job_flags::job_from;
use crate::exit::{usage, Interrupted};

#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Parameter-server shard processes.
    #[arg(long, default_value_t = 2)]
    servers: u16,
    /// The job, as a TOML file (job flags given here override its fields).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    job: Job,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// Folder holding mnist/ and fashion-mnist/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    data: Option<PathBuf>,
    #[command(flatten)]
    link: LinkConfig,
    /// Seconds a round waits for a straggler before evicting it.
    #[arg(long, default_value_t = 30.0)]
    deadline: f64,
    /// Swarm folder for credentials and logs (default: a fresh one under the temp folder).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// Write the trained model (safetensors: parameters and optimizer state) here at the end
    /// or when stopped by SIGINT/SIGTERM.
    #[arg(long)]
    save: Option<PathBuf>,
    /// With --save, also write it every this many rounds.
    #[arg(long, requires = "save")]
    save_every: Option<u64>,
    /// Write every worker's metrics here as JSON lines, each with its rank (created at the
    /// start; `murmur plot` draws them): a line per worker and round with step, epoch,
    /// loss, learning rate, bytes pushed (up) and pulled (down) and the round's seconds, and
    /// a line with the test accuracy after each epoch.
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Start a node that dies (crash, kill) again: a worker at most 10 times (it gets its rank
    /// back and catches up), a server shard from its saved state (the workers reconnect).
    /// Without it the other workers train on without a dead worker, and a dead shard ends
    /// the run.
    #[arg(long)]
    respawn: bool,
    /// Every worker computes as a device that takes this many milliseconds a sample would,
    /// sleeping for what the real compute leaves: swarms of uneven devices measured on one
    /// machine, whose shared cores would otherwise set the pace (emulate a device slower than
    /// the machine; overrun rounds are logged).
    #[arg(long, value_name = "MS")]
    emulate_device_ms: Option<f64>,
    /// Make the first worker's emulated device this many times slower: one slow device in
    /// the swarm (try it with the default shares by speed and with `--shares equal`).
    #[arg(long, value_name = "FACTOR", requires = "emulate_device_ms")]
    slow_worker: Option<f64>,
}

/// Most times --respawn starts one node again (a worker that keeps dying is let go; a shard
/// that keeps dying ends the run).
const MAX_RESPAWNS: usize = 10;

/// How long nodes get to stop gracefully before they are killed.
const GRACE: Duration = Duration::from_secs(15);

pub fn run(a: LaunchArgs, matches: &ArgMatches) -> anyhow::Result<()> {
    let job = job_from(a.config.as_deref(), &a.job, matches)?;
    if a.servers == 0 {
        return Err(usage("--servers must be at least 1"));
    }
    if let Some(path) = &a.save {
        super::super::flag_checks::writable("--save", path)?;
    }
    if let Some(path) = &a.metrics {
        super::super::flag_checks::writable("--metrics", path)?;
    }
    let save = a.save.as_deref().map(std::path::absolute).transpose()?;
    crate::signals::listen();
    let mut metrics = a.metrics.as_deref().map(MetricsFile::create).transpose()?;
    let dir = match &a.dir {
        Some(dir) => dir.clone(),
        None => crate::commands::fresh_temp_dir("murmur-swarm-")?,
    };
    let started = Instant::now();
    eprintln!(
        "murmur swarm: {} workers, {} servers, codec {} (pull {}), worker memory {}, server memory {}; logs in {}{}",
        job.workers,
        a.servers,
        job.codec,
        job.pull_codec.as_deref().unwrap_or(&job.codec),
        job.memory,
        job.server_memory,
        dir.join("logs").display(),
        if a.dir.is_none() {
            " (kept only if the run fails; --dir keeps them)"
        } else {
            ""
        }
    );
    let workers = job.workers as usize;
    let mut swarm = LocalSwarm::start(
        SwarmConfig {
            servers: a.servers,
            job,
            device: a.device,
            data: a.data,
            link: a.link,
            deadline_s: a.deadline,
            dir: dir.clone(),
            save: save.clone(),
            save_every: a.save_every,
            // Nodes started again pick up their saved state.
            durable: a.respawn,
            emulated_seconds_per_sample: a.emulate_device_ms.map(|ms| ms / 1e3),
            slow_worker: a.slow_worker,
            attacker: None,
        },
        Launch::Processes {
            exe: std::env::current_exe()?,
        },
    )?;

    let mut dashboard = Dashboard::new(workers, a.quiet);
    let mut ended = 0;
    let mut respawns = vec![0; workers];
    let mut server_restarts = 0;
    // Workers that died and were let go, with why.
    let mut gone: Vec<(usize, String)> = Vec::new();
    let mut last_word = Instant::now();
    while ended < workers {
        if let Some(signal) = crate::signals::received() {
            dashboard.clear();
            eprintln!("murmur swarm: stopping every node (each worker finishes its round)");
            let killed = swarm.stop(GRACE);
            if killed > 0 {
                eprintln!(
                    "murmur swarm: {killed} nodes did not stop within {} s and were killed",
                    GRACE.as_secs()
                );
            }
            report_saved(&save);
            eprintln!("logs in {}", dir.join("logs").display());
            return Err(Interrupted { signal }.into());
        }
        for (shard, how) in swarm.ended_servers() {
            if !a.respawn || server_restarts >= MAX_RESPAWNS {
                dashboard.clear();
                let hint = if a.respawn {
                    format!("it was started again {MAX_RESPAWNS} times")
                } else {
                    "--respawn starts a server or worker that dies again".into()
                };
                bail!("server {shard} ended ({how}); {hint}");
            }
            server_restarts += 1;
            dashboard.server_restarted(shard);
            swarm.restart_server(shard)?;
        }
        let Some(event) = swarm.next_event(Duration::from_millis(200)) else {
            if last_word.elapsed() > Duration::from_secs(3600) {
                bail!("no word from any worker for an hour");
            }
            continue;
        };
        last_word = Instant::now();
        match event {
            SwarmEvent::Worker { index, event } => {
                // The workers' own events, as they arrive: one file holds every rank.
                if let (Some(file), Some(line)) = (&mut metrics, Metrics::from_event(&event)) {
                    file.write(&line)?;
                }
                dashboard.handle(index, event)
            }
            SwarmEvent::Ended { error: None, .. } => ended += 1,
            SwarmEvent::Ended {
                index,
                error: Some(why),
            } => {
                let respawn = a.respawn && respawns[index] < MAX_RESPAWNS;
                dashboard.left(index, respawn);
                if respawn {
                    respawns[index] += 1;
                    swarm.respawn_worker(index)?;
                } else {
                    swarm.kill_worker(index)?;
                    gone.push((index, why));
                    ended += 1;
                }
            }
        }
    }
    dashboard.clear();
    // Workers are done: reap them, then stop the servers.
    swarm.finish()?;
    report_saved(&save);
    for (index, why) in &gone {
        eprintln!("murmur swarm: worker {index} left early: {why}");
    }
    if gone.len() == workers {
        bail!("every worker left before the end");
    }

    let outcome = dashboard.outcome();
    eprintln!(
        "swarm done in {:.1} s: final {}; per worker and round {:.1} KB up, {:.1} KB down against {:.1} KB each way in f32 every step: {:.1}x less traffic ({:.1} MB in all instead of {:.1} MB)",
        started.elapsed().as_secs_f64(),
        super::super::worker::final_measure(outcome.final_test_accuracy, outcome.final_valid_loss)
            .unwrap_or_else(|| "test accuracy n/a".into()),
        outcome.pushed_per_step / 1e3,
        outcome.pulled_per_step / 1e3,
        outcome.f32_per_step / 1e3,
        outcome.reduction,
        outcome.total_bytes as f64 / 1e6,
        outcome.total_f32_bytes as f64 / 1e6,
    );
    println!("{}", serde_json::to_string(&outcome)?);
    // The others finished, but a worker that died is a failure a script must see (the logs
    // stay, for it).
    if !gone.is_empty() {
        let saved = if gone.iter().any(|(index, _)| *index == 0) && save.is_some() {
            "; worker 0, which writes --save, was one of them, so no model was saved"
        } else {
            ""
        };
        bail!(
            "{} of {workers} workers died before the end and the others finished without them{saved} (--respawn starts a worker that dies again); logs in {}",
            gone.len(),
            dir.join("logs").display()
        );
    }
    // A folder of our own making (fresh CA key, logs) goes once the run has succeeded; after
    // a failure it stays, for its logs.
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Says where the model went, if it was saved.
fn report_saved(save: &Option<PathBuf>) {
    if let Some(path) = save.as_ref().filter(|p| p.exists()) {
        eprintln!("model written to {}", path.display());
    }
}
