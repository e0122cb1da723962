//! Small facts about pods that several controllers need, in one place.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimTemplate, Pod};
use kube::ResourceExt;

/// The kubelet's annotation on static (mirror) pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

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
}
