//! Voluntary disruption decisions (emptiness, drift, consolidation), budgets, disruption
//! conditions and the orchestration state machine: pure logic over plain data with an injected
//! clock. The disruption controller gathers the inputs, calls these functions and executes the
//! commands they return.
//!
//! One loop of the disruption controller:
//! 1. build a [`model::ClusterView`] (nodes with their pods, NodePools with instance types and
//!    scheduler templates, pending pods, PDBs, queued provider IDs, `now`);
//! 2. [`methods::decide`] tries emptiness, drift, multi-node and single-node consolidation in
//!    that order and returns the first [`command::Command`] plus events and gauge values
//!    ([`memo::ConsolidationMemo`] lets it skip an unchanged cluster);
//! 3. [`orchestration::Orchestration::new`] turns the command into [`orchestration::Action`]s:
//!    after [`validation::COMMAND_VALIDATION_DELAY`] the controller calls `validate` with a fresh
//!    view, executes the actions (taint, condition, launch, mark, delete, restore, events,
//!    counters) and reports replacement progress through `observe` / `launch_failed`.
//!
//! The `nodeclaim.disruption` controller uses [`conditions`] (`Consolidatable`, `Drifted`) and
//! the NodePool hash controller [`hash::nodepool_hash`].

pub mod balanced;
pub mod budgets;
pub mod candidates;
pub mod command;
pub mod conditions;
pub mod cron;
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
