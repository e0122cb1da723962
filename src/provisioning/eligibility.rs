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
//!
//! The verdict outlives its pods for a while ([`MarkMemory`]): once the marked pods bind to
//! the Nodes launched for them, the siblings kube-scheduler has still not tried would
//! otherwise wait for its next mark (the last NodeClaims of a 10 000-pod launch came 16-54 s
//! after the last pod was created, BENCHMARKS forty-first session).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scheduling::PodShape;

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
/// ReplicaSet, Job…) owns a marked pod of the same scheduling shape, or did within
/// [`MARK_MEMORY`] when a memory is given.
pub struct Provisionable<'a> {
    /// Controller UID and shape (the shared copy's address: equal shapes share one) of each
    /// marked pod.
    marked: HashSet<(&'a str, usize)>,
    /// Marks seen before, and the instant they are judged at.
    recalled: Option<(&'a MarkMemory, Instant)>,
}

impl<'a> Provisionable<'a> {
    /// From the marks in `index` alone (what explain, disruption and tests see).
    pub fn of(index: &'a ClusterIndex) -> Provisionable<'a> {
        Provisionable {
            marked: marks(index)
                .map(|(uid, shape)| (uid, address(shape)))
                .collect(),
            recalled: None,
        }
    }

    /// From the marks in `index` and those `memory` saw within [`MARK_MEMORY`] of `now`;
    /// records the marks in `index` first.
    pub fn remembering(
        index: &'a ClusterIndex,
        memory: &'a mut MarkMemory,
        now: Instant,
    ) -> Provisionable<'a> {
        let mut marked = HashSet::new();
        for (uid, shape) in marks(index) {
            if marked.insert((uid, address(shape))) {
                memory.mark(uid, shape, now);
            }
        }
        memory.forget_before(now);
        Provisionable {
            marked,
            recalled: Some((memory, now)),
        }
    }

    /// From the marks in `index` and those `memory` saw within [`MARK_MEMORY`] of `now`,
    /// recording nothing.
    pub fn recalling(
        index: &'a ClusterIndex,
        memory: &'a MarkMemory,
        now: Instant,
    ) -> Provisionable<'a> {
        Provisionable {
            recalled: Some((memory, now)),
            ..Provisionable::of(index)
        }
    }

    /// Whether provisioning places `pod` now.
    pub fn admits(&self, pod: &Pod) -> bool {
        match check(pod) {
            Ok(()) => true,
            // Without a mark, no untried pod is read (a big backlog before any verdict).
            Err(Ineligible::NotTriedYet) => {
                let vouching = !self.marked.is_empty()
                    || self.recalled.is_some_and(|(memory, _)| !memory.is_empty());
                vouching
                    && sibling_key(pod).is_some_and(|key| {
                        self.marked.contains(&key)
                            || self
                                .recalled
                                .is_some_and(|(memory, now)| memory.recalls(key, now))
                    })
            }
            Err(_) => false,
        }
    }
}

/// How long a mark vouches for its untried siblings after its last marked pod was seen: long
/// enough for kube-scheduler to work through a big backlog while it binds the marked pods to
/// their new Nodes, short enough that a verdict on room that has since come (a Node not ours
/// that kube-scheduler would use) launches little. Every round still places the siblings on
/// existing and in-flight room first.
pub const MARK_MEMORY: Duration = Duration::from_secs(30);

/// The marks provisioning saw, by shape and controller, each with the last instant a marked
/// pod of it was seen. Holding the shape keeps the shared copy, hence its address, for the
/// pods of that shape that come later.
#[derive(Default)]
pub struct MarkMemory {
    by_shape: HashMap<usize, ShapeMarks>,
}

struct ShapeMarks {
    /// Kept so that its address names no other shape while remembered.
    _shape: Arc<PodShape>,
    /// Controller UIDs, each with when a marked pod of it was last seen.
    last_seen: Vec<(String, Instant)>,
}

impl MarkMemory {
    fn mark(&mut self, controller: &str, shape: &Arc<PodShape>, now: Instant) {
        let controllers = &mut self
            .by_shape
            .entry(address(shape))
            .or_insert_with(|| ShapeMarks {
                _shape: shape.clone(),
                last_seen: Vec::new(),
            })
            .last_seen;
        match controllers.iter_mut().find(|(uid, _)| uid == controller) {
            Some((_, seen)) => *seen = now,
            None => controllers.push((controller.to_string(), now)),
        }
    }

    /// Forgets the marks last seen more than [`MARK_MEMORY`] before `now`.
    fn forget_before(&mut self, now: Instant) {
        self.by_shape.retain(|_, marks| {
            marks
                .last_seen
                .retain(|(_, seen)| now.saturating_duration_since(*seen) <= MARK_MEMORY);
            !marks.last_seen.is_empty()
        });
    }

    fn recalls(&self, (controller, shape): (&str, usize), now: Instant) -> bool {
        self.by_shape.get(&shape).is_some_and(|marks| {
            marks.last_seen.iter().any(|(uid, seen)| {
                uid == controller && now.saturating_duration_since(*seen) <= MARK_MEMORY
            })
        })
    }

