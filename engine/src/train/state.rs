//! Checkpoints of models and of training runs, as safetensors bytes ([`crate::checkpoint`]).
//!
//! Tensors: each parameter under its module name (`layers.0.weight`), and in a training
//! checkpoint the optimizer's state named after its parameter (`optim.m.layers.0.weight`).
//! Metadata: the format tag, what the file holds (`training`: resumable, or `weights` alone),
//! the model's kind, the run's description as JSON (what rebuilds the model, and what a
//! resumed run must share to continue bit for bit: model, optimizer, seed, schedule, data),
//! the step count and the optimizer's.
//!
//! Checkpoints are untrusted (files, and snapshots from peers): every tensor must belong to
//! a parameter of the model with its shape, and nothing is changed when one is refused.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::{self, Precision};
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::optim::{Optimizer, OptimizerState};
use crate::tensor::{Device, Tensor};

/// The format tag of the checkpoints this version writes and reads.
pub const FORMAT: &str = "murmur-checkpoint-2";

/// The tags of the checkpoints murmur wrote before tensors had names (`param.<i>`, with the
/// run described by a Rust debug string); they are recognised to say so.
const OLD_FORMATS: [&str; 3] = ["murmur-classifier-1", "murmur-cnn-1", "murmur-gpt-1"];

const TRAINING: &str = "training";
const WEIGHTS: &str = "weights";

/// `value` as JSON, normalised as it reads back from a file (maps sorted by key, floats in
/// their shortest form), so that a run's description compares equal to its saved copy.
pub(super) fn describe(value: &impl Serialize) -> Result<Value> {
    let text = serde_json::to_string(value).map_err(|e| Error::Data(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| Error::Data(e.to_string()))
}

/// What a model writes into a checkpoint besides its tensors.
pub(super) struct Header<'a> {
    /// `mlp`, `cnn` or `gpt`.
    pub model: &'a str,
    /// The run's description ([`describe`]).
    pub run: Value,
    /// Training steps taken.
    pub steps: u64,
}

/// Serialises `model`'s named parameters in `precision` and, for a training checkpoint, the
/// optimizer's state (always f32, so that resuming is exact).
pub(super) fn write(
    header: Header<'_>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    precision: Precision,
) -> Result<Vec<u8>> {
    let mut tensors: Vec<(String, Tensor)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let names: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
    let mut meta = BTreeMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("model".to_string(), header.model.to_string()),
        ("run".to_string(), header.run.to_string()),
        ("steps".to_string(), header.steps.to_string()),
    ]);
    let optim = match optimizer {
        None => {
            meta.insert("contents".into(), WEIGHTS.into());
            vec![]
        }
        Some(_) if precision != Precision::F32 => {
            return Err(Error::Config(format!(
                "a training checkpoint stays f32 so that resuming is exact; write {precision} weights alone"
            )))
        }
        Some(opt) => {
            let state = opt.export();
            meta.insert("contents".into(), TRAINING.into());
            meta.insert("optimizer_steps".into(), state.steps.to_string());
            state
                .tensors
                .into_iter()
                .map(|(name, t)| Ok((optimizer_name(&name, &names)?, t)))
                .collect::<Result<Vec<_>>>()?
        }
    };
    tensors.extend(optim);
    checkpoint::to_bytes(&tensors, &meta, precision)
}

/// `optim.<kind>.<parameter name>` for the optimizer's `<kind>.<index>`.
fn optimizer_name(name: &str, params: &[String]) -> Result<String> {
    let (kind, param) = name
        .rsplit_once('.')
        .and_then(|(kind, i)| Some((kind, params.get(i.parse::<usize>().ok()?)?)))
        .ok_or_else(|| Error::Data(format!("optimizer state {name} has no parameter")))?;
    Ok(format!("optim.{kind}.{param}"))
}

