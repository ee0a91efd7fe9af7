//! One model cut into E stages on this machine, neighbours linked over loopback QUIC,
//! training with Clapping (or a baseline): [`run_pipeline`] starts the stages as threads of
//! this process ([`Launch::Threads`]) or as processes of a `murmur` binary
//! ([`Launch::Processes`], `murmur pipeline-stage`), reports their progress, and at the end
//! puts the stages' weights back together and tests them.

pub mod job;
pub mod stage;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use murmur_engine::checkpoint::Precision;
use murmur_engine::data::ImageDataset;
use murmur_engine::nn::{Activation, Mlp, Module};
use murmur_engine::pipeline::{image_accuracy, PipelineConfig, Variant};
use murmur_engine::train::{Classifier, ClassifierConfig, ClassifierModel};
use murmur_engine::{Device, Tensor};
use murmur_net::identity::{Role, Swarm};

use crate::data::Sets;
use crate::error::{NodeError, Result};
use crate::files::write_atomically;
use crate::process::{log_tail, spawn_logged, Children};
use crate::swarm::Launch;
use crate::worker::panic_message;
pub use job::PipelineJob;
pub use stage::{run_stage, StageConfig, StageEvent};

/// What a pipeline run reports while it trains.
#[derive(Debug, Clone, PartialEq)]
pub enum PipelineProgress {
    /// The credentials are written and the stages are about to start.
    Started {
        /// The MLP's widths, input first.
        sizes: Vec<usize>,
        /// The dataset it trains on.
        dataset: ImageDataset,
        /// The method.
        variant: Variant,
        /// Codec of the activations.
        forward_codec: String,
        /// Codec of the activation gradients.
        backward_codec: String,
        /// Steps in the whole run.
        steps: u64,
        /// Where the stage processes log (`None` for threads).
        logs: Option<PathBuf>,
    },
    /// A stage said something (the last stage's progress carries the loss).
    Stage(StageEvent),
}

/// What a pipeline run achieved.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOutcome {
    /// Accuracy of the reassembled model on the test set, in [0, 1].
    pub test_accuracy: f64,
    /// The last mean loss the last stage reported (NaN if it reported none).
    pub final_loss: f64,
    /// Bytes sent per step over every cut, both ways.
    pub bytes_per_step: f64,
    /// What a step would send over every cut in f32.
    pub f32_bytes_per_step: usize,
    /// Floats of error-feedback state over all stages.
    pub memory_floats: usize,
    /// Seconds from starting the stages to the test's end.
    pub seconds: f64,
}

/// What the stages tell the launcher.
enum Report {
    Event(usize, StageEvent),
    /// A stage ended; the message says why if it failed.
    Ended(Option<String>),
}

enum Stages {
    Threads(Vec<JoinHandle<()>>),
    Processes(Children),
}

