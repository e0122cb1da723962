//! The pod as the cluster state holds it: the fields a decision, a drain or a metric reads,
//! deserialized straight from the watch. k8s-openapi's `Pod` is ~2.4 KB inline and each
//! `Container` another 2.1 KB even when their probes, environment and security contexts are
//! empty; at 10 000 pods those empty fields were most of the controller's memory.
//!
//! Field names and types mirror the API's, so code reads `pod.spec.as_ref()?.node_name` as it
//! would on the full object; a field left out here does not compile where it is read.
//! Held pods are never written back: pods are only evicted or deleted, by name and UID.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};

use crate::scheduling::PodLabels;
use crate::scheduling::convert::{ConvertError, Converted, shared_labels};

/// A pod as held in the cluster state (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(from = "WatchedPod", into = "WatchedPod")]
pub struct HeldPod {
    /// Without its labels: see [`HeldPod::labels`].
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
    /// The labels, shared with every pod that carries the same ones (the pods of one
    /// workload do): a map of their own was ~650 B a pod. Taken out of `metadata` as the pod
    /// is read, so `ResourceExt::labels` on a held pod is empty; [`HeldPod::labels`] (which
    /// a method call finds first) is what the pod says.
    labels: PodLabels,
    /// The scheduler's reading of this pod (`convert::converted`), made on first use.
    pub(crate) converted: ConvertedOnce,
}

/// A held pod as the API writes it, labels in their place.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct WatchedPod {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<PodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<PodStatus>,
}

impl From<WatchedPod> for HeldPod {
    fn from(mut pod: WatchedPod) -> Self {
        let labels = shared_labels(pod.metadata.labels.take().unwrap_or_default());
        HeldPod {
            metadata: pod.metadata,
            spec: pod.spec,
            status: pod.status,
            labels,
            converted: ConvertedOnce::default(),
        }
    }
}

impl From<HeldPod> for WatchedPod {
    fn from(pod: HeldPod) -> Self {
        let mut metadata = pod.metadata;
        metadata.labels = (!pod.labels.is_empty()).then(|| (*pod.labels).clone());
        WatchedPod {
            metadata,
            spec: pod.spec,
            status: pod.status,
        }
    }
}

impl HeldPod {
    /// The pod's labels: the shared copy, which the scheduler's reading points at too.
    pub fn labels(&self) -> &PodLabels {
        &self.labels
    }

    /// Replaces the pod's labels (a copy being edited: its reading is made anew).
    pub fn set_labels(&mut self, labels: BTreeMap<String, String>) {
        self.labels = shared_labels(labels);
        self.converted = ConvertedOnce::default();
    }
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
    /// Boxed: most pods have none, and inline it is 144 B of every held pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Box<core::Affinity>>,
    /// Shared with the other pods of its workload once watched (`pods::slim`): ~260 B a pod.
    pub containers: Arc<[Container]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<ResourceList>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Dynamic Resource Allocation claims. Behind one pointer: most pods have none, and the
    /// list inline would be 16 B more of every held pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_claims: Option<Box<Vec<core::PodResourceClaim>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Shared like the containers: most pods carry the same two (the admission defaults for
    /// `not-ready` and `unreachable`), ~360 B a pod.
    pub tolerations: Option<Arc<[core::Toleration]>>,
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
    pub resources: Option<ResourceRequirements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// Requests, limits and the Dynamic Resource Allocation claims a container uses.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct ResourceRequirements {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceList>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceList>,
    /// Behind one pointer, as the pod's: most containers have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claims: Option<Box<Vec<core::ResourceClaim>>>,
}

/// A resource list as a held pod keeps it: `(name, quantity)` pairs sorted by name, in one
/// allocation of their own length. As a `BTreeMap` any list with an entry took a node with
/// room for eleven (~540 B): a container's requests and limits were ~1 KB of every pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceList(Box<[(String, Quantity)]>);

