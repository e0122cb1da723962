//! One solve: pods in order, each tried on existing nodes, then on the NodeClaims this solve
//! already opened, then on a new NodeClaim (`claim.rs`), relaxing preferences one step at a time
//! when nothing takes it.

use super::*;

mod claim;

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
    Volume(crate::scheduling::requirements::Incompatibility),
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

pub(super) struct Solve<'a> {
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
    pub(super) fn new<S: AsRef<str>>(
        s: &'a Scheduler,
        pods: &'a [Pod],
        excluded: &HashSet<S>,
    ) -> Self {
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
                let by_weight = |v: &[crate::scheduling::model::WeightedPodAffinityTerm]| {
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

    pub(super) fn run(mut self) -> Results {
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
        // Permanent while the setting holds: nothing to relax, no NodePool to ask.
        let claims_devices = self.pods[pi].uses_dynamic_resources;
        if self.s.options.refuses_dynamic_resources(claims_devices) {
            return Err((DRA_NOT_SUPPORTED.to_string(), Vec::new()));
        }
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
                NO_NODEPOOLS.to_string()
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
        if base.settling && pod.moved_by_consolidation {
            return None;
        }
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
                reqs.get(crate::scheduling::labels::ZONE).cloned(),
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
