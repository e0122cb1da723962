//! `karpenter.sh/v1` NodePool: which machines may be launched, and how they are disrupted.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, DURATION_PATTERN, LABEL_VALUE_PATTERN, NILLABLE_DURATION_PATTERN,
    NodeClassReference, NodeSelectorRequirementWithMinValues, ResourceList, Taint,
    nodepool_nodeclass_ref_schema, nodepool_requirements_schema, resource_list_schema,
    strict_conditions_schema, taints_schema,
};

/// A NodePool sets constraints on the nodes Karpenter may create and the pods that may run on them.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    status = "NodePoolStatus",
    category = "karpenter",
    doc = "NodePool is the Schema for the NodePools API: constraints on the nodes Karpenter may launch.",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.nodes"
    ),
    printcolumn(
        name = "NodeClass",
        type_ = "string",
        json_path = ".spec.template.spec.nodeClassRef.name"
    ),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodes"),
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
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        json_path = ".status.resources.cpu",
        priority = 1
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".status.resources.memory",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"message": "Cannot transition NodePool between static (replicas set) and dynamic (replicas unset) provisioning modes",
     "rule": "has(self.replicas) == has(oldSelf.replicas)"},
    {"message": "only 'limits.nodes' is supported on static NodePools",
     "rule": "!has(self.replicas) || (!has(self.limits) || size(self.limits) == 0 || (size(self.limits) == 1 && 'nodes' in self.limits))"},
    {"message": "'weight' is not supported on static NodePools",
     "rule": "!has(self.replicas) || !has(self.weight)"}
]))]
pub struct NodePoolSpec {
    /// Template of the NodeClaims this NodePool creates.
    pub template: NodeClaimTemplate,
    /// How and when nodes of this NodePool may be disrupted.
    #[serde(default)]
    #[schemars(extend("default" = {"consolidateAfter": "0s"}))]
    pub disruption: Disruption,
    /// Upper bounds on the resources (and `nodes`) this NodePool may provision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub limits: Option<ResourceList>,
    /// Priority among NodePools: higher is tried first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
    /// Static NodePools only (alpha): the exact number of nodes to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i64>,
}

/// The NodeClaim template of a NodePool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeClaimTemplate {
    /// Labels and annotations copied to every NodeClaim and Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The NodeClaim spec.
    pub spec: NodeClaimTemplateSpec,
}

/// Labels and annotations of the NodeClaim template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateMetadata {
    /// Labels for launched nodes; Karpenter-owned keys are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "additionalProperties" = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
        "maxProperties" = 100,
        "x-kubernetes-map-type" = "atomic",
        "x-kubernetes-validations" = [
            {"message": "label domain \"karpenter.sh\" is restricted",
             "rule": "self.all(x, x in [\"karpenter.sh/capacity-type\", \"karpenter.sh/nodepool\"] || !x.find(\"^([^/]+)\").endsWith(\"karpenter.sh\"))"},
            {"message": "label \"karpenter.sh/nodepool\" is restricted",
             "rule": "self.all(x, x != \"karpenter.sh/nodepool\")"},
            {"message": "label \"kubernetes.io/hostname\" is restricted",
             "rule": "self.all(x, x != \"kubernetes.io/hostname\")"}
        ]
    ))]
    pub labels: BTreeMap<String, String>,
    /// Annotations for launched nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub annotations: BTreeMap<String, String>,
}

/// What every NodeClaim of the NodePool looks like.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeClaimTemplateSpec {
    /// Taints of launched nodes; pods must tolerate them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub taints: Vec<Taint>,
    /// Taints expected to be removed by a daemon after start-up; ignored when scheduling.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub startup_taints: Vec<Taint>,
    /// Label requirements on the launched node.
    #[schemars(schema_with = "nodepool_requirements_schema")]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The provider NodeClass.
    #[schemars(schema_with = "nodepool_nodeclass_ref_schema")]
    pub node_class_ref: NodeClassReference,
    /// Lifetime of a node before it is replaced, or `Never`.
    #[serde(default = "default_expire_after")]
    #[schemars(pattern(NILLABLE_DURATION_PATTERN))]
    pub expire_after: String,
    /// Longest time a draining node may take before its pods are forcibly removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub termination_grace_period: Option<String>,
}

pub fn default_expire_after() -> String {
    "720h".into()
}

/// Disruption settings of a NodePool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disruption {
    /// Time since the last pod event after which a node may be consolidated, or `Never`.
    #[serde(default = "default_consolidate_after")]
    #[schemars(pattern(NILLABLE_DURATION_PATTERN))]
    pub consolidate_after: String,
    /// Which nodes consolidation may act on.
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// Limits on how many nodes may be disrupted at once.
    #[serde(default = "default_budgets")]
    #[schemars(length(max = 50))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "atomic",
        "x-kubernetes-validations" = [{"message": "'schedule' must be set with 'duration'",
                                       "rule": "self.all(x, has(x.schedule) == has(x.duration))"}]
    ))]
    pub budgets: Vec<Budget>,
}

