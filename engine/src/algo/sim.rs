//! Simulated data-parallel training: N workers as threads of this process, joined by the
//! in-process collective, training a classifier on an image set with one of the algorithms.
//! What `murmur repro liec` runs; the same workers run over QUIC with a `QuicCollective`.

use std::sync::mpsc;
use std::time::Instant;

use super::norm2;
use super::replica::set_flat_params;
use super::{
    Blocking, ClassifierReplica, Method, MethodSpec, OptimizerSpec, Replica, Setup, Worker,
};
use crate::comm::local::local_collectives;
use crate::comm::Collective;
use crate::data::{epoch_batches, ImageSet};
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::stats::Mean;
use crate::tensor::Device;
use crate::train::{rank_share, rank_slice, Classifier, ClassifierConfig};

/// One simulated data-parallel training run: an algorithm, its codec and optimizer, and the
/// workers, data and model it trains in-process.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The distributed algorithm the workers run.
    pub method: MethodSpec,
    /// Codec spec the algorithm compresses with, e.g. `topk:0.01`.
    pub codec: String,
    /// The optimizer the parameters' owner steps.
    pub optimizer: OptimizerSpec,
    /// How the flat parameter vector is cut into compression blocks.
    pub blocking: Blocking,
    /// Number of simulated workers, each with its own replica and slice of the data.
    pub workers: usize,
    /// Samples per worker per step.
    pub batch: usize,
    /// Passes over the training set.
    pub epochs: u32,
    /// Learning rate at epoch 0, before any decay of `decay_at`.
    pub lr: f32,
    /// Epochs at whose start the learning rate is multiplied by 0.1.
    pub decay_at: Vec<u32>,
    /// Decoupled weight decay the optimizer applies.
    pub weight_decay: f32,
    /// Seeds the model, the data order and the codecs.
    pub seed: u64,
    /// The classifier every worker trains, built identically from `seed` on each.
    pub model: ClassifierConfig,
}

impl SimConfig {
    /// The learning rate of epoch `epoch` (step decay).
    pub fn lr_at(&self, epoch: u32) -> f32 {
        let decays = self.decay_at.iter().filter(|&&e| e <= epoch).count();
        self.lr * 0.1f32.powi(decays as i32)
    }
}

/// What one epoch of a simulation measured (as the reproductions' JSON records it).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EpochReport {
    /// The epoch measured, counted from 0.
    pub epoch: u32,
    /// Mean training loss over the epoch's steps and workers.
    pub train_loss: f64,
    /// Test accuracy of the average of the workers' models (the models differ between syncs
    /// in LIEC-SGD and CSER; elsewhere they are equal), or of EF21-P's true iterate.
    pub test_accuracy: f64,
    /// `|avg_i e_i + e_server|` at the end of the epoch (liec-sgd.md Fig. 8); in model units
    /// for EF21-P, whose server memory is `w − x`.
    pub error_norm: f64,
    /// Fraction of nonzero entries in worker 0's error at the end of the epoch (LoCo's
    /// diagnostic of an error stuck at zero, loco.md §7.2); `None` where it keeps none.
    pub worker_error_nonzero: Option<f64>,
    /// Mean contraction δ of the workers' compressed pushes over the epoch.
    pub worker_contraction: Option<f64>,
    /// Mean contraction δ of the server's compressed replies over the epoch.
    pub server_contraction: Option<f64>,
    /// Bytes pushed and pulled by all workers in this epoch, counted.
    pub bytes: u64,
    /// Wall-clock seconds from the start of the run to the end of this epoch's evaluation
    /// (cumulative, not per epoch).
    pub seconds: f64,
}

/// One worker's state at the end of an epoch.
struct EpochEnd {
    x: Vec<f32>,
    worker_error: Option<Vec<f32>>,
    server_error: Option<Vec<f32>>,
    loss_sum: f64,
    contraction: Mean,
    server_contraction: Mean,
    bytes: u64,
}

/// Steps per epoch: whole global batches only, so that every worker has a full batch.
pub fn steps_per_epoch(samples: usize, workers: usize, batch: usize) -> usize {
    samples / (workers * batch).max(1)
}

