//! `murmur worker`: one worker of a data-parallel job. It needs only where the servers are and
//! its credentials: the servers hand it the job and its rank. Everything here is node-local.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use murmur_node::{
    Budget, DeviceKind, Event, LinkConfig, Metrics, MetricsFile, Worker, WorkerConfig,
};

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The server shards as HOST:PORT (names, IPv4 or [IPv6]), shard 0 first, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    connect: Vec<String>,
    /// Swarm folder (from `murmur swarm init`).
    #[arg(long, default_value = "swarm")]
    swarm: PathBuf,
    /// This node's name in the swarm folder.
    #[arg(long)]
    node: String,
    #[arg(long, value_enum, default_value_t)]
    device: DeviceKind,
    /// Folder holding mnist/ and fashion-mnist/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    data: Option<PathBuf>,
    #[command(flatten)]
    link: LinkConfig,
    /// The codec of this worker's own pushes, one the job allows (its --codec or one of its
    /// --push-codecs): a harder top-k for a slow link; or auto, which measures the path to
    /// the shards and takes the least compressed that moves a round's pushes within the job's
    /// --push-budget-ms. Default: the job's codec.
    #[arg(long)]
    push_codec: Option<String>,
    /// Fraction of the time spent computing, in (0, 1] (the GPU budget).
    #[arg(long, default_value_t = 1.0)]
    duty_cycle: f64,
    /// At most this many steps per second.
    #[arg(long)]
    max_steps_per_s: Option<f64>,
    /// Reconnections tried after losing the servers before giving up (back-off 1 s to 30 s).
    #[arg(long, default_value_t = 5)]
    rejoin_attempts: u32,
    /// Seconds to keep trying to reach the servers at the start.
    #[arg(long, default_value_t = 120.0)]
    join_timeout: f64,
    /// Write the model and optimizer state here at the end, on a stop (SIGINT, SIGTERM) and
    /// every --save-every rounds (safetensors: parameters and optimizer state).
    #[arg(long)]
    save: Option<PathBuf>,
    /// With --save, also write it every this many rounds.
    #[arg(long, requires = "save")]
    save_every: Option<u64>,
    /// Keep this worker's own state here after every round (parameters, optimizer state,
    /// error-feedback memories): started again with the same FILE after dying, it takes them
    /// back and catches up from there.
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// Report events as JSON lines on stdout (what `murmur swarm` reads) instead of a
    /// progress bar.
    #[arg(long)]
    json: bool,
    /// Write metrics here as JSON lines (created at the start; `murmur plot` draws them): a
    /// line per round with step, epoch, rank, loss, learning rate, bytes pushed (up) and
    /// pulled (down) and the round's seconds, and a line with the test accuracy after each
    /// epoch this rank evaluated (the ranks take the epochs in turn; all, the last).
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Compute as a device that takes this many milliseconds a sample would, sleeping for
    /// what the real compute leaves: for trying swarms of uneven devices on one machine
    /// (emulate a device slower than the machine; overrun rounds are logged).
    #[arg(long, value_name = "MS")]
    emulate_device_ms: Option<f64>,
}

pub fn run(a: WorkerArgs) -> anyhow::Result<()> {
    if let Some(path) = &a.save {
        super::flag_checks::writable("--save", path)?;
    }
    if let Some(path) = &a.metrics {
        super::flag_checks::writable("--metrics", path)?;
    }
    if let Some(path) = &a.state {
        super::flag_checks::writable("--state", path)?;
    }
    let metrics = a.metrics.as_deref().map(MetricsFile::create).transpose()?;
    let worker = Worker::start(WorkerConfig {
        servers: a.connect,
        swarm: a.swarm,
        node: a.node,
        device: a.device,
        data: a.data,
        link: a.link,
        push_codec: a.push_codec,
        budget: Budget {
            duty_cycle: a.duty_cycle,
            max_steps_per_second: a.max_steps_per_s,
        },
        rejoin_attempts: a.rejoin_attempts,
        join_timeout_s: a.join_timeout,
        save: a.save,
        save_every: a.save_every,
        state: a.state,
        json_events: a.json,
        emulated_seconds_per_sample: a.emulate_device_ms.map(|ms| ms / 1e3),
        attack: None,
    })?;
    let stopper = worker.stopper();
    crate::signals::on_signal(move |_| stopper.stop());
    follow(worker.events(), !a.json, metrics)?;
    let report = match worker.join() {
        Ok(report) => report,
        // A signal's stop may end the worker before it joined: that is an interruption.
        Err(e) => return crate::signals::check().and(Err(e.into())),
    };
    let saved = 2.0 * report.f32_bytes_each_way as f64
        / (report.bytes_pushed + report.bytes_pulled).max(1) as f64;
    eprintln!(
        "rank {} done after {} rounds: pushed {:.1} MB, pulled {:.1} MB, {saved:.1}x less than f32{}",
        report.rank,
        report.steps,
        report.bytes_pushed as f64 / 1e6,
        report.bytes_pulled as f64 / 1e6,
        final_measure(report.final_accuracy, report.final_valid_loss)
            .map_or(String::new(), |m| format!(", {m}"))
    );
    crate::signals::check()
}

