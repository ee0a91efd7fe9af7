//! A decoded push: what a shard's aggregation rules combine ([`super::aggregate`]) and a
//! key's state keeps until its round closes ([`super::shard`]).

use super::owner::StepHeader;

/// One decoded push.
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    /// The decoded gradient (or parameters, in a parameter round), `numel` elements.
    pub values: Vec<f32>,
    /// The step's hyperparameters, in pushes to an owner after its parameter round.
    pub header: Option<StepHeader>,
    /// The scale (`log2 s`) a rescalable LoCo push was coded at.
    pub log2s: Option<i32>,
    /// The training samples the push stands for: its weight in the round's mean. A worker
    /// without a share of the round pushes zeros standing for none.
    pub samples: u32,
}
