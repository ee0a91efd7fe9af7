//! The node library as an app embeds it: a server shard and three workers as threads of this
//! process. One worker (on the GPU) is paused mid-run: the pause takes effect within a second,
//! the paused worker issues no GPU work, the others keep training without it, and on resume it
//! rejoins and finishes with a replica equal to the others' bit for bit. A budget changes at
//! run time, and a stopped worker writes its checkpoint and says goodbye.

mod common;

use std::time::{Duration, Instant};

use common::{have_mnist, wait_for, RemovedOnDrop};
use murmur_engine::train::{Classifier, Saved};
use murmur_engine::Device;
use murmur_node::swarm::prepare;
use murmur_node::{
    Budget, DeviceKind, Event, Job, ServerConfig, ServerNode, Worker, WorkerConfig, WorkerHandle,
};
use tokio::sync::broadcast::Receiver;

fn job(workers: u16, max_steps: u64) -> Job {
    Job {
        workers,
        hidden: vec![32],
        batch: 32,
        epochs: 1,
        max_steps: Some(max_steps),
        train_limit: Some(8000),
        codec: "topk:0.1".into(),
        min_compress_bytes: 0,
        // No snapshot: a worker back from a pause replays from its own round.
        snapshot_every: 100_000,
        ..Job::default()
    }
}

/// A swarm folder with one server's and `workers` workers' certificates, removed when the
/// test ends; `None` (the test skips) where MNIST is not fetched.
fn swarm_dir(name: &str, workers: u16) -> Option<RemovedOnDrop> {
    if !have_mnist() {
        return None;
    }
    let dir = RemovedOnDrop::temp(name);
    prepare(&dir.0, 1, workers).unwrap();
    Some(dir)
}

fn server(dir: &std::path::Path, job: Job) -> murmur_node::ServerHandle {
    ServerNode::start(ServerConfig {
        listen: "127.0.0.1:0".into(),
        swarm: dir.to_path_buf(),
        node: "server-0".into(),
        job,
        ..ServerConfig::default()
    })
    .unwrap()
}

fn worker(
    dir: &std::path::Path,
    server: &murmur_node::ServerHandle,
    index: usize,
    device: DeviceKind,
) -> WorkerHandle {
    Worker::start(WorkerConfig {
        servers: vec![format!("localhost:{}", server.local_addr().port())],
        swarm: dir.to_path_buf(),
        node: format!("worker-{index}"),
        device,
        save: Some(dir.join(format!("worker-{index}.state"))),
        ..WorkerConfig::default()
    })
    .unwrap()
}

fn step_of(e: &Event) -> Option<u64> {
    match e {
        Event::Step { step, .. } => Some(*step),
        _ => None,
    }
}

/// Rounds per second over the next `rounds` live rounds (skipping those already reported),
/// and the round reached.
fn rounds_per_second(events: &mut Receiver<Event>, rounds: u64) -> (f64, u64) {
    let minute = Duration::from_secs(60);
    let mut before = wait_for(events, minute, step_of);
    while let Ok(e) = events.try_recv() {
        before = step_of(&e).unwrap_or(before);
    }
    let window = Instant::now();
    let after = wait_for(events, minute, |e| {
        step_of(e).filter(|s| *s >= before + rounds)
    });
    (
        (after - before) as f64 / window.elapsed().as_secs_f64(),
        after,
    )
}

