//! Shared pieces of the network tests: a swarm with in-memory credentials, server shards on
//! loopback, a tiny classifier and a synthetic task it can learn on the CPU.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::comm::Collective;
use murmur_engine::train::{Classifier, ClassifierConfig, DataParallel};
use murmur_engine::Device;
use murmur_net::identity::{Credentials, Role, Swarm};
use murmur_net::ps::{ClientOptions, QuicCollective, Server, ServerOptions};

pub const FEATURES: usize = 24;
pub const CLASSES: usize = 4;
pub const BATCH: usize = 16;

/// Server shards on loopback, served by their own runtime until dropped.
pub struct Servers {
    pub runtime: tokio::runtime::Runtime,
    pub addrs: Vec<SocketAddr>,
    /// Whether the servers serve a job (workers then join shard 0 for a rank ticket).
    pub job: bool,
    endpoints: Vec<quinn::Endpoint>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for e in &self.endpoints {
            e.close(0u32.into(), b"test over");
        }
    }
}

pub fn start_servers(swarm: &Swarm, shards: u16, options: ServerOptions) -> Servers {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut addrs = Vec::new();
    let mut endpoints = Vec::new();
    for shard in 0..shards {
        let creds = swarm
            .credentials(&format!("server-{shard}"), Role::Server { shard })
            .unwrap();
        let options = ServerOptions {
            shard,
            shards,
            ..options.clone()
        };
        let server = runtime.block_on(async {
            Server::bind("127.0.0.1:0".parse().unwrap(), &creds, options).unwrap()
        });
        addrs.push(server.local_addr().unwrap());
        endpoints.push(server.endpoint());
        runtime.spawn(server.run());
    }
    Servers {
        runtime,
        addrs,
        job: options.job.is_some(),
        endpoints,
    }
}

/// Options under which every round waits for every member (up to the deadline): what runs
/// compared bit for bit with in-process runs, and the deadline's own tests, need.
pub fn every_member() -> ServerOptions {
    ServerOptions {
        quorum: murmur_net::ps::quorum::QuorumRule::ALL,
        ..ServerOptions::default()
    }
}

pub fn client_options() -> ClientOptions {
    ClientOptions {
        round_timeout: Duration::from_secs(60),
        start_timeout: Duration::from_secs(60),
        ..ClientOptions::default()
    }
}

pub fn worker(swarm: &Swarm, servers: &[SocketAddr], rank: u16, world: u16) -> QuicCollective {
    worker_with(swarm, servers, rank, world, client_options())
}

pub fn worker_with(
    swarm: &Swarm,
    servers: &[SocketAddr],
    rank: u16,
    world: u16,
    options: ClientOptions,
) -> QuicCollective {
    let creds: Credentials = swarm
        .credentials(&format!("worker-{rank}"), Role::Worker)
        .unwrap();
    QuicCollective::connect(
        servers,
        &creds,
        rank,
        world,
        &format!("worker-{rank}"),
        options,
    )
    .unwrap()
}

