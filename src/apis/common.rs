//! Types shared by several CRDs: requirements, taints, NodeClass references, conditions and
//! resource lists, with the exact schema rules of the upstream CRDs.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Qualified-name pattern for label keys (optional DNS prefix, then a name).
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";
/// Label-value pattern (may be empty).
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// Kubernetes quantity pattern as emitted for `resource.Quantity`.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
/// A duration made of `<n>s|m|h` parts, or `Never`.
pub const NILLABLE_DURATION_PATTERN: &str = r"^(([0-9]+(s|m|h))+|Never)$";
/// A duration made of `<n>s|m|h` parts.
pub const DURATION_PATTERN: &str = r"^([0-9]+(s|m|h))+$";
const CONDITION_TYPE_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";
const CONDITION_REASON_PATTERN: &str = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";
const CONDITION_REASON_OR_EMPTY_PATTERN: &str = r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?|)$";

/// A map of resource name to quantity (`cpu`, `memory`, `nodes`, `nvidia.com/gpu`, ...).
pub type ResourceList = BTreeMap<String, Quantity>;

/// Schema of a `ResourceList` field: values are int-or-string quantities.
pub fn resource_list_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true
        }
    })
}

/// Requirement operators, including the `Gte`/`Lte` extensions of Karpenter v1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
    Gte,
    Lte,
}

/// A node-selector requirement with an optional minimum number of distinct values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSelectorRequirementWithMinValues {
    pub key: String,
    pub operator: Operator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_values: Option<i64>,
}

/// Which key rules a requirement list enforces: NodePools also forbid `karpenter.sh/nodepool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequirementFlavour {
    NodePool,
    NodeClaim,
    NodeOverlay,
}

const KEY_DOMAIN_RULE: &str = r#"self in ["karpenter.sh/capacity-type", "karpenter.sh/nodepool"] || !self.find("^([^/]+)").endsWith("karpenter.sh")"#;
const IN_NEEDS_VALUE: &str = "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)";
const COMPARISON_SINGLE_INT: &str = "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && int(x.values[0]) >= 0) : true)";

/// Schema of a requirement list with the CEL rules of the given CRD.
pub fn requirements_schema(flavour: RequirementFlavour) -> Schema {
    let mut key_rules = vec![serde_json::json!({
        "message": "label domain \"karpenter.sh\" is restricted", "rule": KEY_DOMAIN_RULE})];
    if flavour == RequirementFlavour::NodePool {
        key_rules.push(serde_json::json!({
            "message": "label \"karpenter.sh/nodepool\" is restricted",
            "rule": "self != \"karpenter.sh/nodepool\""}));
    }
    key_rules.push(serde_json::json!({
        "message": "label \"kubernetes.io/hostname\" is restricted",
        "rule": "self != \"kubernetes.io/hostname\""}));

    let mut item = json_schema!({
        "description": "A node selector requirement with an optional minimum number of distinct values.",
        "type": "object",
        "required": ["key", "operator"],
        "properties": {
            "key": {
                "description": "The label key the requirement applies to.",
                "type": "string", "maxLength": 316, "pattern": LABEL_KEY_PATTERN,
                "x-kubernetes-validations": key_rules
            },
            "operator": {
                "description": "How the key relates to the values.",
                "type": "string",
                "enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]
            },
            "values": {
                "description": "Label values; one integer for Gt/Lt/Gte/Lte, none for Exists/DoesNotExist.",
                "type": "array",
                "items": {"type": "string"},
                "maxLength": 63,
                "pattern": LABEL_VALUE_PATTERN,
                "x-kubernetes-list-type": "atomic"
            }
        }
    });
    if flavour != RequirementFlavour::NodeOverlay {
        item.ensure_object()["properties"]["minValues"] = serde_json::json!({
            "description": "Minimum number of distinct values the launched capacity must be able to pick from.",
            "type": "integer", "minimum": 1, "maximum": 50
        });
    }
    let rules = match flavour {
        RequirementFlavour::NodeOverlay => serde_json::json!([
            {"message": "requirements with operator 'NotIn' must have a value defined",
             "rule": "self.all(x, x.operator == 'NotIn' ? x.values.size() != 0 : true)"},
            {"message": "requirements with operator 'In' must have a value defined", "rule": IN_NEEDS_VALUE},
            {"message": "requirements operator 'Gt', 'Lt', 'Gte' or 'Lte' must have a single positive integer value",
             "rule": COMPARISON_SINGLE_INT}
        ]),
        _ => serde_json::json!([
            {"message": "requirements with operator 'In' must have a value defined", "rule": IN_NEEDS_VALUE},
            {"message": "requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single positive integer value",
             "rule": COMPARISON_SINGLE_INT},
            {"message": "requirements with 'minValues' must have at least that many values specified in the 'values' field",
             "rule": "self.all(x, (x.operator == 'In' && has(x.minValues)) ? x.values.size() >= x.minValues : true)"}
        ]),
    };
    json_schema!({
        "description": "Requirements that constrain the labels of launched nodes.",
        "type": "array",
        "maxItems": 100,
        "items": item,
        "x-kubernetes-list-type": "atomic",
        "x-kubernetes-validations": rules
    })
}

