//! The `karpenter-exoscale run` process: configuration, logging, leader election, metrics and
//! health servers, events, and the wiring of cluster state and controllers.

pub mod config;
pub mod events;
pub mod fenced_client;
pub mod health;
pub mod kube_connections;
pub mod leader;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod rate_limited_client;
pub mod rbac;
pub mod scheduler_config;
pub mod summary;
pub mod tasks;
pub mod timed_client;

pub use config::{Config, ConfigError, RunArgs};
pub mod run;

pub use run::{ExtraController, RunError, Runtime, run, serve};
