//! Provisioning: batches pending pods, solves them with the shared scheduler against existing
//! capacity and NodePool templates, and creates NodeClaims.

pub mod batcher;
pub mod controller;
pub mod eligibility;
pub mod input;
pub mod template;
