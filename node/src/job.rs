//! The job of a data-parallel swarm: the one description of what every worker trains and how
//! its gradients travel. The servers load it (a TOML file, flags on top) and hand it to every
//! worker that joins, so a worker needs only the servers' address and its credentials.
//!
//! Every field here is **job-wide**: fixed by the servers, the same on every worker (and, once
//! jobs are signed, covered by the signature). What may differ from node to node — the device,
//! the data folder, the link, the GPU budget — is **node-local** and lives in the node's own
//! config ([`crate::WorkerConfig`]), never here.
//!
//! ```
//! let job = murmur_node::Job::from_toml("workers = 2\ncodec = \"topk:0.01\"\nepochs = 1\n").unwrap();
//! assert_eq!(job.workers, 2);
//! assert_eq!(job.batch, 128); // fields left out take their defaults
//! ```

use std::path::Path;

use murmur_engine::algo::calibrate::scale_left_to_calibration;
use murmur_engine::comm::aggregate::Aggregate;
use murmur_engine::comm::partition::PartitionPlan;
use murmur_engine::data::ImageDataset;
use murmur_engine::nn::GptConfig;
use murmur_engine::train::{ClassifierConfig, LmConfig, OptimizerKind, OuterConfig, WarmupCosine};
use murmur_net::ps::queue::QueueSpec;
use murmur_net::ps::quorum::QuorumRule;
use serde::{Deserialize, Serialize};

use crate::error::{NodeError, Result};

/// Rounds of a gpt job that does not say (`murmur train --model gpt`'s default).
const GPT_STEPS: u64 = 3000;

