//! `karpenter-exoscale simulate`: which nodes would be launched for a set of manifests, using the
//! same scheduler and instance-type pipeline as the controller, without a cluster or credentials.

pub mod manifests;