#[test]
fn a_paused_worker_leaves_the_rounds_and_rejoins_with_the_same_bits() {
    let Some(dir) = swarm_dir("embedded-node", 3) else {
        return;
    };
    let total = 80;
    let server = server(&dir.0, job(3, total));
    let workers: Vec<WorkerHandle> = (0..3)
        .map(|i| {
            let device = if i == 2 {
                DeviceKind::Gpu
            } else {
                DeviceKind::Cpu
            };
            worker(&dir.0, &server, i, device)
        })
        .collect();
    let mut events: Vec<Receiver<Event>> = workers.iter().map(|w| w.events()).collect();
    let minute = Duration::from_secs(60);

    // Pause the GPU worker at its 20th round.
    wait_for(&mut events[2], minute, |e| step_of(e).filter(|s| *s >= 20));
    let asked = Instant::now();
    workers[2].pause();
    let paused_at = wait_for(&mut events[2], minute, |e| match e {
        Event::Paused { step, .. } => Some(*step),
        _ => None,
    });
    let pause_latency = asked.elapsed();
    assert!(
        pause_latency < Duration::from_secs(1),
        "the pause took {pause_latency:?}"
    );
    let gpu = workers[2].device().and_then(|d| d.as_gpu().cloned());
    let gpu_work = gpu.as_ref().map(|g| g.command_stats());

    // The others go on without it; a budget change is taken at run time.
    workers[1]
        .set_budget(Budget {
            duty_cycle: 0.5,
            max_steps_per_second: None,
        })
        .unwrap();
    assert!(workers[1]
        .set_budget(Budget {
            duty_cycle: 0.0,
            max_steps_per_second: None,
        })
        .is_err());
    let (paused_rate, after) = rounds_per_second(&mut events[0], 15);
    // Had the others waited for the paused worker, the round deadline (30 s) would hold
    // them: they would manage well under one round a second.
    assert!(
        paused_rate > 2.0,
        "{paused_rate} rounds/s while one worker was paused"
    );
    assert_eq!(
        gpu.as_ref().map(|g| g.command_stats()),
        gpu_work,
        "a paused worker issues no GPU work"
    );
    // Its stream stays quiet while it is paused.
    assert!(matches!(
        events[2].try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Empty)
    ));
    eprintln!(
        "pause took effect in {pause_latency:?} at round {paused_at}; the other two went on at {paused_rate:.1} rounds/s while it was paused"
    );

    workers[2].resume();
    let rejoined = wait_for(&mut events[2], minute, |e| match e {
        Event::Rejoined { step, .. } => Some(*step),
        _ => None,
    });
    assert!(rejoined >= after, "it caught up to round {rejoined}");
    let (full_rate, _) = rounds_per_second(&mut events[0], 15);
    eprintln!("with all three back: {full_rate:.1} rounds/s");

    let reports: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for r in &reports {
        assert_eq!(r.steps, total);
        assert!(!r.stopped);
    }
    // Every replica, the paused one included, ends with the same bits.
    let states: Vec<Vec<u8>> = (0..3)
        .map(|i| std::fs::read(dir.0.join(format!("worker-{i}.state"))).unwrap())
        .collect();
    assert!(states[0] == states[1] && states[1] == states[2]);
    drop(server);
}

/// A job of three places that starts with two (`start_with`): a third worker joins the
/// running job at round 20 with nothing but its credentials, and one of the first two leaves
/// at round 40. Nobody is restarted, the rounds go on, and the two that finish end with the
/// same bits (every round they also compared replica digests with shard 0).
#[test]
fn a_worker_joins_a_running_job_and_another_leaves() {
    join_and_leave("embedded-elastic", job(3, 80), 20, 25.0);
}

/// The same with outer rounds of 4 local steps and snapshots every 4 rounds: the newcomer
/// takes the outer loop's state from a snapshot, replays the rounds since, and ends with the
/// bits of the worker that stayed; the one that left cost the others nothing but its share.
#[test]
fn with_local_steps_a_worker_joins_and_another_leaves() {
    let job = Job {
        local_steps: Some(4),
        snapshot_every: 4,
        ..job(3, 32)
    };
    join_and_leave("embedded-elastic-local", job, 8, 8.0);
}

