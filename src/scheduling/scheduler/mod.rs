//! The solver: places pods on existing nodes, in-flight NodeClaims, then new NodeClaims built
//! from NodePool templates, relaxing preferences when a pod does not fit.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use super::labels::{CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, NODE_POOL, WellKnownLabels};
use super::model::{
    DaemonSetPod, ExistingNode, HostPort, InstanceType, NodePoolTemplate, Pod, PodAffinityTerm,
    WhenUnsatisfiable, ports_conflict,
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

pub use api::*;
use explain::*;
use filters::*;

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
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    available: Resources,
}

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
        Solve::new(self, pods, excluded).run()
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

/// Per-pod data fixed for the whole solve.
struct PodInfo {
    matching: Vec<GroupId>,
    inverse: Vec<GroupId>,
    required_groups: Vec<GroupId>,
    required_anti: Vec<GroupId>,
    preferred_affinity: Vec<GroupId>,
    preferred_anti: Vec<GroupId>,
    schedule_anyway: Vec<GroupId>,
    preferred_node: Vec<Requirements>,
}

/// One scheduling attempt of a pod, after some relaxations.
#[derive(Default, Clone, Copy)]
struct Relaxation {
    required_terms_dropped: usize,
    preferred_affinity_dropped: usize,
    preferred_anti_dropped: usize,
    preferred_node_dropped: usize,
    schedule_anyway_dropped: usize,
    tolerate_prefer_no_schedule: bool,
}

struct Attempt {
    reqs: Requirements,
    strict: Requirements,
    node_reqs_extra: Option<Requirements>,
    owned: Vec<GroupId>,
    tolerates_template: Vec<Result<(), String>>,
    tolerate_pns: bool,
}

struct Claim {
    template: usize,
    reqs: Requirements,
    /// Single domain per cached topology key, kept in step with `reqs`.
    domains: DomainIds,
    host: HostId,
    types: Vec<u32>,
    requests: Resources,
    headroom: Resources,
    /// Smallest usable capacity left over the instance types: a pod that fits here keeps them all.
    floor: Resources,
    pods: Vec<usize>,
    min_values_relaxed: bool,
    /// Host ports of the pods placed here.
    ports: Vec<HostPort>,
}

/// A template index and the narrowed requirements that decide type compatibility.
type TypeCacheKey = (usize, Vec<Requirement>);

/// What one attempt checks every candidate against.
struct Check<'c> {
    pod: &'c Pod,
    a: &'c Attempt,
    topo: &'c PodTopology<'c>,
    prepared: &'c [PreparedGroup<'c>],
}

enum Target {
    Node(usize, Option<Requirements>),
    Claim(usize, ClaimUpdate),
    New(usize, Box<Claim>),
}

/// Why merging a pod into a node's requirements failed; only formatted when reported.
enum MergeError {
    Topology(Rejected),
    Volume(super::requirements::Incompatibility),
    Empty(String),
}

struct ClaimUpdate {
    reqs: Option<Requirements>,
    types: Vec<u32>,
    min_values_relaxed: bool,
}

/// What a solve placed on one existing node (host id = node index).
struct NodeUse {
    node: usize,
    available: Resources,
    pods: Vec<usize>,
    /// Host ports of the pods placed here (bound pods' are in `Scheduler::bound_ports`).
    ports: Vec<HostPort>,
}

const NO_USE: u32 = u32::MAX;

struct Solve<'a> {
    s: &'a Scheduler,
    pods: &'a [Pod],
    info: Vec<PodInfo>,
    topology: Topology,
    /// Existing nodes left out of this solve (by node index).
    excluded: Vec<bool>,
    /// Existing nodes taking part in this solve.
    included: usize,
    /// Index into `node_uses` per existing node (`NO_USE` until a pod lands there).
    node_use_slot: Vec<u32>,
    node_uses: Vec<NodeUse>,
    claims: Vec<Claim>,
    claim_order: BTreeSet<(usize, usize)>,
    remaining: Vec<BTreeMap<String, i128>>,
    /// Instance types (bitset per template) compatible with a set of narrowed requirements;
    /// pods mostly repeat a few requirement shapes, so this saves re-checking every type.
    type_cache: RefCell<HashMap<TypeCacheKey, Rc<Vec<u64>>>>,
}

