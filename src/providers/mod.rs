//! The Exoscale pieces behind the cloud provider: instance types, pricing, templates, user
//! data, bootstrap tokens, instances, NodeClass resolution and drift. Each has one job; the
//! pure parts are separate from the API and Kubernetes I/O.

pub mod bootstrap_token;
pub mod cluster_ca;
pub mod drift;
pub mod instance;
pub mod instance_types;
pub mod nodeclass;
pub mod nodeclass_controller;
pub mod pricing;
pub mod template;
pub mod userdata;