/// Runs `job` (three places) from two workers paced at `rounds_per_second`; a third joins
/// after round `at`, and the second leaves after round `2 * at`.
fn join_and_leave(name: &str, job: Job, at: u64, rounds_per_second: f64) {
    let Some(dir) = swarm_dir(name, 3) else {
        return;
    };
    let local_steps = job.local_steps.is_some();
    let total = job.max_steps.unwrap();
    let job = Job {
        start_with: Some(2),
        ..job
    };
    let server = server(&dir.0, job);
    let minute = Duration::from_secs(60);
    // Paced, so that the job is still running when the third worker comes.
    let paced = Budget {
        duty_cycle: 1.0,
        max_steps_per_second: Some(rounds_per_second),
    };
    let first: Vec<WorkerHandle> = (0..2)
        .map(|i| {
            let w = worker(&dir.0, &server, i, DeviceKind::Cpu);
            w.set_budget(paced).unwrap();
            w
        })
        .collect();
    let mut events = first[0].events();
    wait_for(&mut events, minute, |e| step_of(e).filter(|s| *s >= at));
    let third = worker(&dir.0, &server, 2, DeviceKind::Cpu);
    let mut third_events = third.events();
    let joined_at = wait_for(&mut third_events, minute, step_of);
    assert!(joined_at > at, "the newcomer's first round is {joined_at}");
    wait_for(&mut events, minute, |e| step_of(e).filter(|s| *s >= 2 * at));
    first[1].stop();
    let mut first = first.into_iter();
    let (staying, leaving) = (first.next().unwrap(), first.next().unwrap());
    let left = leaving.join().unwrap();
    assert!(
        left.stopped && left.steps >= 2 * at && left.steps < total,
        "{left:?}"
    );
    let reports = [staying.join().unwrap(), third.join().unwrap()];
    for r in &reports {
        assert_eq!((r.steps, r.stopped), (total, false));
    }
    eprintln!(
        "the third worker took part from round {joined_at}; the second left at round {}",
        left.steps
    );
    let state = |i: usize| std::fs::read(dir.0.join(format!("worker-{i}.state"))).unwrap();
    if local_steps {
        // The inner optimizer's state is each worker's own: the shared parameters agree.
        let parameters = |i: usize| {
            let saved = Saved::from_bytes(&state(i), &Device::Cpu).unwrap();
            Classifier::from_saved(saved)
                .unwrap()
                .parameter_bits()
                .unwrap()
        };
        assert!(
            parameters(0) == parameters(2),
            "the two that finished differ"
        );
    } else {
        assert!(state(0) == state(2), "the two that finished differ");
    }
    drop(server);
}

#[test]
fn a_stopped_worker_writes_its_checkpoint_and_leaves() {
    let Some(dir) = swarm_dir("embedded-stop", 2) else {
        return;
    };
    let server = server(&dir.0, job(1, 100_000));
    let w = worker(&dir.0, &server, 0, DeviceKind::Cpu);
    let mut events = w.events();
    wait_for(&mut events, Duration::from_secs(60), |e| {
        step_of(e).filter(|s| *s >= 5)
    });
    // The job's one place is taken: a second certificate is refused at once, with the reason,
    // rather than retried until the join time-out.
    let asked = Instant::now();
    let err = worker(&dir.0, &server, 1, DeviceKind::Cpu)
        .join()
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused") && err.contains("taken"), "{err}");
    assert!(asked.elapsed() < Duration::from_secs(5), "{err}");
    w.stop();
    let report = w.join().unwrap();
    assert!(report.stopped);
    assert!(report.steps >= 5 && report.steps < 100_000);
    let state = std::fs::read(dir.0.join("worker-0.state")).unwrap();
    assert!(!state.is_empty());
    // The job came from the server, not from the worker's config.
    assert_eq!(report.job, job(1, 100_000));
}

#[test]
fn a_worker_runs_from_inside_an_async_runtime() {
    let Some(dir) = swarm_dir("embedded-async", 1) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Everything below runs in an async task: no call may start a runtime of its own here.
    let report = runtime.block_on(async {
        let server = server(&dir.0, job(1, 100_000));
        let w = worker(&dir.0, &server, 0, DeviceKind::Cpu);
        let mut events = w.events();
        loop {
            match events.recv().await.unwrap() {
                Event::Step { step, .. } if step >= 3 => break,
                Event::Error { message, .. } => panic!("{message}"),
                _ => {}
            }
        }
        w.stop();
        let report = tokio::task::spawn_blocking(move || w.join())
            .await
            .unwrap()
            .unwrap();
        tokio::task::spawn_blocking(move || drop(server))
            .await
            .unwrap();
        report
    });
    assert!(report.stopped && report.steps >= 3);
}

