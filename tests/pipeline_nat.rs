//! A pipeline whose two stages sit behind NATs of their own (network namespaces with nftables
//! NAT and a home router's firewall) trains through a rendezvous node: directly when both
//! NATs keep one public port per socket, through the rendezvous's relay when one is
//! symmetric. Either way every stage ends with the weights of the same pipeline run in one
//! process, bit for bit. Needs root, iproute2, nftables and MNIST: a skip elsewhere, a
//! failure under CI.
#![cfg(target_os = "linux")]

mod common;

use std::sync::{Arc, Mutex};
use std::thread;

use common::{have_mnist, RemovedOnDrop};
use murmur::engine::pipeline::Pipeline;
use murmur::engine::Device;
use murmur::net::identity::{Role, Swarm};
use murmur::net::nat::lab::{Host, Mapping, NatLab, PUBLIC};
use murmur::net::nat::Route;
use murmur::node::pipeline::{run_stage, PipelineJob, StageConfig, StageEvent};
use murmur::node::{DeviceKind, RendezvousConfig, RendezvousNode};

fn can_run() -> bool {
    if !have_mnist() {
        return false;
    }
    let Some(missing) = NatLab::missing() else {
        return true;
    };
    assert!(std::env::var_os("CI").is_none(), "under CI, {missing}");
    eprintln!("NOTICE: skipping: {missing}");
    false
}

fn job() -> PipelineJob {
    PipelineJob {
        stages: 2,
        variant: "fu".into(),
        codec: "topk:0.2".into(),
        backward_codec: Some("qsgd:bits=6".into()),
        p: 0.5,
        dataset: "mnist".into(),
        epochs: 1,
        train_limit: Some(640),
        hidden: vec![32],
        seed: 3,
        device: DeviceKind::Cpu,
        ..PipelineJob::default()
    }
}

/// Trains the job with stage 0 behind NAT A and stage 1 behind NAT B; returns each stage's
/// link route and its weights as written.
fn across_nats(a: Mapping, b: Mapping, name: &str) -> ([Route; 2], [Vec<u8>; 2], u64) {
    let dir = RemovedOnDrop::temp(name);
    let swarm = Swarm::generate("nat-pipeline").unwrap();
    swarm.save(&dir.0).unwrap();
    swarm
        .issue_to(&dir.0, "rendezvous", Role::Rendezvous, 1)
        .unwrap();
    for e in 0..2 {
        swarm
            .issue_to(&dir.0, &format!("stage-{e}"), Role::Stage, 1)
            .unwrap();
    }
    let lab = Arc::new(NatLab::create(a, b).unwrap());
    let rendezvous = lab
        .in_public(|| {
            RendezvousNode::start(RendezvousConfig {
                listen: format!("{PUBLIC}:0"),
                swarm: dir.0.clone(),
                ..RendezvousConfig::default()
            })
        })
        .unwrap()
        .unwrap();
    let at = rendezvous.local_addr().to_string();
    let routes = Arc::new(Mutex::new([None, None]));
    let stages: Vec<_> = [Host::A, Host::B]
        .into_iter()
        .enumerate()
        .map(|(e, host)| {
            let config = StageConfig {
                index: e,
                listen: None,
                connect: None,
                rendezvous: Some(at.clone()),
                session: Some(name.into()),
                swarm: dir.0.clone(),
                node: format!("stage-{e}"),
                weights_out: dir.0.join(format!("stage-{e}.f32")),
                job: job(),
                json_events: false,
            };
            let (lab, routes) = (lab.clone(), routes.clone());
            thread::spawn(move || {
                lab.in_host(host, || {
                    run_stage(&config, |event| {
                        if let StageEvent::Linked { stage, route, .. } = event {
                            routes.lock().unwrap()[stage] = Some(route);
                        }
                    })
                })
                .unwrap()
                .unwrap()
            })
        })
        .collect();
    for s in stages {
        s.join().unwrap();
    }
    let relayed = rendezvous.relayed().get().0;
    let routes = routes
        .lock()
        .unwrap()
        .map(|r| r.expect("each stage reports its link"));
    let weights = [0, 1].map(|e| std::fs::read(dir.0.join(format!("stage-{e}.f32"))).unwrap());
    (routes, weights, relayed)
}

/// The same job's stage weights, trained in this process.
fn in_process() -> [Vec<u8>; 2] {
    let job = job();
    let sets = job.load().unwrap();
    let config = job.config(&sets.train).unwrap();
    let steps = job.steps(&sets.train);
    let mut p = Pipeline::new(config, &Device::Cpu, Arc::new(sets.train.into())).unwrap();
    for _ in 0..steps {
        p.step().unwrap();
    }
    [0, 1].map(|e| {
        p.stages()[e]
            .weights()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    })
}

#[test]
fn stages_behind_nats_train_the_in_process_bits_directly_or_through_the_relay() {
    if !can_run() {
        return;
    }
    let want = in_process();
    let (routes, weights, relayed) = across_nats(
        Mapping::EndpointIndependent,
        Mapping::EndpointIndependent,
        "nat-direct",
    );
    assert_eq!(routes, [Route::Direct, Route::Direct]);
    assert_eq!(relayed, 0);
    assert!(
        weights == want,
        "a direct pipeline across NATs trained other bits"
    );
    let (routes, weights, relayed) = across_nats(
        Mapping::EndpointIndependent,
        Mapping::Symmetric,
        "nat-relayed",
    );
    assert_eq!(routes, [Route::Relayed, Route::Relayed]);
    assert!(relayed > 0);
    assert!(weights == want, "a relayed pipeline trained other bits");
}
