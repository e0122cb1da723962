//! `karpenter.exoscale.com/v1` ExoscaleNodeClass: how to build an Exoscale instance.
//! Wire-compatible with the Go provider's CRD, plus `kubelet.maxPods` (the SKS node agent's
//! `max-pods`), `nodeLabels` and `nodeTaints` (shown in the Go provider's README and GPU example
//! but missing from its CRD).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, LABEL_VALUE_PATTERN, Taint, nodeclass_conditions_schema, taints_schema,
};

const UUID_PATTERN: &str = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
const CPU_PATTERN: &str = r"^(\d+(m|[.])?(\d+)?|\d+m)$";
const BYTES_PATTERN: &str = r"^(\d+(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)$";
/// Pods per node when `kubelet.maxPods` is unset (the Go provider's fixed value).
pub const DEFAULT_MAX_PODS: i32 = 110;
pub const DEFAULT_CLUSTER_DNS: &str = "10.96.0.10";

/// Describes the Exoscale instances Karpenter launches: template, disk, networking, kubelet.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.exoscale.com",
    version = "v1",
    kind = "ExoscaleNodeClass",
    status = "ExoscaleNodeClassStatus",
    category = "karpenter",
    doc = "ExoscaleNodeClass is the Schema for the ExoscaleNodeClass API: how Exoscale instances are built.",
    derive = "PartialEq",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"message": "imageGCLowThresholdPercent must be less than imageGCHighThresholdPercent",
     "rule": "!has(self.kubelet) || !has(self.kubelet.imageGCHighThresholdPercent) || !has(self.kubelet.imageGCLowThresholdPercent) || self.kubelet.imageGCLowThresholdPercent < self.kubelet.imageGCHighThresholdPercent"},
    {"message": "exactly one of templateID or imageTemplateSelector must be specified",
     "rule": "(has(self.templateID) && !has(self.imageTemplateSelector)) || (!has(self.templateID) && has(self.imageTemplateSelector))"}
]))]
pub struct ExoscaleNodeClassSpec {
    /// Exoscale template UUID to boot from. Exclusive with imageTemplateSelector.
    #[serde(
        default,
        rename = "templateID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(pattern(UUID_PATTERN))]
    pub template_id: Option<String>,
    /// Selects the SKS node template for a Kubernetes version and variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_template_selector: Option<ImageTemplateSelector>,
    /// Root disk size in GB.
    #[serde(default = "default_disk_size")]
    #[schemars(range(min = 10, max = 8000))]
    pub disk_size: i64,
    /// Deprecated: security group IDs; use securityGroupSelectorTerms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub security_groups: Vec<String>,
    /// Security groups by ID or name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub security_group_selector_terms: Vec<SelectorTerm>,
    /// Deprecated: anti-affinity group IDs; use antiAffinityGroupSelectorTerms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_affinity_groups: Vec<String>,
    /// Anti-affinity groups by ID or name (at most 8 instances per group).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub anti_affinity_group_selector_terms: Vec<SelectorTerm>,
    /// Deprecated: private network IDs; use privateNetworkSelectorTerms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub private_networks: Vec<String>,
    /// Private networks by ID or name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub private_network_selector_terms: Vec<SelectorTerm>,
    /// Kubelet settings of launched nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Labels every node of this class carries, on top of its NodePool's template labels (the
    /// NodePool wins on a shared key). Karpenter-owned keys are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "additionalProperties" = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
        "maxProperties" = 100,
        "x-kubernetes-map-type" = "atomic",
        "x-kubernetes-validations" = [
            {"message": "label domain \"karpenter.sh\" is restricted",
             "rule": "self.all(x, !x.find(\"^([^/]+)\").endsWith(\"karpenter.sh\"))"},
            {"message": "label domain \"karpenter.exoscale.com\" is restricted",
             "rule": "self.all(x, !x.find(\"^([^/]+)\").endsWith(\"karpenter.exoscale.com\"))"},
            {"message": "label \"kubernetes.io/hostname\" is restricted",
             "rule": "self.all(x, x != \"kubernetes.io/hostname\")"}
        ]
    ))]
    pub node_labels: BTreeMap<String, String>,
    /// Taints every node of this class carries, on top of its NodePool's taints; pods must
    /// tolerate them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub node_taints: Vec<Taint>,
}

fn default_disk_size() -> i64 {
    50
}

/// SKS node template selection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageTemplateSelector {
    /// Kubernetes version `x.y.z`; the control plane's version when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9]+\.[0-9]+\.[0-9]+$"))]
    pub version: Option<String>,
    /// Template variant.
    #[serde(default)]
    pub variant: TemplateVariant,
}

/// SKS template variants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TemplateVariant {
    #[default]
    Standard,
    Nvidia,
}

impl TemplateVariant {
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateVariant::Standard => "standard",
            TemplateVariant::Nvidia => "nvidia",
        }
    }
}