/// Runs `config` on `train`, evaluating on `test` after every epoch; `on_epoch` sees each
/// report as it is made.
pub fn simulate(
    config: &SimConfig,
    train: &ImageSet,
    test: &ImageSet,
    device: &Device,
    mut on_epoch: impl FnMut(&EpochReport),
) -> Result<Vec<EpochReport>> {
    let world = config.workers;
    let per_epoch = steps_per_epoch(train.len(), world, config.batch);
    if world == 0 || per_epoch == 0 {
        return Err(Error::Config(format!(
            "{world} workers with batches of {} need more than {} training samples",
            config.batch,
            train.len()
        )));
    }
    let (features, classes) = (train.features(), train.classes);
    let new_classifier = || Classifier::new(device, features, classes, &config.model);
    let mut eval = new_classifier()?;
    let evaluated = config.method.build(
        &config.codec,
        &Setup {
            world,
            sizes: eval.model.parameters().iter().map(|p| p.numel()).collect(),
            optimizer: config.optimizer,
        },
    )?;
    let (tx, rx) = mpsc::channel::<(usize, EpochEnd)>();
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for collective in local_collectives(world) {
            let tx = tx.clone();
            joins.push(s.spawn(move || -> Result<()> {
                let rank = collective.rank();
                let mut cache: Option<(u64, Vec<Vec<usize>>)> = None;
                let batch_of = move |step: u64| {
                    let epoch = step / per_epoch as u64;
                    if cache.as_ref().map(|c| c.0) != Some(epoch) {
                        let order = epoch_batches(
                            train.len(),
                            world * config.batch,
                            config.seed,
                            epoch as u32,
                        );
                        cache = Some((epoch, order));
                    }
                    let global = &cache.as_ref().expect("just filled").1[step as usize % per_epoch];
                    train.batch(rank_slice(global, rank, world))
                };
                let mut replica = ClassifierReplica::new(new_classifier()?, batch_of)
                    .sharing_from(rank_share(world * config.batch, rank, world).start);
                let mut worker = Worker::new(
                    config.method,
                    &config.codec,
                    config.optimizer,
                    config.blocking,
                    config.seed,
                    &replica as &dyn Replica,
                    Box::new(collective),
                )?;
                worker.exchange.measure_server = rank == 0;
                for epoch in 0..config.epochs {
                    let lr = config.lr_at(epoch);
                    let (mut loss_sum, mut contraction, mut server_contraction) =
                        (0.0, Mean::default(), Mean::default());
                    let bytes_before = worker.exchange.traffic;
                    for _ in 0..per_epoch {
                        worker.exchange.last_contraction = None;
                        loss_sum += worker.step(&mut replica, lr, config.weight_decay)? as f64;
                        contraction.add(worker.exchange.last_contraction);
                        server_contraction.add(worker.exchange.last_server_contraction.take());
                    }
                    let t = worker.exchange.traffic;
                    let end = EpochEnd {
                        x: worker.x.clone(),
                        worker_error: worker.method.worker_error(),
                        server_error: if rank == 0 {
                            worker.exchange.server_error()
                        } else {
                            None
                        },
                        loss_sum,
                        contraction,
                        server_contraction,
                        bytes: t.pushed + t.pulled - bytes_before.pushed - bytes_before.pulled,
                    };
                    if tx.send((rank, end)).is_err() {
                        break;
                    }
                }
                Ok(())
            }));
        }
        drop(tx);
        let mut reports = Vec::new();
        let started = Instant::now();
        'epochs: for epoch in 0..config.epochs {
            let mut ends: Vec<Option<EpochEnd>> = (0..world).map(|_| None).collect();
            for _ in 0..world {
                match rx.recv() {
                    Ok((rank, end)) => ends[rank] = Some(end),
                    Err(_) => break 'epochs,
                }
            }
            let ends: Vec<EpochEnd> = ends.into_iter().map(|e| e.expect("one per rank")).collect();
            let report = summarize(
                epoch,
                &ends,
                per_epoch,
                (&*evaluated, &mut eval),
                test,
                started,
            )?;
            on_epoch(&report);
            reports.push(report);
        }
        drop(rx);
        for j in joins {
            j.join()
                .map_err(|_| Error::Data("a simulated worker panicked".into()))??;
        }
        Ok(reports)
    })
}

fn summarize(
    epoch: u32,
    ends: &[EpochEnd],
    per_epoch: usize,
    (method, eval): (&dyn Method, &mut Classifier),
    test: &ImageSet,
    started: Instant,
) -> Result<EpochReport> {
    let world = ends.len();
    let d = ends[0].x.len();
    let inv = 1.0 / world as f32;
    // Sums in rank order, as everywhere.
    let mut average = vec![0.0f32; d];
    let mut error = vec![0.0f32; d];
    for end in ends {
        average.iter_mut().zip(&end.x).for_each(|(a, x)| *a += x);
        if let Some(e) = &end.worker_error {
            error.iter_mut().zip(e).for_each(|(a, e)| *a += e * inv);
        }
    }
    average.iter_mut().for_each(|a| *a *= inv);
    if let Some(e) = &ends[0].server_error {
        error.iter_mut().zip(e).for_each(|(a, e)| *a += e);
    }
    set_flat_params(
        eval,
        &method.evaluated_model(&average, ends[0].server_error.as_deref()),
    )?;
    let (mut contraction, mut server_contraction) = (Mean::default(), Mean::default());
    for end in ends {
        contraction.merge(end.contraction);
        server_contraction.merge(end.server_contraction);
    }
    Ok(EpochReport {
        epoch,
        train_loss: ends.iter().map(|e| e.loss_sum).sum::<f64>() / (world * per_epoch) as f64,
        test_accuracy: eval.accuracy(test, 1000)?,
        error_norm: norm2(&error).sqrt(),
        worker_error_nonzero: ends[0]
            .worker_error
            .as_ref()
            .map(|e| e.iter().filter(|v| **v != 0.0).count() as f64 / e.len().max(1) as f64),
        worker_contraction: contraction.get(),
        server_contraction: server_contraction.get(),
        bytes: ends.iter().map(|e| e.bytes).sum(),
        seconds: started.elapsed().as_secs_f64(),
    })
}
