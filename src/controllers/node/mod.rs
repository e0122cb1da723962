//! Node controllers: termination (taint, drain through the eviction queue, volume detachment,
//! instance deletion, finalizer).

pub mod drain;
pub mod eviction;
pub mod termination;
pub mod throttle;
pub mod volumes;