/// A data-parallel job: model, data, schedule and compression. Defaults are the demo's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct Job {
    /// Workers in the job; the servers give each certificate that joins one of ranks
    /// 0..workers, and the rounds start once all have registered (or `start_with`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().workers))]
    pub workers: u16,
    /// Start the rounds once this many workers have registered, not all: the other places
    /// are taken by workers that join the running job at any round (a place not taken
    /// leaves its share of each global batch untrained meanwhile).
    #[cfg_attr(feature = "cli", arg(long))]
    pub start_with: Option<u16>,
    /// The model: mlp (the classifier, on images) or gpt (the byte-level transformer, on
    /// text; its sizes are context, layers, dim and heads, and it trains for `steps` rounds).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().model))]
    pub model: String,
    /// The dataset: mnist or fashion-mnist for the mlp, shakespeare for the gpt.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().dataset))]
    pub dataset: String,
    /// Rounds of a gpt job [default: 3000] (an mlp job counts epochs).
    #[cfg_attr(feature = "cli", arg(long))]
    pub steps: Option<u64>,
    /// A gpt job measures its validation loss every this many rounds [default: 250].
    #[cfg_attr(feature = "cli", arg(long))]
    pub eval_every: Option<u64>,
    /// The gpt's context in bytes [default: the engine's, 64].
    #[cfg_attr(feature = "cli", arg(long))]
    pub context: Option<usize>,
    /// The gpt's transformer blocks [default: 4].
    #[cfg_attr(feature = "cli", arg(long))]
    pub layers: Option<usize>,
    /// The gpt's width [default: 64].
    #[cfg_attr(feature = "cli", arg(long))]
    pub dim: Option<usize>,
    /// The gpt's attention heads per block [default: 4].
    #[cfg_attr(feature = "cli", arg(long))]
    pub heads: Option<usize>,
    /// Passes over the training set (an mlp job).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().epochs))]
    pub epochs: u32,
    /// Samples per worker per step (images, or sequences of `context` bytes; the global batch
    /// is this times the workers).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().batch))]
    pub batch: usize,
    /// The learning rate (the schedule's peak where there is one).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().lr))]
    pub lr: f32,
    /// Hidden layer widths of the MLP.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', default_values_t = Job::default().hidden)
    )]
    pub hidden: Vec<usize>,
    /// The optimizer: adamw or sgd.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().optimizer))]
    pub optimizer: String,
    /// AdamW's decoupled decay, or SGD's L2 term [default: the engine's, 0.01 for the mlp's
    /// AdamW; 0.1 for the gpt].
    #[cfg_attr(feature = "cli", arg(long))]
    pub weight_decay: Option<f32>,
    /// SGD's momentum [default: the engine's].
    #[cfg_attr(feature = "cli", arg(long))]
    pub momentum: Option<f32>,
    /// Linear warm-up over this many rounds, then cosine decay to a tenth of lr at the job's
    /// end (otherwise lr throughout; a gpt job always decays, after a warm-up of a tenth of
    /// its steps up to 100 unless this says).
    #[cfg_attr(feature = "cli", arg(long))]
    pub warmup: Option<u64>,
    /// Clip the averaged gradient to this global L2 norm [a gpt job: 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub clip: Option<f32>,
    /// Seed of the initial model, the data order and every codec's randomness.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().seed))]
    pub seed: u64,
    /// Stop after this many rounds (for quick checks; an mlp job's schedule ends there, a gpt
    /// job's spans its `steps`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub max_steps: Option<u64>,
    /// Train on the first N training samples only.
    #[cfg_attr(feature = "cli", arg(long))]
    pub train_limit: Option<usize>,
    /// Codec of worker pushes, e.g. topk:0.01, sign, dither:linear:s=15, f32.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().codec))]
    pub codec: String,
    /// Codec of the servers' replies (default: the push codec).
    #[cfg_attr(feature = "cli", arg(long))]
    pub pull_codec: Option<String>,
    /// Push codecs a worker may take instead of `codec` for its own pushes, to suit its link
    /// (e.g. topk:0.003,topk:0.001 beside codec topk:0.01); the servers decode each push with
    /// its sender's codec, and the replies stay `pull_codec` for all. LoCo codes cannot vary.
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ','))]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub push_codecs: Vec<String>,
    /// How long a worker's pushes may take per round on its link, in milliseconds: a worker
    /// given `--push-codec auto` measures its path to the shards and pushes with the least
    /// compressed of `codec` and `push_codecs` that its link moves in this time.
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_budget_ms: Option<f64>,
    /// Error feedback on the workers: none, ef, or loco-ema:...
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().memory))]
    pub memory: String,
    /// Error feedback on the servers.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().server_memory))]
    pub server_memory: String,
    /// Tensors are cut into partitions of this many bytes (BytePS default 4,096,000).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().partition_bytes))]
    pub partition_bytes: usize,
    /// Tensors smaller than this travel uncompressed (BytePS default 1,024,000).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().min_compress_bytes))]
    pub min_compress_bytes: usize,
    /// The ranks in turn send the servers a snapshot every this many rounds, for workers
    /// that rejoin (the servers' log of rounds reaches back to the newest one).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().snapshot_every))]
    pub snapshot_every: u64,
    /// Recalibrate LoCo's scale every this many epochs: at the epoch's first round every
    /// worker measures the gradient of the epoch's first global batch at the current model
    /// (the rule of the calibration at the start) and all move to the new scale together.
    /// Needs a `loco` codec both ways (leave pull_codec out, or name a loco codec).
    #[cfg_attr(feature = "cli", arg(long))]
    pub loco_recalibrate_every: Option<u32>,
    /// The share of the workers whose pushes let a round close without the others, in
    /// (0, 1]: once that many have pushed, the servers wait `quorum_wait` times the recent
    /// median push time (at least half a second, at most the servers' deadline) and close
    /// the round over those who pushed. 1 waits for every worker, every round, as runs that
    /// must be bit-identical from one run to the next need.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().quorum))]
    pub quorum: f32,
    /// How long a round waits for its other workers after its quorum, as a multiple of the
    /// recent median push time.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().quorum_wait))]
    pub quorum_wait: f32,
    /// How shard 0 cuts each round over its members: `speed` (the default: by the samples per
    /// second each one pushed lately, once one is off the median by a factor of 1.5, so that
    /// a slow worker gets a smaller share instead of being late; members alike get equal
    /// shares) or `equal` (equal shares whatever the speeds; what runs that must be
    /// bit-identical from one run to the next need, since measured speeds differ from run to
    /// run). Where the cut follows the speeds, rounds are smaller, an epoch takes more of them,
    /// and the learning-rate schedule, which spans the rounds of equal cuts, reaches its end
    /// early and holds its last value; `max_steps` counts rounds.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().shares))]
    pub shares: String,
    /// What a worker does with a push that reached a shard after the round closed without it:
    /// `requeue` (the default: the push is dropped and its samples go back to shard 0's queue,
    /// trained again in a later round) or `fold` (the worker adds what it sent back into its
    /// error-feedback memory, so its next push carries the gradient, and the samples count as
    /// seen once that push is summed; needs `memory` ef). docs/benchmarks.md compares them.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().late_pushes))]
    pub late_pushes: String,
    /// How the servers combine a round's pushes of each key: `mean` (the default: weighted by
    /// the samples each push stands for), or a rule that bounds what a minority of bad
    /// workers can do: `trimmed-mean[:β]`, `median`, `centered-clip[:L]` (see
    /// docs/results/robustness.md for what each withstands and costs).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().aggregate))]
    pub aggregate: String,
    /// Outer rounds of local steps (DiLoCo): each worker takes this many optimizer steps of
    /// `batch` samples on its share of a round, then pushes its pseudo-gradient (the round's
    /// starting parameters minus its own, through the job's codecs and error feedback), and
    /// an outer optimizer steps the shared parameters with their aggregate. A round then holds
    /// `local_steps` global batches; `max_steps`, `warmup` and `snapshot_every` count rounds.
    /// Left out, workers exchange gradients every step.
    #[cfg_attr(feature = "cli", arg(long))]
    pub local_steps: Option<u32>,
    /// The outer optimizer's learning rate (with `local_steps`; DiLoCo's 0.7).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().outer_lr))]
    pub outer_lr: f32,
    /// The outer optimizer's Nesterov momentum (with `local_steps`; DiLoCo's 0.9); 0 makes it
    /// plain SGD, and with `outer_lr` 1 the round averages the workers' models (FedAvg).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Job::default().outer_momentum))]
    pub outer_momentum: f32,
}

