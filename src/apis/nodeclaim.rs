//! `karpenter.sh/v1` NodeClaim: one requested machine and its lifecycle.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, DURATION_PATTERN, NILLABLE_DURATION_PATTERN, NodeClassReference,
    NodeSelectorRequirementWithMinValues, ResourceList, Taint, nodeclaim_conditions_schema,
    nodeclaim_nodeclass_ref_schema, nodeclaim_requirements_schema, resource_list_schema,
    taints_schema,
};
use super::nodepool::default_expire_after;

/// A NodeClaim asks the cloud provider for one node matching its requirements.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    status = "NodeClaimStatus",
    category = "karpenter",
    doc = "NodeClaim is the Schema for the NodeClaims API: one machine requested from the cloud provider.",
    derive = "PartialEq",
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".metadata.labels.node\\.kubernetes\\.io/instance-type"
    ),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/capacity-type"
    ),
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".metadata.labels.topology\\.kubernetes\\.io/zone"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "ImageID",
        type_ = "string",
        json_path = ".status.imageID",
        priority = 1
    ),
    printcolumn(
        name = "ID",
        type_ = "string",
        json_path = ".status.providerID",
        priority = 1
    ),
    printcolumn(
        name = "NodePool",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/nodepool",
        priority = 1
    ),
    printcolumn(
        name = "NodeClass",
        type_ = "string",
        json_path = ".spec.nodeClassRef.name",
        priority = 1
    ),
    printcolumn(
        name = "Drifted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drifted\")].status",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{"message": "spec is immutable", "rule": "self == oldSelf"}]))]
pub struct NodeClaimSpec {
    /// Taints of the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub taints: Vec<Taint>,
    /// Taints removed by daemons after start-up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub startup_taints: Vec<Taint>,
    /// Label requirements the launched instance must satisfy.
    #[schemars(schema_with = "nodeclaim_requirements_schema")]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// Minimum resources the node must provide (the scheduled pods plus daemon overhead).
    #[serde(default, skip_serializing_if = "ResourceRequirements::is_empty")]
    pub resources: ResourceRequirements,
    /// The provider NodeClass.
    #[schemars(schema_with = "nodeclaim_nodeclass_ref_schema")]
    pub node_class_ref: NodeClassReference,
    /// Longest time a draining node may take before its pods are forcibly removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub termination_grace_period: Option<String>,
    /// Lifetime of the node, or `Never`.
    #[serde(default = "default_expire_after")]
    #[schemars(pattern(NILLABLE_DURATION_PATTERN))]
    pub expire_after: String,
}

/// Resource requests of a NodeClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceRequirements {
    /// Minimum resources the node must provide.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    #[schemars(schema_with = "resource_list_schema")]
    pub requests: ResourceList,
}

impl ResourceRequirements {
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

impl NodeClaim {
    /// Whether the NodeClaim states condition `type_` as `True` (no status states none).
    pub fn condition_is_true(&self, type_: &str) -> bool {
        use super::common::ConditionsExt;
        self.status
            .as_ref()
            .is_some_and(|s| s.conditions.is_true(type_))
    }
}

/// Observed state of a NodeClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeClaimStatus {
    /// Name of the Node that registered for this NodeClaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Cloud provider ID, `exoscale://<instance uuid>`.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Image (template) the instance booted from.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Total resources of the instance.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    #[schemars(schema_with = "resource_list_schema")]
    pub capacity: ResourceList,
    /// Resources available to pods.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    #[schemars(schema_with = "resource_list_schema")]
    pub allocatable: ResourceList,
    /// Lifecycle and disruption conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "nodeclaim_conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Last time a pod was bound to, or left, the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<Time>,
}