    /// How many shape-and-controller marks are kept.
    pub fn len(&self) -> usize {
        self.by_shape.values().map(|m| m.last_seen.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_shape.is_empty()
    }
}

/// The controller UID and shared shape of every marked pod that has a controller.
fn marks(index: &ClusterIndex) -> impl Iterator<Item = (&str, &Arc<PodShape>)> {
    index
        .pods_iter()
        .filter(|pod| check(pod).is_ok())
        .filter_map(|pod| sibling(pod))
}

fn address(shape: &Arc<PodShape>) -> usize {
    Arc::as_ptr(shape) as usize
}

/// What makes two pods siblings: the same controller and the same scheduling shape. `None`
/// for a pod without a controller or one the scheduler cannot read (never a sibling).
fn sibling(pod: &Pod) -> Option<(&str, &Arc<PodShape>)> {
    let controller = pod
        .metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    let reading = crate::scheduling::convert::converted(pod).ok()?;
    Some((controller.uid.as_str(), &reading.pod.shape))
}

fn sibling_key(pod: &Pod) -> Option<(&str, usize)> {
    sibling(pod).map(|(uid, shape)| (uid, address(shape)))
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
                apply(&mut index, pod);
            }
            admitted(&index, &Provisionable::of(&index))
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

    /// Names of the pods `provisionable` admits from `index`, sorted.
    fn admitted(index: &ClusterIndex, provisionable: &Provisionable) -> Vec<String> {
        let mut names: Vec<String> = index
            .pods_iter()
            .filter(|p| provisionable.admits(p))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    fn apply(index: &mut ClusterIndex, pod: serde_json::Value) {
        index.apply_pod(serde_json::from_value::<Pod>(pod).unwrap());
    }

    #[test]
    fn a_mark_vouches_for_later_siblings_after_its_pods_bound_until_it_is_forgotten() {
        let mut index = ClusterIndex::default();
        let mut memory = MarkMemory::default();
        let t0 = Instant::now();
        apply(&mut index, replica("m1", Some("rs-1"), "1", true));
        apply(&mut index, replica("u1", Some("rs-1"), "1", false));
        let seen = Provisionable::remembering(&index, &mut memory, t0);
        assert_eq!(admitted(&index, &seen), ["m1", "u1"]);
        assert_eq!(memory.len(), 1);

        // The marked pod binds to its new Node and goes; more of the workload come, untried,
        // with pods of another shape and another controller.
        index.delete_pod("default", "m1");
        apply(&mut index, replica("u2", Some("rs-1"), "1", false));
        apply(&mut index, replica("other-shape", Some("rs-1"), "2", false));
        apply(
            &mut index,
            replica("other-controller", Some("rs-2"), "1", false),
        );
        assert!(
            admitted(&index, &Provisionable::of(&index)).is_empty(),
            "without a memory, no mark is left to vouch"
        );
        let later = t0 + MARK_MEMORY;
        let recalled = Provisionable::recalling(&index, &memory, later);
        assert_eq!(admitted(&index, &recalled), ["u1", "u2"]);
        let remembered = Provisionable::remembering(&index, &mut memory, later);
        assert_eq!(admitted(&index, &remembered), ["u1", "u2"]);

        // Past the memory, the untried pods wait for kube-scheduler again, and the mark is
        // dropped.
        let past = later + Duration::from_millis(1);
        assert!(admitted(&index, &Provisionable::recalling(&index, &memory, past)).is_empty());
        let forgotten = Provisionable::remembering(&index, &mut memory, past);
        assert!(admitted(&index, &forgotten).is_empty());
        assert!(memory.is_empty());
    }

    #[test]
    fn a_new_mark_renews_the_memory_and_recalling_records_nothing() {
        let mut index = ClusterIndex::default();
        let mut memory = MarkMemory::default();
        let t0 = Instant::now();
        apply(&mut index, replica("m1", Some("rs-1"), "1", true));
        let _ = Provisionable::recalling(&index, &memory, t0);
        assert!(memory.is_empty(), "recalling only reads the memory");
        let _ = Provisionable::remembering(&index, &mut memory, t0);
        // Still marked later: the memory runs from the last sight.
        let renewed = t0 + MARK_MEMORY;
        let _ = Provisionable::remembering(&index, &mut memory, renewed);
        index.delete_pod("default", "m1");
        apply(&mut index, replica("u1", Some("rs-1"), "1", false));
        let recalled = Provisionable::recalling(&index, &memory, renewed + MARK_MEMORY);
        assert_eq!(admitted(&index, &recalled), ["u1"]);
    }

    #[test]
    fn pod_refusing_karpenter_nodes_is_skipped() {
        let pod = pending(serde_json::json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}}}));
        assert_eq!(check(&pod), Err(Ineligible::RefusesKarpenterNodes));
    }
}
