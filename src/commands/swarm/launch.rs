//! A whole swarm on this machine: `servers` shard processes and `workers` worker processes
//! talking over loopback QUIC, with the dashboard of [`super::progress`]. Each process logs to
//! `<swarm dir>/logs/`; a failure shows the end of the failing process's log.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use murmur_net::identity::Swarm;

use super::args::{CompressionArgs, JobArgs, LinkArgs, Listening, WorkerEvent};
use super::progress::Dashboard;
use crate::commands::processes::{log_tail, spawn_logged, Children};

#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: u16,
    /// Parameter-server shard processes.
    #[arg(long, default_value_t = 2)]
    servers: u16,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    compression: CompressionArgs,
    #[command(flatten)]
    link: LinkArgs,
    /// Seconds a round waits for a straggler before evicting it.
    #[arg(long, default_value_t = 30.0)]
    deadline: f64,
    /// Swarm folder for credentials and logs (default: a fresh one under the temp folder).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

/// Credentials for every process, in `dir`.
fn prepare(dir: &Path, servers: u16, workers: u16) -> anyhow::Result<()> {
    let swarm = if dir.join("ca.key").exists() {
        Swarm::load(dir)?
    } else {
        let swarm = Swarm::generate("local")?;
        swarm.save(dir)?;
        swarm
    };
    for s in 0..servers {
        swarm.issue_to(dir, &format!("server-{s}"))?;
    }
    for r in 0..workers {
        swarm.issue_to(dir, &format!("worker-{r}"))?;
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    Ok(())
}

pub fn run(a: LaunchArgs) -> anyhow::Result<()> {
    if a.workers == 0 || a.servers == 0 {
        bail!("--workers and --servers must be at least 1");
    }
    // Fail here, not in every worker, on a codec spec that does not parse.
    murmur_engine::compress::parse(&a.compression.codec)?;
    if let Some(p) = &a.compression.pull_codec {
        murmur_engine::compress::parse(p)?;
    }
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("murmur-swarm-{}", std::process::id()))
    });
    prepare(&dir, a.servers, a.workers)?;
    let exe = std::env::current_exe()?;
    let logs = dir.join("logs");
    let started = Instant::now();
    eprintln!(
        "murmur swarm: {} workers, {} servers, codec {} (pull {}), worker memory {}, server memory {}; logs in {}{}",
        a.workers,
        a.servers,
        a.compression.codec,
        a.compression.pull_codec.as_deref().unwrap_or(&a.compression.codec),
        a.compression.memory,
        a.compression.server_memory,
        logs.display(),
        if a.dir.is_none() {
            " (kept only if the run fails; --dir keeps them)"
        } else {
            ""
        }
    );

    let mut children = Children(Vec::new());
    let mut addrs = Vec::new();
    for shard in 0..a.servers {
        let mut args: Vec<String> = ["server", "--listen", "127.0.0.1:0", "--swarm"]
            .map(String::from)
            .to_vec();
        args.push(dir.display().to_string());
        args.extend(["--node".into(), format!("server-{shard}")]);
        args.extend([
            "--shard".into(),
            shard.to_string(),
            "--shards".into(),
            a.servers.to_string(),
        ]);
        args.extend(["--deadline".into(), a.deadline.to_string()]);
        args.extend(a.link.to_args());
        let log = logs.join(format!("server-{shard}.log"));
        let mut child = spawn_logged(&exe, &args, &log)?;
        let stdout = child.stdout.take().expect("piped");
        children.0.push((format!("server {shard}"), child));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let listening: Listening = serde_json::from_str(line.trim())
            .with_context(|| format!("server {shard} did not start:\n{}", log_tail(&log)))?;
        addrs.push(listening.addr.to_string());
    }

    let (tx, rx) = mpsc::channel::<(usize, Option<WorkerEvent>)>();
    for rank in 0..a.workers {
        let mut args: Vec<String> = vec!["worker".into(), "--connect".into(), addrs.join(",")];
        args.extend(["--swarm".into(), dir.display().to_string()]);
        args.extend(["--node".into(), format!("worker-{rank}")]);
        args.extend([
            "--rank".into(),
            rank.to_string(),
            "--world".into(),
            a.workers.to_string(),
        ]);
        args.extend(a.job.to_args());
        args.extend(a.compression.to_args());
        args.extend(a.link.to_args());
        args.push("--json".into());
        let mut child = spawn_logged(&exe, &args, &logs.join(format!("worker-{rank}.log")))?;
        let stdout = child.stdout.take().expect("piped");
        children.0.push((format!("worker {rank}"), child));
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) {
                    let _ = tx.send((rank as usize, Some(event)));
                }
            }
            let _ = tx.send((rank as usize, None));
        });
    }
    drop(tx);

    let mut dashboard = Dashboard::new(a.workers as usize, a.quiet);
    let mut finished = 0;
    while finished < a.workers {
        let (rank, event) = rx.recv().context("worker output")?;
        match event {
            Some(e) => dashboard.handle(e),
            None => {
                finished += 1;
                if !dashboard.is_done(rank) {
                    let log = logs.join(format!("worker-{rank}.log"));
                    dashboard.failed(rank, "exited early");
                    dashboard.clear();
                    bail!(
                        "worker {rank} exited before finishing; the end of its log:\n{}",
                        log_tail(&log)
                    );
                }
            }
        }
    }
    dashboard.clear();
    // Workers are done: reap them, then stop the servers.
    for (name, child) in children
        .0
        .iter_mut()
        .filter(|(n, _)| n.starts_with("worker"))
    {
        let status = child.wait()?;
        if !status.success() {
            bail!("{name} failed with {status}");
        }
    }
    drop(children);

    let outcome = dashboard.outcome();
    eprintln!(
        "swarm done in {:.1} s: final test accuracy {}; per worker and step {:.1} KB up, {:.1} KB down against {:.1} KB each way in f32: {:.1}x less traffic ({:.1} MB in all instead of {:.1} MB)",
        started.elapsed().as_secs_f64(),
        outcome
            .final_test_accuracy
            .map_or("n/a".into(), |a| format!("{:.2}%", 100.0 * a)),
        outcome.pushed_per_step / 1e3,
        outcome.pulled_per_step / 1e3,
        outcome.f32_per_step / 1e3,
        outcome.reduction,
        outcome.total_bytes as f64 / 1e6,
        outcome.total_f32_bytes as f64 / 1e6,
    );
    println!("{}", serde_json::to_string(&outcome)?);
    // A folder of our own making (fresh CA key, logs) goes once the run has succeeded; after
    // a failure it stays, for its logs.
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
