//! Training loops that the CLI, the examples and the reproductions share.

mod classifier;
mod data_parallel;
mod host_update;
mod language_model;
mod learner;
mod outer;
mod push_pipeline;
mod schedule;
mod shares;
mod state;

pub use classifier::{Classifier, ClassifierConfig, ClassifierModel, OptimizerKind};
pub use data_parallel::{
    CodeStats, DataParallel, RoundBytes, RoundTiming, Tamper, MAX_EMULATED_SECONDS_PER_SAMPLE,
};
pub use language_model::{LanguageModel, LmConfig};
pub use learner::Learner;
pub use outer::{OuterConfig, OuterRounds, SavedOuter};
pub use schedule::{clip_global_norm, WarmupCosine};
pub use shares::{rank_share, rank_slice};
pub use state::{Saved, FORMAT};
