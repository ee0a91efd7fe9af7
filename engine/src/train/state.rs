//! Resumable training state as safetensors bytes: a model's parameters (`param.<i>` in the
//! module's order), the optimizer's state (`optim.<name>.<i>` for parameter i), the step
//! count, a format tag and an identity: everything about the run that a resumed run must
//! share to continue bit for bit (model shape, optimizer, seed, schedule, batch). A checkpoint
//! of another kind of model, or of another run, is refused before anything is changed.

use std::collections::BTreeMap;

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::optim::{Optimizer, OptimizerState};
use crate::tensor::{Device, Tensor};

/// Serialises parameters, optimizer state and `steps`, tagged with `format` and `identity`.
pub fn save(
    params: &[&Tensor],
    optimizer: &dyn Optimizer,
    steps: u64,
    format: &str,
    identity: &str,
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
        ("identity".to_string(), identity.to_string()),
        ("steps".to_string(), steps.to_string()),
        ("optimizer_steps".to_string(), opt.steps.to_string()),
    ]);
    checkpoint::to_bytes(&tensors, &meta)
}

/// Restores what [`save`] wrote into `params` and `optimizer` (same `format`, same
/// `identity`, same shapes) and returns the step count. Nothing is changed when the
/// checkpoint is refused.
pub fn load(
    bytes: &[u8],
    device: &Device,
    format: &str,
    identity: &str,
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
    let found = meta.get("identity").map(String::as_str).unwrap_or("");
    if found != identity {
        return Err(Error::Data(format!(
            "checkpoint is of another run: it was written by [{found}], this run is [{identity}]; resume with the same model and flags"
        )));
    }
    let (steps, optimizer_steps) = (number("steps")?, number("optimizer_steps")?);
    // Every tensor must belong to a parameter of this model, with its shape.
    for (name, t) in &tensors {
        let index = name
            .strip_prefix("param.")
            .or_else(|| {
                name.strip_prefix("optim.")
                    .and_then(|n| n.rsplit_once('.').map(|(_, i)| i))
            })
            .and_then(|i| i.parse::<usize>().ok());
        match index.and_then(|i| params.get(i)) {
            Some(p) if p.shape() == t.shape() => {}
            Some(p) => {
                return Err(Error::Data(format!(
                    "checkpoint tensor {name} of shape {:?} for a parameter of shape {:?}",
                    t.shape(),
                    p.shape()
                )))
            }
            None => {
                return Err(Error::Data(format!(
                    "checkpoint tensor {name} has no parameter in a model of {} parameter tensors",
                    params.len()
                )))
            }
        }
    }
    let loaded: Vec<Tensor> = (0..params.len())
        .map(|i| checkpoint::take(&tensors, &format!("param.{i}")))
        .collect::<Result<_>>()?;
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
