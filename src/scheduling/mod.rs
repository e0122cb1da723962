//! The scheduling engine: pure, no I/O. Provisioning, consolidation and `simulate` all call
//! [`Scheduler::solve`]; consolidation builds one scheduler per disruption loop and calls
//! [`Scheduler::solve_excluding`] per candidate.
//!
//! Inputs are plain domain types ([`Pod`], [`ExistingNode`], [`NodePoolTemplate`],
//! [`InstanceType`], [`DaemonSetPod`]) gathered in a [`SchedulerInput`]; [`convert`] builds them
//! from Kubernetes objects and [`fixtures`] generates upstream-shaped synthetic ones.
//!
//! ```
//! use karpenter_exoscale::scheduling::{fixtures, Scheduler, SchedulerOptions};
//!
//! let scheduler = Scheduler::new(fixtures::benchmark_input(
//!     fixtures::instance_types(10),
//!     SchedulerOptions::default(),
//! ));
//! let pods = vec![fixtures::pod("web", "1", "1Gi"), fixtures::pod("api", "1", "1Gi")];
//! let results = scheduler.solve(&pods);
//! assert_eq!(results.new_node_claims.len(), 1);
//! assert_eq!(results.new_node_claims[0].pods.len(), 2);
//! assert!(results.unschedulable.is_empty());
//! ```
//!
//! Order of placement (upstream's): existing nodes and in-flight NodeClaims first, then NodeClaims
//! created earlier in the same solve (emptiest first), then a new NodeClaim from the heaviest
//! NodePool that can take the pod. Pods are packed largest CPU first; a pod that fits nowhere is
//! retried with its preferences relaxed one by one, and finally reported with a reason per NodePool.

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
    NamespaceScope, NodeLabels, NodePoolTemplate, Offering, Pod, PodAffinityTerm, PodLabels,
    PodShape, SelectorExpression, SelectorOperator, TopologySpreadConstraint,
    WeightedPodAffinityTerm, WeightedRequirements, WhenUnsatisfiable,
};
pub use quantity::{Quantity, QuantityError, Resources};
pub use requirements::{Incompatibility, Operator, Requirement, RequirementError, Requirements};
pub use scheduler::{
    DRA_NOT_SUPPORTED, ExistingNodeAssignment, MAX_INSTANCE_TYPES, MinValuesPolicy, NO_NODEPOOLS,
    NewNodeClaim, PreferencePolicy, Results, Scheduler, SchedulerInput, SchedulerOptions,
    SkippedNodePool, UnschedulablePod,
};
pub use taints::{Taint, TaintEffect, Toleration, TolerationOperator};
pub use topology::TopologyError;

#[cfg(test)]
mod exclusion_tests;
#[cfg(test)]
mod tests;