/// A checkpoint read from bytes: which model it holds, the run that wrote it, and its
/// tensors, not yet given to a model.
pub struct Saved {
    /// The model's kind: `mlp`, `cnn` or `gpt`.
    pub model: String,
    /// The run's description as JSON, as the model wrote it.
    pub run: Value,
    /// Training steps taken.
    pub steps: u64,
    /// The optimizer's step count, where the checkpoint holds the optimizer's state (a
    /// training checkpoint); `None` for weights alone.
    pub optimizer_steps: Option<u64>,
    /// The device the tensors were loaded onto.
    pub device: Device,
    tensors: Vec<(String, Tensor)>,
}

impl Saved {
    /// Parses and checks checkpoint bytes, loading the tensors onto `device` (as f32).
    /// Refuses files that are not murmur checkpoints, or of another format version, with
    /// an error that says what the file is.
    pub fn from_bytes(bytes: &[u8], device: &Device) -> Result<Saved> {
        let (tensors, meta) = checkpoint::from_bytes(bytes, device)?;
        match meta.get("format").map(String::as_str) {
            Some(FORMAT) => {}
            Some(old) if OLD_FORMATS.contains(&old) => {
                return Err(Error::Data(format!(
                    "this checkpoint was written by an older murmur (format {old}, tensors named param.0, param.1, ...), which this version does not read: train again with `murmur train --save`, or use the murmur that wrote it"
                )))
            }
            Some(other) => {
                return Err(Error::Data(format!(
                    "this checkpoint has format {other:?}; this murmur reads {FORMAT}"
                )))
            }
            None => {
                return Err(Error::Data(
                    "not a murmur checkpoint: its metadata has no format tag (a safetensors file of another tool?)".into(),
                ))
            }
        }
        let field = |k: &str| {
            meta.get(k)
                .ok_or_else(|| Error::Data(format!("checkpoint metadata lacks {k}")))
        };
        let number = |k: &str| {
            field(k)?
                .parse::<u64>()
                .map_err(|_| Error::Data(format!("checkpoint metadata {k} is not a count")))
        };
        let run = serde_json::from_str(field("run")?)
            .map_err(|e| Error::Data(format!("checkpoint metadata run is not JSON: {e}")))?;
        let optimizer_steps = match field("contents")?.as_str() {
            TRAINING => Some(number("optimizer_steps")?),
            WEIGHTS => None,
            other => {
                return Err(Error::Data(format!(
                    "checkpoint holds {other:?}, neither {TRAINING} nor {WEIGHTS}"
                )))
            }
        };
        Ok(Saved {
            model: field("model")?.clone(),
            run,
            steps: number("steps")?,
            optimizer_steps,
            device: device.clone(),
            tensors,
        })
    }

    /// Whether the checkpoint holds the optimizer's state (so a run can resume from it).
    pub fn is_training_state(&self) -> bool {
        self.optimizer_steps.is_some()
    }

    /// The digest of the weights this checkpoint holds for `model`'s parameters, as
    /// [`Module::parameter_digest`] computes it for a replica holding them: what a shard
    /// compares a snapshot against. Refuses a checkpoint that lacks one of the parameters or
    /// holds it in another shape; the run it describes is not compared.
    pub fn parameter_digest(&self, model: &dyn Module) -> Result<u64> {
        let mut held = Vec::new();
        for (name, param) in model.named_parameters() {
            let Some((_, t)) = self.tensors.iter().find(|(n, _)| *n == name) else {
                return Err(Error::Data(format!("the checkpoint lacks {name}")));
            };
            if t.shape() != param.shape() {
                return Err(Error::Data(format!(
                    "checkpoint tensor {name} has shape {:?}, the parameter {:?}",
                    t.shape(),
                    param.shape()
                )));
            }
            held.push(t);
        }
        Ok(crate::nn::digest_of_values(Tensor::read_many(&held)?))
    }

    /// Refuses a checkpoint of another kind of model than `model`.
    pub(super) fn expect_model(&self, model: &str) -> Result<()> {
        if self.model != model {
            return Err(Error::Data(format!(
                "the checkpoint's model is {}, not {model}",
                self.model
            )));
        }
        Ok(())
    }