impl ResourceList {
    pub fn get(&self, name: &str) -> Option<&Quantity> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Quantity)> {
        self.into_iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<BTreeMap<String, Quantity>> for ResourceList {
    fn from(map: BTreeMap<String, Quantity>) -> Self {
        ResourceList(map.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a ResourceList {
    type Item = (&'a String, &'a Quantity);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Quantity)>,
        fn(&'a (String, Quantity)) -> (&'a String, &'a Quantity),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl Serialize for ResourceList {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for ResourceList {
    /// Through a map, as the API's JSON object: sorted, a repeated name keeps its last value.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, Quantity>::deserialize(deserializer).map(ResourceList::from)
    }
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
    pub conditions: Option<Vec<PodCondition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nominated_node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
}

/// A pod condition without its message and probe time, which nothing reads (a message can be
/// long: the scheduler's reason a pod does not fit).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_resource_list_reads_and_writes_the_apis_map() {
        let list: ResourceList =
            serde_json::from_value(json!({"memory": "1Gi", "cpu": "500m", "nvidia.com/gpu": "1"}))
                .unwrap();
        let names: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["cpu", "memory", "nvidia.com/gpu"], "sorted by name");
        assert_eq!(list.get("memory"), Some(&Quantity("1Gi".into())));
        assert_eq!(list.get("nvidia.com/gpu"), Some(&Quantity("1".into())));
        assert_eq!(list.get("ephemeral-storage"), None);
        assert_eq!(
            serde_json::to_value(&list).unwrap(),
            json!({"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"})
        );
        let empty: ResourceList = serde_json::from_value(json!({})).unwrap();
        assert!(empty.is_empty() && empty.get("cpu").is_none());
        assert!(serde_json::from_value::<ResourceList>(json!(["cpu"])).is_err());
    }

    #[test]
    fn pods_with_equal_labels_share_one_copy() {
        let read = |name: &str, app: &str| -> HeldPod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default",
                    "labels": {"app": app, "pod-template-hash": "5d9f"}}
            }))
            .unwrap()
        };
        let (a, b, other) = (read("a", "web"), read("b", "web"), read("c", "api"));
        assert!(std::sync::Arc::ptr_eq(a.labels(), b.labels()));
        assert!(!std::sync::Arc::ptr_eq(a.labels(), other.labels()));
        // A full pod (tests, `simulate`) is read the same way.
        let mut full = core::Pod::default();
        full.metadata.labels = Some(
            [
                ("app".to_string(), "web".to_string()),
                ("pod-template-hash".to_string(), "5d9f".to_string()),
            ]
            .into(),
        );
        let held = HeldPod::from(full);
        assert!(std::sync::Arc::ptr_eq(a.labels(), held.labels()));
        // An edited copy has its own labels and is read again.
        let mut edited = a.clone();
        edited.set_labels([("app".to_string(), "edited".to_string())].into());
        assert_eq!(edited.labels()["app"], "edited");
        assert_eq!(a.labels()["app"], "web");
    }

    #[test]
    fn a_held_pod_keeps_what_is_read_and_stays_small() {
        let pod: HeldPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"},
                    "claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "overhead": {"memory": "64Mi"}},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available: …",
                "lastProbeTime": null, "lastTransitionTime": "2026-11-26T10:00:00Z"}]}
        }))
        .unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let resources = spec.containers[0].resources.as_ref().unwrap();
        assert_eq!(
            resources.requests.as_ref().unwrap().get("cpu"),
            Some(&Quantity("1".into()))
        );
        assert!(resources.limits.as_ref().unwrap().get("memory").is_some());
        assert!(spec.overhead.as_ref().unwrap().get("memory").is_some());
        // Dynamic Resource Allocation claims decide whether the pod is provisioned for.
        assert_eq!(resources.claims.as_deref().unwrap()[0].name, "gpu");
        assert_eq!(spec.resource_claims.as_deref().unwrap()[0].name, "gpu");
        let condition = &pod.status.as_ref().unwrap().conditions.as_ref().unwrap()[0];
        assert_eq!(condition.reason.as_deref(), Some("Unschedulable"));
        assert!(condition.last_transition_time.is_some());
        let written = serde_json::to_string(&pod).unwrap();
        assert!(!written.contains("message"), "{written}");
        // The labels are kept apart from the metadata and written back in place.
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("web"));
        assert!(pod.metadata.labels.is_none());
        let back = serde_json::to_value(&pod).unwrap();
        assert_eq!(back["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(serde_json::from_value::<HeldPod>(back).unwrap(), pod);
        // Inline sizes: every held pod pays them (10 000 pods: each 100 B is 1 MB).
        assert!(
            std::mem::size_of::<HeldPod>() <= 832,
            "{}",
            std::mem::size_of::<HeldPod>()
        );
        // Containers are shared by the pods of a workload (`pods::slim`): the 8 B of DRA
        // claims is mostly paid per workload, not per pod.
        assert!(std::mem::size_of::<Container>() <= 120);
    }
}
