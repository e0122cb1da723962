//! Which pending pods provisioning acts on: upstream's "provisionable" pods (marked
//! unschedulable by kube-scheduler), and the siblings of those that kube-scheduler has not
//! tried yet.
//!
//! kube-scheduler tries a big workload's pods one at a time; while it binds some to new Nodes,
//! thousands of their siblings wait untried, and upstream provisions only for the ones it
//! marked. Each new Node then fills with untried siblings, the marked pods planned there are
//! displaced and need another round, and the rounds go on until the unseen backlog is bound
//! (BENCHMARKS, thirty-eighth session: 300 NodeClaims in 15 rounds after the last mark). A
//! marked pod's verdict holds for a pod of the same controller with the same scheduling shape
//! (requests, labels, selectors, affinities, tolerations, spread, ports): there was no room
//! for that shape when kube-scheduler looked. The round still places every pod on room that
//! exists or is in flight first, so a sibling that fits launches nothing.

use std::collections::HashSet;
use std::sync::Arc;

use crate::state::ClusterIndex;
use crate::state::HeldPod as Pod;

use crate::apis::labels::NODEPOOL_LABEL;

/// Why a pod is not considered by provisioning; `None` means it is provisionable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ineligible {
    /// Already bound to a node.
    Bound,
    /// kube-scheduler has not tried it yet (no `PodScheduled` condition): provisionable when a
    /// marked sibling vouches for it ([`Provisionable`]).
    NotTriedYet,
    /// kube-scheduler's `PodScheduled` condition says something else than unschedulable
    /// (scheduling gates, a scheduler error).
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
    if refuses_karpenter_nodes(pod) {
        return Err(Ineligible::RefusesKarpenterNodes);
    }
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled");
    match scheduled {
        None => Err(Ineligible::NotTriedYet),
        Some(c) if c.status == "False" && c.reason.as_deref() == Some("Unschedulable") => Ok(()),
        Some(_) => Err(Ineligible::NotMarkedUnschedulable),
    }
}

/// The pods provisioning places, read from one view of the cluster: every pod [`check`]
/// accepts, and every pod kube-scheduler has not tried yet whose controller (its
/// ReplicaSet, Job…) owns a marked pod of the same scheduling shape.
pub struct Provisionable<'a> {
    /// Controller UID and shape (the shared copy's address: equal shapes share one) of each
    /// marked pod.
    marked: HashSet<(&'a str, usize)>,
}

impl<'a> Provisionable<'a> {
    pub fn of(index: &'a ClusterIndex) -> Provisionable<'a> {
        let marked = index
            .pods_iter()
            .filter(|pod| check(pod).is_ok())
            .filter_map(|pod| sibling_key(pod))
            .collect();
        Provisionable { marked }
    }

    /// Whether provisioning places `pod` now.
    pub fn admits(&self, pod: &Pod) -> bool {
        match check(pod) {
            Ok(()) => true,
            Err(Ineligible::NotTriedYet) => {
                !self.marked.is_empty()
                    && sibling_key(pod).is_some_and(|key| self.marked.contains(&key))
            }
            Err(_) => false,
        }
    }
}

/// What makes two pods siblings: the same controller and the same scheduling shape. `None`
/// for a pod without a controller or one the scheduler cannot read (never a sibling).
fn sibling_key(pod: &Pod) -> Option<(&str, usize)> {
    let controller = pod
        .metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    let reading = crate::scheduling::convert::converted(pod).ok()?;
    Some((
        controller.uid.as_str(),
        Arc::as_ptr(&reading.pod.shape) as usize,
    ))
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
    fn pods_the_scheduler_has_not_judged_are_told_apart() {
        let pod = pending(serde_json::json!({"status": {"conditions": []}}));
        assert_eq!(check(&pod), Err(Ineligible::NotTriedYet));
        let gated = pending(serde_json::json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}));
        assert_eq!(check(&gated), Err(Ineligible::NotMarkedUnschedulable));
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

    /// A pod of workload `owner` asking for `cpu`; `marked` as kube-scheduler leaves a pod it
    /// found no room for, else untried (no `PodScheduled` condition).
    fn replica(name: &str, owner: Option<&str>, cpu: &str, marked: bool) -> serde_json::Value {
        let conditions = if marked {
            serde_json::json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])
        } else {
            serde_json::json!([])
        };
        let owners = owner.map_or(serde_json::json!([]), |uid| {
            serde_json::json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                "uid": uid, "controller": true}])
        });
        serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name,
                "labels": {"app": "web"}, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending", "conditions": conditions}
        })
    }

    #[test]
    fn an_untried_pod_is_placed_with_a_marked_sibling_of_its_shape_and_controller() {
        let placed = |pods: Vec<serde_json::Value>| {
            let mut index = ClusterIndex::default();
            for pod in pods {
                index.apply_pod(serde_json::from_value::<Pod>(pod).unwrap());
            }
            let provisionable = Provisionable::of(&index);
            let mut names: Vec<String> = index
                .pods_iter()
                .filter(|p| provisionable.admits(p))
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            names.sort();
            names
        };
        // No verdict on the workload yet: nothing to place.
        assert!(placed(vec![replica("u1", Some("rs-1"), "1", false)]).is_empty());
        // A marked sibling vouches for the untried ones of its shape and controller only.
        let mut bound = replica("b1", Some("rs-1"), "1", false);
        merge(&mut bound, serde_json::json!({"spec": {"nodeName": "n1"}}));
        let mut gated = replica("g1", Some("rs-1"), "1", false);
        merge(
            &mut gated,
            serde_json::json!({"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}),
        );
        let names = placed(vec![
            replica("m1", Some("rs-1"), "1", true),
            replica("u1", Some("rs-1"), "1", false),
            replica("u2", Some("rs-1"), "1", false),
            replica("other-controller", Some("rs-2"), "1", false),
            replica("other-shape", Some("rs-1"), "2", false),
            replica("no-controller", None, "1", false),
            bound,
            gated,
        ]);
        assert_eq!(names, ["m1", "u1", "u2"]);
    }

    #[test]
    fn pod_refusing_karpenter_nodes_is_skipped() {
        let pod = pending(serde_json::json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}}}));
        assert_eq!(check(&pod), Err(Ineligible::RefusesKarpenterNodes));
    }
}