pub fn nodepool_requirements_schema(_: &mut SchemaGenerator) -> Schema {
    requirements_schema(RequirementFlavour::NodePool)
}
pub fn nodeclaim_requirements_schema(_: &mut SchemaGenerator) -> Schema {
    requirements_schema(RequirementFlavour::NodeClaim)
}
pub fn nodeoverlay_requirements_schema(_: &mut SchemaGenerator) -> Schema {
    requirements_schema(RequirementFlavour::NodeOverlay)
}

/// Taint effects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// A node taint, as in `core/v1` but with label-syntax validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: TaintEffect,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<Time>,
}

impl Taint {
    pub fn new(key: &str, value: Option<&str>, effect: TaintEffect) -> Self {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect,
            time_added: None,
        }
    }
}

impl JsonSchema for Taint {
    fn schema_name() -> Cow<'static, str> {
        "Taint".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A taint applied to launched nodes.",
            "type": "object",
            "required": ["effect", "key"],
            "properties": {
                "effect": {"description": "The taint effect.", "type": "string",
                           "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
                "key": {"description": "The taint key.", "type": "string", "minLength": 1,
                        "pattern": LABEL_KEY_PATTERN},
                "timeAdded": {"description": "When the taint was added (NoExecute only).",
                              "type": "string", "format": "date-time"},
                "value": {"description": "The taint value.", "type": "string",
                          "pattern": LABEL_KEY_PATTERN}
            }
        })
    }
}

/// Schema of a taint list.
pub fn taints_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = Taint::json_schema(generator);
    json_schema!({"type": "array", "items": item, "x-kubernetes-list-type": "atomic"})
}

/// Reference to the provider-specific NodeClass of a NodePool or NodeClaim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeClassReference {
    pub group: String,
    pub kind: String,
    pub name: String,
}

impl NodeClassReference {
    /// Schema, optionally with the immutability rules NodePools carry.
    pub fn schema(immutable_group_kind: bool) -> Schema {
        let mut schema = json_schema!({
            "description": "The NodeClass that describes how to build the machine.",
            "type": "object",
            "required": ["group", "kind", "name"],
            "properties": {
                "group": {"description": "API group of the NodeClass.", "type": "string", "pattern": "^[^/]*$",
                          "x-kubernetes-validations": [{"message": "group may not be empty", "rule": "self != ''"}]},
                "kind": {"description": "Kind of the NodeClass.", "type": "string",
                         "x-kubernetes-validations": [{"message": "kind may not be empty", "rule": "self != ''"}]},
                "name": {"description": "Name of the NodeClass.", "type": "string",
                         "x-kubernetes-validations": [{"message": "name may not be empty", "rule": "self != ''"}]}
            }
        });
        if immutable_group_kind {
            schema.insert(
                "x-kubernetes-validations".into(),
                serde_json::json!([
                    {"message": "nodeClassRef.group is immutable", "rule": "self.group == oldSelf.group"},
                    {"message": "nodeClassRef.kind is immutable", "rule": "self.kind == oldSelf.kind"}
                ]),
            );
        }
        schema
    }
}