impl<'a> Solve<'a> {
    fn new<S: AsRef<str>>(s: &'a Scheduler, pods: &'a [Pod], excluded: &HashSet<S>) -> Self {
        let respect = s.options.preference_policy == PreferencePolicy::Respect;
        let (excluded, excluded_nodes) = s.exclusion(excluded);
        // Bound pods' required anti-affinity groups on the nodes that stay, by first occurrence.
        let mut owners: Vec<(usize, &OwnerGroup)> = s
            .owner_groups
            .iter()
            .filter_map(|og| {
                let (seq, _) = og.occurrences.iter().find(|(_, ni)| !excluded[*ni])?;
                Some((*seq, og))
            })
            .collect();
        owners.sort_unstable_by_key(|(seq, _)| *seq);
        let mut topology = Topology::new(HashMap::new());
        // Which keys need a domain universe?
        let mut keys: BTreeSet<String> = BTreeSet::new();
        let has_topology = |p: &Pod| {
            !p.topology_spread.is_empty()
                || !p.pod_affinity.is_empty()
                || !p.pod_anti_affinity.is_empty()
                || !p.preferred_pod_affinity.is_empty()
                || !p.preferred_pod_anti_affinity.is_empty()
        };
        for p in pods.iter().filter(|p| has_topology(p)) {
            keys.extend(p.topology_spread.iter().map(|c| c.topology_key.clone()));
            keys.extend(p.pod_affinity.iter().map(|t| t.topology_key.clone()));
            keys.extend(p.pod_anti_affinity.iter().map(|t| t.topology_key.clone()));
            keys.extend(
                p.preferred_pod_affinity
                    .iter()
                    .map(|t| t.term.topology_key.clone()),
            );
            keys.extend(
                p.preferred_pod_anti_affinity
                    .iter()
                    .map(|t| t.term.topology_key.clone()),
            );
        }
        keys.extend(owners.iter().map(|(_, og)| og.term.topology_key.clone()));
        keys.remove(HOSTNAME);
        if !keys.is_empty() {
            topology = Topology::new(s.domain_universe(&keys, &excluded_nodes));
        }
        // Host id = node index; excluded nodes keep theirs unused.
        topology.add_hosts(s.nodes.len());
        topology.start_claims();
        let mut info: Vec<PodInfo> = pods
            .iter()
            .map(|p| {
                let mut required_groups = Vec::new();
                let mut schedule_anyway = Vec::new();
                for c in &p.topology_spread {
                    let filter = spread_filter(p, c);
                    let g = topology.spread_group(c, &p.namespace, &p.labels, filter);
                    match c.when_unsatisfiable {
                        WhenUnsatisfiable::DoNotSchedule => required_groups.push(g),
                        WhenUnsatisfiable::ScheduleAnyway if respect => schedule_anyway.push(g),
                        WhenUnsatisfiable::ScheduleAnyway => {}
                    }
                }
                for t in &p.pod_affinity {
                    required_groups.push(topology.affinity_group(t, &p.namespace));
                }
                let mut required_anti = Vec::new();
                for t in &p.pod_anti_affinity {
                    let g = topology.anti_affinity_group(t, &p.namespace, true);
                    required_groups.push(g);
                    required_anti.push(g);
                }
                let by_weight = |v: &[super::model::WeightedPodAffinityTerm]| {
                    let mut v = v.to_vec();
                    v.sort_by_key(|t| std::cmp::Reverse(t.weight));
                    v
                };
                let (mut preferred_affinity, mut preferred_anti, mut preferred_node) =
                    (Vec::new(), Vec::new(), Vec::new());
                if respect {
                    for t in by_weight(&p.preferred_pod_affinity) {
                        preferred_affinity.push(topology.affinity_group(&t.term, &p.namespace));
                    }
                    for t in by_weight(&p.preferred_pod_anti_affinity) {
                        preferred_anti.push(topology.anti_affinity_group(
                            &t.term,
                            &p.namespace,
                            false,
                        ));
                    }
                    let mut prefs = p.preferred_node_affinity.clone();
                    prefs.sort_by_key(|t| std::cmp::Reverse(t.weight));
                    preferred_node = prefs.into_iter().map(|w| w.requirements).collect();
                }
                PodInfo {
                    matching: Vec::new(),
                    inverse: Vec::new(),
                    required_groups,
                    required_anti,
                    preferred_affinity,
                    preferred_anti,
                    schedule_anyway,
                    preferred_node,
                }
            })
            .collect();
        // Required anti-affinity of running pods blocks matching pods from their domains.
        for (_, og) in &owners {
            topology.anti_affinity_group(&og.term, &og.namespace, true);
        }
        if topology.has_groups() {
            for (pi, p) in pods.iter().enumerate() {
                let matching = topology.matching_groups(&p.namespace, &p.labels);
                info[pi].inverse = topology.inverse_groups(&matching);
                info[pi].matching = matching;
            }
            s.count_existing_pods(&mut topology, &excluded_nodes);
        }
        Solve {
            s,
            pods,
            info,
            topology,
            included: s.nodes.len() - excluded_nodes.len(),
            excluded,
            node_use_slot: vec![NO_USE; s.nodes.len()],
            node_uses: Vec::new(),
            claims: Vec::new(),
            claim_order: BTreeSet::new(),
            remaining: s.templates.iter().map(|t| t.remaining.clone()).collect(),
            type_cache: RefCell::new(HashMap::new()),
        }
    }

