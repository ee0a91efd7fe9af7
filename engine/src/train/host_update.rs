//! The optimizer step on the CPU for a model on any device, so that replicas on different
//! devices take the same update bit for bit.
//!
//! Data-parallel replicas must stay identical whatever device each worker computes on, but a
//! GPU driver may contract a multiply and an add of the optimizer's kernel into one fused
//! operation (the WGSL kernels rely on lavapipe not doing so), and then a GPU replica would
//! drift from a CPU one by a rounding a step. The gradients are on the host already (the codecs
//! encode them there) and the servers' mean comes back there, so a replica steps a CPU copy of
//! its parameters with the CPU path's optimizer (the reference arithmetic every device agrees
//! with) and uploads the result: the update's bits are defined in one place.

use crate::error::Result;
use crate::optim::{Optimizer, OptimizerState};
use crate::tensor::{Device, Tensor};

/// CPU copies of a model's parameters, which the optimizer steps in place of the device's.
pub(crate) struct HostUpdate {
    params: Vec<Tensor>,
}

impl HostUpdate {
    /// Copies `params` to the CPU and moves `optimizer`'s state there. Call again whenever
    /// the device's parameters or the optimizer's state were replaced (a restored checkpoint).
    pub(crate) fn start(params: &[&Tensor], optimizer: &mut dyn Optimizer) -> Result<HostUpdate> {
        let state = optimizer.export();
        let tensors = state
            .tensors
            .iter()
            .map(|(name, t)| Ok((name.clone(), on_cpu(t)?)))
            .collect::<Result<Vec<_>>>()?;
        optimizer.import(OptimizerState {
            steps: state.steps,
            tensors,
        })?;
        Ok(HostUpdate {
            params: params.iter().map(|p| on_cpu(p)).collect::<Result<_>>()?,
        })
    }

    /// `grads` on the CPU, for the clipping and the step (the host's own when they are there).
    pub(crate) fn grads(grads: &[Tensor]) -> Result<Vec<Tensor>> {
        grads.iter().map(on_cpu).collect()
    }

    /// One `optimizer` step of the CPU copies with `grads` (on the CPU), then the device's
    /// parameters, `device_params`, replaced by the result.
    pub(crate) fn step(
        &mut self,
        optimizer: &mut dyn Optimizer,
        grads: &[Tensor],
        device_params: &mut [&mut Tensor],
    ) -> Result<()> {
        optimizer.step(&mut self.params.iter_mut().collect::<Vec<_>>(), grads)?;
        for (on_device, host) in device_params.iter_mut().zip(&self.params) {
            let device = on_device.device().clone();
            **on_device = Tensor::from_vec(&device, host.shape(), host.to_vec()?)?;
        }
        Ok(())
    }
}

/// `t` on the CPU: itself where it is there, else a copy read back from its device.
fn on_cpu(t: &Tensor) -> Result<Tensor> {
    match t.device() {
        Device::Cpu => Ok(t.clone()),
        Device::Gpu(_) => Tensor::from_vec(&Device::Cpu, t.shape(), t.to_vec()?),
    }
}
