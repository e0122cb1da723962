//! NodePool controllers: drift hash annotations, status counters, readiness, validation,
//! registration health and cost.

pub mod cost;
pub mod hash;
pub mod reconcile;
pub mod status;