impl Default for Disruption {
    fn default() -> Self {
        Disruption {
            consolidate_after: default_consolidate_after(),
            consolidation_policy: ConsolidationPolicy::default(),
            budgets: default_budgets(),
        }
    }
}

fn default_consolidate_after() -> String {
    "0s".into()
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget {
        nodes: default_budget_nodes(),
        schedule: None,
        duration: None,
        reasons: None,
    }]
}

/// Which nodes consolidation considers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConsolidationPolicy {
    WhenEmpty,
    #[default]
    WhenEmptyOrUnderutilized,
    Balanced,
}

impl ConsolidationPolicy {
    /// As spelt in the spec (and in upstream's metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            ConsolidationPolicy::WhenEmpty => "WhenEmpty",
            ConsolidationPolicy::WhenEmptyOrUnderutilized => "WhenEmptyOrUnderutilized",
            ConsolidationPolicy::Balanced => "Balanced",
        }
    }
}

/// A limit on concurrent disruptions, optionally active only in a cron window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("required" = ["nodes"]))]
pub struct Budget {
    /// Nodes that may be disrupted at once: a count or a percentage of the NodePool.
    #[serde(default = "default_budget_nodes")]
    #[schemars(pattern(r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    /// Cron schedule (UTC) at which the budget window starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$"))]
    pub schedule: Option<String>,
    /// How long the window lasts once the schedule fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"))]
    pub duration: Option<String>,
    /// Disruption reasons the budget applies to; all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 50))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub reasons: Option<Vec<DisruptionReason>>,
}

fn default_budget_nodes() -> String {
    "10%".into()
}

/// Reasons a node is voluntarily disrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DisruptionReason {
    Underutilized,
    Empty,
    Drifted,
}

impl DisruptionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DisruptionReason::Underutilized => "Underutilized",
            DisruptionReason::Empty => "Empty",
            DisruptionReason::Drifted => "Drifted",
        }
    }
}

/// Observed state of a NodePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePoolStatus {
    /// Resources provisioned by this NodePool.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    #[schemars(schema_with = "resource_list_schema")]
    pub resources: ResourceList,
    /// Number of nodes of this NodePool.
    #[serde(default)]
    pub nodes: i64,
    /// Generation of the NodeClass last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
    /// Conditions: ValidationSucceeded, NodeClassReady, NodeRegistrationHealthy, Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "strict_conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl NodePool {
    /// The NodePool's weight (absent = 0).
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    /// Template labels (empty when unset).
    pub fn template_labels(&self) -> BTreeMap<String, String> {
        self.spec
            .template
            .metadata
            .as_ref()
            .map(|m| m.labels.clone())
            .unwrap_or_default()
    }

    /// Whether new nodes may be launched from this NodePool: as upstream, only once its Ready
    /// condition is True. A NodePool created a moment ago has no status yet; its NodeClass may
    /// not exist or resolve, and its template has not been validated.
    pub fn is_ready(&self) -> bool {
        self.ready_condition()
            .is_some_and(|c| c.status == super::ConditionStatus::True)
    }

    /// Why this NodePool may not launch nodes (`None` when it is Ready), worded to follow
    /// "nodepool <name>".
    pub fn not_ready_reason(&self) -> Option<String> {
        match self.ready_condition() {
            Some(c) if c.status == super::ConditionStatus::True => None,
            Some(c) if !c.message.is_empty() => Some(format!("is not ready: {}", c.message)),
            Some(c) => Some(format!("is not ready ({})", c.reason)),
            None => Some("is not ready: its status has no Ready condition yet".to_string()),
        }
    }

    /// Sets the Ready condition, dated at the Unix epoch: for a NodePool read from a manifest
    /// (`simulate`) and for tests. The NodePool controller writes its own, with the time.
    pub fn set_ready_condition(
        &mut self,
        status: super::ConditionStatus,
        reason: &str,
        message: &str,
    ) {
        use super::ConditionsExt;
        let conditions = &mut self.status.get_or_insert_with(Default::default).conditions;
        let at = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        conditions.set_condition(
            super::labels::conditions::READY,
            status,
            reason,
            message,
            None,
            at,
        );
    }

    fn ready_condition(&self) -> Option<&Condition> {
        use super::ConditionsExt;
        self.status
            .as_ref()
            .and_then(|s| s.conditions.get_condition(super::labels::conditions::READY))
    }
}
