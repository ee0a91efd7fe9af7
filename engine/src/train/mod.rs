//! Training loops that the CLI, the examples and the reproductions share.

mod classifier;
mod data_parallel;

pub use classifier::{Classifier, ClassifierConfig, OptimizerKind};
pub use data_parallel::{rank_slice, DataParallel, RoundBytes};