    /// What this solve placed on existing node `ni` so far.
    fn node_use(&self, ni: usize) -> Option<&NodeUse> {
        match self.node_use_slot[ni] {
            NO_USE => None,
            slot => Some(&self.node_uses[slot as usize]),
        }
    }

    /// The name of the placeholder hostname for NodeClaim host `host`: numbered after the
    /// nodes taking part, as a scheduler built without the excluded nodes would number it.
    fn placeholder_name(&self, host: HostId) -> String {
        let ordinal = host as usize - self.s.nodes.len() + self.included;
        format!("hostname-placeholder-{ordinal:04}")
    }

    fn run(mut self) -> Results {
        let mut results = Results::default();
        let mut order: Vec<usize> = Vec::with_capacity(self.pods.len());
        for (i, p) in self.pods.iter().enumerate() {
            if p.refuses_karpenter_nodes() {
                results.ignored.push(i);
            } else {
                order.push(i);
            }
        }
        let pods = self.pods;
        order.sort_by(|&a, &b| {
            let (pa, pb) = (&pods[a], &pods[b]);
            pb.requests
                .cpu()
                .cmp(&pa.requests.cpu())
                .then(pb.requests.memory().cmp(&pa.requests.memory()))
                .then(pa.created_at.cmp(&pb.created_at))
                .then(pa.uid.cmp(&pb.uid))
        });
        let mut queue: VecDeque<usize> = order.into();
        let mut last_push_len: HashMap<usize, usize> = HashMap::new();
        let mut errors: HashMap<usize, (String, Vec<(String, String)>)> = HashMap::new();
        while let Some(&pi) = queue.front() {
            if last_push_len.get(&pi) == Some(&queue.len()) {
                break;
            }
            queue.pop_front();
            match self.schedule_with_relaxation(pi) {
                Ok(()) => {
                    errors.remove(&pi);
                }
                Err(e) => {
                    errors.insert(pi, e);
                    queue.push_back(pi);
                    last_push_len.insert(pi, queue.len());
                }
            }
        }
        let mut failed: Vec<usize> = queue.into_iter().collect();
        failed.sort_unstable();
        for pi in failed {
            let (reason, per_node_pool) = errors.remove(&pi).unwrap_or_default();
            results.unschedulable.push(UnschedulablePod {
                pod: pi,
                reason,
                per_node_pool,
            });
        }
        self.finish(results)
    }

    fn attempt(&self, pi: usize, r: &Relaxation) -> Attempt {
        let pod = &self.pods[pi];
        let info = &self.info[pi];
        let mut strict = pod.node_selector.clone();
        if let Some(term) = pod.required_node_affinity.get(r.required_terms_dropped) {
            strict.add_all(term);
        }
        let mut reqs = strict.clone();
        if let Some(pref) = info.preferred_node.get(r.preferred_node_dropped) {
            reqs.add_all(pref);
        }
        let mut owned = info.required_groups.clone();
        owned.extend_from_slice(
            &info.preferred_affinity[r
                .preferred_affinity_dropped
                .min(info.preferred_affinity.len())..],
        );
        owned.extend_from_slice(
            &info.preferred_anti[r.preferred_anti_dropped.min(info.preferred_anti.len())..],
        );
        owned.extend_from_slice(
            &info.schedule_anyway[r.schedule_anyway_dropped.min(info.schedule_anyway.len())..],
        );
        let tolerate_pns = r.tolerate_prefer_no_schedule;
        let tolerates_template = self
            .s
            .templates
            .iter()
            .map(
                |t| match first_untolerated(&t.pool.taints, &pod.tolerations, tolerate_pns) {
                    Some(taint) => Err(format!("did not tolerate taint {taint}")),
                    None => Ok(()),
                },
            )
            .collect();
        Attempt {
            reqs,
            strict,
            node_reqs_extra: pod.volume_requirements.clone(),
            owned,
            tolerates_template,
            tolerate_pns,
        }
    }