pub fn nodepool_nodeclass_ref_schema(_: &mut SchemaGenerator) -> Schema {
    NodeClassReference::schema(true)
}
pub fn nodeclaim_nodeclass_ref_schema(_: &mut SchemaGenerator) -> Schema {
    NodeClassReference::schema(false)
}

/// Status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// A status condition (the `operatorpkg` shape every Karpenter CRD uses).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub last_transition_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// How strict the condition schema of a CRD is (NodeClaims allow an empty reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionFlavour {
    Strict,
    EmptyReasonAllowed,
    /// As Strict, but without list-map keys (the Go provider's ExoscaleNodeClass).
    StrictUnkeyed,
}

pub fn conditions_schema(flavour: ConditionFlavour) -> Schema {
    let (required, reason) = match flavour {
        ConditionFlavour::EmptyReasonAllowed => (
            serde_json::json!(["lastTransitionTime", "status", "type"]),
            serde_json::json!({"description": "Machine-readable reason for the last transition.",
                "type": "string", "maxLength": 1024, "pattern": CONDITION_REASON_OR_EMPTY_PATTERN}),
        ),
        _ => (
            serde_json::json!(["lastTransitionTime", "message", "reason", "status", "type"]),
            serde_json::json!({"description": "Machine-readable reason for the last transition.",
                "type": "string", "maxLength": 1024, "minLength": 1, "pattern": CONDITION_REASON_PATTERN}),
        ),
    };
    let mut schema = json_schema!({
        "description": "Current state of the object.",
        "type": "array",
        "items": {
            "description": "One aspect of the object's current state.",
            "type": "object",
            "required": required,
            "properties": {
                "lastTransitionTime": {"description": "When the status last changed.", "type": "string", "format": "date-time"},
                "message": {"description": "Human-readable details.", "type": "string", "maxLength": 32768},
                "observedGeneration": {"description": "The generation the condition was computed for.",
                                       "type": "integer", "format": "int64", "minimum": 0},
                "reason": reason,
                "status": {"description": "True, False or Unknown.", "type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {"description": "Condition type in CamelCase.", "type": "string", "maxLength": 316,
                         "pattern": CONDITION_TYPE_PATTERN}
            }
        }
    });
    if flavour != ConditionFlavour::StrictUnkeyed {
        schema.insert(
            "x-kubernetes-list-map-keys".into(),
            serde_json::json!(["type"]),
        );
        schema.insert("x-kubernetes-list-type".into(), serde_json::json!("map"));
    }
    schema
}

pub fn strict_conditions_schema(_: &mut SchemaGenerator) -> Schema {
    conditions_schema(ConditionFlavour::Strict)
}
pub fn nodeclaim_conditions_schema(_: &mut SchemaGenerator) -> Schema {
    conditions_schema(ConditionFlavour::EmptyReasonAllowed)
}
pub fn nodeclass_conditions_schema(_: &mut SchemaGenerator) -> Schema {
    conditions_schema(ConditionFlavour::StrictUnkeyed)
}

/// Longest condition message written. Messages echo user input (selector names, label keys,
/// quantities) of any length; past the CRDs' 32768 the apiserver rejects the whole status patch.
pub const CONDITION_MESSAGE_MAX_CHARS: usize = 1024;
/// Ends a message that was cut.
const CUT_MARKER: char = '…';

