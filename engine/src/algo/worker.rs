//! One worker of a data-parallel algorithm: its model, its side of the algorithm and its
//! exchange with the servers.

use super::{blocks, Blocking, Exchange, Hyper, Method, MethodSpec, OptimizerSpec, Replica, Setup};
use crate::comm::Collective;
use crate::error::Result;

/// One worker of a simulated or distributed run: the algorithm's state, its exchange with the
/// servers, and its flat model.
pub struct Worker {
    /// The algorithm's per-worker state (residuals, moving averages, optimizer).
    pub method: Box<dyn Method>,
    /// The worker's blocks and its rounds through the collective.
    pub exchange: Exchange,
    /// This worker's model, flat.
    pub x: Vec<f32>,
    /// Steps taken: the global iteration counter t.
    pub steps: u64,
}

impl Worker {
    /// Starts from `replica`'s parameters (the same on every worker: same seed) and registers
    /// the algorithm's keys with `collective`.
    pub fn new(
        spec: MethodSpec,
        codec: &str,
        optimizer: OptimizerSpec,
        blocking: Blocking,
        seed: u64,
        replica: &dyn Replica,
        collective: Box<dyn Collective>,
    ) -> Result<Self> {
        let sizes = replica.sizes();
        let setup = Setup {
            world: collective.world(),
            sizes: sizes.clone(),
            optimizer,
        };
        let method = spec.build(codec, &setup)?;
        let blocks = blocks::blocks(&sizes, blocking)?;
        let exchange = Exchange::new(collective, blocks, &method.wire(), seed)?;
        Ok(Worker {
            method,
            exchange,
            x: replica.params()?,
            steps: 0,
        })
    }

    /// One iteration at learning rate `lr`: the gradient of this worker's batch at its model,
    /// then the algorithm's communication and update. Returns the batch's loss.
    pub fn step(&mut self, replica: &mut dyn Replica, lr: f32, weight_decay: f32) -> Result<f32> {
        if self.steps == 0 {
            self.method.start(&mut self.exchange, &mut self.x)?;
        }
        replica.set_params(&self.x)?;
        let (loss, g) = replica.loss_and_gradient(self.steps)?;
        let hyper = Hyper {
            step: self.steps,
            lr,
            weight_decay,
        };
        self.method
            .step(&mut self.exchange, &mut self.x, &g, hyper)?;
        self.steps += 1;
        Ok(loss)
    }
}