/// Trains `job` with one stage per thread or process: writes fresh credentials for every
/// stage into `dir` (and, for processes, their logs into `dir/logs`), starts the stages one
/// after the other — each once the one before listens — and reports their progress to
/// `progress`. The stages write their weights into `dir`; the run ends by testing the model
/// they make up together. The first stage failure is the error.
pub fn run_pipeline(
    job: &PipelineJob,
    dir: &Path,
    launch: Launch,
    mut progress: impl FnMut(PipelineProgress),
) -> Result<PipelineOutcome> {
    job.validate()?;
    let sets = job.load()?;
    let config = job.config(&sets.train)?;
    let sizes = job.sizes(&sets.train);
    let steps = job.steps(&sets.train);
    let e_count = config.stages;
    let swarm = Swarm::generate("pipeline")?;
    swarm.save(dir)?;
    for e in 0..e_count {
        swarm.issue_to(
            dir,
            &format!("stage-{e}"),
            Role::Stage,
            crate::swarm::LOCAL_DAYS,
        )?;
    }
    let logs = match &launch {
        Launch::Threads => None,
        Launch::Processes { .. } => {
            let logs = dir.join("logs");
            std::fs::create_dir_all(&logs)
                .map_err(|e| NodeError::io(format!("creating {}", logs.display()), e))?;
            Some(logs)
        }
    };
    progress(PipelineProgress::Started {
        sizes: sizes.clone(),
        dataset: sets.dataset,
        variant: config.variant,
        forward_codec: config.forward_codec.clone(),
        backward_codec: config.backward_codec.clone(),
        steps,
        logs: logs.clone(),
    });
    let started = Instant::now();
    let mut stages = match &launch {
        Launch::Threads => Stages::Threads(Vec::new()),
        Launch::Processes { .. } => Stages::Processes(Children(Vec::new())),
    };
    let (tx, rx) = mpsc::channel::<Report>();
    let mut prev_addr: Option<String> = None;
    for e in 0..e_count {
        let stage = StageConfig {
            index: e,
            listen: (e + 1 < e_count).then(|| "127.0.0.1:0".into()),
            connect: prev_addr.take(),
            rendezvous: None,
            session: None,
            swarm: dir.to_path_buf(),
            node: format!("stage-{e}"),
            weights_out: weights_path(dir, e),
            job: job.clone(),
            json_events: false,
        };
        let (addr_tx, addr_rx) = mpsc::channel();
        let log = logs.as_ref().map(|l| l.join(format!("stage-{e}.log")));
        match (&mut stages, &launch, &log) {
            (Stages::Threads(threads), _, _) => {
                threads.push(start_thread(stage, addr_tx, tx.clone())?);
            }
            (Stages::Processes(children), Launch::Processes { exe }, Some(log)) => {
                children.0.push((
                    format!("stage {e}"),
                    start_process(&stage, exe, log, addr_tx, tx.clone())?,
                ));
            }
            _ => unreachable!("processes come with a binary and logs"),
        }
        if e + 1 < e_count {
            let addr = match addr_rx.recv_timeout(Duration::from_secs(120)) {
                Ok(Ok(addr)) => addr,
                Ok(Err(message)) => return Err(NodeError::Thread(message)),
                Err(_) => {
                    return Err(NodeError::Thread(match &log {
                        Some(log) => format!(
                            "stage {e} did not start; the end of its log:\n{}",
                            log_tail(log)
                        ),
                        None => format!("stage {e} did not start"),
                    }))
                }
            };
            progress(PipelineProgress::Stage(StageEvent::Listening {
                stage: e,
                addr,
            }));
            prev_addr = Some(addr.to_string());
        }
    }
    drop(tx);

    let mut done = vec![None; e_count];
    let mut finished = 0;
    let mut last_loss = f64::NAN;
    while finished < e_count {
        let report = rx
            .recv()
            .map_err(|_| NodeError::Thread("the stages went silent".into()))?;
        match report {
            Report::Event(e, event) => {
                match &event {
                    StageEvent::Progress {
                        loss: Some(loss), ..
                    } => last_loss = *loss,
                    StageEvent::Done {
                        bytes_sent,
                        memory_floats,
                        ..
                    } => done[e] = Some((*bytes_sent, *memory_floats)),
                    _ => {}
                }
                progress(PipelineProgress::Stage(event));
            }
            Report::Ended(Some(error)) => return Err(NodeError::Thread(error)),
            Report::Ended(None) => finished += 1,
        }
    }
    match stages {
        Stages::Threads(threads) => {
            for thread in threads {
                let _ = thread.join();
            }
        }
        Stages::Processes(mut children) => children.wait_for("stage")?,
    }

    let model = reassemble(&config, &sizes, dir)?;
    let test_accuracy = image_accuracy(&Device::Cpu, &sets.test, 1000, |g, x| {
        model.forward(g, g.input(x))
    })?;
    if let Some(path) = &job.save {
        save_model(job, model, &sets, path)?;
    }
    let bytes: u64 = done.iter().flatten().map(|d| d.0).sum();
    let memory_floats: usize = done.iter().flatten().map(|d| d.1).sum();
    let widths: usize = (0..e_count - 1).map(|e| config.cut_width(e)).sum();
    Ok(PipelineOutcome {
        test_accuracy,
        final_loss: last_loss,
        bytes_per_step: bytes as f64 / steps.max(1) as f64,
        f32_bytes_per_step: 2 * 4 * config.batch * widths,
        memory_floats,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Where stage `e` writes its weights.
fn weights_path(dir: &Path, e: usize) -> PathBuf {
    dir.join(format!("stage-{e}.weights"))
}

/// Runs a stage on a thread of its own; its listening address goes to `addr_tx`, everything
/// else to `tx`.
fn start_thread(
    stage: StageConfig,
    addr_tx: mpsc::Sender<std::result::Result<SocketAddr, String>>,
    tx: mpsc::Sender<Report>,
) -> Result<JoinHandle<()>> {
    let e = stage.index;
    std::thread::Builder::new()
        .name(format!("murmur-stage-{e}"))
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| {
                run_stage(&stage, |event| match event {
                    StageEvent::Listening { addr, .. } => {
                        let _ = addr_tx.send(Ok(addr));
                    }
                    event => {
                        let _ = tx.send(Report::Event(e, event));
                    }
                })
            });
            let error = match std::panic::catch_unwind(run) {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(format!("stage {e} failed: {err}")),
                Err(p) => Some(format!("stage {e} panicked: {}", panic_message(&p))),
            };
            if let Some(error) = &error {
                // Whoever still waits for it to listen learns why it never will.
                let _ = addr_tx.send(Err(error.clone()));
            }
            let _ = tx.send(Report::Ended(error));
        })
        .map_err(|err| NodeError::io(format!("starting stage {e}'s thread"), err))
}

