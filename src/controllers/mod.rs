//! Controllers: each a thin shell that reads cluster state, calls pure decision code and
//! writes the result back.

pub mod node;
pub mod nodeclaim;
pub mod nodepool;