impl Default for Job {
    fn default() -> Self {
        Job {
            workers: 4,
            start_with: None,
            model: "mlp".into(),
            dataset: "mnist".into(),
            steps: None,
            eval_every: None,
            context: None,
            layers: None,
            dim: None,
            heads: None,
            epochs: 8,
            batch: 128,
            lr: 2e-3,
            hidden: vec![512, 256],
            optimizer: "adamw".into(),
            weight_decay: None,
            momentum: None,
            warmup: None,
            clip: None,
            seed: 0,
            max_steps: None,
            train_limit: None,
            codec: "f32".into(),
            pull_codec: None,
            push_codecs: Vec::new(),
            push_budget_ms: None,
            memory: "ef".into(),
            server_memory: "ef".into(),
            partition_bytes: 4_096_000,
            min_compress_bytes: 1_024_000,
            snapshot_every: 50,
            loco_recalibrate_every: None,
            quorum: QuorumRule::default().fraction,
            quorum_wait: QuorumRule::default().wait,
            shares: "speed".into(),
            late_pushes: "requeue".into(),
            aggregate: "mean".into(),
            local_steps: None,
            outer_lr: 0.7,
            outer_momentum: 0.9,
        }
    }
}

impl Job {
    /// The names of the job's fields, as in TOML and as flags (with `-` for `_`), read from
    /// its serialised form so that the list never drifts from the struct.
    pub fn field_names() -> Vec<String> {
        match serde_json::to_value(Job::default()) {
            Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
            _ => unreachable!("a job serialises to an object"),
        }
    }

    /// Parses a job from TOML text; fields left out take their defaults, unknown fields are
    /// an error (a typo must not silently fall back to a default). The job is validated.
    pub fn from_toml(text: &str) -> Result<Job> {
        let job: Job = toml::from_str(text).map_err(|e| NodeError::Job(e.to_string()))?;
        job.validate()?;
        Ok(job)
    }

