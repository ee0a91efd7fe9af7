//! Per-link compression: workers of one job push with different codecs (one it names, one
//! chosen by `--push-codec auto` from a measured path), the servers decode each push with its
//! sender's codec, the replies stay one for all, and the replicas agree bit for bit (the
//! servers compare their digests every round and stop a worker whose replica differs). A
//! worker naming a codec the job does not allow is refused.

mod common;

use common::{have_mnist, RemovedOnDrop};
use murmur_node::swarm::prepare;
use murmur_node::{
    DeviceKind, Event, Job, ServerConfig, ServerNode, Worker, WorkerConfig, WorkerReport,
};

fn job() -> Job {
    Job {
        workers: 2,
        hidden: vec![32],
        batch: 32,
        epochs: 1,
        max_steps: Some(12),
        train_limit: Some(2000),
        codec: "topk:0.1".into(),
        pull_codec: Some("topk:0.05".into()),
        push_codecs: vec!["topk:0.01".into()],
        push_budget_ms: Some(10_000.0),
        min_compress_bytes: 0,
        ..Job::default()
    }
}

/// Runs the job's two workers with these push codecs; returns each one's codec (from its
/// joined event) and report.
fn run(dir: &std::path::Path, codecs: [&str; 2]) -> Vec<(String, WorkerReport)> {
    let server = ServerNode::start(ServerConfig {
        listen: "127.0.0.1:0".into(),
        swarm: dir.to_path_buf(),
        node: "server-0".into(),
        job: job(),
        ..ServerConfig::default()
    })
    .unwrap();
    let workers: Vec<_> = codecs
        .iter()
        .enumerate()
        .map(|(i, codec)| {
            Worker::start(WorkerConfig {
                servers: vec![format!("127.0.0.1:{}", server.local_addr().port())],
                swarm: dir.to_path_buf(),
                node: format!("worker-{i}"),
                device: DeviceKind::Cpu,
                push_codec: Some(codec.to_string()),
                ..WorkerConfig::default()
            })
            .unwrap()
        })
        .collect();
    let mut events: Vec<_> = workers.iter().map(|w| w.events()).collect();
    let reports: Vec<WorkerReport> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    events
        .iter_mut()
        .zip(reports)
        .map(|(events, report)| {
            let mut codec = None;
            while let Ok(e) = events.try_recv() {
                if let Event::Joined { codec: c, .. } = e {
                    codec = Some(c);
                }
            }
            (codec.expect("a joined event"), report)
        })
        .collect()
}

#[test]
fn workers_push_their_own_codecs_and_keep_identical_replicas() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("push-codecs");
    prepare(&dir.0, 1, 2).unwrap();
    let ran = run(&dir.0, ["topk:0.01", "auto"]);
    // Loopback moves a round's pushes far within the budget: auto takes the job's codec.
    assert_eq!(ran[0].0, "topk:0.01");
    assert_eq!(ran[1].0, "topk:0.1");
    for (_, report) in &ran {
        assert_eq!(report.steps, 12);
    }
    // A tenth of the elements: the harder code pushes far fewer bytes for the same rounds.
    assert!(
        ran[0].1.bytes_pushed * 5 < ran[1].1.bytes_pushed,
        "{} against {}",
        ran[0].1.bytes_pushed,
        ran[1].1.bytes_pushed
    );
    // The replies are the same for both.
    assert_eq!(ran[0].1.bytes_pulled, ran[1].1.bytes_pulled);
}

#[test]
fn a_push_codec_the_job_does_not_allow_is_refused() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("push-codecs-refused");
    prepare(&dir.0, 1, 1).unwrap();
    let server = ServerNode::start(ServerConfig {
        listen: "127.0.0.1:0".into(),
        swarm: dir.0.clone(),
        node: "server-0".into(),
        job: Job {
            workers: 1,
            ..job()
        },
        ..ServerConfig::default()
    })
    .unwrap();
    let worker = Worker::start(WorkerConfig {
        servers: vec![format!("127.0.0.1:{}", server.local_addr().port())],
        swarm: dir.0.clone(),
        node: "worker-0".into(),
        device: DeviceKind::Cpu,
        push_codec: Some("topk:0.5".into()),
        join_timeout_s: 30.0,
        ..WorkerConfig::default()
    })
    .unwrap();
    let err = worker.join().unwrap_err().to_string();
    assert!(err.contains("topk:0.5") && err.contains("allows"), "{err}");
}
