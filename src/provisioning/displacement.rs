//! Pods whose planned room was taken by others, noticed when it happens.
//!
//! kube-scheduler binds most pods of a big launch without ever marking them unschedulable: a
//! new Node with room appears before it fails to place them. Provisioning sees such a pod only
//! through a marked sibling ([`super::eligibility::Provisionable`]; upstream not at all), so a
//! pod of another workload, or one that no verdict vouches for yet, may take room a round
//! planned for a marked pod, which then needs another node. Nothing writes to the marked pod when that
//! happens, so it waited for its 10 s requeue; at 1 000 nodes one or two such requeues were
//! the launch's tail (BENCHMARKS, twenty-fifth session).
//!
//! Each round's placements are kept here per target, and when pods not planned there are bound
//! to the target's Node while a pod planned there still waits, provisioning asks for a round.
//! The round decides: if the Node still has room, the pods are placed there again and nothing
//! is launched. Pure: the caller passes the cluster index.

use std::collections::HashMap;

use crate::state::pods::{is_daemonset_pod, is_terminal};
use crate::state::{ClusterIndex, HeldPod, NamespacedName};

use super::eligibility::Provisionable;

/// A pod a round placed, by key and UID (a pod re-created under the same name is another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPod {
    pub key: NamespacedName,
    pub uid: String,
}

impl PlannedPod {
    pub fn of(pod: &HeldPod) -> Option<PlannedPod> {
        Some(PlannedPod {
            key: (pod.metadata.namespace.clone()?, pod.metadata.name.clone()?),
            uid: pod.metadata.uid.clone()?,
        })
    }
}

#[derive(Debug)]
struct Plan {
    pods: Vec<PlannedPod>,
    /// Pods not planned there that were bound to the target's Node when last looked.
    others: usize,
}

/// Where the pods still waiting were last planned.
#[derive(Debug, Default)]
pub struct Displacements {
    /// By target: a NodeClaim's name, or a Node's for capacity that already registered (the
    /// scheduler's names for existing capacity).
    plans: HashMap<String, Plan>,
    /// Each planned pod's target, by UID: a pod planned again moves.
    target_of: HashMap<String, String>,
}

impl Displacements {
    /// Records that a round placed `pods` on `target`; pods planned elsewhere before move here.
    /// Pods already bound to the target's Node count from now on, not as displacing.
    pub fn plan(&mut self, index: &ClusterIndex, target: &str, pods: Vec<PlannedPod>) {
        for pod in &pods {
            let previous = self.target_of.insert(pod.uid.clone(), target.to_string());
            if let Some(plan) = previous
                .filter(|p| p != target)
                .and_then(|p| self.plans.get_mut(&p))
            {
                plan.pods.retain(|p| p.uid != pod.uid);
            }
        }
        let plan = self.plans.entry(target.to_string()).or_insert(Plan {
            pods: Vec::new(),
            others: 0,
        });
        for pod in pods {
            if !plan.pods.contains(&pod) {
                plan.pods.push(pod);
            }
        }
        plan.others = node_of(index, target).map_or(0, |node| others_on(index, &node, &plan.pods));
    }

    /// Targets whose Node took pods not planned there since the last look while a pod planned
    /// there still waits. Forgets pods that no longer wait (bound, gone, deleted) and targets
    /// with none left or that no longer exist.
    pub fn displaced(
        &mut self,
        index: &ClusterIndex,
        provisionable: &Provisionable,
    ) -> Vec<String> {
        let mut found = Vec::new();
        let mut forgotten = Vec::new();
        self.plans.retain(|target, plan| {
            // Counted against the pods planned at the last look, so one of them that has just
            // landed there is not taken for another pod.
            let node = node_of(index, target);
            let taken = node
                .as_deref()
                .is_some_and(|node| others_on(index, node, &plan.pods) > plan.others);
            plan.pods.retain(|pod| {
                let waits = still_waits(index, provisionable, pod);
                if !waits {
                    forgotten.push((pod.uid.clone(), target.clone()));
                }
                waits
            });
            let exists = index.node(target).is_some() || index.nodeclaim(target).is_some();
            if plan.pods.is_empty() || !exists {
                forgotten.extend(plan.pods.drain(..).map(|p| (p.uid, target.clone())));
                return false;
            }
            if taken {
                found.push(target.clone());
            }
            // Nothing can be bound to a target not registered yet.
            plan.others = node.map_or(0, |node| others_on(index, &node, &plan.pods));
            true
        });
        for (uid, target) in forgotten {
            if self.target_of.get(&uid) == Some(&target) {
                self.target_of.remove(&uid);
            }
        }
        found.sort();
        found
    }

    /// Pods planned and still waiting, over every target.
    pub fn waiting(&self) -> usize {
        self.plans.values().map(|p| p.pods.len()).sum()
    }
}

/// The Node a target stands for: itself if a Node has its name, else its NodeClaim's Node.
fn node_of(index: &ClusterIndex, target: &str) -> Option<String> {
    if index.node(target).is_some() {
        return Some(target.to_string());
    }
    index
        .nodeclaim(target)?
        .status
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
}

/// A planned pod that is still provisionable (the same pod, unbound, marked unschedulable or
/// vouched for by a marked sibling).
fn still_waits(index: &ClusterIndex, provisionable: &Provisionable, pod: &PlannedPod) -> bool {
    index.pod_by_key(&pod.key).is_some_and(|held| {
        held.metadata.uid.as_deref() == Some(pod.uid.as_str()) && provisionable.admits(held)
    })
}

