//! Voluntary disruption decisions (emptiness, drift, consolidation), budgets, disruption
//! conditions and the orchestration state machine: pure logic over plain data with an injected
//! clock. The disruption controller gathers the inputs, calls these functions and executes the
//! commands they return.

pub mod balanced;
pub mod budgets;
pub mod candidates;
pub mod command;
pub mod conditions;
pub mod fixtures;
pub mod hash;
pub mod memo;
pub mod methods;
pub mod model;
pub mod names;
pub mod orchestration;
pub mod simulate;
#[cfg(test)]
mod tests;
pub mod validation;

use thiserror::Error;

use crate::apis::duration::DurationError;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DisruptionError {
    #[error("invalid budget nodes {0:?}: expected a count like 3 or a percentage like 10%")]
    InvalidBudgetNodes(String),
    #[error("invalid budget schedule {0:?}: {1}")]
    InvalidSchedule(String, String),
    #[error("a budget schedule must be set together with a duration")]
    ScheduleWithoutDuration,
    #[error(transparent)]
    Duration(#[from] DurationError),
}