#[test]
fn workers_calibrate_loco_alike_and_report_how_its_codes_sit() {
    // A `loco` codec that names no scale used to run at the codec's fixed 2^19 (most codes
    // clipped). Each worker now derives s from the first global batch: both derive the same
    // (the server takes only identical keys, so both training is the proof), and every round
    // reports its clipped codes and nonzero error entries.
    let Some(dir) = swarm_dir("embedded-loco", 2) else {
        return;
    };
    let loco = Job {
        codec: "loco".into(),
        memory: "loco-ema".into(),
        server_memory: "none".into(),
        pull_codec: Some("f32".into()),
        ..job(2, 4)
    };
    let server = server(&dir.0, loco);
    let workers: Vec<WorkerHandle> = (0..2)
        .map(|i| worker(&dir.0, &server, i, DeviceKind::Cpu))
        .collect();
    let mut events = workers[0].events();
    let (clipped, nonzero) = wait_for(&mut events, Duration::from_secs(120), |e| match e {
        Event::Step {
            saturated,
            error_nonzero,
            ..
        } => Some((*saturated, *error_nonzero)),
        _ => None,
    });
    assert!(clipped.is_some_and(|c| c < 0.5), "{clipped:?}");
    assert!(nonzero.is_some(), "{nonzero:?}");
    let reports: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(reports[0].steps, 4);
    let ran = &reports[0].job;
    assert!(ran.codec.starts_with("loco:log2s="), "{}", ran.codec);
    assert_ne!(ran.codec, "loco:log2s=19");
    assert!(ran.memory.starts_with("loco-ema:se="), "{}", ran.memory);
    assert_eq!(reports[1].job, *ran, "both workers ran one scale");
}

#[test]
fn a_recalibrating_job_moves_every_worker_to_the_same_loco_scale() {
    // A job that names a poor scale (the codec's old default, 2^19: most codes clip) and asks
    // for recalibration every epoch: at the second epoch's first round both workers measure
    // the same gradient, move to the same scale, the server follows, the codes stop clipping
    // and the replicas stay identical.
    let Some(dir) = swarm_dir("embedded-loco-recalibrate", 2) else {
        return;
    };
    let loco = Job {
        codec: "loco:bits=4:log2s=19".into(),
        memory: "loco-ema".into(),
        server_memory: "none".into(),
        epochs: 2,
        max_steps: None,
        train_limit: Some(256),
        loco_recalibrate_every: Some(1),
        ..job(2, 8)
    };
    let server = server(&dir.0, loco);
    let workers: Vec<WorkerHandle> = (0..2)
        .map(|i| worker(&dir.0, &server, i, DeviceKind::Cpu))
        .collect();
    let mut moves = Vec::new();
    for w in &workers {
        let mut events = w.events();
        let mut clipped_before = None;
        let (step, log2s, was) = wait_for(&mut events, Duration::from_secs(120), |e| match e {
            Event::Step { saturated, .. } => {
                clipped_before = *saturated;
                None
            }
            Event::Recalibrated {
                step, log2s, was, ..
            } => Some((*step, *log2s, *was)),
            _ => None,
        });
        let clipped_after = wait_for(&mut events, Duration::from_secs(120), |e| match e {
            Event::Step { saturated, .. } => Some(*saturated),
            _ => None,
        });
        assert!(
            clipped_before.is_some_and(|c| c > 0.5),
            "{clipped_before:?}"
        );
        assert!(clipped_after.is_some_and(|c| c < 0.1), "{clipped_after:?}");
        moves.push((step, log2s, was));
    }
    let reports: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    // 256 samples in global batches of 64: 4 rounds an epoch.
    assert_eq!(moves[0].0, 4, "the second epoch's first round");
    assert_eq!(moves[0].2, Some(19));
    assert!(moves[0].1 < 19, "{moves:?}");
    assert_eq!(moves[0], moves[1], "both workers moved alike");
    assert_eq!(reports[0].steps, 8);
    assert!(
        reports[0].job.codec.ends_with(":rescalable"),
        "{}",
        reports[0].job.codec
    );
    let state = |i: usize| std::fs::read(dir.0.join(format!("worker-{i}.state"))).unwrap();
    assert_eq!(state(0), state(1), "replicas differ");
}