/// Pods bound to `node` that take room a round counted on: neither planned there, nor
/// finished, nor DaemonSet pods (whose room every plan set aside).
fn others_on(index: &ClusterIndex, node: &str, planned: &[PlannedPod]) -> usize {
    index
        .pods_on_node_iter(node)
        .filter(|pod| {
            let uid = pod.metadata.uid.as_deref();
            !is_terminal(pod)
                && !is_daemonset_pod(pod)
                && !planned.iter().any(|p| Some(p.uid.as_str()) == uid)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing;
    use serde_json::json;

    /// A pod kube-scheduler marked unschedulable, with a UID.
    fn marked(name: &str) -> HeldPod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap()
    }

    fn bound(name: &str, node: &str) -> HeldPod {
        let mut pod = testing::pod("default", name, Some(node));
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod
    }

    fn planned(name: &str) -> PlannedPod {
        PlannedPod {
            key: ("default".into(), name.into()),
            uid: format!("uid-{name}"),
        }
    }

    /// NodeClaim `claim`, registered as Node `node` when given.
    fn claim(index: &mut ClusterIndex, claim: &str, node: Option<&str>) {
        let mut nc = testing::nodeclaim(claim, "pool", Some(&format!("exoscale://{claim}")));
        if let Some(node) = node {
            nc.status.get_or_insert_with(Default::default).node_name = Some(node.into());
            let provider = format!("exoscale://{claim}");
            index.apply_node(testing::node(node, Some(&provider), &[]));
        }
        index.apply_nodeclaim(nc);
    }

    #[test]
    fn a_pod_not_planned_there_bound_to_the_node_asks_once_for_a_round() {
        let mut index = ClusterIndex::default();
        claim(&mut index, "c1", None);
        index.apply_pod(marked("planned"));
        let mut d = Displacements::default();
        d.plan(&index, "c1", vec![planned("planned")]);
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "nothing bound yet"
        );

        claim(&mut index, "c1", Some("node-1"));
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "registered, still nothing bound"
        );
        index.apply_pod(bound("stranger", "node-1"));
        assert_eq!(
            d.displaced(&index, &Provisionable::of(&index)),
            vec!["c1".to_string()]
        );
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "the same stranger asks once"
        );
        index.apply_pod(bound("second", "node-1"));
        assert_eq!(
            d.displaced(&index, &Provisionable::of(&index)),
            vec!["c1".to_string()],
            "another one asks again"
        );
        assert_eq!(d.waiting(), 1);
    }

    #[test]
    fn daemonset_and_finished_pods_and_the_planned_pod_itself_displace_nothing() {
        let mut index = ClusterIndex::default();
        claim(&mut index, "c1", Some("node-1"));
        index.apply_pod(marked("planned"));
        index.apply_pod(marked("other-planned"));
        let mut d = Displacements::default();
        d.plan(
            &index,
            "c1",
            vec![planned("planned"), planned("other-planned")],
        );

        index.apply_pod(testing::owned_by_daemonset(bound("daemon", "node-1")));
        let mut done = bound("done", "node-1");
        done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        index.apply_pod(done);
        index.apply_pod(bound("planned", "node-1"));
        assert!(d.displaced(&index, &Provisionable::of(&index)).is_empty());
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "a planned pod that landed is not taken for another one later either"
        );
        assert_eq!(
            d.waiting(),
            1,
            "the bound planned pod no longer waits; its companion does"
        );
    }

    #[test]
    fn pods_already_on_an_existing_node_when_planned_are_not_counted() {
        let mut index = ClusterIndex::default();
        index.apply_node(testing::node("node-1", Some("exoscale://x"), &[]));
        index.apply_pod(bound("resident", "node-1"));
        index.apply_pod(marked("planned"));
        let mut d = Displacements::default();
        d.plan(&index, "node-1", vec![planned("planned")]);
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "the resident was there"
        );
        index.apply_pod(bound("newcomer", "node-1"));
        assert_eq!(
            d.displaced(&index, &Provisionable::of(&index)),
            vec!["node-1".to_string()]
        );
    }

    #[test]
    fn a_pod_planned_again_elsewhere_moves_and_plans_are_forgotten_when_nothing_waits() {
        let mut index = ClusterIndex::default();
        claim(&mut index, "c1", Some("node-1"));
        claim(&mut index, "c2", None);
        index.apply_pod(marked("planned"));
        let mut d = Displacements::default();
        d.plan(&index, "c1", vec![planned("planned")]);
        d.plan(&index, "c2", vec![planned("planned")]);
        index.apply_pod(bound("stranger", "node-1"));
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "the pod no longer counts on c1"
        );
        assert_eq!(d.waiting(), 1);

        index.delete_nodeclaim("c2");
        assert!(d.displaced(&index, &Provisionable::of(&index)).is_empty());
        assert_eq!(d.waiting(), 0, "its target is gone");

        d.plan(&index, "c1", vec![planned("planned")]);
        index.delete_pod("default", "planned");
        index.apply_pod(bound("late", "node-1"));
        assert!(
            d.displaced(&index, &Provisionable::of(&index)).is_empty(),
            "a deleted pod waits for nothing"
        );
        assert_eq!(d.waiting(), 0);
    }

    #[test]
    fn a_pod_recreated_under_the_same_name_is_not_the_planned_one() {
        let mut index = ClusterIndex::default();
        claim(&mut index, "c1", Some("node-1"));
        index.apply_pod(marked("planned"));
        let mut d = Displacements::default();
        d.plan(&index, "c1", vec![planned("planned")]);
        let mut again = marked("planned");
        again.metadata.uid = Some("uid-recreated".into());
        index.apply_pod(again);
        index.apply_pod(bound("stranger", "node-1"));
        assert!(d.displaced(&index, &Provisionable::of(&index)).is_empty());
        assert_eq!(d.waiting(), 0);
    }
}
