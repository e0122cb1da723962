//! karpenter-exoscale: the Karpenter core and its Exoscale cloud provider.
pub mod kubelet_sim;
