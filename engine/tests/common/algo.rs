//! The data-parallel algorithms' test harness: a least-squares problem whose gradients are
//! computed on the CPU, and N workers as threads joined by the in-process collective, each
//! step of every worker recorded.

use murmur_engine::algo::{Blocking, MethodSpec, OptimizerSpec, Replica, Worker};
use murmur_engine::comm::local::local_collectives;
use murmur_engine::rng::Rng;
use murmur_engine::Result;

/// Two parameter tensors of 37 and 5 elements (two blocks with a 100-byte bucket).
pub const SIZES: [usize; 2] = [37, 5];
pub const D: usize = 42;
const ROWS: usize = 64;
const BATCH: usize = 4;
pub const SEED: u64 = 17;

/// `0.5 · mean (a_j·x − b_j)²` over this worker's batch; the batch of (rank, step) is fixed.
pub struct LeastSquares {
    a: Vec<f32>,
    b: Vec<f32>,
    pub x: Vec<f32>,
    rank: usize,
}

impl LeastSquares {
    pub fn new(rank: usize) -> Self {
        let mut rng = Rng::new(99, 0);
        let a = (0..ROWS * D).map(|_| rng.normal()).collect();
        let b = (0..ROWS).map(|_| rng.normal()).collect();
        let mut init = Rng::new(98, 0);
        let x = (0..D).map(|_| 0.3 * init.normal()).collect();
        LeastSquares { a, b, x, rank }
    }
}

impl Replica for LeastSquares {
    fn sizes(&self) -> Vec<usize> {
        SIZES.to_vec()
    }

    fn params(&self) -> Result<Vec<f32>> {
        Ok(self.x.clone())
    }

    fn set_params(&mut self, flat: &[f32]) -> Result<()> {
        self.x = flat.to_vec();
        Ok(())
    }

    fn loss_and_gradient(&mut self, step: u64) -> Result<(f32, Vec<f32>)> {
        let mut rng = Rng::new(step, self.rank as u32);
        let mut g = vec![0.0f32; D];
        let mut loss = 0.0;
        for _ in 0..BATCH {
            let j = rng.below(ROWS);
            let row = &self.a[j * D..(j + 1) * D];
            let residual = row.iter().zip(&self.x).map(|(a, x)| a * x).sum::<f32>() - self.b[j];
            loss += 0.5 * residual * residual / BATCH as f32;
            g.iter_mut()
                .zip(row)
                .for_each(|(g, a)| *g += a * residual / BATCH as f32);
        }
        Ok((loss, g))
    }
}

/// Everything a run did, step by step.
pub struct Trace {
    /// `x[t][i]`: worker i's model after step t.
    pub x: Vec<Vec<Vec<f32>>>,
    /// `g[t][i]`: worker i's gradient of step t (at its model before the step).
    pub g: Vec<Vec<Vec<f32>>>,
    /// The server's error after step t.
    pub server_error: Vec<Vec<f32>>,
    /// `worker_error[t][i]`: worker i's own error after step t (empty where it keeps none).
    pub worker_error: Vec<Vec<Vec<f32>>>,
    /// Bytes all workers pushed and pulled in all.
    pub bytes: u64,
    pub x0: Vec<f32>,
}

pub struct Run {
    pub method: MethodSpec,
    pub codec: &'static str,
    pub blocking: Blocking,
    pub workers: usize,
    pub steps: u64,
    pub lr: f32,
    pub weight_decay: f32,
    pub optimizer: OptimizerSpec,
    /// Seeds the codecs (the problem is fixed).
    pub seed: u64,
}

impl Run {
    pub fn new(method: MethodSpec, codec: &'static str) -> Self {
        Run {
            method,
            codec,
            blocking: Blocking::Bucket { bytes: 100 },
            workers: 3,
            steps: 12,
            lr: 0.05,
            weight_decay: 0.0,
            optimizer: OptimizerSpec::Sgd,
            seed: SEED,
        }
    }

    pub fn trace(&self) -> Trace {
        type PerWorker = (
            Vec<Vec<f32>>,
            Vec<Vec<f32>>,
            Vec<Vec<f32>>,
            u64,
            Vec<Vec<f32>>,
        );
        let per_worker: Vec<PerWorker> = std::thread::scope(|s| {
            let joins: Vec<_> = local_collectives(self.workers)
                .into_iter()
                .enumerate()
                .map(|(rank, c)| {
                    s.spawn(move || {
                        let mut replica = LeastSquares::new(rank);
                        let mut w = Worker::new(
                            self.method,
                            self.codec,
                            self.optimizer,
                            self.blocking,
                            self.seed,
                            &replica,
                            Box::new(c),
                        )
                        .unwrap();
                        let (mut xs, mut gs, mut es, mut ws) =
                            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                        for t in 0..self.steps {
                            gs.push(replica.clone_gradient(&w.x, t));
                            w.step(&mut replica, self.lr, self.weight_decay).unwrap();
                            xs.push(w.x.clone());
                            ws.push(w.method.worker_error().unwrap_or_default());
                            if rank == 0 {
                                es.push(w.exchange.server_error().unwrap());
                            }
                        }
                        let t = w.exchange.traffic;
                        (xs, gs, es, t.pushed + t.pulled, ws)
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let steps = self.steps as usize;
        Trace {
            x: (0..steps)
                .map(|t| per_worker.iter().map(|w| w.0[t].clone()).collect())
                .collect(),
            g: (0..steps)
                .map(|t| per_worker.iter().map(|w| w.1[t].clone()).collect())
                .collect(),
            server_error: per_worker[0].2.clone(),
            worker_error: (0..steps)
                .map(|t| per_worker.iter().map(|w| w.4[t].clone()).collect())
                .collect(),
            bytes: per_worker.iter().map(|w| w.3).sum(),
            x0: LeastSquares::new(0).x,
        }
    }
}

impl LeastSquares {
    /// The gradient this replica computes at `x` for `step` (without disturbing it).
    pub fn clone_gradient(&mut self, x: &[f32], step: u64) -> Vec<f32> {
        self.loss_and_gradient_at(x, step).1
    }

    /// The loss of `step`'s batch at `x` (without disturbing the replica).
    pub fn clone_loss(&mut self, x: &[f32], step: u64) -> f32 {
        self.loss_and_gradient_at(x, step).0
    }

    fn loss_and_gradient_at(&mut self, x: &[f32], step: u64) -> (f32, Vec<f32>) {
        let saved = std::mem::replace(&mut self.x, x.to_vec());
        let out = self.loss_and_gradient(step).unwrap();
        self.x = saved;
        out
    }
}

pub fn mean(vs: &[Vec<f32>]) -> Vec<f32> {
    let mut m = vec![0.0f32; vs[0].len()];
    for v in vs {
        m.iter_mut().zip(v).for_each(|(m, v)| *m += v);
    }
    m.iter_mut().for_each(|m| *m /= vs.len() as f32);
    m
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

pub fn norm2(v: &[f32]) -> f64 {
    v.iter().map(|v| (*v as f64).powi(2)).sum()
}

pub fn all_equal_bits(xs: &[Vec<f32>]) -> bool {
    let bits = |v: &Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    xs.iter().all(|x| bits(x) == bits(&xs[0]))
}
