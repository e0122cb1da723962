//! Small facts about pods that several controllers need, in one place.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{PersistentVolumeClaimTemplate, Toleration};
use kube::ResourceExt;

use super::held_pod::{Container, HeldPod as Pod, PodCondition};
use crate::interner::ListInterner;

/// The kubelet's annotation on static (mirror) pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The annotation `kubectl apply` leaves on objects it created: a copy of the whole manifest.
#[cfg(test)]
const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The pod annotations a decision reads: `do-not-disrupt` (disruption, drains, static
/// capacity), the deletion cost (which pods a disruption moves first) and the mirror marker
/// (static pods). Others (a sidecar injector's status, `kubectl apply`'s copy of the manifest,
/// scrape settings) can be kilobytes a pod and nothing reads them.
const KEPT_ANNOTATIONS: [&str; 3] = [
    crate::apis::labels::DO_NOT_DISRUPT_ANNOTATION,
    "controller.kubernetes.io/pod-deletion-cost",
    MIRROR_ANNOTATION,
];

/// The parts of a pod that the pods of one workload repeat verbatim, one copy each.
#[derive(Default)]
struct SharedParts {
    containers: ListInterner<Container>,
    tolerations: ListInterner<Toleration>,
}

static SHARED_PARTS: LazyLock<Mutex<SharedParts>> = LazyLock::new(Default::default);

fn shared_parts() -> std::sync::MutexGuard<'static, SharedParts> {
    SHARED_PARTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Compacts a held pod further than its type does: only the annotations a decision reads,
/// only the `PodScheduled` and `Ready` conditions, only the volumes that are claims, no
/// managed fields or `generateName` (the name is what is read), and every list in an
/// allocation of its own length (serde grows a list by doubling, so one container sat in room
/// for four). Its containers and tolerations become the copy shared with every pod carrying
/// the same ones.
pub fn slim(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.generate_name = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, _| KEPT_ANNOTATIONS.contains(&key.as_str()));
    }
    if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        meta.annotations = None;
    }
    meta.owner_references.as_mut().map(Vec::shrink_to_fit);
    meta.finalizers.as_mut().map(Vec::shrink_to_fit);
    if let Some(spec) = pod.spec.as_mut() {
        // Read fresh from the watch, so the containers are this pod's alone until shared below.
        for container in Arc::get_mut(&mut spec.containers)
            .into_iter()
            .flatten()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            container.ports.as_mut().map(Vec::shrink_to_fit);
        }
        spec.init_containers.as_mut().map(Vec::shrink_to_fit);
        let mut shared = shared_parts();
        spec.containers = shared
            .containers
            .intern(std::mem::take(&mut spec.containers));
        spec.tolerations = spec
            .tolerations
            .take()
            .map(|t| shared.tolerations.intern(t));
        drop(shared);
        spec.topology_spread_constraints
            .as_mut()
            .map(Vec::shrink_to_fit);
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
            volumes.shrink_to_fit();
        }
        if spec.volumes.as_ref().is_some_and(Vec::is_empty) {
            spec.volumes = None;
        }
    }
    if let Some(status) = pod.status.as_mut() {
        status.conditions = status.conditions.take().map(slim_conditions);
    }
}

/// The conditions a decision or metric reads: `PodScheduled` (provisionable, scheduling
/// times) and `Ready` (readiness, startup times); a running pod's other three went (their
/// messages were never read in).
fn slim_conditions(conditions: Vec<PodCondition>) -> Vec<PodCondition> {
    // Collected in place, the kept two would sit in the buffer of all five.
    let mut kept: Vec<PodCondition> = conditions
        .into_iter()
        .filter(|c| matches!(c.type_.as_str(), "PodScheduled" | "Ready"))
        .collect();
    kept.shrink_to_fit();
    kept
}

/// Finished: `Succeeded` or `Failed`.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Owned by a DaemonSet: it follows nodes, it never needs one.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.owner_references().iter().any(|o| o.kind == "DaemonSet")
}

/// A static pod's API mirror: it belongs to its node.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.annotations().contains_key(MIRROR_ANNOTATION)
        || pod
            .owner_references()
            .iter()
            .any(|o| o.kind == "Node" && o.api_version == "v1")
}

/// A PersistentVolumeClaim a pod uses, by the name the claim has (or will have).
pub struct PodClaim<'a> {
    pub name: String,
    /// For a generic ephemeral volume: the template its claim is created from.
    pub ephemeral: Option<Option<&'a PersistentVolumeClaimTemplate>>,
}

