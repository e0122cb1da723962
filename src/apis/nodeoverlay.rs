//! `karpenter.sh/v1alpha1` NodeOverlay: price and capacity adjustments for instance types.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, NodeSelectorRequirementWithMinValues, ResourceList, nodeoverlay_requirements_schema,
    resource_list_schema, strict_conditions_schema,
};

/// Adjusts the price or capacity of the instance types its requirements select.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1alpha1",
    kind = "NodeOverlay",
    status = "NodeOverlayStatus",
    category = "karpenter",
    doc = "NodeOverlay is the Schema for the NodeOverlays API: price and capacity adjustments.",
    shortname = "overlays",
    derive = "PartialEq",
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
        name = "Weight",
        type_ = "integer",
        json_path = ".spec.weight",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"message": "cannot set both 'price' and 'priceAdjustment'", "rule": "!has(self.price) || !has(self.priceAdjustment)"}
]))]
pub struct NodeOverlaySpec {
    /// Selects (NodePool, instance type, offering) tuples by label.
    #[schemars(schema_with = "nodeoverlay_requirements_schema")]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// Absolute price per hour for the selected offerings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^\d+(\.\d+)?$"))]
    pub price: Option<String>,
    /// Relative change: `+0.5`, `-0.1`, `+10%`, `-25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(
        r"^(([+-]{1}(\d*\.?\d+))|(\+{1}\d*\.?\d+%)|(^(-\d{1,2}(\.\d+)?%)$)|(-100%))$"
    ))]
    pub price_adjustment: Option<String>,
    /// Extended resources added to the selected instance types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "overlay_capacity_schema")]
    pub capacity: Option<ResourceList>,
    /// Higher weights win when overlays overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub weight: Option<i32>,
}

fn overlay_capacity_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = resource_list_schema(generator);
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{"message": "invalid resource restricted",
            "rule": "self.all(x, !(x in ['cpu', 'memory', 'ephemeral-storage', 'pods']))"}]),
    );
    schema
}

/// Observed state of a NodeOverlay.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeOverlayStatus {
    /// ValidationSucceeded and Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "strict_conditions_schema")]
    pub conditions: Vec<Condition>,
}
