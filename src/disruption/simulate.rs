//! "Can these pods go elsewhere, and on what?": one call of the shared scheduler with the
//! candidates removed from the cluster.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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
    /// Positions in `active`, in the order the scheduler tries existing nodes.
    scheduler_order: Vec<usize>,
    /// Some bound pod has required anti-affinity: every node matters to topology.
    bound_anti_affinity: bool,
    /// A PreferNoSchedule taint on a node or NodePool: pods may be retried tolerating it.
    prefer_no_schedule: bool,
    uninitialized: HashSet<&'a str>,
    /// Per node of the view: within its NodePool's `consolidateAfter` of its last pod event.
    settling: Vec<bool>,
    /// Reschedulable pods of deleting nodes: they need a home too.
    deleting_pods: Vec<Pod>,
    instance_types: HashMap<String, Vec<std::sync::Arc<crate::scheduling::InstanceType>>>,
    /// Every active node as it is, built on the first simulation with topology in play and
    /// reused by all of them: each solves with its candidates excluded.
    whole_cluster: OnceLock<Scheduler>,
    /// How long each simulation took since the last [`Self::take_timings`]
    /// (`karpenter_scheduler_scheduling_duration_seconds{controller="disruption"}`).
    timings: Mutex<Vec<Duration>>,
    /// Candidates whose replacement a consolidation held back (`methods::hold_replacement`).
    held: Mutex<BTreeSet<String>>,
}

