//! The scheduling engine: pure, no I/O. Provisioning, consolidation and `simulate` all call
//! [`Scheduler::solve`].
//!
//! Inputs are plain domain types ([`Pod`], [`ExistingNode`], [`NodePoolTemplate`],
//! [`InstanceType`], [`DaemonSetPod`]); `convert` builds them from Kubernetes objects.

pub mod convert;
pub mod fixtures;
pub mod labels;
pub mod model;
pub mod quantity;
pub mod requirements;
mod scheduler;
pub mod taints;
mod topology;

pub use labels::WellKnownLabels;
pub use model::{
    BoundPod, DaemonSetPod, ExistingNode, InclusionPolicy, InstanceType, LabelSelector,
    NamespaceScope, NodePoolTemplate, Offering, Pod, PodAffinityTerm, SelectorExpression,
    SelectorOperator, TopologySpreadConstraint, WeightedPodAffinityTerm, WeightedRequirements,
    WhenUnsatisfiable,
};
pub use quantity::{Quantity, QuantityError, Resources};
pub use requirements::{Incompatibility, Operator, Requirement, RequirementError, Requirements};
pub use scheduler::{
    ExistingNodeAssignment, MAX_INSTANCE_TYPES, MinValuesPolicy, NewNodeClaim, PreferencePolicy,
    Results, Scheduler, SchedulerInput, SchedulerOptions, SkippedNodePool, UnschedulablePod,
};
pub use taints::{Taint, TaintEffect, Toleration, TolerationOperator};
pub use topology::TopologyError;

#[cfg(test)]
mod tests;
