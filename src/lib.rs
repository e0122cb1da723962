//! karpenter-exoscale: the Karpenter core and its Exoscale cloud provider.

pub mod apis;
pub mod catalogue;
pub mod clock;
pub mod cloudprovider;
pub mod controllers;
pub mod disruption;
pub mod doctor;
pub mod exoscale;
pub mod explain;
pub mod fence;
pub mod interner;
pub mod operator;
pub mod providers;
pub mod provisioning;
pub mod scheduling;
pub mod sim;
pub mod simulate;
pub mod state;
pub mod token_bucket;