#[test]
fn the_swarm_trains_the_gpt_and_its_workers_agree() {
    if !common::have_shakespeare() {
        return;
    }
    let dir = RemovedOnDrop::temp("embedded-gpt");
    prepare(&dir.0, 1, 2).unwrap();
    let job = Job {
        model: "gpt".into(),
        dataset: "shakespeare".into(),
        workers: 2,
        batch: 4,
        steps: Some(24),
        eval_every: Some(12),
        context: Some(16),
        layers: Some(1),
        dim: Some(16),
        heads: Some(2),
        lr: 3e-3,
        codec: "topk:0.1".into(),
        min_compress_bytes: 0,
        ..Job::default()
    };
    let server = server(&dir.0, job.clone());
    let workers: Vec<_> = (0..2)
        .map(|i| worker(&dir.0, &server, i, DeviceKind::Cpu))
        .collect();
    let mut events: Vec<_> = workers.iter().map(|w| w.events()).collect();
    let reports: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let mut validated = Vec::new();
    for events in &mut events {
        while let Ok(e) = events.try_recv() {
            if let Event::Validated {
                step, valid_loss, ..
            } = e
            {
                validated.push((step, valid_loss));
            }
        }
    }
    for r in &reports {
        assert_eq!((r.steps, r.final_accuracy), (24, None));
        assert_eq!(r.job, job);
    }
    // Every worker measures the last round: identical replicas give one loss.
    let losses: Vec<f64> = reports
        .iter()
        .map(|r| r.final_valid_loss.unwrap())
        .collect();
    assert_eq!(losses[0], losses[1], "the replicas differ");
    // One rank measures round 12 (the ranks take turns) and every worker round 24: the
    // model learns, from uniform guessing's ln 256 = 5.55 nats per byte.
    let at = |step| validated.iter().find(|(s, _)| *s == step).map(|(_, l)| *l);
    let (Some(middle), Some(end)) = (at(12), at(24)) else {
        panic!("rounds 12 and 24 are measured: {validated:?}");
    };
    assert_eq!(end, losses[0]);
    assert!(end < middle && middle < 5.5, "{validated:?}");
}

/// Shard 0 hands out the job's samples, and a worker that leaves mid-epoch loses none: the
/// share it held in the round it left goes back to the queue and to the worker that stays.
/// Two epochs of 640 samples over two workers (32 each a round, so 10 calm rounds an
/// epoch); one stops in the first epoch. The shard's saved state counts each epoch's
/// samples seen, exactly 640, and the rounds that took, which the staying worker played.
#[test]
fn a_worker_leaving_mid_epoch_loses_no_sample() {
    let Some(dir) = swarm_dir("embedded-samples", 2) else {
        return;
    };
    let state = dir.0.join("shard-0-state");
    let job = Job {
        epochs: 2,
        max_steps: None,
        train_limit: Some(640),
        ..job(2, 0)
    };
    let server = ServerNode::start(ServerConfig {
        listen: "127.0.0.1:0".into(),
        swarm: dir.0.clone(),
        node: "server-0".into(),
        job,
        state: Some(state.clone()),
        ..ServerConfig::default()
    })
    .unwrap();
    let paced = Budget {
        duty_cycle: 1.0,
        max_steps_per_second: Some(20.0),
    };
    let workers: Vec<WorkerHandle> = (0..2)
        .map(|i| {
            let w = worker(&dir.0, &server, i, DeviceKind::Cpu);
            w.set_budget(paced).unwrap();
            w
        })
        .collect();
    let mut events = workers[1].events();
    wait_for(&mut events, Duration::from_secs(60), |e| {
        step_of(e).filter(|s| *s >= 4)
    });
    workers[1].stop();
    let mut workers = workers.into_iter();
    let (staying, leaving) = (workers.next().unwrap(), workers.next().unwrap());
    let left = leaving.join().unwrap();
    assert!(left.stopped && left.steps < 10, "{left:?}");
    let stayed = staying.join().unwrap();
    assert!(!stayed.stopped, "{stayed:?}");
    drop(server);
    let saved = murmur::net::ps::durable::StateDir::create(&state)
        .unwrap()
        .load(1 << 30)
        .unwrap()
        .expect("the shard saved its state");
    let queue = saved.shard.queue.expect("shard 0 keeps the queue");
    let epochs = queue.epochs_done();
    assert_eq!(epochs.len(), 2, "{epochs:?}");
    assert!(epochs.iter().all(|e| e.seen == 640), "{epochs:?}");
    assert!(epochs[0].given_back > 0, "{epochs:?}");
    let rounds: u64 = epochs.iter().map(|e| e.rounds).sum();
    assert_eq!(stayed.steps, rounds, "{epochs:?}");
    assert!(rounds > 20, "the share given back took rounds: {epochs:?}");
}
