//! NodeClaim controller: `reconcile` runs upstream's sub-steps (expiration, launch,
//! registration, initialization, consistency, liveness) over one shared `pass`, and `finalize`
//! tears a deleted NodeClaim down. `lifecycle` holds their pure decisions.

pub mod arrivals;
mod consistency;
pub mod expiration;
mod finalize;
mod initialization;
pub mod launch;
pub mod lifecycle;
mod liveness;
mod pass;
pub mod reconcile;
mod registration;