/// Runs `rank` for every rank of a `world` of workers on threads of their own, each with a
/// classifier trained through `servers` with `plan` and error feedback, and connected with
/// `options`; returns what each gave back, in rank order. Where the servers serve a job, the
/// workers join shard 0 first, one after the other, so that worker r holds rank r and its
/// ticket.
pub fn on_every_rank<T: Send>(
    swarm: &Swarm,
    servers: &Servers,
    world: u16,
    plan: &PartitionPlan,
    options: ClientOptions,
    rank: impl Fn(u16, DataParallel<QuicCollective>) -> T + Sync,
) -> Vec<T> {
    let seats: Vec<(Credentials, ClientOptions)> = (0..world)
        .map(|r| {
            let creds = swarm
                .credentials(&format!("worker-{r}"), Role::Worker)
                .unwrap();
            let mut options = options.clone();
            if servers.job {
                let welcome =
                    murmur_net::ps::join_job(servers.addrs[0], &creds, "w", &options).unwrap();
                assert_eq!(
                    welcome.rank, r,
                    "ranks are handed out in the order of joining"
                );
                options.ticket = Some(welcome.ticket);
            }
            (creds, options)
        })
        .collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = seats
            .into_iter()
            .enumerate()
            .map(|(r, (creds, options))| {
                let rank = &rank;
                let r = r as u16;
                s.spawn(move || {
                    let c = QuicCollective::connect(
                        &servers.addrs,
                        &creds,
                        r,
                        world,
                        &format!("worker-{r}"),
                        options,
                    )
                    .unwrap();
                    rank(r, DataParallel::new(classifier(), c, plan, "ef").unwrap())
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// Trains `steps` rounds on each of the in-process `collectives` (one thread per rank) and
/// returns each rank's final bits.
pub fn train_in_process(
    collectives: Vec<murmur_engine::comm::local::LocalCollective>,
    plan: &PartitionPlan,
    steps: u64,
) -> Vec<Vec<u32>> {
    train_in_process_with(collectives, plan, steps, |_| {})
}

/// [`train_in_process`], with `setup` called on each rank before its first round.
pub fn train_in_process_with(
    collectives: Vec<murmur_engine::comm::local::LocalCollective>,
    plan: &PartitionPlan,
    steps: u64,
    setup: impl Fn(&mut DataParallel<murmur_engine::comm::local::LocalCollective>) + Sync,
) -> Vec<Vec<u32>> {
    std::thread::scope(|s| {
        let joins: Vec<_> = collectives
            .into_iter()
            .map(|c| {
                let setup = &setup;
                s.spawn(move || {
                    let mut dp = DataParallel::new(classifier(), c, plan, "ef").unwrap();
                    setup(&mut dp);
                    train(&mut dp, steps);
                    bits(&dp.replica)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

pub fn classifier() -> Classifier {
    let config = ClassifierConfig {
        hidden: vec![16],
        seed: 11,
        lr: 1e-2,
        ..ClassifierConfig::default()
    };
    Classifier::new(&Device::Cpu, FEATURES, CLASSES, &config).unwrap()
}

/// Several keys per tensor, compressed both ways with error feedback on both sides.
pub fn plan(push: &str, pull: &str) -> PartitionPlan {
    PartitionPlan {
        partition_bytes: 256,
        min_compress_bytes: 0,
        push: push.into(),
        pull: pull.into(),
        server_memory: "ef".into(),
        seed: 9,
    }
}

/// A learnable task: the class is the argmax of a fixed linear map of the features.
/// Rank `rank`'s batch of round `step` is a pure function of both.
pub fn batch(step: u64, rank: usize) -> (Vec<f32>, Vec<u32>) {
    let mut state = (step * 1_000_003 + rank as u64 * 7919 + 1) as u32;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state as f32 / u32::MAX as f32) * 2.0 - 1.0
    };
    let mut x = Vec::with_capacity(BATCH * FEATURES);
    let mut y = Vec::with_capacity(BATCH);
    for _ in 0..BATCH {
        let row: Vec<f32> = (0..FEATURES).map(|_| next()).collect();
        let score = |c: usize| -> f32 {
            row.iter()
                .enumerate()
                .map(|(i, v)| {
                    if (i + c).is_multiple_of(CLASSES) {
                        *v
                    } else {
                        -0.3 * v
                    }
                })
                .sum()
        };
        let label = (0..CLASSES)
            .max_by(|a, b| score(*a).total_cmp(&score(*b)))
            .unwrap();
        x.extend(row);
        y.push(label as u32);
    }
    (x, y)
}

pub fn bits(clf: &Classifier) -> Vec<u32> {
    clf.parameter_bits().unwrap()
}

/// Trains one rank for rounds `dp.round()..steps`.
pub fn train<C: Collective>(dp: &mut DataParallel<C>, steps: u64) {
    while dp.round() < steps {
        let rank = dp.collective.rank();
        let (x, y) = batch(dp.round(), rank);
        dp.step((&x, &y), rank * BATCH).unwrap();
    }
}

/// One key of four f32 elements, plain both ways, with no server memory.
pub fn f32_key(key: murmur_engine::comm::Key) -> murmur_engine::comm::KeySpec {
    murmur_engine::comm::KeySpec {
        key,
        numel: 4,
        push: "f32".into(),
        pull: "f32".into(),
        server_memory: "none".into(),
        seed: 1,
        sync_every: 0,
        owner: String::new(),
    }
}

/// An f32 key's payload of `values`, as a worker's codec encodes it.
pub fn f32_payload(values: &[f32]) -> Vec<u8> {
    murmur_engine::compress::parse("f32")
        .unwrap()
        .encode(values, &Default::default())
}

/// A push frame's payload as a worker sends it: one sample's worth of f32 values.
pub fn f32_push(values: &[f32]) -> Vec<u8> {
    [&1u32.to_le_bytes()[..], &f32_payload(values)].concat()
}

/// Two shards with the default quorum (half the members, then a wait of at least 0.5 s), a
/// 60 s hard deadline, and `job` if given: what the quorum tests run against.
pub fn quorum_servers(swarm: &Swarm, job: Option<murmur_net::ps::JobOffer>) -> Servers {
    start_servers(
        swarm,
        2,
        ServerOptions {
            deadline: Duration::from_secs(60),
            job,
            ..ServerOptions::default()
        },
    )
}
