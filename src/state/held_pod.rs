//! The pod as the cluster state holds it: the fields a decision, a drain or a metric reads,
//! deserialized straight from the watch. k8s-openapi's `Pod` is ~2.4 KB inline and each
//! `Container` another 2.1 KB even when their probes, environment and security contexts are
//! empty; at 10 000 pods those empty fields were most of the controller's memory.
//!
//! Field names and types mirror the API's, so code reads `pod.spec.as_ref()?.node_name` as it
//! would on the full object; a field left out here does not compile where it is read.
//! Held pods are never written back: pods are only evicted or deleted, by name and UID.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};

use crate::scheduling::convert::{ConvertError, Converted};

/// A pod as held in the cluster state (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
    /// The scheduler's reading of this pod (`convert::converted`), made on first use.
    #[serde(skip)]
    pub(crate) converted: ConvertedOnce,
}

/// The scheduler's reading of a held pod, kept with it. Every provisioning round and
/// disruption pass reads every bound pod; converting each of 10 000 pods anew each time cost
/// more memory at its peak than the pods themselves. A watch event replaces the whole held
/// pod, so the reading never outlives the version it was made from. A clone starts empty
/// (it may be edited); the memo takes no part in equality or serialization. The rare error is
/// boxed: it would otherwise make every held pod larger.
#[derive(Default)]
pub struct ConvertedOnce(OnceLock<Result<Converted, Box<ConvertError>>>);

impl ConvertedOnce {
    pub(crate) fn get_or_init(
        &self,
        convert: impl FnOnce() -> Result<Converted, Box<ConvertError>>,
    ) -> &Result<Converted, Box<ConvertError>> {
        self.0.get_or_init(convert)
    }
}

impl Clone for ConvertedOnce {
    fn clone(&self) -> Self {
        ConvertedOnce::default()
    }
}

impl PartialEq for ConvertedOnce {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for ConvertedOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "converted"
        } else {
            "not converted"
        })
    }
}

/// How the pod is scheduled and what it asks for.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<core::Affinity>,
    pub containers: Vec<Container>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<BTreeMap<String, Quantity>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<core::ResourceRequirements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<core::Toleration>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<core::TopologySpreadConstraint>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
}

/// A container as scheduling sees it: name, resources, host ports, restart policy (a
/// restartable init container is a sidecar).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<core::ContainerPort>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<core::ResourceRequirements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// A volume that is a claim: a `persistentVolumeClaim` or a generic ephemeral volume. The
/// others (projected service-account tokens, config maps…) constrain no node and are skipped
/// as they are read.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Volume {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<core::PersistentVolumeClaimVolumeSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<core::EphemeralVolumeSource>,
}

/// Phase, start, nomination and the `PodScheduled` and `Ready` conditions.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<core::PodCondition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nominated_node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
}

impl PodSpec {
    /// A full pod spec (a DaemonSet's pod template) as a held pod's. Both sides are the API's
    /// own JSON, so the round trip cannot fail short of a bug; an empty spec would then ask
    /// for nothing.
    pub fn from_k8s(spec: &core::PodSpec) -> PodSpec {
        reshape(spec)
    }
}

/// A full API object's JSON read as our compact type, which names the same fields; the
/// default if serde refuses (it cannot, short of a bug).
fn reshape<T: Default + serde::de::DeserializeOwned>(full: &impl Serialize) -> T {
    serde_json::to_value(full)
        .and_then(serde_json::from_value)
        .unwrap_or_default()
}

impl kube::Resource for HeldPod {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<core::Pod> for HeldPod {
    /// The held copy of a full pod (tests, `simulate`'s manifests), compacted as a watched
    /// one is.
    fn from(pod: core::Pod) -> Self {
        let mut held: HeldPod = reshape(&pod);
        super::pods::slim(&mut held);
        held
    }
}