/// Simulations timed per method at most; a pass stops recording beyond (single-node
/// consolidation tries each candidate once, and a pass has at most a few thousand).
const MAX_TIMINGS: usize = 10_000;

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
                        .map(|p| (*p.pod).clone()),
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
        let settling: Vec<bool> = view.nodes.iter().map(|n| is_settling(view, n)).collect();
        let compact = active
            .iter()
            .map(|&i| {
                let mut node = compact_node(&view.nodes[i].scheduling);
                node.settling = settling[i];
                node
            })
            .collect();
        // Mirrors the scheduler's ordering of existing nodes (see `solve_topology_free`).
        let mut scheduler_order: Vec<usize> = (0..active.len()).collect();
        scheduler_order.sort_by(|&a, &b| {
            let (na, nb) = (
                &view.nodes[active[a]].scheduling,
                &view.nodes[active[b]].scheduling,
            );
            nb.initialized
                .cmp(&na.initialized)
                .then(na.name.cmp(&nb.name))
        });
        let pns = |t: &crate::scheduling::Taint| {
            t.effect == crate::scheduling::TaintEffect::PreferNoSchedule
        };
        let prefer_no_schedule = view
            .nodes
            .iter()
            .any(|n| n.scheduling.taints.iter().any(pns))
            || view
                .pools
                .values()
                .any(|p| p.template.taints.iter().any(pns));
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
            scheduler_order,
            bound_anti_affinity,
            prefer_no_schedule,
            uninitialized: view
                .nodes
                .iter()
                .filter(|n| !n.initialized)
                .map(|n| n.name.as_str())
                .collect(),
            settling,
            deleting_pods,
            instance_types,
            whole_cluster: OnceLock::new(),
            timings: Mutex::new(Vec::new()),
            held: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn view(&self) -> &'a ClusterView {
        self.view
    }

    fn solve(&self, existing_nodes: Vec<ExistingNode>, pods: &[Pod]) -> Results {
        self.scheduler(existing_nodes).solve(pods)
    }

    fn scheduler(&self, existing_nodes: Vec<ExistingNode>) -> Scheduler {
        let input = SchedulerInput {
            node_pools: self
                .view
                .pools
                .values()
                .filter(|p| p.launches_replacements())
                .map(|p| p.template.clone())
                .collect(),
            instance_types: self.instance_types.clone(),
            existing_nodes,
            daemonsets: self.view.daemonsets.clone(),
            options: self.view.scheduler_options.clone(),
        };
        Scheduler::new(input)
    }

    /// Active nodes, as they are, without `removed`.
    fn active_nodes_except(&self, removed: &HashSet<&str>) -> Vec<ExistingNode> {
        self.active
            .iter()
            .filter(|&&i| !removed.contains(self.view.nodes[i].name.as_str()))
            .map(|&i| ExistingNode {
                settling: self.settling[i],
                ..self.view.nodes[i].scheduling.clone()
            })
            .collect()
    }

    /// Without topology constraints the scheduler only looks at a node's free resources,
    /// labels, taints and DaemonSet presence, so:
    /// - nodes no pod fits on cannot change the outcome and are left out;
    /// - bound workload pods are folded into one pod with their summed requests;
    /// - the scheduler places each pod on the first existing node that takes it, in its own
    ///   order (initialized first, then by name). Solving on a prefix of that order gives the
    ///   same result whenever no pod that missed the prefix's nodes fits on a node after it,
    ///   which is checked; otherwise the full list is solved. Pods that may be retried with
    ///   relaxed preferences make earlier attempts matter, so they always get the full list.
    fn solve_topology_free(&self, pods: &[Pod], removed: &HashSet<&str>) -> Results {
        let view = self.view;
        let fitting: Vec<usize> = self
            .scheduler_order
            .iter()
            .copied()
            .filter(|&k| !removed.contains(view.nodes[self.active[k]].name.as_str()))
            .filter(|&k| pods.iter().any(|p| p.requests.fits_in(&self.free[k])))
            .collect();
        let nodes = |ks: &[usize]| ks.iter().map(|&k| self.compact[k].clone()).collect();
        let prefix = (pods.len() * 2).max(MIN_PREFIX_NODES);
        let relaxable = self.prefer_no_schedule || pods.iter().any(may_be_relaxed);
        if fitting.len() > prefix && !relaxable {
            let (head, tail) = fitting.split_at(prefix);
            let results = self.solve(nodes(head), pods);
            let mut settled = vec![false; pods.len()];
            for i in results
                .existing_nodes
                .iter()
                .flat_map(|a| a.pods.iter())
                .chain(results.ignored.iter())
            {
                settled[*i] = true;
            }
            let exact = pods
                .iter()
                .zip(&settled)
                .filter(|(_, settled)| !**settled)
                .all(|(p, _)| tail.iter().all(|&k| !p.requests.fits_in(&self.free[k])));
            if exact {
                return results;
            }
        }
        self.solve(nodes(&fitting), pods)
    }

    /// Schedules pending pods, the candidates' pods and deleting nodes' pods on the cluster
    /// without the candidates (drift: any node may take the candidates' pods).
    pub fn simulate(&self, candidates: &[&Candidate]) -> Simulation {
        self.simulate_with(candidates, Move::Anywhere, Strategy::Fast)
    }

    /// As [`Self::simulate`], for consolidation: the candidates' pods do not land on settling
    /// nodes (upstream's consolidation simulation).
    pub fn simulate_consolidation(&self, candidates: &[&Candidate]) -> Simulation {
        self.simulate_with(candidates, Move::OffSettlingNodes, Strategy::Fast)
    }

    /// Whether a node pods may land on is settling (a pod event within its NodePool's
    /// `consolidateAfter`).
    pub fn any_active_node_settling(&self) -> bool {
        self.active.iter().any(|&i| self.settling[i])
    }

    /// Records candidates whose replacement was held back in this pass.
    pub fn note_held(&self, candidates: &[&Candidate]) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.extend(candidates.iter().map(|c| c.name.clone()));
    }

    /// The candidates held back since the last call.
    pub fn take_held(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The simulations' durations since the last call.
    pub fn take_timings(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.timings.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn simulate_with(
        &self,
        candidates: &[&Candidate],
        moves: Move,
        strategy: Strategy,
    ) -> Simulation {
        let started = Instant::now();
        let simulation = self.simulate_untimed(candidates, moves, strategy);
        let mut timings = self.timings.lock().unwrap_or_else(|p| p.into_inner());
        if timings.len() < MAX_TIMINGS {
            timings.push(started.elapsed());
        }
        simulation
    }

    fn simulate_untimed(
        &self,
        candidates: &[&Candidate],
        moves: Move,
        strategy: Strategy,
    ) -> Simulation {
        let view = self.view;
        let removed: HashSet<&str> = candidates.iter().map(|c| c.name.as_str()).collect();
        let mut pods: Vec<Pod> = view.pending_pods.clone();
        let pending = pods.len();
        for c in candidates {
            pods.extend(currently_reschedulable(view, c).map(|p| Pod {
                moved_by_consolidation: moves == Move::OffSettlingNodes,
                ..(*p.pod).clone()
            }));
        }
        let from_candidates = pods.len();
        pods.extend(self.deleting_pods.iter().cloned());
        let topology_free = !self.bound_anti_affinity && !pods.iter().any(has_topology);
        let results = match strategy {
            Strategy::Fast if topology_free => self.solve_topology_free(&pods, &removed),
            Strategy::Fast => self
                .whole_cluster
                .get_or_init(|| self.scheduler(self.active_nodes_except(&HashSet::new())))
                .solve_excluding(&pods, &removed),
            Strategy::Exhaustive => self.solve(self.active_nodes_except(&removed), &pods),
        };
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
            if self.uninitialized.contains(assignment.node_name.as_str()) {
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

/// Where a simulation may put the candidates' pods.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Move {
    Anywhere,
    OffSettlingNodes,
}

/// [`super::conditions::settling_now`] for a node of the view (a node of no known NodePool
/// never is).
fn is_settling(view: &ClusterView, node: &super::model::StateNode) -> bool {
    node.node_pool()
        .and_then(|pool| view.pools.get(pool))
        .is_some_and(|pool| {
            super::conditions::settling_now(
                &pool.nodepool,
                node.initialized,
                node.last_pod_event,
                view.now,
            )
        })
}

/// Smallest prefix of nodes tried before falling back to every node.
const MIN_PREFIX_NODES: usize = 32;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Strategy {
    /// Without topology: pruned, folded nodes (see `solve_topology_free`); with topology:
    /// the loop's whole-cluster scheduler with the candidates excluded.
    Fast,
    /// A scheduler built for every node but the candidates, as is: the reference the fast
    /// path must agree with.
    #[cfg_attr(not(test), allow(dead_code))]
    Exhaustive,
}

/// Pods the scheduler may retry with relaxed node preferences.
fn may_be_relaxed(p: &Pod) -> bool {
    !p.preferred_node_affinity.is_empty() || p.required_node_affinity.len() > 1
}

fn compact_node(node: &ExistingNode) -> ExistingNode {
    let mut workload = BoundPod::default();
    let mut pods = Vec::new();
    for p in &node.pods {
        if p.daemonset.is_some() {
            // Kept apart: the scheduler adds the overhead of DaemonSets missing from a node.
            pods.push(Arc::new(BoundPod {
                requests: p.requests.clone(),
                daemonset: p.daemonset.clone(),
                host_ports: p.host_ports.clone(),
                ..Default::default()
            }));
        } else {
            workload.requests += &p.requests;
            workload.host_ports.extend(p.host_ports.iter().cloned());
        }
    }
    pods.push(Arc::new(workload));
    ExistingNode {
        name: node.name.clone(),
        hostname: node.hostname.clone(),
        labels: node.labels.clone(),
        taints: node.taints.clone(),
        allocatable: node.allocatable.clone(),
        pods,
        node_pool: node.node_pool.clone(),
        initialized: node.initialized,
        settling: node.settling,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disruption::candidates::{DisruptionClass, candidates};
    use crate::disruption::fixtures::{
        instance_type, instance_types, node, nodepool, pod, pool, view,
    };
    use crate::disruption::model::NodePod;
    use crate::scheduling::LabelSelector;
    use chrono::{TimeZone, Utc};

    fn summary(sim: &Simulation) -> (Vec<Vec<String>>, usize, usize, Vec<String>) {
        let claims = sim
            .new_node_claims()
            .iter()
            .map(|c| c.instance_types.iter().map(|it| it.name.clone()).collect())
            .collect();
        (
            claims,
            sim.results.unschedulable.len(),
            sim.results.scheduled_pod_count(),
            sim.errors.clone(),
        )
    }

    /// Gives half the pods a topology constraint (hostname or zonal spread, required
    /// anti-affinity, pod affinity); bound pods inherit them.
    fn with_topology(mut p: NodePod, choice: u64) -> NodePod {
        use crate::scheduling::labels::{HOSTNAME, ZONE};
        use crate::scheduling::{PodAffinityTerm, TopologySpreadConstraint};
        let app = ["web", "api"][(choice % 2) as usize];
        let pod = Arc::make_mut(&mut p.pod);
        Arc::make_mut(&mut pod.labels).insert("app".into(), app.into());
        let selector = LabelSelector::from_labels([("app", app)]);
        match choice % 8 {
            0 => pod.topology_spread = vec![TopologySpreadConstraint::new(ZONE, 1, selector)],
            1 => pod.topology_spread = vec![TopologySpreadConstraint::new(HOSTNAME, 2, selector)],
            2 => pod.pod_anti_affinity = vec![PodAffinityTerm::new(selector, HOSTNAME)],
            3 => pod.pod_affinity = vec![PodAffinityTerm::new(selector, ZONE)],
            _ => {}
        }
        p
    }

    /// The fast paths decide exactly as a scheduler built for the cluster without the
    /// candidates: pruning, folding and prefix solves without topology, the loop's shared
    /// scheduler with the candidates excluded with it, across clusters of varied fullness.
    #[test]
    fn fast_path_agrees_with_the_exhaustive_simulation() {
        let now = Utc.with_ymd_and_hms(2026, 3, 10, 12, 0, 0).unwrap();
        let cpus = ["50m", "100m", "250m", "400m", "700m", "1200m", "1800m"];
        let types = [instance_type("medium", 2), instance_type("large", 4)];
        let mut with_topology_compared = 0;
        for seed in 0..12u64 {
            let topology = seed >= 6;
            let mut nodes = Vec::new();
            let mut x = seed * 7919 + 17;
            let mut next = |m: u64| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % m
            };
            for n in 0..90 {
                let it = &types[next(2) as usize];
                let pods = (0..next(6))
                    .map(|p| {
                        let p = pod(
                            &format!("n{n}-{p}"),
                            cpus[next(cpus.len() as u64) as usize],
                            "128Mi",
                        );
                        if topology {
                            with_topology(p, next(16))
                        } else {
                            p
                        }
                    })
                    .collect();
                let mut sn = node(&format!("node-{n:03}"), "default", it, pods, now);
                if next(10) == 0 {
                    sn.initialized = false;
                    sn.scheduling.initialized = false;
                }
                if topology && next(5) == 0 {
                    // A zone only existing nodes are in: it leaves the domains with them.
                    let zone = crate::scheduling::labels::ZONE;
                    Arc::make_mut(&mut sn.scheduling.labels)
                        .insert(zone.into(), "legacy-zone".into());
                }
                nodes.push(sn);
            }
            let mut v = view(
                now,
                vec![pool(
                    nodepool("default", "{consolidateAfter: 0s}"),
                    instance_types(),
                )],
                nodes,
            );
            v.pending_pods = (0..next(4))
                .map(|p| {
                    let p = pod(&format!("pending-{p}"), cpus[next(7) as usize], "64Mi");
                    if topology {
                        with_topology(p, next(16))
                    } else {
                        p
                    }
                    .pod
                })
                .map(Arc::unwrap_or_clone)
                .collect();
            let base = SimulationBase::new(&v);
            let (cands, _) = candidates(&v, DisruptionClass::Graceful);
            for c in cands.iter().take(40) {
                let fast = base.simulate_with(&[c], Move::OffSettlingNodes, Strategy::Fast);
                let full = base.simulate_with(&[c], Move::OffSettlingNodes, Strategy::Exhaustive);
                assert_eq!(
                    summary(&fast),
                    summary(&full),
                    "seed {seed}, candidate {}",
                    c.name
                );
                with_topology_compared += usize::from(topology);
            }
            let pair: Vec<&Candidate> = cands.iter().take(3).collect();
            assert_eq!(
                summary(&base.simulate_with(&pair, Move::OffSettlingNodes, Strategy::Fast)),
                summary(&base.simulate_with(&pair, Move::OffSettlingNodes, Strategy::Exhaustive))
            );
            if topology {
                assert!(
                    base.whole_cluster.get().is_some(),
                    "seed {seed}: topology simulations use the shared scheduler"
                );
            }
        }
        assert!(with_topology_compared > 100);
    }
}
