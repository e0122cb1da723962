//! "Can these pods go elsewhere, and on what?": one call of the shared scheduler with the
//! candidates removed from the cluster.

use std::collections::{HashMap, HashSet};

use crate::scheduling::{
    BoundPod, ExistingNode, NewNodeClaim, Pod, Resources, Results, Scheduler, SchedulerInput,
};

use super::candidates::{Candidate, currently_reschedulable};
use super::model::ClusterView;

/// Scheduler inputs shared by every simulation of one disruption loop.
pub struct SimulationBase<'a> {
    view: &'a ClusterView,
    /// Nodes pods may land on (not deleting), by index into `view.nodes`.
    active: Vec<usize>,
    /// Upper bound of each active node's free resources (daemon overhead not subtracted).
    free: Vec<Resources>,
    /// Each active node with its workload pods folded into one pod carrying their summed
    /// requests: all the scheduler looks at when no topology is in play.
    compact: Vec<ExistingNode>,
    /// Some bound pod has required anti-affinity: every node matters to topology.
    bound_anti_affinity: bool,
    /// Reschedulable pods of deleting nodes: they need a home too.
    deleting_pods: Vec<Pod>,
    instance_types: HashMap<String, Vec<std::sync::Arc<crate::scheduling::InstanceType>>>,
}

impl<'a> SimulationBase<'a> {
    pub fn new(view: &'a ClusterView) -> Self {
        let mut active = Vec::new();
        let mut deleting_pods = Vec::new();
        for (i, n) in view.nodes.iter().enumerate() {
            if n.marked_for_deletion || n.instance_terminating {
                deleting_pods.extend(
                    n.pods
                        .iter()
                        .filter(|p| p.is_reschedulable() && !p.do_not_disrupt_active(view.now))
                        .map(|p| p.pod.clone()),
                );
            } else {
                active.push(i);
            }
        }
        let free = active
            .iter()
            .map(|&i| {
                let n = &view.nodes[i].scheduling;
                let mut used = Resources::new();
                for p in &n.pods {
                    used += &p.requests;
                }
                n.allocatable.saturating_minus(&used)
            })
            .collect();
        let compact = active
            .iter()
            .map(|&i| compact_node(&view.nodes[i].scheduling))
            .collect();
        let bound_anti_affinity = view.nodes.iter().any(|n| {
            n.scheduling
                .pods
                .iter()
                .any(|p| !p.required_anti_affinity.is_empty())
        });
        let instance_types = view
            .pools
            .values()
            .map(|p| (p.name().to_string(), p.instance_types.clone()))
            .collect();
        SimulationBase {
            view,
            active,
            free,
            compact,
            bound_anti_affinity,
            deleting_pods,
            instance_types,
        }
    }

    pub fn view(&self) -> &'a ClusterView {
        self.view
    }

    /// Schedules pending pods, the candidates' pods and deleting nodes' pods on the cluster
    /// without the candidates.
    pub fn simulate(&self, candidates: &[&Candidate]) -> Simulation {
        let view = self.view;
        let removed: HashSet<&str> = candidates.iter().map(|c| c.name.as_str()).collect();
        let mut pods: Vec<Pod> = view.pending_pods.clone();
        let pending = pods.len();
        for c in candidates {
            pods.extend(currently_reschedulable(view, c).map(|p| p.pod.clone()));
        }
        let from_candidates = pods.len();
        pods.extend(self.deleting_pods.iter().cloned());
        // Without topology constraints a node that no pod fits on cannot change the result;
        // leaving it out saves building it into the scheduler (most of a simulation's cost).
        let prune = !self.bound_anti_affinity && !pods.iter().any(has_topology);
        let existing_nodes: Vec<ExistingNode> = self
            .active
            .iter()
            .enumerate()
            .filter(|(k, _)| !prune || pods.iter().any(|p| p.requests.fits_in(&self.free[*k])))
            .filter(|(_, i)| !removed.contains(view.nodes[**i].name.as_str()))
            .map(|(k, &i)| {
                if prune {
                    self.compact[k].clone()
                } else {
                    view.nodes[i].scheduling.clone()
                }
            })
            .collect();
        let input = SchedulerInput {
            node_pools: view.pools.values().map(|p| p.template.clone()).collect(),
            instance_types: self.instance_types.clone(),
            existing_nodes,
            daemonsets: view.daemonsets.clone(),
            options: view.scheduler_options.clone(),
        };
        let results = Scheduler::new(input).solve(&pods);
        let initialized: HashMap<&str, bool> = view
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.initialized))
            .collect();
        let mut errors = Vec::new();
        for u in &results.unschedulable {
            if u.pod >= pending {
                let p = &pods[u.pod];
                errors.push(format!("pod {}/{}: {}", p.namespace, p.name, u.reason));
            }
        }
        // Moving pods onto a node that is not initialized yet is a gamble upstream refuses,
        // except for pods already evicted from deleting nodes.
        for assignment in &results.existing_nodes {
            if initialized.get(assignment.node_name.as_str()) == Some(&false) {
                for &i in assignment
                    .pods
                    .iter()
                    .filter(|&&i| i >= pending && i < from_candidates)
                {
                    let p = &pods[i];
                    errors.push(format!(
                        "pod {}/{}: would schedule against uninitialized node/{}",
                        p.namespace, p.name, assignment.node_name
                    ));
                }
            }
        }
        Simulation {
            results,
            pending,
            errors,
        }
    }
}

fn compact_node(node: &ExistingNode) -> ExistingNode {
    let mut workload = Resources::new();
    let mut pods = Vec::new();
    for p in &node.pods {
        if p.daemonset.is_some() {
            // Kept whole: the scheduler adds the overhead of DaemonSets missing from a node.
            pods.push(BoundPod {
                requests: p.requests.clone(),
                daemonset: p.daemonset.clone(),
                ..Default::default()
            });
        } else {
            workload += &p.requests;
        }
    }
    pods.push(BoundPod {
        requests: workload,
        ..Default::default()
    });
    ExistingNode {
        name: node.name.clone(),
        hostname: node.hostname.clone(),
        labels: node.labels.clone(),
        taints: node.taints.clone(),
        allocatable: node.allocatable.clone(),
        pods,
        node_pool: node.node_pool.clone(),
        initialized: node.initialized,
    }
}

fn has_topology(p: &Pod) -> bool {
    !p.topology_spread.is_empty()
        || !p.pod_affinity.is_empty()
        || !p.pod_anti_affinity.is_empty()
        || !p.preferred_pod_affinity.is_empty()
        || !p.preferred_pod_anti_affinity.is_empty()
}

/// The outcome of one simulation.
pub struct Simulation {
    pub results: Results,
    /// The first `pending` pods given to the scheduler were already pending.
    pub pending: usize,
    /// Why pods that are running now would not get a home (empty when all would).
    pub errors: Vec<String>,
}

impl Simulation {
    pub fn all_non_pending_pods_scheduled(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn new_node_claims(&self) -> &[NewNodeClaim] {
        &self.results.new_node_claims
    }
}
