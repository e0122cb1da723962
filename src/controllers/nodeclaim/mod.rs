//! NodeClaim controllers: lifecycle (launch, registration, initialization, liveness),
//! termination (finalizer), expiration and consistency.

pub mod expiration;
pub mod lifecycle;
pub mod reconcile;
