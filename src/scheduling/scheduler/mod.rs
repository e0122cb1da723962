//! The scheduler: NodePool templates, instance types, existing nodes and topology prepared once
//! (`Scheduler::new`), then any number of solves (`solve/`: pods onto existing nodes, in-flight
//! NodeClaims, then new NodeClaims — `solve/claim.rs` builds and grows those — relaxing
//! preferences when a pod does not fit). `api` holds the input/output types, `filters` the
//! type and offering filters, `explain` why a pod fits no NodePool.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use super::labels::{CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, NODE_POOL, WellKnownLabels};
use super::model::{
    DaemonSetPod, ExistingNode, HostPort, InstanceType, LabelSelector, NodeLabels,
    NodePoolTemplate, Pod, PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable,
    ports_conflict,
};
use super::quantity::{NODES, Quantity, Resources};
use super::requirements::{Requirement, Requirements};
use super::taints::{Taint, TaintEffect, Toleration, first_untolerated};
use super::topology::{
    DomainIds, ExistingCounts, GroupId, HostId, NodeFilter, PodTopology, PreparedGroup, Rejected,
    Topology,
};

mod api;
mod explain;
mod filters;
mod solve;

pub use api::*;
use explain::*;
use filters::*;
use solve::Solve;

#[derive(Debug, Clone)]
struct TypeEntry {
    it: Arc<InstanceType>,
    /// Allocatable minus the DaemonSet overhead of daemons that would land on this type.
    usable: Resources,
    daemon_overhead: Resources,
}

#[derive(Debug, Clone)]
struct Template {
    pool: NodePoolTemplate,
    reqs: Requirements,
    types: Vec<TypeEntry>,
    /// Limited resources: limit minus usage (may go negative).
    remaining: BTreeMap<String, i128>,
    /// Per-resource maximum capacity over all types (quick "nothing exceeds the limits" check).
    max_capacity: Resources,
    /// Per-resource maximum and minimum usable capacity over all types.
    max_usable: Resources,
    min_usable: Resources,
    /// Host ports of the DaemonSets that run on this NodePool's nodes.
    daemon_ports: Vec<HostPort>,
}

#[derive(Debug, Clone)]
struct NodeBase {
    name: String,
    reqs: Requirements,
    labels: NodeLabels,
    taints: Vec<Taint>,
    available: Resources,
    settling: bool,
}

/// Upstream's reason for a pod when no NodePool reached the scheduler.
pub const NO_NODEPOOLS: &str = "no nodepools found";

/// A NodePool that could not take part, and why (for the operator).
#[derive(Debug, Clone)]
pub struct SkippedNodePool {
    pub name: String,
    pub reason: String,
}

/// The reusable scheduler: templates and nodes are prepared once, `solve` can run many times,
/// and [`Scheduler::solve_excluding`] can leave different nodes out of each solve.
#[derive(Debug)]
pub struct Scheduler {
    templates: Vec<Template>,
    nodes: Vec<NodeBase>,
    existing: Vec<ExistingNode>,
    /// Node indices by node name.
    node_by_name: HashMap<String, Vec<usize>>,
    /// Host ports of each node's bound pods.
    bound_ports: Vec<Vec<HostPort>>,
    /// Required anti-affinity terms of bound pods, one entry per distinct group, ordered by
    /// first occurrence.
    owner_groups: Vec<OwnerGroup>,
    owner_index: HashMap<String, usize>,
    options: SchedulerOptions,
    relax_prefer_no_schedule: bool,
    skipped: Vec<SkippedNodePool>,
    /// Instance types by price for (template, zone, capacity type), shared by every solve.
    price_orders: Mutex<HashMap<PriceOrderKey, PriceOrder>>,
    /// What the existing nodes contribute to topology, over all nodes; a solve that excludes
    /// nodes takes the excluded nodes' part back out.
    topology_cache: Mutex<TopologyCache>,
}

/// A required anti-affinity term carried by bound pods (all terms of one group).
#[derive(Debug)]
struct OwnerGroup {
    term: PodAffinityTerm,
    namespace: String,
    /// (Position among all bound pods' terms, node index) of every pod term in this group.
    occurrences: Vec<(usize, usize)>,
}

#[derive(Debug, Default)]
struct TopologyCache {
    /// Per topology key: the values NodePools offer, and how many nodes carry each value.
    domains: HashMap<String, Arc<KeyDomains>>,
    /// Per group identity: the bound pods' counts on all nodes (host id = node index).
    groups: HashMap<String, Arc<ExistingCounts>>,
}

