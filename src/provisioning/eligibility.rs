//! Which pending pods provisioning acts on (upstream's "provisionable" pods).

use crate::state::HeldPod as Pod;

use crate::apis::labels::NODEPOOL_LABEL;

/// Why a pod is not considered by provisioning; `None` means it is provisionable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ineligible {
    /// Already bound to a node.
    Bound,
    /// kube-scheduler has not marked it unschedulable (yet).
    NotMarkedUnschedulable,
    /// Preempting: kube-scheduler nominated a node for it.
    Nominated,
    /// DaemonSet pods follow nodes; they never cause one.
    DaemonSetOwned,
    /// Static (mirror) pods belong to their node.
    Mirror,
    /// Finished or being deleted.
    Terminal,
    /// Requires `karpenter.sh/nodepool DoesNotExist`: the pod refuses Karpenter nodes.
    RefusesKarpenterNodes,
}

/// Classifies a pod; `Ok(())` when provisioning should find capacity for it.
pub fn check(pod: &Pod) -> Result<(), Ineligible> {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    if spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        return Err(Ineligible::Bound);
    }
    if pod.metadata.deletion_timestamp.is_some()
        || status
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
    {
        return Err(Ineligible::Terminal);
    }
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    if owners
        .iter()
        .any(|o| o.kind == "DaemonSet" && o.api_version.starts_with("apps/"))
    {
        return Err(Ineligible::DaemonSetOwned);
    }
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    if mirror
        || owners
            .iter()
            .any(|o| o.kind == "Node" && o.api_version == "v1")
    {
        return Err(Ineligible::Mirror);
    }
    if status
        .and_then(|s| s.nominated_node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        return Err(Ineligible::Nominated);
    }
    let unschedulable = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
    if !unschedulable {
        return Err(Ineligible::NotMarkedUnschedulable);
    }
    if refuses_karpenter_nodes(pod) {
        return Err(Ineligible::RefusesKarpenterNodes);
    }
    Ok(())
}

fn refuses_karpenter_nodes(pod: &Pod) -> bool {
    let Some(affinity) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
        return false;
    };
    let terms = affinity
        .node_affinity
        .as_ref()
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    // Every term refusing the label means no Karpenter node can ever satisfy the pod.
    !terms.is_empty()
        && terms.iter().all(|t| {
            t.match_expressions
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|e| e.key == NODEPOOL_LABEL && e.operator == "DoesNotExist")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(extra: serde_json::Value) -> Pod {
        let mut pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        });
        merge(&mut pod, extra);
        serde_json::from_value(pod).unwrap()
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    #[test]
    fn unschedulable_pending_pod_is_provisionable() {
        assert_eq!(check(&pending(serde_json::json!({}))), Ok(()));
    }

    #[test]
    fn pods_the_scheduler_has_not_judged_are_skipped() {
        let pod = pending(serde_json::json!({"status": {"conditions": []}}));
        assert_eq!(check(&pod), Err(Ineligible::NotMarkedUnschedulable));
    }

    #[test]
    fn bound_nominated_daemonset_mirror_and_terminal_pods_are_skipped() {
        let cases = [
            (
                serde_json::json!({"spec": {"nodeName": "n"}}),
                Ineligible::Bound,
            ),
            (
                serde_json::json!({"status": {"nominatedNodeName": "n"}}),
                Ineligible::Nominated,
            ),
            (
                serde_json::json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]}}),
                Ineligible::DaemonSetOwned,
            ),
            (
                serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
                Ineligible::Mirror,
            ),
            (
                serde_json::json!({"status": {"phase": "Succeeded"}}),
                Ineligible::Terminal,
            ),
            (
                serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
                Ineligible::Terminal,
            ),
        ];
        for (extra, expected) in cases {
            assert_eq!(check(&pending(extra.clone())), Err(expected), "{extra}");
        }
    }

    #[test]
    fn pod_refusing_karpenter_nodes_is_skipped() {
        let pod = pending(serde_json::json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}}}));
        assert_eq!(check(&pod), Err(Ineligible::RefusesKarpenterNodes));
    }
}
