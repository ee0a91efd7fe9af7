//! Resumable training state as safetensors bytes: a model's parameters (`param.<i>` in the
//! module's order), the optimizer's state (`optim.<name>`), the step count and a format tag,
//! so a checkpoint of one kind of model is refused by another.

use std::collections::BTreeMap;

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::optim::{Optimizer, OptimizerState};
use crate::tensor::{Device, Tensor};

/// Serialises parameters, optimizer state and `steps`, tagged with `format`.
pub fn save(
    params: &[&Tensor],
    optimizer: &dyn Optimizer,
    steps: u64,
    format: &str,
) -> Result<Vec<u8>> {
    let opt = optimizer.export();
    let mut tensors: Vec<(String, Tensor)> = params
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("param.{i}"), (*p).clone()))
        .collect();
    tensors.extend(
        opt.tensors
            .into_iter()
            .map(|(n, t)| (format!("optim.{n}"), t)),
    );
    let meta = BTreeMap::from([
        ("format".to_string(), format.to_string()),
        ("steps".to_string(), steps.to_string()),
        ("optimizer_steps".to_string(), opt.steps.to_string()),
    ]);
    checkpoint::to_bytes(&tensors, &meta)
}

/// Restores what [`save`] wrote into `params` and `optimizer` (same model shape, same
/// `format`) and returns the step count. Nothing is changed when the checkpoint is refused.
pub fn load(
    bytes: &[u8],
    device: &Device,
    format: &str,
    mut params: Vec<&mut Tensor>,
    optimizer: &mut dyn Optimizer,
) -> Result<u64> {
    let (tensors, meta) = checkpoint::from_bytes(bytes, device)?;
    let found = meta.get("format").map(String::as_str);
    if found != Some(format) {
        return Err(Error::Data(format!(
            "checkpoint holds {}, not {format}",
            found.unwrap_or("no format tag")
        )));
    }
    let number = |k: &str| {
        meta.get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| Error::Data(format!("checkpoint metadata lacks {k}")))
    };
    let (steps, optimizer_steps) = (number("steps")?, number("optimizer_steps")?);
    let loaded: Vec<Tensor> = (0..params.len())
        .map(|i| checkpoint::take(&tensors, &format!("param.{i}")))
        .collect::<Result<_>>()?;
    for (p, t) in params.iter().zip(&loaded) {
        if p.shape() != t.shape() {
            return Err(Error::Data(format!(
                "checkpoint parameter of shape {:?} for a model parameter of shape {:?}",
                t.shape(),
                p.shape()
            )));
        }
    }
    let optim = tensors
        .iter()
        .filter_map(|(n, t)| n.strip_prefix("optim.").map(|n| (n.to_string(), t.clone())))
        .collect();
    optimizer.import(OptimizerState {
        steps: optimizer_steps,
        tensors: optim,
    })?;
    for (p, t) in params.iter_mut().zip(loaded) {
        **p = t;
    }
    Ok(steps)
}