    /// Upstream's relaxation order; `false` when nothing is left to relax.
    fn relax(&self, pi: usize, r: &mut Relaxation) -> bool {
        let pod = &self.pods[pi];
        let info = &self.info[pi];
        if pod.required_node_affinity.len() > r.required_terms_dropped + 1 {
            r.required_terms_dropped += 1;
        } else if r.preferred_affinity_dropped < info.preferred_affinity.len() {
            r.preferred_affinity_dropped += 1;
        } else if r.preferred_anti_dropped < info.preferred_anti.len() {
            r.preferred_anti_dropped += 1;
        } else if r.preferred_node_dropped < info.preferred_node.len() {
            r.preferred_node_dropped += 1;
        } else if r.schedule_anyway_dropped < info.schedule_anyway.len() {
            r.schedule_anyway_dropped += 1;
        } else if self.s.relax_prefer_no_schedule && !r.tolerate_prefer_no_schedule {
            r.tolerate_prefer_no_schedule = true;
        } else {
            return false;
        }
        true
    }

    fn schedule_with_relaxation(
        &mut self,
        pi: usize,
    ) -> Result<(), (String, Vec<(String, String)>)> {
        let mut r = Relaxation::default();
        loop {
            let attempt = self.attempt(pi, &r);
            match self.add(pi, &attempt) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if !self.relax(pi, &mut r) {
                        return Err(e);
                    }
                }
            }
        }
    }

    fn add(&mut self, pi: usize, a: &Attempt) -> Result<(), (String, Vec<(String, String)>)> {
        let target = self.find_target(pi, a)?;
        let pod = &self.pods[pi];
        let info = &self.info[pi];
        match target {
            Target::Node(ni, final_reqs) => {
                let base = &self.s.nodes[ni];
                if self.node_use_slot[ni] == NO_USE {
                    self.node_use_slot[ni] = self.node_uses.len() as u32;
                    self.node_uses.push(NodeUse {
                        node: ni,
                        available: base.available.clone(),
                        pods: Vec::new(),
                        ports: Vec::new(),
                    });
                }
                let used = &mut self.node_uses[self.node_use_slot[ni] as usize];
                used.available = used.available.saturating_minus(&pod.requests);
                used.pods.push(pi);
                used.ports.extend(pod.host_ports.iter().cloned());
                let req = final_reqs.as_ref().unwrap_or(&base.reqs);
                self.topology.record(
                    &info.matching,
                    &info.required_anti,
                    req,
                    &base.taints,
                    ni as HostId,
                );
            }
            Target::Claim(ci, update) => {
                let claim = &mut self.claims[ci];
                self.claim_order.remove(&(claim.pods.len(), ci));
                claim.pods.push(pi);
                claim.requests += &pod.requests;
                claim.ports.extend(pod.host_ports.iter().cloned());
                if let Some(reqs) = update.reqs {
                    claim.domains = self.topology.domain_ids(&reqs);
                    claim.reqs = reqs;
                }
                (claim.headroom, claim.floor) = if update.types.len() == claim.types.len() {
                    // Same instance types: only the new pod's requests come off.
                    (
                        claim.headroom.saturating_minus(&pod.requests),
                        claim.floor.saturating_minus(&pod.requests),
                    )
                } else {
                    headroom(
                        &self.s.templates[claim.template],
                        &update.types,
                        &claim.requests,
                    )
                };
                claim.types = update.types;
                claim.min_values_relaxed |= update.min_values_relaxed;
                self.claim_order.insert((claim.pods.len(), ci));
                let claim = &self.claims[ci];
                let taints = &self.s.templates[claim.template].pool.taints;
                self.topology.record(
                    &info.matching,
                    &info.required_anti,
                    &claim.reqs,
                    taints,
                    claim.host,
                );
            }
            Target::New(ti, claim) => {
                let host = self.topology.add_host();
                debug_assert_eq!(host, claim.host);
                let t = &self.s.templates[ti];
                let max_capacity = if claim.types.len() == t.types.len() {
                    t.max_capacity.clone()
                } else {
                    let mut m = Resources::new();
                    for &i in &claim.types {
                        m.max_with(&t.types[i as usize].it.capacity);
                    }
                    m
                };
                for (k, v) in self.remaining[ti].iter_mut() {
                    *v -= if k == NODES {
                        1000
                    } else {
                        max_capacity.get(k).milli()
                    };
                }
                self.topology.record(
                    &info.matching,
                    &info.required_anti,
                    &claim.reqs,
                    &t.pool.taints,
                    host,
                );
                let ci = self.claims.len();
                self.claim_order.insert((1, ci));
                self.claims.push(*claim);
            }
        }
        Ok(())
    }

    /// Where the pod goes: (a) existing nodes in order, (b) this solve's NodeClaims emptiest
    /// first, (c) a new NodeClaim from the first NodePool (by weight) that can take it.
    fn find_target(
        &self,
        pi: usize,
        a: &Attempt,
    ) -> Result<Target, (String, Vec<(String, String)>)> {
        let pod = &self.pods[pi];
        let info = &self.info[pi];
        let mut always: Vec<&Requirements> = vec![&a.reqs];
        always.extend(a.node_reqs_extra.as_ref());
        let topo = PodTopology {
            matching: &info.matching,
            inverse: &info.inverse,
            owned: &a.owned,
            strict: &a.strict,
            always: &always,
        };
        let prepared = match self.topology.prepare(&topo) {
            Ok(p) => p,
            Err(r) => {
                let why = self.topology.explain(r).to_string();
                let per_pool: Vec<(String, String)> = self
                    .s
                    .templates
                    .iter()
                    .map(|t| (t.pool.name.clone(), why.clone()))
                    .collect();
                return Err((why, per_pool));
            }
        };
        let check = Check {
            pod,
            a,
            topo: &topo,
            prepared: &prepared,
        };
        for ni in (0..self.s.nodes.len()).filter(|&ni| !self.excluded[ni]) {
            if let Some(final_reqs) = self.can_add_to_node(ni, &check) {
                return Ok(Target::Node(ni, final_reqs));
            }
        }
        if !self.topology.blocks_every_claim(&topo) {
            for &(_, ci) in &self.claim_order {
                if let Some(update) = self.can_add_to_claim(ci, &check) {
                    return Ok(Target::Claim(ci, update));
                }
            }
        }
        if self.s.templates.is_empty() {
            let reason = if self.s.skipped.is_empty() {
                "no nodepools found".to_string()
            } else {
                "nodepool requirements filtered out all available instance types".to_string()
            };
            return Err((reason, Vec::new()));
        }
        let mut per_pool = Vec::new();
        for ti in 0..self.s.templates.len() {
            match self.new_claim(ti, pi, &check) {
                Ok(claim) => return Ok(Target::New(ti, Box::new(claim))),
                Err(reason) => per_pool.push((self.s.templates[ti].pool.name.clone(), reason)),
            }
        }
        let reason = per_pool
            .iter()
            .map(|(pool, why)| format!("incompatible with nodepool {pool:?}, {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        Err((reason, per_pool))
    }

    /// `Some(None)`: fits with the node's requirements unchanged; `Some(Some(r))`: fits, narrowed to `r`.
    fn can_add_to_node(&self, ni: usize, c: &Check) -> Option<Option<Requirements>> {
        let (pod, a, topo) = (c.pod, c.a, c.topo);
        let base = &self.s.nodes[ni];
        if first_untolerated(&base.taints, &pod.tolerations, a.tolerate_pns).is_some()
            || ports_conflict(&pod.host_ports, &self.s.bound_ports[ni])
        {
            return None;
        }
        let used = self.node_use(ni);
        if used.is_some_and(|u| ports_conflict(&pod.host_ports, &u.ports)) {
            return None;
        }
        if !pod
            .requests
            .fits_in(used.map_or(&base.available, |u| &u.available))
        {
            return None;
        }
        self.topology.hostname_allows(topo, ni as HostId).ok()?;
        base.reqs.compatible(&a.reqs, None).ok()?;
        if let Some(v) = &a.node_reqs_extra {
            base.reqs.compatible(v, None).ok()?;
        }
        if !c.prepared.is_empty() {
            let extra = Topology::domain_requirements(c.prepared, &[&base.reqs]).ok()?;
            let mut r = base.reqs.clone();
            for e in extra {
                r.add(e);
            }
            if r.iter().any(|x| x.is_empty()) {
                return None;
            }
            return Some(Some(r));
        }
        Some(None)
    }

    fn can_add_to_claim(&self, ci: usize, c: &Check) -> Option<ClaimUpdate> {
        let (pod, a, topo) = (c.pod, c.a, c.topo);
        let claim = &self.claims[ci];
        if a.tolerates_template[claim.template].is_err()
            || !pod.requests.fits_in(&claim.headroom)
            || !Topology::may_admit(c.prepared, &claim.domains)
        {
            return None;
        }
        if !pod.host_ports.is_empty()
            && (ports_conflict(&pod.host_ports, &claim.ports)
                || ports_conflict(
                    &pod.host_ports,
                    &self.s.templates[claim.template].daemon_ports,
                ))
        {
            return None;
        }
        self.topology.hostname_allows(topo, claim.host).ok()?;
        let wk = &self.s.options.well_known_labels;
        claim.reqs.compatible(&a.reqs, Some(wk)).ok()?;
        let t = &self.s.templates[claim.template];
        if a.reqs.is_empty() && a.node_reqs_extra.is_none() && c.prepared.is_empty() {
            let types = self.refit(claim, pod);
            if types.is_empty() {
                return None;
            }
            return Some(ClaimUpdate {
                reqs: None,
                types,
                min_values_relaxed: false,
            });
        }
        let (merged, changed) = self.merge(&claim.reqs, c).ok()?;
        let Some(merged) = merged else {
            let types = self.refit(claim, pod);
            return (!types.is_empty()).then_some(ClaimUpdate {
                reqs: None,
                types,
                min_values_relaxed: false,
            });
        };
        let compatible = self.compatible_set(claim.template, &merged, &changed);
        let types = filter_types(
            t,
            &claim.types,
            &claim.requests,
            &pod.requests,
            compatible.as_deref().map(Vec::as_slice),
        );
        if types.is_empty() {
            return None;
        }
        let (merged, types, relaxed) = self.check_min_values(t, merged, types).ok()?;
        Some(ClaimUpdate {
            reqs: Some(merged),
            types,
            min_values_relaxed: relaxed,
        })
    }

    /// The claim's instance types that still fit with the pod added (no requirement change).
    fn refit(&self, claim: &Claim, pod: &Pod) -> Vec<u32> {
        if pod.requests.fits_in(&claim.floor) {
            return claim.types.clone();
        }
        let t = &self.s.templates[claim.template];
        filter_types(t, &claim.types, &claim.requests, &pod.requests, None)
    }

    /// Node requirements ∩ pod requirements ∩ volume requirements ∩ topology requirements,
    /// and the keys that may have narrowed.
    fn merge(
        &self,
        base: &Requirements,
        c: &Check,
    ) -> Result<(Option<Requirements>, Vec<String>), MergeError> {
        let a = c.a;
        let mut views: Vec<&Requirements> = vec![base, &a.reqs];
        if let Some(v) = &a.node_reqs_extra {
            base.intersects(v).map_err(MergeError::Volume)?;
            views.push(v);
        }
        let topology =
            Topology::domain_requirements(c.prepared, &views).map_err(MergeError::Topology)?;
        // Most pods narrow nothing (or re-pick the claim's own zone): skip the clone then.
        let narrowing: Vec<&Requirement> = views[1..]
            .iter()
            .flat_map(|r| r.iter())
            .chain(topology.iter())
            .filter(|r| base.get(r.key()).is_none_or(|b| !r.admits_all_of(b)))
            .collect();
        if narrowing.is_empty() {
            return Ok((None, Vec::new()));
        }
        let mut changed: Vec<String> = narrowing.iter().map(|r| r.key().to_string()).collect();
        changed.sort_unstable();
        changed.dedup();
        let mut merged = base.clone();
        for r in narrowing {
            merged.add(r.clone());
        }
        if let Some(empty) = changed
            .iter()
            .filter_map(|k| merged.get(k))
            .find(|r| r.is_empty() && !base.get(r.key()).is_some_and(|b| b.is_empty()))
        {
            return Err(MergeError::Empty(empty.key().to_string()));
        }
        Ok((Some(merged), changed))
    }

    /// Bitset of the template's instance types whose requirements and offerings admit `merged`
    /// on the `changed` keys; `None` when nothing narrowed.
    fn compatible_set(
        &self,
        ti: usize,
        merged: &Requirements,
        changed: &[String],
    ) -> Option<Rc<Vec<u64>>> {
        if changed.is_empty() {
            return None;
        }
        let mut key: Vec<Requirement> = changed
            .iter()
            .filter_map(|k| merged.get(k).cloned())
            .collect();
        for k in [super::labels::ZONE, CAPACITY_TYPE] {
            if !changed.iter().any(|c| c == k)
                && let Some(r) = merged.get(k)
            {
                key.push(r.clone());
            }
        }
        let key = (ti, key);
        if let Some(bits) = self.type_cache.borrow().get(&key) {
            return Some(Rc::clone(bits));
        }
        let t = &self.s.templates[ti];
        let narrowed: Vec<&Requirement> = changed.iter().filter_map(|k| merged.get(k)).collect();
        let offerings = OfferingFilter::new(merged);
        let mut bits = vec![0u64; t.types.len().div_ceil(64)];
        for (i, e) in t.types.iter().enumerate() {
            let ok = narrowed.iter().all(|r| {
                e.it.requirements
                    .get(r.key())
                    .is_none_or(|tr| r.intersects(tr))
            }) && offerings.any_available(&e.it);
            if ok {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        let bits = Rc::new(bits);
        self.type_cache.borrow_mut().insert(key, Rc::clone(&bits));
        Some(bits)
    }

    fn check_min_values(
        &self,
        t: &Template,
        mut reqs: Requirements,
        types: Vec<u32>,
    ) -> Result<(Requirements, Vec<u32>, bool), String> {
        if !reqs.has_min_values() {
            return Ok((reqs, types, false));
        }
        let shortfalls = min_values_shortfalls(t, &reqs, &types);
        if shortfalls.is_empty() {
            return Ok((reqs, types, false));
        }
        match self.s.options.min_values_policy {
            MinValuesPolicy::Strict => Err(format!(
                "minValues requirement is not met for {}",
                shortfalls
                    .iter()
                    .map(|(k, want, have)| format!(
                        "key {k} (needs {want}, instance types offer {have})"
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            MinValuesPolicy::BestEffort => {
                for (k, _, have) in shortfalls {
                    if let Some(r) = reqs.get_mut(&k) {
                        r.set_min_values(Some(have));
                    }
                }
                Ok((reqs, types, true))
            }
        }
    }

    fn new_claim(&self, ti: usize, pi: usize, c: &Check) -> Result<Claim, String> {
        let (a, topo) = (c.a, c.topo);
        let t = &self.s.templates[ti];
        let pod = &self.pods[pi];
        let remaining = &self.remaining[ti];
        if remaining.get(NODES).is_some_and(|n| *n < 1000) {
            return Err("node limits have been exhausted for nodepool".into());
        }
        a.tolerates_template[ti].clone()?;
        if ports_conflict(&pod.host_ports, &t.daemon_ports) {
            return Err("host port conflicts with a DaemonSet on this nodepool".into());
        }
        let wk = &self.s.options.well_known_labels;
        t.reqs
            .compatible(&a.reqs, Some(wk))
            .map_err(|e| e.to_string())?;
        let host = self.topology.next_host_id();
        self.topology
            .hostname_allows(topo, host)
            .map_err(|r| self.topology.explain(r).to_string())?;
        let mut base = t.reqs.clone();
        base.set(Requirement::in_values(
            HOSTNAME,
            [self.placeholder_name(host)],
        ));
        let (merged, changed) = self.merge(&base, c).map_err(|e| match e {
            MergeError::Topology(r) => self.topology.explain(r).to_string(),
            MergeError::Volume(i) => format!("incompatible volume requirements, {i}"),
            MergeError::Empty(k) => format!("requirement {k} cannot be satisfied"),
        })?;
        let merged = merged.unwrap_or(base);
        let all_within = remaining
            .iter()
            .all(|(k, v)| k == NODES || t.max_capacity.get(k).milli() <= *v);
        let within_limits: Vec<u32> = (0..t.types.len() as u32)
            .filter(|&i| {
                if all_within {
                    return true;
                }
                let cap = &t.types[i as usize].it.capacity;
                remaining
                    .iter()
                    .all(|(k, v)| k == NODES || cap.get(k).milli() <= *v)
            })
            .collect();
        if within_limits.is_empty() {
            return Err("all available instance types exceed limits for nodepool".into());
        }
        let zero = Resources::new();
        let compatible = self.compatible_set(ti, &merged, &changed);
        let types = filter_types(
            t,
            &within_limits,
            &zero,
            &pod.requests,
            compatible.as_deref().map(Vec::as_slice),
        );
        if types.is_empty() {
            return Err(explain_no_type(
                t,
                &within_limits,
                &merged,
                &changed,
                &pod.requests,
            ));
        }
        let (merged, types, relaxed) = self.check_min_values(t, merged, types)?;
        let requests = pod.requests.clone();
        let room = headroom(t, &types, &requests);
        Ok(Claim {
            template: ti,
            domains: self.topology.domain_ids(&merged),
            headroom: room.0,
            floor: room.1,
            reqs: merged,
            host,
            types,
            requests,
            pods: vec![pi],
            min_values_relaxed: relaxed,
            ports: pod.host_ports.clone(),
        })
    }

    fn finish(self, mut results: Results) -> Results {
        let max = self.s.options.max_instance_types;
        // Price order depends only on the template and the zone/capacity-type requirements.
        let mut price_orders = self
            .s
            .price_orders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for claim in self.claims {
            let t = &self.s.templates[claim.template];
            let mut reqs = claim.reqs;
            reqs.remove(HOSTNAME);
            let key = (
                claim.template,
                reqs.get(super::labels::ZONE).cloned(),
                reqs.get(CAPACITY_TYPE).cloned(),
            );
            let order = Arc::clone(price_orders.entry(key).or_insert_with(|| {
                let offerings = OfferingFilter::new(&reqs);
                let mut priced: Vec<(f64, u32)> = (0..t.types.len() as u32)
                    .map(|i| {
                        let price = offerings.cheapest(&t.types[i as usize].it);
                        (price.unwrap_or(f64::MAX), i)
                    })
                    .collect();
                priced.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let capacity_types: BTreeSet<&str> = t
                    .types
                    .iter()
                    .flat_map(|e| e.it.offerings.iter())
                    .filter(|o| offerings.admits(o))
                    .map(|o| o.capacity_type.as_str())
                    .collect();
                Arc::new((
                    priced.into_iter().map(|(_, i)| i).collect(),
                    capacity_types.len(),
                ))
            }));
            let mut member = vec![0u64; t.types.len().div_ceil(64)];
            for &i in &claim.types {
                member[i as usize / 64] |= 1 << (i % 64);
            }
            let types: Vec<u32> = order
                .0
                .iter()
                .copied()
                .filter(|&i| member[i as usize / 64] & (1 << (i % 64)) != 0)
                .take(max)
                .collect();
            let mut relaxed = claim.min_values_relaxed;
            if reqs.has_min_values() {
                let short = min_values_shortfalls(t, &reqs, &types);
                if !short.is_empty() {
                    if self.s.options.min_values_policy == MinValuesPolicy::Strict {
                        for pi in claim.pods {
                            results.unschedulable.push(UnschedulablePod {
                                pod: pi,
                                reason: "pod didn't schedule because NodePool couldn't meet minValues requirements".into(),
                                per_node_pool: vec![(t.pool.name.clone(), "minValues not met after truncating instance types".into())],
                            });
                        }
                        continue;
                    }
                    for (k, _, have) in short {
                        if let Some(r) = reqs.get_mut(&k) {
                            r.set_min_values(Some(have));
                        }
                    }
                    relaxed = true;
                }
            }
            let instance_types: Vec<Arc<InstanceType>> = types
                .iter()
                .map(|&i| Arc::clone(&t.types[i as usize].it))
                .collect();
            let offerings = OfferingFilter::new(&reqs);
            let mut capacity_types: BTreeSet<&str> = BTreeSet::new();
            for it in &instance_types {
                if capacity_types.len() == order.1 {
                    break; // every capacity type the template offers here is already present
                }
                for o in &it.offerings {
                    if offerings.admits(o) {
                        capacity_types.insert(o.capacity_type.as_str());
                    }
                }
            }
            let capacity_types: Vec<String> =
                capacity_types.into_iter().map(str::to_string).collect();
            let ct_min = reqs.get(CAPACITY_TYPE).and_then(Requirement::min_values);
            reqs.set(Requirement::in_values(CAPACITY_TYPE, capacity_types).with_min_values(ct_min));
            let mut overhead: Option<Resources> = None;
            for &i in &types {
                let o = &t.types[i as usize].daemon_overhead;
                match &mut overhead {
                    None => overhead = Some(o.clone()),
                    Some(m) => m.min_with(o),
                }
            }
            let daemon_overhead = overhead.unwrap_or_default();
            results.new_node_claims.push(NewNodeClaim {
                node_pool: t.pool.name.clone(),
                requirements: reqs,
                instance_types,
                requests: claim.requests.plus(&daemon_overhead),
                daemon_overhead,
                pods: claim.pods,
                min_values_relaxed: relaxed,
            });
        }
        let mut node_uses = self.node_uses;
        node_uses.sort_unstable_by_key(|u| u.node);
        for u in node_uses {
            results.existing_nodes.push(ExistingNodeAssignment {
                node_name: self.s.nodes[u.node].name.clone(),
                pods: u.pods,
            });
        }
        results.unschedulable.sort_by_key(|u| u.pod);
        results
    }
}