/// The last measurement, in words: test accuracy (image models) or validation loss (the
/// language model).
pub(crate) fn final_measure(accuracy: Option<f64>, valid_loss: Option<f64>) -> Option<String> {
    match (accuracy, valid_loss) {
        (Some(a), _) => Some(format!("test accuracy {:.2}%", 100.0 * a)),
        (None, Some(l)) => Some(format!("validation loss {l:.4} nats/byte")),
        (None, None) => None,
    }
}

/// Follows the worker's events until it ends: writes their metrics lines, and shows them as a
/// progress bar and plain lines if `show`.
fn follow(
    mut events: tokio::sync::broadcast::Receiver<Event>,
    show: bool,
    mut metrics: Option<MetricsFile>,
) -> anyhow::Result<()> {
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("rank {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    loop {
        let event = match events.blocking_recv() {
            Ok(e) => e,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(_) => break,
        };
        if let (Some(file), Some(line)) = (&mut metrics, Metrics::from_event(&event)) {
            file.write(&line)?;
        }
        if matches!(event, Event::Error { .. } | Event::Done { .. }) {
            break;
        }
        if !show {
            continue;
        }
        match event {
            Event::Waiting { what } => bar.println(format!("waiting for {what}")),
            // The wait that follows names the rank.
            Event::Assigned { .. } => {}
            Event::Joined {
                rank,
                world,
                steps,
                parameters,
                keys,
                from_step,
                codec,
                ..
            } => {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.set_length(steps);
                bar.set_position(from_step);
                bar.set_prefix(rank.to_string());
                bar.println(format!(
                    "rank {rank} of {world}: {parameters} parameters in {keys} keys, rounds {from_step}..{steps}, pushes {codec}"
                ));
            }
            Event::Step {
                step,
                loss,
                pushed,
                pulled,
                samples_per_second,
                saturated,
                error_nonzero,
                communicating,
                hidden,
                ..
            } => {
                bar.set_position(step);
                let codes = super::code_stats::code_stats_line(saturated, error_nonzero);
                bar.set_message(format!(
                    "loss {loss:.4}  {:.0} KB up / {:.0} KB down per step  {samples_per_second:.0} samples/s  \
                     exchange {:.0} ms ({:.0}% behind the backward pass){codes}",
                    pushed as f64 / 1e3,
                    pulled as f64 / 1e3,
                    communicating * 1e3,
                    100.0 * hidden / communicating.max(1e-9),
                ));
            }
            Event::Evaluated {
                epoch,
                accuracy,
                seconds,
                ..
            } => bar.println(format!(
                "epoch {epoch}: test accuracy {:.2}% ({seconds:.1} s)",
                100.0 * accuracy
            )),
            Event::Validated {
                step,
                valid_loss,
                seconds,
                ..
            } => bar.println(format!(
                "round {step}: validation loss {valid_loss:.4} nats/byte ({seconds:.1} s)"
            )),
            Event::Recalibrated {
                step, log2s, was, ..
            } => bar.println(super::code_stats::recalibrated_line(step, log2s, was)),
            Event::Paused { step, .. } => bar.println(format!("paused at step {step}")),
            Event::Rejoined { step, reason, .. } => {
                bar.println(format!("rejoined at step {step} after: {reason}"))
            }
            Event::Error { .. } | Event::Done { .. } => {}
            // `Event` is non-exhaustive: a kind added later shows nothing until it has a line.
            _ => {}
        }
    }
    bar.finish_and_clear();
    Ok(())
}