    /// The run's description as `T`.
    pub(super) fn run_as<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.run).map_err(|e| {
            Error::Data(format!(
                "the checkpoint's run description does not fit a {}: {e}",
                self.model
            ))
        })
    }

    /// Refuses to build a model of `count` parameters (`None`: past `usize::MAX`) unless
    /// the checkpoint holds exactly that many weights: the sizes in the metadata are
    /// untrusted, and a model is allocated from them.
    pub(super) fn expect_weights(&self, count: Option<usize>) -> Result<()> {
        let held: usize = self
            .tensors
            .iter()
            .filter(|(n, _)| !n.starts_with("optim."))
            .map(|(_, t)| t.numel())
            .sum();
        if count != Some(held) {
            return Err(Error::Data(format!(
                "the checkpoint's metadata describes a {} of {} parameters, but it holds {held} weights",
                self.model,
                count.map_or("too many".into(), |c| c.to_string())
            )));
        }
        Ok(())
    }

    /// Refuses a checkpoint that cannot resume this run: of another model, of weights
    /// alone, or of a run described otherwise (the error names the differences).
    pub(super) fn expect_run(&self, model: &str, run: &Value) -> Result<()> {
        self.expect_model(model)?;
        if !self.is_training_state() {
            return Err(Error::Data(
                "the checkpoint holds weights alone (no optimizer state); resume from one written by `murmur train --save`".into(),
            ));
        }
        let mut diffs = vec![];
        differences("", run, &self.run, &mut diffs);
        if !diffs.is_empty() {
            let more = match diffs.len() {
                0..=3 => String::new(),
                n => format!(" (and {} more)", n - 3),
            };
            diffs.truncate(3);
            return Err(Error::Data(format!(
                "the checkpoint is of another run: {}{more}; resume with the same model and flags",
                diffs.join("; ")
            )));
        }
        Ok(())
    }

    /// Moves the weights into `model`'s parameters (matched by name) and, when `optimizer`
    /// is given and the checkpoint holds its state, restores that too; returns the step
    /// count. Every tensor must belong to a parameter, with its shape; nothing is changed on
    /// refusal.
    pub(super) fn restore(
        self,
        model: &mut dyn Module,
        optimizer: Option<&mut dyn Optimizer>,
    ) -> Result<u64> {
        let names = model.parameter_names();
        let mut params = model.parameters_mut();
        let index = |name: &str| names.iter().position(|n| n == name);
        let mut weights: Vec<Option<Tensor>> = vec![None; names.len()];
        let mut optim: BTreeMap<String, Vec<Option<Tensor>>> = BTreeMap::new();
        for (name, t) in self.tensors {
            // `optim.<kind>.<parameter>`, or a parameter.
            let (kind, param) = match name.strip_prefix("optim.") {
                Some(rest) => {
                    let (kind, param) = rest.split_once('.').unwrap_or((rest, ""));
                    (Some(kind), param)
                }
                None => (None, name.as_str()),
            };
            let Some(i) = index(param) else {
                return Err(Error::Data(format!(
                    "checkpoint tensor {name} has no parameter {param} in this model"
                )));
            };
            if t.shape() != params[i].shape() {
                return Err(Error::Data(format!(
                    "checkpoint tensor {name} has shape {:?}, the parameter {:?}",
                    t.shape(),
                    params[i].shape()
                )));
            }
            let slots = match kind {
                Some(kind) => optim
                    .entry(kind.to_string())
                    .or_insert_with(|| vec![None; names.len()]),
                None => &mut weights,
            };
            slots[i] = Some(t);
        }
        let complete = |kind: &str, slots: Vec<Option<Tensor>>| -> Result<Vec<Tensor>> {
            slots
                .into_iter()
                .zip(&names)
                .map(|(t, name)| {
                    t.ok_or_else(|| Error::Data(format!("checkpoint lacks {kind}{name}")))
                })
                .collect()
        };
        let weights = complete("", weights)?;
        let mut state = vec![];
        for (kind, slots) in optim {
            let prefix = format!("optim.{kind}.");
            for (i, t) in complete(&prefix, slots)?.into_iter().enumerate() {
                state.push((format!("{kind}.{i}"), t));
            }
        }
        if let (Some(opt), Some(steps)) = (optimizer, self.optimizer_steps) {
            opt.import(OptimizerState {
                steps,
                tensors: state,
            })?;
        }
        for (p, t) in params.iter_mut().zip(weights) {
            **p = t;
        }
        Ok(self.steps)
    }
}

