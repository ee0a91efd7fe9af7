//! Embedding murmur in an app, the way a desktop program that lends its owner's GPU would:
//! start a node, show progress from its events, step aside while the owner is busy, lower the
//! GPU budget at run time, and stop cleanly.
//!
//! To have something to join, this example starts a small swarm of its own (one server shard,
//! three workers, all threads of this process) and steers one of its workers. An app joining
//! a real swarm starts only its worker: `Worker::start(WorkerConfig { servers, swarm, node,
//! .. })`, with the servers' address and its certificate.
//!
//! ```text
//! scripts/fetch-data.sh      # MNIST into ./data
//! cargo run --release --example embed_worker
//! ```

use std::time::{Duration, Instant};

use murmur::node::swarm::{Launch, LocalSwarm, SwarmConfig};
use murmur::node::{Budget, Event, Job};

/// Stands in for "the owner is using the machine": busy from round 60 to round 120.
fn owner_is_busy(step: u64) -> bool {
    (60..120).contains(&step)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Before any thread starts: keeps Mesa's window-system layer quiet on headless machines,
    // and has glibc reuse a training step's large blocks rather than map them anew each step.
    murmur::node::platform::quiet_mesa_wsi();
    murmur::node::platform::keep_large_blocks_for_reuse();
    let dir = std::env::temp_dir().join(format!("murmur-embed-{}", std::process::id()));
    let job = Job {
        workers: 3,
        hidden: vec![128],
        epochs: 1,
        max_steps: Some(150),
        codec: "topk:0.01".into(),
        ..Job::default()
    };
    let swarm = LocalSwarm::start(SwarmConfig::new(1, job, dir.clone()), Launch::Threads)?;
    // "Our" node is worker 0; the other two stand for the rest of the swarm.
    let me = swarm.worker(0).expect("threads have handles");
    let mut events = me.events();
    let started = Instant::now();
    let mut paused_since = None;
    loop {
        let event = match events.blocking_recv() {
            Ok(e) => e,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                eprintln!("(skipped {n} events)");
                continue;
            }
            Err(_) => break,
        };
        match event {
            Event::Waiting { what } => println!("waiting for {what}"),
            Event::Assigned { rank, world } => println!("rank {rank} of {world}"),
            Event::Joined {
                rank, world, steps, ..
            } => {
                println!("joined as rank {rank} of {world}; {steps} rounds to go")
            }
            Event::Step {
                step, loss, pushed, ..
            } => {
                if step % 20 == 0 {
                    println!("round {step}: loss {loss:.3}, {pushed} bytes up");
                }
                if owner_is_busy(step) && paused_since.is_none() {
                    println!("the owner is busy: stepping aside");
                    paused_since = Some(Instant::now());
                    me.pause();
                }
                if step == 130 {
                    println!("lowering the GPU budget to half the time");
                    me.set_budget(Budget {
                        duty_cycle: 0.5,
                        max_steps_per_second: None,
                    })?;
                }
                if step == 145 {
                    println!("the app is closing: stopping the node");
                    me.stop();
                }
            }
            Event::Recalibrated { step, log2s, .. } => {
                println!("round {step}: LoCo's scale moved to 2^{log2s}")
            }
            Event::Validated {
                step, valid_loss, ..
            } => println!("round {step}: validation loss {valid_loss:.4} nats/byte"),
            Event::Paused { step, .. } => {
                let took = paused_since.map_or(Duration::ZERO, |t| t.elapsed());
                println!("paused at round {step} ({took:?} after asking); the swarm trains on");
                // The owner is busy for a while; the other workers keep training.
                std::thread::sleep(Duration::from_secs(3));
                println!("the owner is idle again: resuming");
                me.resume();
            }
            Event::Rejoined { step, reason, .. } => {
                println!("rejoined at round {step} (after: {reason})")
            }
            Event::Evaluated { accuracy, .. } => {
                println!("test accuracy {:.2}%", 100.0 * accuracy)
            }
            Event::Error { message, .. } => return Err(message.into()),
            Event::Done { steps, stopped, .. } => {
                println!(
                    "our node is done after {steps} rounds ({}) in {:.1} s",
                    if stopped { "stopped" } else { "the job ended" },
                    started.elapsed().as_secs_f64()
                );
                break;
            }
            // Kinds of event a later murmur adds.
            _ => {}
        }
    }
    // The rest of the swarm finishes the job without us.
    swarm.finish()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
