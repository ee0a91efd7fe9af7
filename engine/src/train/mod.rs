//! Training loops that the CLI, the examples and the reproductions share.

mod classifier;

pub use classifier::{Classifier, ClassifierConfig, OptimizerKind};
