//! What `murmur worker` and `murmur swarm` share: the training job, how gradients are
//! compressed, and the events a worker reports. The launcher forwards the first two to its
//! worker processes flag for flag.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use murmur_engine::comm::partition::PartitionPlan;
use murmur_net::transport::Link;
use serde::{Deserialize, Serialize};

use crate::commands::train::DeviceKind;

/// The data-parallel job every worker runs.
#[derive(Args, Debug, Clone)]
pub struct JobArgs {
    /// mnist or fashion-mnist.
    #[arg(long, default_value = "mnist")]
    pub dataset: String,
    #[arg(long, default_value_t = 8)]
    pub epochs: u32,
    /// Samples per worker per step (the global batch is this times the world size).
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
    /// Hidden layer widths.
    #[arg(long, default_value = "512,256", value_delimiter = ',')]
    pub hidden: Vec<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "gpu")]
    pub device: DeviceKind,
    /// Stop after this many rounds (for quick checks).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Use only the first N training samples.
    #[arg(long)]
    pub train_limit: Option<usize>,
    /// Folder holding mnist/ and fashion-mnist/ (default: $MURMUR_DATA or ./data).
    #[arg(long)]
    pub data: Option<PathBuf>,
}

/// How gradients travel.
#[derive(Args, Debug, Clone)]
pub struct CompressionArgs {
    /// Codec of worker pushes, e.g. topk:0.01, sign, dither:linear:s=15, f32.
    #[arg(long, default_value = "f32")]
    pub codec: String,
    /// Codec of the servers' replies (default: the push codec).
    #[arg(long)]
    pub pull_codec: Option<String>,
    /// Error feedback on the workers: none, ef, or loco-ema:...
    #[arg(long, default_value = "ef")]
    pub memory: String,
    /// Error feedback on the servers.
    #[arg(long, default_value = "ef")]
    pub server_memory: String,
    /// Tensors are cut into partitions of this many bytes (BytePS default 4,096,000).
    #[arg(long, default_value_t = 4_096_000)]
    pub partition_bytes: usize,
    /// Tensors smaller than this travel uncompressed (BytePS default 1,024,000).
    #[arg(long, default_value_t = 1_024_000)]
    pub min_compress_bytes: usize,
}

/// What the link between peers carries; QUIC windows are sized from it.
#[derive(Args, Debug, Clone)]
pub struct LinkArgs {
    /// Link bandwidth in Mbit/s.
    #[arg(long, default_value_t = 1000.0)]
    pub link_mbit: f64,
    /// Link round-trip time in milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub link_rtt_ms: f64,
}

impl LinkArgs {
    pub fn link(&self) -> Link {
        Link {
            bytes_per_second: self.link_mbit * 1e6 / 8.0,
            rtt: Duration::from_secs_f64(self.link_rtt_ms / 1e3),
        }
    }

    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--link-mbit".into(),
            self.link_mbit.to_string(),
            "--link-rtt-ms".into(),
            self.link_rtt_ms.to_string(),
        ]
    }
}

impl JobArgs {
    /// The same job as command-line flags, for a worker process.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec![
            "--dataset".into(),
            self.dataset.clone(),
            "--epochs".into(),
            self.epochs.to_string(),
            "--batch".into(),
            self.batch.to_string(),
            "--lr".into(),
            self.lr.to_string(),
            "--hidden".into(),
            self.hidden
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            "--seed".into(),
            self.seed.to_string(),
            "--device".into(),
            format!("{:?}", self.device).to_lowercase(),
        ];
        if let Some(n) = self.max_steps {
            out.extend(["--max-steps".into(), n.to_string()]);
        }
        if let Some(n) = self.train_limit {
            out.extend(["--train-limit".into(), n.to_string()]);
        }
        if let Some(d) = &self.data {
            out.extend(["--data".into(), d.display().to_string()]);
        }
        out
    }
}

impl CompressionArgs {
    pub fn plan(&self) -> PartitionPlan {
        PartitionPlan {
            partition_bytes: self.partition_bytes,
            min_compress_bytes: self.min_compress_bytes,
            push: self.codec.clone(),
            pull: self
                .pull_codec
                .clone()
                .unwrap_or_else(|| self.codec.clone()),
            server_memory: self.server_memory.clone(),
            seed: 0,
        }
    }

    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec![
            "--codec".into(),
            self.codec.clone(),
            "--memory".into(),
            self.memory.clone(),
            "--server-memory".into(),
            self.server_memory.clone(),
            "--partition-bytes".into(),
            self.partition_bytes.to_string(),
            "--min-compress-bytes".into(),
            self.min_compress_bytes.to_string(),
        ];
        if let Some(p) = &self.pull_codec {
            out.extend(["--pull-codec".into(), p.clone()]);
        }
        out
    }
}

/// What a worker reports, one JSON object per line on stdout under `--json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerEvent {
    Started {
        rank: u16,
        world: u16,
        steps: u64,
        steps_per_epoch: u64,
        parameters: usize,
        keys: usize,
        /// The round it starts at (above 0 after catching up with a running swarm).
        from_step: u64,
    },
    Progress {
        rank: u16,
        step: u64,
        loss: f32,
        /// Bytes of the latest round.
        pushed: usize,
        pulled: usize,
        f32_each_way: usize,
        samples_per_second: f64,
    },
    Epoch {
        rank: u16,
        epoch: u32,
        accuracy: f64,
        seconds: f64,
    },
    Rejoined {
        rank: u16,
        step: u64,
        reason: String,
    },
    Done {
        rank: u16,
        steps: u64,
        final_accuracy: Option<f64>,
        bytes_pushed: u64,
        bytes_pulled: u64,
        f32_bytes_each_way: u64,
        seconds: f64,
    },
}

/// A server's first line on stdout: where it listens.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Listening {
    pub event: String,
    pub shard: u16,
    pub addr: std::net::SocketAddr,
    pub fingerprint: String,
}