    /// Reads a job from a TOML file.
    pub fn load(path: &Path) -> Result<Job> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| NodeError::io(format!("reading the job {}", path.display()), e))?;
        Job::from_toml(&text).map_err(|e| NodeError::Job(format!("{}: {e}", path.display())))
    }

    /// The job as TOML, for a file a server can load.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a job serialises to TOML")
    }

    /// This job with the fields named in `fields` taken from `other` (how flags given on a
    /// command line override a job file).
    pub fn with_fields_from(&self, other: &Job, fields: &[&str]) -> Result<Job> {
        let mut mine = serde_json::to_value(self).expect("a job serialises");
        let theirs = serde_json::to_value(other).expect("a job serialises");
        for field in fields {
            let Some(value) = theirs.get(*field) else {
                return Err(NodeError::Job(format!("no job field {field:?}")));
            };
            mine[*field] = value.clone();
        }
        let job: Job = serde_json::from_value(mine).map_err(|e| NodeError::Job(e.to_string()))?;
        job.validate()?;
        Ok(job)
    }

    /// When the servers close a round without every worker.
    pub fn quorum_rule(&self) -> QuorumRule {
        QuorumRule {
            fraction: self.quorum,
            wait: self.quorum_wait,
        }
    }

    /// The push codecs a worker of this job may push with: `codec`, then `push_codecs`.
    pub fn allowed_push_codecs(&self) -> Vec<&str> {
        std::iter::once(self.codec.as_str())
            .chain(self.push_codecs.iter().map(String::as_str))
            .collect()
    }

    /// The job as it travels to joining workers (JSON).
    pub fn to_wire(&self) -> String {
        serde_json::to_string(self).expect("a job serialises")
    }

    /// Reads a job as a server sent it, and checks that this build can run it.
    pub fn from_wire(text: &str) -> Result<Job> {
        let job: Job = serde_json::from_str(text)
            .map_err(|e| NodeError::Job(format!("the servers sent a job this build cannot read ({e}); is this murmur older than the servers'?")))?;
        job.validate()?;
        Ok(job)
    }

    /// Checks every field against its range and that this build knows the dataset, codecs
    /// and memories the job names: a node refuses a job it cannot run at once, with the reason.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(NodeError::Job(m));
        if self.workers == 0 {
            return bad("workers must be at least 1".into());
        }
        if self.start_with.is_some_and(|n| n == 0 || n > self.workers) {
            return bad(format!(
                "start_with must be from 1 to the {} workers when given",
                self.workers
            ));
        }
        if self.epochs == 0 || self.batch == 0 {
            return bad("epochs and batch must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("lr must be a positive number, not {}", self.lr));
        }
        self.optimizer
            .parse::<OptimizerKind>()
            .map_err(|e| NodeError::Job(format!("optimizer {:?}: {e}", self.optimizer)))?;
        for (what, v) in [
            ("weight_decay", self.weight_decay),
            ("momentum", self.momentum),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                return bad(format!("{what} must be a number of at least 0"));
            }
        }
        if self.clip.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            return bad("clip must be a positive number".into());
        }
        if self.hidden.contains(&0) {
            return bad("hidden layer widths must be at least 1".into());
        }
        if self.max_steps == Some(0) || self.train_limit == Some(0) {
            return bad("max_steps and train_limit must be at least 1 when given".into());
        }
        if !matches!(self.shares.as_str(), "speed" | "equal") {
            return bad(format!("shares is speed or equal, not {:?}", self.shares));
        }
        match self.late_pushes.as_str() {
            "requeue" => {}
            "fold" if self.memory == "ef" => {}
            "fold" => {
                return bad(format!(
                    "late_pushes fold needs memory ef (a residual the late push is added back \
                     to), not {:?}",
                    self.memory
                ))
            }
            other => return bad(format!("late_pushes is requeue or fold, not {other:?}")),
        }
        self.aggregate_rule()?;
        // Checked whether or not local steps are on, so that a bad value is refused before
        // someone turns them on.
        OuterConfig {
            local_steps: self.local_steps.unwrap_or(1),
            step_samples: self.batch,
            lr: self.outer_lr,
            momentum: self.outer_momentum,
        }
        .validate()
        .map_err(|e| NodeError::Job(format!("local_steps, outer_lr, outer_momentum: {e}")))?;
        let round = (self.batch as u64)
            .checked_mul(u64::from(self.workers))
            .and_then(|n| n.checked_mul(self.steps_per_round()));
        if round.is_none_or(|n| n > u64::from(u32::MAX)) {
            return bad(format!(
                "a round of batch {} × {} workers × {} local steps is past 2^32 samples",
                self.batch,
                self.workers,
                self.steps_per_round()
            ));
        }
        if self.local_steps.is_some() && self.loco_codes() {
            return bad(
                "local_steps with a loco codec: LoCo's scale is calibrated on gradients, and a \
                 pseudo-gradient is the sum of many steps; use topk, hybrid, sign or f32"
                    .into(),
            );
        }
        self.quorum_rule().validate().map_err(NodeError::Job)?;
        if self.partition_bytes < 4 {
            return bad("partition_bytes must be at least 4".into());
        }
        self.validate_model()?;
        // The codec's own refusal names it (`codec "x": ...`); the pull codec's gets the
        // field's name in front (`pull_codec "x": ...`).
        for (prefix, spec) in [("", Some(&self.codec)), ("pull_", self.pull_codec.as_ref())] {
            if let Some(spec) = spec {
                murmur_engine::compress::parse(spec)
                    .map_err(|e| NodeError::Job(format!("{prefix}{e}")))?;
            }
        }
        for spec in &self.push_codecs {
            let parsed = murmur_engine::compress::parse(spec)
                .map_err(|e| NodeError::Job(format!("push_codecs: {e}")))?;
            let loco = |s: &str| {
                matches!(
                    s.parse::<murmur_engine::compress::CodecSpec>(),
                    Ok(murmur_engine::compress::CodecSpec::Loco { .. })
                )
            };
            if loco(spec) || loco(&self.codec) {
                return bad(format!(
                    "push_codecs {:?}: a LoCo code's scale is the swarm's; workers cannot push \
                     other codes than codec {:?}",
                    parsed.spec().to_string(),
                    self.codec
                ));
            }
        }
        if let Some(ms) = self.push_budget_ms {
            if !(ms.is_finite() && ms > 0.0) {
                return bad(format!("push_budget_ms {ms} must be a positive time"));
            }
        }
        self.memory
            .parse::<murmur_engine::feedback::Memory>()
            .map_err(|e| NodeError::Job(format!("memory {:?}: {e}", self.memory)))?;
        if let Some(every) = self.loco_recalibrate_every {
            if every == 0 {
                return bad("loco_recalibrate_every must be at least 1 epoch when given".into());
            }
            let pull = self.pull_codec.as_ref().unwrap_or(&self.codec);
            let is_loco = |spec: &str| {
                matches!(
                    spec.parse(),
                    Ok(murmur_engine::compress::CodecSpec::Loco { .. })
                )
            };
            if !is_loco(&self.codec) || !is_loco(pull) {
                return bad(format!(
                    "loco_recalibrate_every needs LoCo codes both ways (codec {:?}, pull_codec \
                     {pull:?}): a worker that misses a recalibration learns the new scale from \
                     the replies",
                    self.codec
                ));
            }
        }
        Ok(())
    }

    /// Whether the job's workers fold a late push into their error feedback
    /// How the servers combine each key's pushes ([`Job::aggregate`]).
    pub fn aggregate_rule(&self) -> Result<Aggregate> {
        self.aggregate
            .parse()
            .map_err(|e| NodeError::Job(format!("aggregate: {e}")))
    }

    /// ([`Job::late_pushes`] `fold`).
    pub fn folds_late_pushes(&self) -> bool {
        self.late_pushes == "fold"
    }

    /// The outer loop of a job with local steps ([`Job::local_steps`]).
    pub fn outer_config(&self) -> Option<OuterConfig> {
        self.local_steps.map(|local_steps| OuterConfig {
            local_steps,
            step_samples: self.batch,
            lr: self.outer_lr,
            momentum: self.outer_momentum,
        })
    }

    /// Optimizer steps per round: the local steps, or 1.
    pub fn steps_per_round(&self) -> u64 {
        u64::from(self.local_steps.unwrap_or(1))
    }

    /// Whether either way's codec is LoCo's.
    fn loco_codes(&self) -> bool {
        let pull = self.pull_codec.as_ref().unwrap_or(&self.codec);
        [&self.codec, pull].iter().any(|spec| {
            matches!(
                spec.parse(),
                Ok(murmur_engine::compress::CodecSpec::Loco { .. })
            )
        })
    }

    /// Whether this job trains the byte-level GPT (else the MLP classifier).
    pub fn is_gpt(&self) -> bool {
        self.model == "gpt"
    }

    /// The model, its dataset and the fields that belong to one model only.
    fn validate_model(&self) -> Result<()> {
        let bad = |m: String| Err(NodeError::Job(m));
        let gpt_fields = [
            ("steps", self.steps.is_some()),
            ("eval_every", self.eval_every.is_some()),
            ("context", self.context.is_some()),
            ("layers", self.layers.is_some()),
            ("dim", self.dim.is_some()),
            ("heads", self.heads.is_some()),
        ];
        match self.model.as_str() {
            "mlp" => {
                if let Some((name, _)) = gpt_fields.iter().find(|(_, given)| *given) {
                    return bad(format!(
                        "{name} is a field of gpt jobs; this job's model is the mlp"
                    ));
                }
                self.dataset
                    .parse::<ImageDataset>()
                    .map_err(|e| NodeError::Job(format!("dataset: {e}")))?;
            }
            "gpt" => {
                if self.dataset != "shakespeare" {
                    return bad(format!(
                        "the gpt trains on dataset \"shakespeare\", not {:?}",
                        self.dataset
                    ));
                }
                if self.optimizer != "adamw" || self.momentum.is_some() {
                    return bad("the gpt trains with AdamW (no optimizer or momentum)".into());
                }
                if self.loco_recalibrate_every.is_some() {
                    return bad("loco_recalibrate_every is for mlp jobs".into());
                }
                // What the mlp's fields would set, a gpt job would silently ignore.
                let defaults = Job::default();
                for (name, given) in [
                    ("train_limit", self.train_limit.is_some()),
                    ("epochs", self.epochs != defaults.epochs),
                    ("hidden", self.hidden != defaults.hidden),
                ] {
                    if given {
                        return bad(format!(
                            "{name} is a field of mlp jobs; a gpt job has steps, context, layers, dim and heads"
                        ));
                    }
                }
                // LoCo's scale is calibrated on the mlp's first batch only.
                let pull = self.pull_codec.as_ref().unwrap_or(&self.codec);
                if [&self.codec, pull]
                    .iter()
                    .any(|c| scale_left_to_calibration(c).is_some())
                {
                    return bad(
                        "a gpt job's LoCo codecs name their scale (loco:log2s=N): the \
                         calibration from the first batch is for mlp jobs"
                            .into(),
                    );
                }
                if let Some((name, _)) = [("steps", self.steps), ("eval_every", self.eval_every)]
                    .iter()
                    .find(|(_, v)| *v == Some(0))
                {
                    return bad(format!("{name} must be at least 1 when given"));
                }
                let gpt = self.gpt_config();
                if [gpt.context, gpt.layers, gpt.dim, gpt.heads].contains(&0)
                    || !gpt.dim.is_multiple_of(gpt.heads)
                {
                    return bad(format!(
                        "the gpt's context, layers, dim and heads must be at least 1, and dim a \
                         multiple of heads (context {}, layers {}, dim {}, heads {})",
                        gpt.context, gpt.layers, gpt.dim, gpt.heads
                    ));
                }
                if gpt.parameter_count().is_none_or(|n| n > u32::MAX as usize) {
                    return bad("the gpt's sizes make more than 2^32 parameters".into());
                }
            }
            other => return bad(format!("model {other:?}: use mlp or gpt")),
        }
        Ok(())
    }

    /// The gpt's sizes: the job's where given, the engine's defaults otherwise.
    pub fn gpt_config(&self) -> GptConfig {
        let defaults = GptConfig::default();
        GptConfig {
            context: self.context.unwrap_or(defaults.context),
            layers: self.layers.unwrap_or(defaults.layers),
            dim: self.dim.unwrap_or(defaults.dim),
            heads: self.heads.unwrap_or(defaults.heads),
            ..defaults
        }
    }

    /// The language model every worker of a gpt job builds: AdamW at `lr` after a warm-up
    /// (the job's, else a tenth of the rounds up to 100), cosine decay to a tenth over the
    /// job's `steps` (a `max_steps` stops it earlier, as in `murmur train --model gpt`);
    /// clipping at the job's norm (else 1) and weight decay (else 0.1), as `murmur train`
    /// has them.
    pub fn lm_config(&self) -> LmConfig {
        let defaults = LmConfig::new(self.steps.unwrap_or(GPT_STEPS));
        // The schedule counts optimizer steps: a round's local steps each.
        let per_round = self.steps_per_round();
        LmConfig {
            model: self.gpt_config(),
            batch: self.batch * self.workers as usize,
            schedule: WarmupCosine {
                peak: self.lr,
                warmup: self.warmup.unwrap_or(defaults.schedule.warmup) * per_round,
                total: defaults.schedule.total * per_round,
                ..defaults.schedule
            },
            weight_decay: self.weight_decay.unwrap_or(defaults.weight_decay),
            clip: self.clip.unwrap_or(defaults.clip),
            seed: self.seed,
        }
    }

    /// The rounds between a gpt job's validations, and its rounds (`max_steps` stops it
    /// early).
    pub fn gpt_steps(&self) -> (u64, u64) {
        let total = self
            .steps
            .unwrap_or(GPT_STEPS)
            .min(self.max_steps.unwrap_or(u64::MAX));
        (self.eval_every.unwrap_or(250), total)
    }

    /// Checks that the model's largest buffer (a weight matrix, or a batch of activations)
    /// fits in `limit` bytes, the most one GPU binding may hold on an adapter: a worker on a
    /// small GPU refuses the job at once instead of failing at its first step.
    pub fn check_fits(&self, features: usize, classes: usize, limit: u64) -> Result<()> {
        let widths: Vec<usize> = std::iter::once(features)
            .chain(self.hidden.iter().copied())
            .chain(std::iter::once(classes))
            .collect();
        let weights = widths.windows(2).map(|w| w[0] * w[1]).max().unwrap_or(0);
        let activations = self.batch * widths.iter().copied().max().unwrap_or(0);
        let need = 4 * weights.max(activations) as u64;
        if need > limit {
            return Err(NodeError::Job(format!(
                "the model's largest buffer needs {need} bytes, but this adapter binds at most {limit}: \
                 run this worker on another device (--device cpu), or ask for a job with smaller layers"
            )));
        }
        Ok(())
    }

    /// The model and optimizer every worker builds (the same on each, so replicas agree),
    /// with the schedule spanning the job's `total_steps` rounds.
    pub fn classifier_config(&self, total_steps: u64) -> Result<ClassifierConfig> {
        let defaults = ClassifierConfig::default();
        Ok(ClassifierConfig {
            hidden: self.hidden.clone(),
            optimizer: self
                .optimizer
                .parse()
                .map_err(|e| NodeError::Job(format!("optimizer: {e}")))?,
            lr: self.lr,
            weight_decay: self.weight_decay.unwrap_or(defaults.weight_decay),
            momentum: self.momentum.unwrap_or(defaults.momentum),
            seed: self.seed,
            // The schedule counts optimizer steps: a round's local steps each.
            schedule: self.warmup.map(|warmup| WarmupCosine {
                peak: self.lr,
                warmup: warmup * self.steps_per_round(),
                total: total_steps * self.steps_per_round(),
                min_ratio: 0.1,
            }),
            clip: self.clip,
            ..defaults
        })
    }

    /// How the model's tensors are cut into keys and compressed.
    pub fn partition_plan(&self) -> PartitionPlan {
        PartitionPlan {
            partition_bytes: self.partition_bytes,
            min_compress_bytes: self.min_compress_bytes,
            push: self.codec.clone(),
            pull: self
                .pull_codec
                .clone()
                .unwrap_or_else(|| self.codec.clone()),
            server_memory: self.server_memory.clone(),
            seed: self.seed,
        }
    }

    /// The samples shard 0 hands out round by round ([`murmur_net::ps::queue`]),
    /// `batch × workers` a round, `batch` to each member at most: an image job's training set every epoch; a gpt job's
    /// windows of all its rounds, as one epoch (window `p` is window `p mod global` of round
    /// `p / global`'s draw).
    pub fn queue_spec(&self) -> Result<QueueSpec> {
        let per_round = self.steps_per_round() as usize;
        let global = self.batch * self.workers as usize * per_round;
        let samples = if self.is_gpt() {
            self.gpt_steps().1 as usize * global
        } else {
            let dataset: ImageDataset = self
                .dataset
                .parse()
                .map_err(|e: murmur_engine::Error| NodeError::Job(e.to_string()))?;
            let published = dataset.train_samples();
            self.train_limit.map_or(published, |n| n.min(published))
        };
        let global = u32::try_from(global)
            .map_err(|_| NodeError::Job(format!("a global batch of {global} samples")))?;
        Ok(QueueSpec {
            samples: samples as u64,
            global,
            // Fewer members make a smaller round: a worker never computes more than its batch.
            per_member: (self.batch * per_round) as u32,
            by_speed: self.shares == "speed",
        })
    }

    /// Epochs the queue hands out before the job is done (a gpt job's rounds are one).
    pub fn queue_epochs(&self) -> u32 {
        if self.is_gpt() {
            1
        } else {
            self.epochs
        }
    }

    /// Rounds per epoch over `train_len` samples when no share is given back (the last one
    /// short), and rounds in all.
    pub fn steps(&self, train_len: usize) -> (u64, u64) {
        let global = self.batch * self.workers as usize * self.steps_per_round() as usize;
        let per_epoch = train_len.div_ceil(global.max(1)).max(1) as u64;
        let total = (per_epoch * self.epochs as u64).min(self.max_steps.unwrap_or(u64::MAX));
        (per_epoch, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_round_trips_and_typos_are_refused() {
        let job = Job {
            workers: 3,
            codec: "topk:0.01".into(),
            max_steps: Some(7),
            ..Job::default()
        };
        assert_eq!(Job::from_toml(&job.to_toml()).unwrap(), job);
        assert_eq!(Job::from_wire(&job.to_wire()).unwrap(), job);
        let err = Job::from_toml("wokers = 3").unwrap_err().to_string();
        assert!(err.contains("wokers"), "{err}");
    }

    #[test]
    fn a_job_this_build_cannot_run_is_refused_with_the_reason() {
        for (text, needle) in [
            ("codec = \"foo\"", "codec"),
            ("push_codecs = [\"foo\"]", "push_codecs"),
            (
                "codec = \"loco:bits=4:log2s=3\"\npush_codecs = [\"loco:bits=4:log2s=5\"]",
                "LoCo",
            ),
            ("lr = -1.0", "lr"),
            ("workers = 0", "workers"),
            ("dataset = \"imagenet\"", "dataset"),
            ("memory = \"nope\"", "memory"),
            ("late_pushes = \"keep\"", "late_pushes"),
            ("aggregate = \"krum\"", "aggregate"),
            (
                "late_pushes = \"fold\"\nmemory = \"none\"",
                "needs memory ef",
            ),
        ] {
            let err = Job::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn the_optimizer_and_schedule_are_the_jobs() {
        // Left out, they are the engine's defaults (the bits of jobs from before they existed).
        let job = Job::default();
        let config = job.classifier_config(100).unwrap();
        let defaults = ClassifierConfig::default();
        assert_eq!(config.optimizer, defaults.optimizer);
        assert_eq!(config.weight_decay, defaults.weight_decay);
        assert_eq!((config.schedule, config.clip), (None, None));
        let job =
            Job::from_toml("optimizer = \"sgd\"\nmomentum = 0.9\nwarmup = 10\nclip = 1.0").unwrap();
        let config = job.classifier_config(100).unwrap();
        assert_eq!(config.optimizer, OptimizerKind::Sgd);
        assert_eq!(config.schedule.unwrap().total, 100);
        assert!(Job::from_toml("optimizer = \"adam\"").is_err());
        assert!(Job::from_toml("clip = 0.0").is_err());
    }

    #[test]
    fn a_gpt_job_takes_its_own_fields_and_refuses_the_others() {
        let gpt = "model = \"gpt\"\ndataset = \"shakespeare\"\n";
        let job =
            Job::from_toml(&format!("{gpt}steps = 40\ndim = 32\nheads = 4\nlr = 0.003")).unwrap();
        assert!(job.is_gpt());
        assert_eq!(job.gpt_steps(), (250, 40));
        let config = job.lm_config();
        assert_eq!((config.model.dim, config.model.heads), (32, 4));
        assert_eq!((config.schedule.peak, config.schedule.total), (0.003, 40));
        assert_eq!(config.batch, job.batch * job.workers as usize);
        for (text, needle) in [
            ("model = \"gpt\"", "shakespeare"),
            ("model = \"cnn\"", "model"),
            ("steps = 10", "gpt jobs"),
            (&format!("{gpt}optimizer = \"sgd\""), "AdamW"),
            (&format!("{gpt}dim = 30\nheads = 4"), "multiple of heads"),
            (&format!("{gpt}steps = 0"), "steps"),
            (&format!("{gpt}epochs = 2"), "mlp jobs"),
            (&format!("{gpt}codec = \"loco:bits=4\""), "log2s"),
        ] {
            let err = Job::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn a_model_too_large_for_the_adapter_is_refused() {
        let job = Job {
            hidden: vec![512, 256],
            ..Job::default()
        };
        // 784 x 512 floats is the largest buffer.
        assert!(job.check_fits(784, 10, 4 * 784 * 512).is_ok());
        let err = job.check_fits(784, 10, 4 * 784 * 512 - 1).unwrap_err();
        assert!(err.to_string().contains("adapter binds at most"), "{err}");
    }

    #[test]
    fn recalibration_needs_loco_both_ways() {
        let ask = |codec: &str, pull: Option<&str>, every| Job {
            codec: codec.into(),
            pull_codec: pull.map(Into::into),
            loco_recalibrate_every: Some(every),
            ..Job::default()
        };
        assert!(ask("loco", None, 2).validate().is_ok());
        assert!(ask("loco:bits=4", Some("loco:bits=8"), 1)
            .validate()
            .is_ok());
        let err = ask("loco", Some("f32"), 1).validate().unwrap_err();
        assert!(err.to_string().contains("LoCo codes both ways"), "{err}");
        assert!(ask("topk:0.01", None, 1).validate().is_err());
        assert!(ask("loco", None, 0).validate().is_err());
    }

    #[test]
    fn flags_override_only_the_fields_given() {
        let file = Job::from_toml("epochs = 2\nbatch = 64").unwrap();
        let flags = Job {
            batch: 32,
            lr: 1e-3,
            ..Job::default()
        };
        let job = file.with_fields_from(&flags, &["lr"]).unwrap();
        assert_eq!((job.epochs, job.batch, job.lr), (2, 64, 1e-3));
        assert!(file.with_fields_from(&flags, &["nope"]).is_err());
        let names = Job::field_names();
        assert!(names.len() == 38 && names.iter().any(|n| n == "start_with"));
    }

    #[test]
    fn a_round_of_local_steps_holds_that_many_global_batches() {
        let job = Job {
            workers: 4,
            batch: 64,
            epochs: 2,
            local_steps: Some(32),
            warmup: Some(3),
            ..Job::default()
        };
        job.validate().unwrap();
        let queue = job.queue_spec().unwrap();
        assert_eq!((queue.global, queue.per_member), (4 * 64 * 32, 64 * 32));
        // 60,000 samples in rounds of 8,192: 7 full rounds and a short one an epoch.
        assert_eq!(job.steps(60_000), (8, 16));
        let schedule = job.classifier_config(16).unwrap().schedule.unwrap();
        assert_eq!((schedule.warmup, schedule.total), (3 * 32, 16 * 32));
        let outer = job.outer_config().unwrap();
        assert_eq!((outer.local_steps, outer.step_samples), (32, 64));
        assert_eq!(Job::default().outer_config(), None);
        for (bad, needle) in [
            (
                Job {
                    local_steps: Some(0),
                    ..job.clone()
                },
                "local step",
            ),
            (
                Job {
                    outer_momentum: 1.0,
                    ..job.clone()
                },
                "momentum",
            ),
            (
                Job {
                    outer_lr: -1.0,
                    ..job.clone()
                },
                "learning rate",
            ),
            (
                Job {
                    codec: "loco".into(),
                    ..job.clone()
                },
                "loco",
            ),
            (
                Job {
                    local_steps: Some(u32::MAX),
                    ..job.clone()
                },
                "2^32",
            ),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