/// The claims of a pod's volumes: `persistentVolumeClaim` ones by their name, generic ephemeral
/// ones by the name the ephemeral-volume controller gives their claim, `<pod>-<volume>`.
pub fn claims(pod: &Pod) -> Vec<PodClaim<'_>> {
    let pod_name = pod.name_any();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(|v| {
            if let Some(pvc) = &v.persistent_volume_claim {
                return Some(PodClaim {
                    name: pvc.claim_name.clone(),
                    ephemeral: None,
                });
            }
            let ephemeral = v.ephemeral.as_ref()?;
            Some(PodClaim {
                name: format!("{pod_name}-{}", v.name),
                ephemeral: Some(ephemeral.volume_claim_template.as_ref()),
            })
        })
        .collect()
}

/// A pod on a node being disrupted that needs capacity elsewhere: not a DaemonSet or mirror
/// pod, not finished, not already being deleted.
pub fn is_reschedulable(pod: &Pod) -> bool {
    !is_daemonset_pod(pod)
        && !is_mirror(pod)
        && !is_terminal(pod)
        && pod.metadata.deletion_timestamp.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn classifies_pods() {
        let web = pod(json!({"metadata": {"name": "web"}}));
        assert!(is_reschedulable(&web));
        let done = pod(json!({"metadata": {"name": "job"}, "status": {"phase": "Succeeded"}}));
        assert!(is_terminal(&done) && !is_reschedulable(&done));
        let daemon = pod(json!({"metadata": {"name": "agent", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u"}]}}));
        assert!(is_daemonset_pod(&daemon) && !is_reschedulable(&daemon));
        let mirror = pod(json!({"metadata": {"name": "etcd",
            "annotations": {MIRROR_ANNOTATION: "x"}}}));
        assert!(is_mirror(&mirror) && !is_reschedulable(&mirror));
        let deleting = pod(json!({"metadata": {"name": "old",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert!(!is_reschedulable(&deleting));
    }

    #[test]
    fn claims_are_named_as_their_pvcs_are() {
        let db = pod(
            json!({"metadata": {"name": "db-0"}, "spec": {"containers": [],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "tmp", "emptyDir": {}}]}}),
        );
        let found: Vec<(String, bool)> = claims(&db)
            .into_iter()
            .map(|c| (c.name, c.ephemeral.is_some()))
            .collect();
        assert_eq!(
            found,
            [
                ("data-db-0".to_string(), false),
                ("db-0-scratch".to_string(), true)
            ]
        );
    }

    #[test]
    fn slimming_keeps_what_scheduling_reads_and_drops_the_rest() {
        let full = pod(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u1",
                "generateName": "web-", "labels": {"app": "web"},
                "annotations": {
                    "karpenter.sh/do-not-disrupt": "true",
                    "controller.kubernetes.io/pod-deletion-cost": "-5",
                    "sidecar.istio.io/status": "{\"initContainers\":[\"istio-init\"]}",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a\":\"large manifest\"}"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "web", "uid": "s1", "controller": true}]},
            "spec": {
                "nodeSelector": {"topology.kubernetes.io/zone": "ch-gva-2"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname",
                     "labelSelector": {"matchLabels": {"app": "web"}}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "web"}}}],
                "priority": 1000, "overhead": {"memory": "64Mi"},
                "serviceAccountName": "web", "dnsPolicy": "ClusterFirst",
                "securityContext": {"runAsUser": 1000},
                "initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "100m"}}}],
                "containers": [{"name": "app", "image": "shop:1", "command": ["/app"],
                    "env": [{"name": "SECRET_REF", "value": "x"}],
                    "livenessProbe": {"httpGet": {"path": "/", "port": 80}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "ports": [{"containerPort": 80, "hostPort": 8080}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                  "limits": {"memory": "2Gi"}}}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                    {"name": "token", "projected": {"sources": []}},
                    {"name": "config", "configMap": {"name": "web"}}]},
            "status": {"phase": "Pending", "podIP": "10.0.0.1",
                "startTime": "2026-01-01T00:00:00Z",
                "nominatedNodeName": "node-a",
                "conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "message": "0/3 nodes are available"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                     "message": "containers with unready status: [app]"}],
                "containerStatuses": [{"name": "app", "image": "shop:1", "imageID": "",
                    "ready": false, "restartCount": 0}]}
        }));
        let mut slim_pod = full.clone();
        slim(&mut slim_pod);

        // Everything the scheduler, the volume checks and the disruption rules read is kept.
        let model = |p: &Pod| format!("{:?}", crate::scheduling::convert::pod_from_k8s(p).unwrap());
        assert_eq!(model(&slim_pod), model(&full));
        let provisionable = crate::scheduling::convert::is_provisionable;
        assert_eq!(provisionable(&slim_pod), provisionable(&full));
        let claim_names = |p: &Pod| claims(p).into_iter().map(|c| c.name).collect::<Vec<_>>();
        assert_eq!(claim_names(&slim_pod), ["data-web-0"]);
        assert_eq!(
            slim_pod
                .annotations()
                .get("karpenter.sh/do-not-disrupt")
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(
            slim_pod.metadata.owner_references,
            full.metadata.owner_references
        );
        let status = slim_pod.status.as_ref().unwrap();
        let kept: Vec<(&str, &str, Option<&str>)> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
            .collect();
        assert_eq!(
            kept,
            [
                ("PodScheduled", "False", Some("Unschedulable")),
                ("Ready", "False", Some("ContainersNotReady"))
            ]
        );
        let kept_json = serde_json::to_string(&status.conditions).unwrap();
        assert!(
            !kept_json.contains("message") && !kept_json.contains("lastProbeTime"),
            "{kept_json}"
        );
        assert_eq!(status.nominated_node_name.as_deref(), Some("node-a"));
        assert!(status.start_time.is_some());

        // What no decision reads is gone.
        assert_eq!(slim_pod.metadata.generate_name, None);
        assert!(!slim_pod.annotations().contains_key(LAST_APPLIED_ANNOTATION));
        assert_eq!(
            slim_pod.annotations().keys().collect::<Vec<_>>(),
            [
                "controller.kubernetes.io/pod-deletion-cost",
                "karpenter.sh/do-not-disrupt"
            ]
        );
        let spec = slim_pod.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!((volumes.len(), volumes.capacity()), (1, 1));
        assert_eq!(spec.containers.len(), 1);
        let conditions = status.conditions.as_ref().unwrap();
        assert_eq!(
            conditions.capacity(),
            2,
            "no room left for the dropped conditions"
        );
        let held = serde_json::to_string(&slim_pod).unwrap();
        for gone in [
            "\"env\"",
            "\"image\"",
            "\"command\"",
            "livenessProbe",
            "volumeMounts",
            "serviceAccountName",
            "securityContext",
            "containerStatuses",
            "podIP",
            "dnsPolicy",
        ] {
            assert!(!held.contains(gone), "{gone} is held: {held}");
        }
        assert!(
            std::mem::size_of::<Pod>() < 1024,
            "a held pod is {} bytes inline",
            std::mem::size_of::<Pod>()
        );
    }

    #[test]
    fn a_pod_with_only_the_service_account_volume_keeps_no_volume_list() {
        let mut p = pod(json!({
            "metadata": {"name": "a", "namespace": "n"},
            "spec": {"containers": [{"name": "c"}],
                "volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}}]}
        }));
        slim(&mut p);
        assert!(p.spec.unwrap().volumes.is_none());
    }

    #[test]
    fn the_pods_of_one_workload_share_their_containers_and_tolerations() {
        let replica = |name: &str, cpu: &str| {
            let mut p = pod(json!({
                "metadata": {"name": name, "namespace": "n"},
                "spec": {
                    "containers": [{"name": "web", "ports": [{"containerPort": 80}],
                        "resources": {"requests": {"cpu": cpu}}}],
                    "tolerations": [
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                            "effect": "NoExecute", "tolerationSeconds": 300},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                            "effect": "NoExecute", "tolerationSeconds": 300}]}
            }));
            slim(&mut p);
            p.spec.unwrap()
        };
        let (a, b, other) = (
            replica("a", "250m"),
            replica("b", "250m"),
            replica("c", "1"),
        );
        assert!(Arc::ptr_eq(&a.containers, &b.containers));
        let tolerations = |s: &super::super::held_pod::PodSpec| s.tolerations.clone().unwrap();
        assert!(Arc::ptr_eq(&tolerations(&a), &tolerations(&b)));
        assert!(
            !Arc::ptr_eq(&a.containers, &other.containers),
            "other requests"
        );
        assert!(Arc::ptr_eq(&tolerations(&a), &tolerations(&other)));
        // The shared copy still reads and writes as the API's.
        assert_eq!(
            serde_json::to_value(&*a.containers).unwrap(),
            json!([{"name": "web", "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": "250m"}}}])
        );
        assert_eq!(tolerations(&a)[1].toleration_seconds, Some(300));
    }
}
