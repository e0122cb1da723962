//! Test support shared by the integration-test targets (`mod support;` in each).
// Each test target uses a different subset of these helpers.
#![allow(dead_code)]

pub mod control_plane;
pub mod crds;
pub mod kube_proxy;
pub mod openapi;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod sandbox;

#[allow(unused_imports)]
pub use control_plane::shared;
