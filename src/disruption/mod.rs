//! Voluntary disruption decisions (emptiness, drift, consolidation), budgets, disruption
//! conditions and the orchestration state machine: pure logic over plain data with an injected
//! clock. The disruption controller gathers the inputs, calls these functions and executes the
//! commands they return.

pub mod budgets;
pub mod conditions;
pub mod hash;
pub mod names;

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