/// Selects one Exoscale object by ID or by name; exactly one must be given.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"message": "exactly one of id or name must be specified",
     "rule": "(has(self.id) && !has(self.name)) || (!has(self.id) && has(self.name))"}
]))]
pub struct SelectorTerm {
    /// Object ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Object name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Kubelet settings. Defaults equal the Go provider's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletConfiguration {
    /// Cluster DNS server addresses.
    #[serde(default = "default_cluster_dns", rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    /// Disk usage percentage that triggers image garbage collection.
    #[serde(default = "default_gc_high", rename = "imageGCHighThresholdPercent")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: i32,
    /// Disk usage percentage image garbage collection frees down to.
    #[serde(default = "default_gc_low", rename = "imageGCLowThresholdPercent")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: i32,
    /// Minimum age of an unused image before it may be collected.
    #[serde(default = "default_gc_age", rename = "imageMinimumGCAge")]
    #[schemars(pattern(r"^[0-9]+(s|m|h)$"))]
    pub image_minimum_gc_age: String,
    /// Resources reserved for Kubernetes daemons.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub kube_reserved: KubeReserved,
    /// Resources reserved for the operating system.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub system_reserved: SystemReserved,
    /// Kubelet feature gates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// Maximum pods per node (110 when unset); the SKS node agent's `max-pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_pods: Option<i32>,
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        KubeletConfiguration {
            cluster_dns: default_cluster_dns(),
            image_gc_high_threshold_percent: default_gc_high(),
            image_gc_low_threshold_percent: default_gc_low(),
            image_minimum_gc_age: default_gc_age(),
            kube_reserved: KubeReserved::default(),
            system_reserved: SystemReserved::default(),
            feature_gates: BTreeMap::new(),
            max_pods: None,
        }
    }
}

fn default_cluster_dns() -> Vec<String> {
    vec![DEFAULT_CLUSTER_DNS.into()]
}
fn default_gc_high() -> i32 {
    85
}
fn default_gc_low() -> i32 {
    80
}
fn default_gc_age() -> String {
    "2m".into()
}

/// The CRD gives defaults to the fields of a reservation but not to the reservation itself.
fn drop_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// Resources reserved for Kubernetes daemons (kubelet, container runtime).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeReserved {
    /// CPU, e.g. `200m`.
    #[serde(default = "kubereserved_cpu")]
    #[schemars(pattern(CPU_PATTERN))]
    pub cpu: String,
    /// Memory, e.g. `300Mi`.
    #[serde(default = "kubereserved_memory")]
    #[schemars(pattern(BYTES_PATTERN))]
    pub memory: String,
    /// Ephemeral storage, e.g. `1Gi`.
    #[serde(default = "kubereserved_ephemeral_storage")]
    #[schemars(pattern(BYTES_PATTERN))]
    pub ephemeral_storage: String,
}

impl Default for KubeReserved {
    fn default() -> Self {
        KubeReserved {
            cpu: kubereserved_cpu(),
            memory: kubereserved_memory(),
            ephemeral_storage: kubereserved_ephemeral_storage(),
        }
    }
}

fn kubereserved_cpu() -> String {
    "200m".into()
}
fn kubereserved_memory() -> String {
    "300Mi".into()
}
fn kubereserved_ephemeral_storage() -> String {
    "1Gi".into()
}

/// Resources reserved for the operating system.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SystemReserved {
    /// CPU, e.g. `100m`.
    #[serde(default = "systemreserved_cpu")]
    #[schemars(pattern(CPU_PATTERN))]
    pub cpu: String,
    /// Memory, e.g. `100Mi`.
    #[serde(default = "systemreserved_memory")]
    #[schemars(pattern(BYTES_PATTERN))]
    pub memory: String,
    /// Ephemeral storage, e.g. `3Gi`.
    #[serde(default = "systemreserved_ephemeral_storage")]
    #[schemars(pattern(BYTES_PATTERN))]
    pub ephemeral_storage: String,
}

impl Default for SystemReserved {
    fn default() -> Self {
        SystemReserved {
            cpu: systemreserved_cpu(),
            memory: systemreserved_memory(),
            ephemeral_storage: systemreserved_ephemeral_storage(),
        }
    }
}

fn systemreserved_cpu() -> String {
    "100m".into()
}
fn systemreserved_memory() -> String {
    "100Mi".into()
}
fn systemreserved_ephemeral_storage() -> String {
    "3Gi".into()
}

/// Observed state of an ExoscaleNodeClass: resolved IDs and conditions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExoscaleNodeClassStatus {
    /// Ready, TemplateResolved, SecurityGroupsResolved, AntiAffinityGroupsResolved, PrivateNetworksResolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "nodeclass_conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Resolved security group IDs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// Resolved anti-affinity group IDs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_affinity_groups: Vec<String>,
    /// Resolved private network IDs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private_networks: Vec<String>,
    /// Resolved template ID (ours; lets drift compare against what the NodeClass wants now).
    #[serde(
        default,
        rename = "templateID",
        skip_serializing_if = "Option::is_none"
    )]
    pub template_id: Option<String>,
}

impl ExoscaleNodeClass {
    /// Kubelet settings with defaults applied, whether or not `kubelet` was written.
    pub fn kubelet(&self) -> KubeletConfiguration {
        self.spec.kubelet.clone().unwrap_or_default()
    }

    /// Pods per node.
    pub fn max_pods(&self) -> i32 {
        self.spec
            .kubelet
            .as_ref()
            .and_then(|k| k.max_pods)
            .unwrap_or(DEFAULT_MAX_PODS)
    }
}
