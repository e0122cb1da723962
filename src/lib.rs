//! karpenter-exoscale: the Karpenter core and its Exoscale cloud provider.

pub mod apis;
pub mod provisioning;
pub mod simulate;