/// Where `ours` (this run) and `theirs` (the checkpoint's) differ, as `path is X in the
/// checkpoint, Y in this run`, descending into objects.
fn differences(path: &str, ours: &Value, theirs: &Value, out: &mut Vec<String>) {
    if let (Value::Object(a), Value::Object(b)) = (ours, theirs) {
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for key in keys {
            let sub = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let none = Value::Null;
            differences(
                &sub,
                a.get(key).unwrap_or(&none),
                b.get(key).unwrap_or(&none),
                out,
            );
        }
    } else if ours != theirs {
        out.push(format!(
            "{path} is {theirs} in the checkpoint, {ours} in this run"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_name_the_paths_that_differ() {
        let ours = json!({"config": {"lr": 0.001, "hidden": [64], "seed": 1}, "inputs": 784});
        let theirs = json!({"config": {"lr": 0.002, "hidden": [32], "seed": 1}, "extra": true, "inputs": 784});
        let mut out = vec![];
        differences("", &ours, &theirs, &mut out);
        assert_eq!(
            out,
            [
                "config.hidden is [32] in the checkpoint, [64] in this run",
                "config.lr is 0.002 in the checkpoint, 0.001 in this run",
                "extra is true in the checkpoint, null in this run",
            ]
        );
        out.clear();
        differences("", &ours, &ours.clone(), &mut out);
        assert!(out.is_empty());
    }

    /// A shard checks a snapshot by the digest of the parameters it holds: for a replica's
    /// own snapshot that is the replica's digest, for anyone else's (another seed, weights
    /// of another shape) it is not.
    #[test]
    fn a_snapshots_digest_is_its_replicas() {
        use crate::train::{Classifier, ClassifierConfig, Learner};
        let config = |seed| ClassifierConfig {
            hidden: vec![5],
            seed,
            ..ClassifierConfig::default()
        };
        let ours = Classifier::new(&Device::Cpu, 7, 3, &config(1)).unwrap();
        let theirs = Classifier::new(&Device::Cpu, 7, 3, &config(2)).unwrap();
        let wider = Classifier::new(&Device::Cpu, 8, 3, &config(1)).unwrap();
        let own = ours.save_state().unwrap();
        assert_eq!(
            ours.snapshot_digest(&own).unwrap(),
            ours.parameter_digest().unwrap()
        );
        assert_ne!(
            ours.snapshot_digest(&theirs.save_state().unwrap()).unwrap(),
            ours.parameter_digest().unwrap()
        );
        assert!(ours.snapshot_digest(&wider.save_state().unwrap()).is_err());
        assert!(ours.snapshot_digest(&own[..own.len() / 2]).is_err());
        assert!(ours.snapshot_digest(b"not a checkpoint").is_err());
    }

    #[test]
    fn describe_matches_what_a_file_reads_back() {
        #[derive(Serialize)]
        struct Run {
            lr: f32,
            steps: u64,
        }
        // An f32 goes through its shortest decimal form, as in the file.
        let run = describe(&Run { lr: 0.1, steps: 3 }).unwrap();
        assert_eq!(run, json!({"lr": 0.1, "steps": 3}));
        assert_eq!(
            serde_json::from_str::<Value>(&run.to_string()).unwrap(),
            run
        );
    }
}
