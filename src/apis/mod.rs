//! CRD types: `karpenter.sh/v1` NodePool and NodeClaim, `karpenter.sh/v1alpha1` NodeOverlay and
//! `karpenter.exoscale.com/v1` ExoscaleNodeClass, plus well-known keys, CRD generation and
//! validation of objects against the generated schemas (OpenAPI rules and CEL).

pub mod common;
pub mod crd;
pub mod duration;
pub mod labels;
// Clippy reads repeated `printcolumn(type_ = ..)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod nodeclaim;
// Clippy reads repeated `printcolumn(type_ = ..)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod nodeclass;
// Clippy reads repeated `printcolumn(type_ = ..)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod nodeoverlay;
// Clippy reads repeated `printcolumn(type_ = ..)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod nodepool;
pub mod validation;

pub use common::{
    Condition, ConditionStatus, ConditionsExt, NodeClassReference,
    NodeSelectorRequirementWithMinValues, Operator, ResourceList, Taint, TaintEffect,
};
pub use nodeclaim::{NodeClaim, NodeClaimSpec, NodeClaimStatus};
pub use nodeclass::{ExoscaleNodeClass, ExoscaleNodeClassSpec, ExoscaleNodeClassStatus};
pub use nodeoverlay::{NodeOverlay, NodeOverlaySpec, NodeOverlayStatus};
pub use nodepool::{NodePool, NodePoolSpec, NodePoolStatus};