/// Starts `exe pipeline-stage ...` and a thread that reads its events: its listening address
/// goes to `addr_tx`, everything else to `tx`.
fn start_process(
    stage: &StageConfig,
    exe: &Path,
    log: &Path,
    addr_tx: mpsc::Sender<std::result::Result<SocketAddr, String>>,
    tx: mpsc::Sender<Report>,
) -> Result<std::process::Child> {
    let e = stage.index;
    let mut args: Vec<String> = vec![
        "pipeline-stage".into(),
        format!("--index={e}"),
        format!("--swarm={}", stage.swarm.display()),
        format!("--node={}", stage.node),
        format!("--weights-out={}", stage.weights_out.display()),
    ];
    if let Some(addr) = &stage.listen {
        args.push(format!("--listen={addr}"));
    }
    if let Some(addr) = &stage.connect {
        args.push(format!("--connect={addr}"));
    }
    args.extend(stage.job.to_args());
    let mut child = spawn_logged(exe, &args, log, false)?;
    let stdout = child.stdout.take().expect("piped");
    let log = log.to_path_buf();
    std::thread::spawn(move || {
        let mut done = false;
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            match serde_json::from_str::<StageEvent>(&line) {
                Ok(StageEvent::Listening { addr, .. }) => {
                    let _ = addr_tx.send(Ok(addr));
                }
                Ok(event) => {
                    done |= matches!(event, StageEvent::Done { .. });
                    let _ = tx.send(Report::Event(e, event));
                }
                Err(_) => {}
            }
        }
        let error = (!done).then(|| {
            format!(
                "stage {e} exited before finishing; the end of its log:\n{}",
                log_tail(&log)
            )
        });
        let _ = tx.send(Report::Ended(error));
    });
    Ok(child)
}

/// Puts the stages' weights back into one model.
fn reassemble(config: &PipelineConfig, sizes: &[usize], dir: &Path) -> Result<Mlp> {
    let mut mlp = Mlp::new(&Device::Cpu, sizes, Activation::Relu, config.seed)?;
    let mut weights = Vec::new();
    for e in 0..config.stages {
        let count: usize = mlp.layers[config.layers_of(e)]
            .iter()
            .map(|l| l.parameter_count())
            .sum();
        weights.extend(read_weights(&weights_path(dir, e), count)?);
    }
    let mut offset = 0;
    for p in mlp.parameters_mut() {
        let n = p.numel();
        *p = Tensor::from_vec(
            &Device::Cpu,
            p.shape(),
            weights[offset..offset + n].to_vec(),
        )?;
        offset += n;
    }
    Ok(mlp)
}

