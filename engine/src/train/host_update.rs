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
//!
//! The models hold an `Option<HostUpdate>` and step through [`step`] whether or not it is set.

use crate::error::Result;
use crate::optim::{Optimizer, OptimizerState};
use crate::tensor::{Device, Tensor};

/// CPU copies of a model's parameters, which the optimizer steps in place of the device's.
pub(crate) struct HostUpdate {
    params: Vec<Tensor>,
}

impl HostUpdate {
    /// For a model on `device`: `None` on the CPU (its own parameters are the host's);
    /// elsewhere, CPU copies of `params`, with `optimizer`'s state moved to the CPU. Called
    /// again whenever the device's parameters or the optimizer's state were replaced (a
    /// restored checkpoint).
    pub(crate) fn for_device(
        device: &Device,
        params: &[&Tensor],
        optimizer: &mut dyn Optimizer,
    ) -> Result<Option<HostUpdate>> {
        if let Device::Cpu = device {
            return Ok(None);
        }
        let state = optimizer.export();
        let tensors = state
            .tensors
            .iter()
            .map(|(name, t)| Ok((name.clone(), t.to(&Device::Cpu)?)))
            .collect::<Result<Vec<_>>>()?;
        optimizer.import(OptimizerState {
            steps: state.steps,
            tensors,
        })?;
        let params = params
            .iter()
            .map(|p| p.to(&Device::Cpu))
            .collect::<Result<_>>()?;
        Ok(Some(HostUpdate { params }))
    }
}

/// `grads` where the step takes them: on the CPU when `host` is set (the host's own when they
/// are there), else as they are.
pub(crate) fn grads(host: &Option<HostUpdate>, grads: &[Tensor]) -> Result<Vec<Tensor>> {
    match host {
        Some(_) => grads.iter().map(|g| g.to(&Device::Cpu)).collect(),
        None => Ok(grads.to_vec()),
    }
}

/// One `optimizer` step with `grads` (from [`grads`]): of the CPU copies, which then replace
/// the device's `params`, when `host` is set; else of `params` themselves.
pub(crate) fn step(
    host: &mut Option<HostUpdate>,
    optimizer: &mut dyn Optimizer,
    params: &mut [&mut Tensor],
    grads: &[Tensor],
) -> Result<()> {
    let Some(host) = host else {
        return optimizer.step(params, grads);
    };
    optimizer.step(&mut host.params.iter_mut().collect::<Vec<_>>(), grads)?;
    for (on_device, on_host) in params.iter_mut().zip(&host.params) {
        **on_device = on_host.to(on_device.device())?;
    }
    Ok(())
}

/// Replaces the values of `params` (and of their CPU copies, when `host` is set) with
/// `values`, CPU tensors of the same shapes, in order: how a replica takes the shared
/// parameters of an outer round. On the CPU the tensors are shared, not copied (a step that
/// writes one copies it then).
pub(crate) fn set_values(
    host: &mut Option<HostUpdate>,
    params: &mut [&mut Tensor],
    values: &[Tensor],
) -> Result<()> {
    if values.len() != params.len()
        || values
            .iter()
            .zip(params.iter())
            .any(|(v, p)| v.shape() != p.shape())
    {
        return Err(crate::error::Error::Data(format!(
            "{} tensors do not fit the model's {} parameters",
            values.len(),
            params.len()
        )));
    }
    for (i, (p, v)) in params.iter_mut().zip(values).enumerate() {
        if let Some(host) = host {
            host.params[i] = v.clone();
        }
        **p = v.to(p.device())?;
    }
    Ok(())
}
