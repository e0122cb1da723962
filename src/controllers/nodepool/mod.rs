//! NodePool controllers: drift hash annotations, status counters, readiness, validation and
//! registration health.

pub mod hash;
pub mod reconcile;
pub mod status;