/// `message` cut on a character boundary to at most [`CONDITION_MESSAGE_MAX_CHARS`] characters,
/// the last one being [`CUT_MARKER`] when anything was cut.
pub fn bounded_condition_message(message: &str) -> Cow<'_, str> {
    if message.chars().nth(CONDITION_MESSAGE_MAX_CHARS).is_none() {
        return Cow::Borrowed(message);
    }
    let kept = message
        .char_indices()
        .nth(CONDITION_MESSAGE_MAX_CHARS - 1)
        .map_or(message.len(), |(end, _)| end);
    Cow::Owned(format!("{}{CUT_MARKER}", &message[..kept]))
}

/// Helpers over a list of conditions, keeping `lastTransitionTime` stable when nothing changed.
/// Every message set is bounded by [`bounded_condition_message`].
pub trait ConditionsExt {
    fn get_condition(&self, type_: &str) -> Option<&Condition>;
    fn is_true(&self, type_: &str) -> bool {
        self.get_condition(type_)
            .is_some_and(|c| c.status == ConditionStatus::True)
    }
    /// Sets a condition; returns true when anything changed.
    fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        generation: Option<i64>,
        now: k8s_openapi::jiff::Timestamp,
    ) -> bool;
}

impl ConditionsExt for Vec<Condition> {
    fn get_condition(&self, type_: &str) -> Option<&Condition> {
        self.iter().find(|c| c.type_ == type_)
    }

    fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        generation: Option<i64>,
        now: k8s_openapi::jiff::Timestamp,
    ) -> bool {
        let message = &*bounded_condition_message(message);
        if let Some(existing) = self.iter_mut().find(|c| c.type_ == type_) {
            let unchanged = existing.status == status
                && existing.reason == reason
                && existing.message == message
                && existing.observed_generation == generation;
            if unchanged {
                return false;
            }
            if existing.status != status {
                existing.last_transition_time = Time(now);
            }
            existing.status = status;
            existing.reason = reason.into();
            existing.message = message.into();
            existing.observed_generation = generation;
            return true;
        }
        self.push(Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(now),
            observed_generation: generation,
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_messages_are_bounded_on_a_char_boundary() {
        let t0 = k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap();
        // A 40 000-character selector name echoed in an error, multi-byte to test the cut.
        let huge = format!(
            "security group with name {:?} not found",
            "é".repeat(40_000)
        );
        let mut conditions = Vec::new();
        conditions.set_condition("Ready", ConditionStatus::False, "Failed", &huge, None, t0);
        let message = &conditions[0].message;
        assert_eq!(message.chars().count(), CONDITION_MESSAGE_MAX_CHARS);
        assert!(message.starts_with("security group with name \"éé"));
        assert!(message.ends_with("é…"), "cut marked");
        assert!(
            !conditions.set_condition("Ready", ConditionStatus::False, "Failed", &huge, None, t0),
            "the same long message again is no change (no status rewrite every pass)"
        );

        let exact = "x".repeat(CONDITION_MESSAGE_MAX_CHARS);
        assert_eq!(bounded_condition_message(&exact), exact.as_str());
        assert_eq!(bounded_condition_message("short"), "short");
    }

    #[test]
    fn set_condition_keeps_transition_time_when_status_is_stable() {
        let t0 = k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap();
        let t1 = k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap();
        let mut conds = Vec::new();
        assert!(conds.set_condition("Ready", ConditionStatus::False, "A", "x", None, t0));
        assert!(!conds.set_condition("Ready", ConditionStatus::False, "A", "x", None, t1));
        assert!(conds.set_condition("Ready", ConditionStatus::False, "B", "y", None, t1));
        assert_eq!(
            conds[0].last_transition_time.0, t0,
            "reason change keeps the transition time"
        );
        assert!(conds.set_condition("Ready", ConditionStatus::True, "Ready", "", None, t1));
        assert_eq!(conds[0].last_transition_time.0, t1);
        assert!(conds.is_true("Ready"));
    }
}
