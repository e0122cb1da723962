//! Node controllers: termination (taint, drain, instance deletion, finalizer).

pub mod drain;
pub mod termination;