/// Writes the reassembled model as weights alone, described as the classifier it is, so
/// that `murmur eval` rebuilds and tests it.
fn save_model(job: &PipelineJob, model: Mlp, sets: &Sets, path: &Path) -> Result<()> {
    let config = ClassifierConfig {
        hidden: job.hidden.clone(),
        activation: Activation::Relu,
        seed: job.seed,
        ..ClassifierConfig::default()
    };
    let mut clf = Classifier::new(
        &Device::Cpu,
        sets.train.features(),
        sets.train.classes,
        &config,
    )?;
    clf.model = ClassifierModel::Mlp(model);
    clf.data = serde_json::json!({
        "dataset": job.dataset,
        "train_samples": sets.train.len(),
        "batch": job.batch,
        "epochs": job.epochs,
    });
    write_atomically(path, &clf.save_weights(Precision::F32)?)
}

/// Reads a stage's weights file: exactly `expected` finite f32 values.
fn read_weights(path: &Path, expected: usize) -> Result<Vec<f32>> {
    let bytes =
        std::fs::read(path).map_err(|e| NodeError::io(format!("reading {}", path.display()), e))?;
    if bytes.len() != 4 * expected {
        return Err(NodeError::Io(format!(
            "{} holds {} bytes; the stage has {expected} parameters ({} bytes)",
            path.display(),
            bytes.len(),
            4 * expected
        )));
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if values.iter().any(|v| !v.is_finite()) {
        return Err(NodeError::Io(format!(
            "{} holds non-finite parameters",
            path.display()
        )));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use murmur_engine::pipeline::Pipeline;

    use super::*;
    use crate::data::DeviceKind;

    #[test]
    fn a_job_round_trips_through_toml_and_typos_are_refused() {
        let job = PipelineJob {
            stages: 3,
            backward_codec: Some("qsgd:bits=6".into()),
            train_limit: Some(1280),
            ..PipelineJob::default()
        };
        let text = toml::to_string(&job).unwrap();
        assert_eq!(toml::from_str::<PipelineJob>(&text).unwrap(), job);
        assert!(toml::from_str::<PipelineJob>("stagse = 3").is_err());
    }

    /// Stages as threads over loopback QUIC train the bits of the in-process pipeline.
    #[test]
    fn stage_threads_train_the_in_process_bits() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        if !data.join("mnist").exists() {
            eprintln!("NOTICE: skipping: MNIST not fetched (scripts/fetch-data.sh)");
            return;
        }
        let job = PipelineJob {
            stages: 3,
            variant: "fu".into(),
            backward_codec: Some("qsgd:bits=6".into()),
            p: 0.5,
            dataset: "mnist".into(),
            epochs: 1,
            train_limit: Some(1280),
            hidden: vec![32, 16],
            seed: 1,
            data: Some(data),
            device: DeviceKind::Cpu,
            ..PipelineJob::default()
        };
        let dir = std::env::temp_dir().join(format!("murmur-node-pipeline-{}", std::process::id()));
        let (mut losses, mut reported_bytes) = (0, 0);
        let outcome = run_pipeline(&job, &dir, Launch::Threads, |p| {
            if let PipelineProgress::Stage(event) = &p {
                // What the metrics file gets: every stage's bytes since its previous report.
                let line = crate::Metrics::from_stage_event(event);
                reported_bytes += line.and_then(|m| m.bytes_up).unwrap_or(0);
            }
            if let PipelineProgress::Stage(StageEvent::Progress { loss: Some(_), .. }) = p {
                losses += 1;
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
        let outcome = outcome.unwrap();
        assert_eq!(losses, 10);

        let sets = job.load().unwrap();
        let config = job.config(&sets.train).unwrap();
        let mut p = Pipeline::new(config, &Device::Cpu, Arc::new(sets.train.into())).unwrap();
        let mut bytes = 0;
        for _ in 0..10 {
            bytes += p.step().unwrap().bytes;
        }
        assert_eq!(outcome.test_accuracy, p.accuracy(&sets.test, 1000).unwrap());
        assert_eq!(outcome.bytes_per_step, bytes as f64 / 10.0);
        assert_eq!(
            reported_bytes, bytes as u64,
            "the reports' bytes add up to the run's"
        );
        assert_eq!(outcome.memory_floats, 4 * 128 * (32 + 16));
    }
}