#[derive(Debug)]
struct KeyDomains {
    offered: BTreeSet<String>,
    on_nodes: BTreeMap<String, usize>,
}

type PriceOrderKey = (usize, Option<Requirement>, Option<Requirement>);
/// Type indices cheapest first, and how many capacity types the admitted offerings have.
type PriceOrder = Arc<(Vec<u32>, usize)>;

impl Scheduler {
    pub fn new(input: SchedulerInput) -> Self {
        let SchedulerInput {
            mut node_pools,
            instance_types,
            existing_nodes,
            daemonsets,
            options,
        } = input;
        let daemonsets: Vec<DaemonSetPod> = daemonsets
            .into_iter()
            .filter(|d| !options.refuses_dynamic_resources(d.uses_dynamic_resources))
            .collect();
        let wk = &options.well_known_labels;
        // Heavier first; equal weights by name descending (upstream order).
        node_pools.sort_by(|a, b| b.weight.cmp(&a.weight).then(b.name.cmp(&a.name)));
        let mut skipped = Vec::new();
        let mut templates = Vec::new();
        for pool in node_pools {
            let Some(types) = instance_types.get(&pool.name).filter(|t| !t.is_empty()) else {
                skipped.push(SkippedNodePool {
                    name: pool.name.clone(),
                    reason: "no instance types".into(),
                });
                continue;
            };
            let mut reqs = pool.requirements.clone();
            for (k, v) in &pool.labels {
                reqs.add(Requirement::in_values(k, [v.clone()]));
            }
            reqs.add(Requirement::in_values(NODE_POOL, [pool.name.clone()]));
            // Daemons selecting registered/initialized nodes still land on new nodes.
            let mut daemon_view = reqs.clone();
            daemon_view.add(Requirement::in_values("karpenter.sh/registered", ["true"]));
            daemon_view.add(Requirement::in_values("karpenter.sh/initialized", ["true"]));
            let daemons: Vec<&DaemonSetPod> = daemonsets
                .iter()
                .filter(|d| first_untolerated(&pool.taints, &d.tolerations, true).is_none())
                .collect();
            let mut daemon_ports: Vec<HostPort> = Vec::new();
            let entries: Vec<TypeEntry> = types
                .iter()
                .filter(|it| {
                    it.requirements.intersects(&reqs).is_ok() && it.has_available_offering(&reqs)
                })
                .map(|it| {
                    let mut overhead = Resources::new();
                    for d in &daemons {
                        if daemon_alternatives(d).iter().any(|alt| {
                            daemon_view.compatible(alt, Some(wk)).is_ok()
                                && it.requirements.intersects(alt).is_ok()
                        }) {
                            overhead += &d.requests;
                            for p in &d.host_ports {
                                if !daemon_ports.contains(p) {
                                    daemon_ports.push(p.clone());
                                }
                            }
                        }
                    }
                    TypeEntry {
                        usable: it.allocatable().saturating_minus(&overhead),
                        daemon_overhead: overhead,
                        it: Arc::clone(it),
                    }
                })
                .collect();
            if entries.is_empty() {
                skipped.push(SkippedNodePool {
                    name: pool.name.clone(),
                    reason: "no instance type is compatible with the NodePool requirements".into(),
                });
                continue;
            }
            let remaining = pool
                .limits
                .iter()
                .map(|(k, v)| (k.clone(), v.milli() - pool.usage.get(k).milli()))
                .collect();
            let mut max_capacity = Resources::new();
            for e in &entries {
                max_capacity.max_with(&e.it.capacity);
            }
            let all: Vec<u32> = (0..entries.len() as u32).collect();
            let (max_usable, min_usable) = usable_range(&entries, &all);
            templates.push(Template {
                pool,
                reqs,
                types: entries,
                remaining,
                max_capacity,
                max_usable,
                min_usable,
                daemon_ports,
            });
        }
        let relax_prefer_no_schedule = templates.iter().any(|t| {
            t.pool
                .taints
                .iter()
                .any(|x| x.effect == TaintEffect::PreferNoSchedule)
        });

        let mut existing: Vec<ExistingNode> = existing_nodes
            .into_iter()
            .filter(|n| !options.excluded_nodes.contains(&n.name))
            .collect();
        existing.sort_by(|a, b| b.initialized.cmp(&a.initialized).then(a.name.cmp(&b.name)));
        let nodes = existing
            .iter()
            .map(|n| {
                let reqs = n.requirements();
                let mut used = Resources::new();
                for p in &n.pods {
                    used += &p.requests;
                }
                for d in &daemonsets {
                    let present = n
                        .pods
                        .iter()
                        .any(|p| p.daemonset.as_deref() == Some(d.name.as_str()));
                    if !present
                        && first_untolerated(&n.taints, &d.tolerations, true).is_none()
                        && daemon_alternatives(d)
                            .iter()
                            .any(|alt| reqs.compatible(alt, Some(wk)).is_ok())
                    {
                        used += &d.requests;
                    }
                }
                NodeBase {
                    name: n.name.clone(),
                    labels: n.labels.clone(),
                    taints: n.taints.clone(),
                    available: n.allocatable.saturating_minus(&used),
                    reqs,
                    settling: n.settling,
                }
            })
            .collect();
        let mut node_by_name: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, n) in existing.iter().enumerate() {
            node_by_name.entry(n.name.clone()).or_default().push(i);
        }
        let bound_ports = existing
            .iter()
            .map(|n| {
                n.pods
                    .iter()
                    .flat_map(|p| p.host_ports.iter().cloned())
                    .collect()
            })
            .collect();
        let mut owner_groups: Vec<OwnerGroup> = Vec::new();
        let mut owner_index: HashMap<String, usize> = HashMap::new();
        let terms = existing.iter().enumerate().flat_map(|(ni, n)| {
            n.pods.iter().flat_map(move |p| {
                p.required_anti_affinity
                    .iter()
                    .map(move |t| (ni, t, p.namespace.as_str()))
            })
        });
        for (seq, (ni, term, namespace)) in terms.enumerate() {
            let identity = Topology::required_anti_affinity_identity(term, namespace);
            let og = *owner_index.entry(identity).or_insert_with(|| {
                owner_groups.push(OwnerGroup {
                    term: term.clone(),
                    namespace: namespace.to_string(),
                    occurrences: Vec::new(),
                });
                owner_groups.len() - 1
            });
            owner_groups[og].occurrences.push((seq, ni));
        }
        Scheduler {
            templates,
            nodes,
            existing,
            node_by_name,
            bound_ports,
            owner_groups,
            owner_index,
            options,
            relax_prefer_no_schedule,
            skipped,
            price_orders: Mutex::new(HashMap::new()),
            topology_cache: Mutex::new(TopologyCache::default()),
        }
    }

    /// NodePools left out at construction, with the reason.
    pub fn skipped_node_pools(&self) -> &[SkippedNodePool] {
        &self.skipped
    }

    /// Places the pods; the input is not modified and the scheduler can be reused.
    pub fn solve(&self, pods: &[Pod]) -> Results {
        self.solve_excluding::<String>(pods, &HashSet::new())
    }

    /// Places the pods as if the nodes named in `excluded` were gone: their capacity, their
    /// pods' topology contributions and their domains (when no other node or NodePool has
    /// them) are left out, exactly as if they had been in
    /// [`SchedulerOptions::excluded_nodes`] at construction. Build the scheduler once and call
    /// this per consolidation candidate: a solve costs about the same whatever is excluded.
    pub fn solve_excluding<S: AsRef<str>>(&self, pods: &[Pod], excluded: &HashSet<S>) -> Results {
        let defaults = &self.options.default_topology_spread;
        if defaults.is_empty() || !pods.iter().any(takes_default_spread) {
            return Solve::new(self, pods, excluded).run();
        }
        let with_defaults: Vec<Pod> = pods
            .iter()
            .map(|p| {
                let mut pod = p.clone();
                if takes_default_spread(p) {
                    pod.topology_spread = defaults
                        .iter()
                        .map(|c| TopologySpreadConstraint {
                            selector: LabelSelector::from_labels(
                                p.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                            ),
                            ..c.clone()
                        })
                        .collect();
                }
                pod
            })
            .collect();
        Solve::new(self, &with_defaults, excluded).run()
    }

    /// `(mask, sorted indices)` of the nodes named in `names`.
    fn exclusion<S: AsRef<str>>(&self, names: &HashSet<S>) -> (Vec<bool>, Vec<usize>) {
        let mut mask = vec![false; self.nodes.len()];
        let mut indices = Vec::new();
        for name in names {
            for &i in self.node_by_name.get(name.as_ref()).into_iter().flatten() {
                if !mask[i] {
                    mask[i] = true;
                    indices.push(i);
                }
            }
        }
        indices.sort_unstable();
        (mask, indices)
    }

    /// Values each topology key can take: from NodePool requirements ∩ instance types, and
    /// the nodes that are not excluded.
    fn domain_universe(
        &self,
        keys: &BTreeSet<String>,
        excluded: &[usize],
    ) -> HashMap<String, BTreeSet<String>> {
        let mut cache = self
            .topology_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = HashMap::new();
        for key in keys {
            let domains = Arc::clone(
                cache
                    .domains
                    .entry(key.clone())
                    .or_insert_with(|| Arc::new(self.key_domains(key))),
            );
            let mut gone: BTreeMap<&str, usize> = BTreeMap::new();
            for &ni in excluded {
                if let Some(v) = self.nodes[ni].labels.get(key) {
                    *gone.entry(v.as_str()).or_insert(0) += 1;
                }
            }
            let mut set = domains.offered.clone();
            set.extend(
                domains
                    .on_nodes
                    .iter()
                    .filter(|(v, n)| **n > gone.get(v.as_str()).copied().unwrap_or(0))
                    .map(|(v, _)| v.clone()),
            );
            out.insert(key.clone(), set);
        }
        out
    }

    fn key_domains(&self, key: &str) -> KeyDomains {
        let mut offered = BTreeSet::new();
        for t in &self.templates {
            let pool_req = t.reqs.get(key);
            for e in &t.types {
                let combined = match (pool_req, e.it.requirements.get(key)) {
                    (Some(p), Some(i)) => Some(p.intersection(i)),
                    (Some(p), None) => Some(p.clone()),
                    (None, Some(i)) => Some(i.clone()),
                    (None, None) => None,
                };
                if let Some(r) = combined.filter(|r| !r.is_complement()) {
                    offered.extend(r.values().iter().cloned());
                }
            }
        }
        let mut on_nodes = BTreeMap::new();
        for n in &self.nodes {
            if let Some(v) = n.labels.get(key) {
                *on_nodes.entry(v.clone()).or_insert(0) += 1;
            }
        }
        KeyDomains { offered, on_nodes }
    }

    /// Installs the bound pods' counts in every group of `topology`, without the excluded nodes.
    fn count_existing_pods(&self, topology: &mut Topology, excluded: &[usize]) {
        let mut cache = self
            .topology_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for g in 0..topology.group_count() {
            let all = Arc::clone(
                cache
                    .groups
                    .entry(topology.identity(g).to_string())
                    .or_insert_with(|| {
                        let nodes = 0..self.nodes.len();
                        Arc::new(self.existing_counts(topology, g, nodes, 1, Default::default()))
                    }),
            );
            let counts = if excluded.is_empty() {
                (*all).clone()
            } else {
                let all = (*all).clone();
                self.existing_counts(topology, g, excluded.iter().copied(), -1, all)
            };
            topology.set_existing(g, counts);
        }
    }

    /// Adds `delta` times what the bound pods of `nodes` contribute to group `g` to `counts`.
    fn existing_counts(
        &self,
        topology: &Topology,
        g: GroupId,
        nodes: impl Iterator<Item = usize> + Clone,
        delta: i32,
        mut counts: ExistingCounts,
    ) -> ExistingCounts {
        for ni in nodes.clone() {
            let base = &self.nodes[ni];
            for p in &self.existing[ni].pods {
                if topology.group_matches(g, &p.namespace, &p.labels) {
                    let host = ni as HostId;
                    let (labels, reqs, taints) = (&base.labels, &base.reqs, &base.taints);
                    topology.count_existing(g, &mut counts, labels, reqs, taints, host, delta);
                }
            }
        }
        if let Some(&og) = self.owner_index.get(topology.identity(g)) {
            let occurrences = &self.owner_groups[og].occurrences;
            let mut wanted = vec![false; self.nodes.len()];
            for ni in nodes {
                wanted[ni] = true;
            }
            for &(_, ni) in occurrences.iter().filter(|(_, ni)| wanted[*ni]) {
                let labels = &self.nodes[ni].labels;
                topology.count_existing_owner(g, &mut counts, labels, ni as HostId, delta);
            }
        }
        counts
    }
}

fn daemon_alternatives(d: &DaemonSetPod) -> Vec<Requirements> {
    if d.required_node_affinity.is_empty() {
        vec![d.node_selector.clone()]
    } else {
        d.required_node_affinity
            .iter()
            .map(|t| d.node_selector.intersection(t))
            .collect()
    }
}

/// A pod without spread constraints of its own gets the defaults; one without labels does not
/// (an empty selector would spread it against every pod, as kube-scheduler also avoids).
fn takes_default_spread(pod: &Pod) -> bool {
    pod.topology_spread.is_empty() && !pod.labels.is_empty()
}
