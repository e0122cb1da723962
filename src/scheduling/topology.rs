//! Topology spread, pod affinity and pod anti-affinity bookkeeping.
//!
//! Constraints are deduplicated into groups; each group counts, per domain of its topology key,
//! the pods matching its selector. Hostname domains are integers (one per existing node or new
//! NodeClaim placeholder) so the common hostname checks are array lookups.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use super::labels::HOSTNAME;
use super::model::{LabelSelector, NamespaceScope, PodAffinityTerm, TopologySpreadConstraint};
use super::requirements::{Requirement, Requirements};
use super::taints::{Taint, Toleration, first_untolerated};

pub(crate) type GroupId = usize;
pub(crate) type HostId = u32;

/// Which nodes a spread constraint counts (`nodeAffinityPolicy` / `nodeTaintsPolicy`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct NodeFilter {
    /// Any alternative must intersect the node's requirements; empty = all nodes.
    pub alternatives: Vec<Requirements>,
    /// When `Some`, node taints must be tolerated.
    pub tolerations: Option<Arc<Vec<Toleration>>>,
}

impl NodeFilter {
    fn matches(&self, node: &Requirements, taints: &[Taint]) -> bool {
        (self.alternatives.is_empty()
            || self
                .alternatives
                .iter()
                .any(|alt| node.intersects(alt).is_ok()))
            && self
                .tolerations
                .as_ref()
                .is_none_or(|tol| first_untolerated(taints, tol, true).is_none())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum GroupKind {
    Spread {
        max_skew: u32,
        min_domains: Option<u32>,
        filter: NodeFilter,
    },
    Affinity,
    AntiAffinity {
        required: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Namespaces {
    All,
    Set(BTreeSet<String>),
}

#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// What makes two constraints the same group (see [`group_identity`]).
    identity: String,
    key: String,
    is_hostname: bool,
    kind: GroupKind,
    namespaces: Namespaces,
    selector: LabelSelector,
    /// Matching pods per hostname domain.
    host_counts: Vec<u32>,
    /// Matching pods per domain (other keys); the map's keys are the domain universe.
    domain_counts: BTreeMap<String, u32>,
    /// Required anti-affinity only: pods owning this term, per domain (the inverse check).
    host_owners: Vec<u32>,
    domain_owners: BTreeMap<String, u32>,
    total: u32,
    /// NodeClaim placeholders with a matching pod / an owner (hostname groups only).
    busy_claim_hosts: u32,
    busy_claim_owner_hosts: u32,
}

/// What running pods contribute to one group: the part of a group's state that depends on
/// the existing nodes only, so it can be computed once and reused by many solves.
#[derive(Debug, Clone, Default)]
pub(crate) struct ExistingCounts {
    host_counts: Vec<u32>,
    domain_counts: BTreeMap<String, u32>,
    host_owners: Vec<u32>,
    domain_owners: BTreeMap<String, u32>,
    total: u32,
}

/// Adds `delta` to the host's entry (growing the vector as needed).
fn adjust(v: &mut Vec<u32>, h: HostId, delta: i32) {
    let i = h as usize;
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] = v[i]
        .checked_add_signed(delta)
        .expect("existing counts never drop below zero");
}

fn adjust_domain(m: &mut BTreeMap<String, u32>, d: &str, delta: i32) {
    let c = match m.get_mut(d) {
        Some(c) => c,
        None => m.entry(d.to_string()).or_insert(0),
    };
    *c = c
        .checked_add_signed(delta)
        .expect("existing counts never drop below zero");
}

/// The key deduplicating constraints into groups.
fn group_identity(
    key: &str,
    kind: &GroupKind,
    namespaces: &Namespaces,
    selector: &LabelSelector,
) -> String {
    format!("{key}|{kind:?}|{namespaces:?}|{selector:?}")
}

/// Why a topology constraint rejected a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologyError {
    Spread { key: String },
    Affinity { key: String },
    AntiAffinity { key: String },
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::Spread { key } => write!(
                f,
                "unsatisfiable topology constraint for topology spread, key={key}"
            ),
            TopologyError::Affinity { key } => write!(
                f,
                "unsatisfiable topology constraint for pod affinity, key={key}"
            ),
            TopologyError::AntiAffinity { key } => write!(
                f,
                "unsatisfiable topology constraint for pod anti-affinity, key={key}"
            ),
        }
    }
}

/// A rejection by one group; turned into a [`TopologyError`] only when reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejected(GroupId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The first admitted domain (spread: lowest count; affinity bootstrap).
    First,
    /// Every admitted domain.
    All,
}

/// One non-hostname constraint evaluated for an attempt: the domains it allows, in preference order.
#[derive(Debug, Clone)]
pub(crate) struct PreparedGroup<'t> {
    group: GroupId,
    key: &'t str,
    pick: Pick,
    domains: Vec<&'t str>,
    /// Cached-key index and the allowed domain ids, when every allowed domain has an id.
    cached: Option<(usize, Vec<u32>)>,
}

/// A pod's view of the topology for one scheduling attempt.
pub(crate) struct PodTopology<'a> {
    /// Groups whose selector matches the pod (sorted).
    pub matching: &'a [GroupId],
    /// Required anti-affinity groups (of any owner) whose selector matches the pod.
    pub inverse: &'a [GroupId],
    /// Groups whose constraint the pod currently carries.
    pub owned: &'a [GroupId],
    /// The pod's strict requirements (for the spread minimum).
    pub strict: &'a Requirements,
    /// Everything every candidate node is intersected with (pod requirements incl. preferences,
    /// volume requirements): domains these exclude can never be chosen.
    pub always: &'a [&'a Requirements],
}

impl PodTopology<'_> {
    fn selects_itself(&self, g: GroupId) -> bool {
        self.matching.binary_search(&g).is_ok()
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Topology {
    groups: Vec<Group>,
    index: HashMap<String, GroupId>,
    /// Hostname domains handed out so far: existing nodes, then NodeClaim placeholders.
    hosts: HostId,
    universe: HashMap<String, BTreeSet<String>>,
    /// Up to `CACHED_KEYS` non-hostname topology keys whose single value nodes cache as an id.
    cached_keys: Vec<String>,
    cached_domains: Vec<Vec<String>>,
    first_claim_host: HostId,
}

/// How many topology keys a NodeClaim caches its single domain for (zone, capacity type, …).
pub(crate) const CACHED_KEYS: usize = 4;
/// "No single cached domain".
pub(crate) const NO_DOMAIN: u32 = u32::MAX;

/// A node's single domain id per cached key, for cheap rejections.
pub(crate) type DomainIds = [u32; CACHED_KEYS];

/// Increments the host's count; true when it was zero.
fn bump(v: &mut Vec<u32>, h: HostId) -> bool {
    let i = h as usize;
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
    v[i] == 1
}

fn at(v: &[u32], h: HostId) -> u32 {
    v.get(h as usize).copied().unwrap_or(0)
}

impl Topology {
    pub fn new(universe: HashMap<String, BTreeSet<String>>) -> Self {
        let mut cached_keys: Vec<String> = universe.keys().cloned().collect();
        cached_keys.sort();
        cached_keys.truncate(CACHED_KEYS);
        let cached_domains = cached_keys
            .iter()
            .map(|k| universe[k].iter().cloned().collect())
            .collect();
        Self {
            universe,
            cached_keys,
            cached_domains,
            ..Default::default()
        }
    }

    fn cached_key_index(&self, key: &str) -> Option<usize> {
        self.cached_keys.iter().position(|k| k == key)
    }

    /// The node's single domain id for each cached key (`NO_DOMAIN` when not a single known value).
    pub fn domain_ids(&self, reqs: &Requirements) -> DomainIds {
        let mut ids = [NO_DOMAIN; CACHED_KEYS];
        for (i, key) in self.cached_keys.iter().enumerate() {
            if let Some(v) = reqs.get(key).and_then(Requirement::single_value) {
                ids[i] = self.cached_domains[i]
                    .binary_search_by(|d| d.as_str().cmp(v))
                    .map(|x| x as u32)
                    .unwrap_or(NO_DOMAIN);
            }
        }
        ids
    }

    /// Cheap pre-check: false when a node's cached single domain is outside what a prepared
    /// constraint allows (the full check would reject it too).
    pub fn may_admit(prepared: &[PreparedGroup], ids: &DomainIds) -> bool {
        prepared.iter().all(|p| match p.cached {
            Some((ki, ref allowed)) => ids[ki] == NO_DOMAIN || allowed.contains(&ids[ki]),
            None => true,
        })
    }

    fn cached_ids(&self, key: &str, domains: &[&str]) -> Option<(usize, Vec<u32>)> {
        let ki = self.cached_key_index(key)?;
        let all = &self.cached_domains[ki];
        let mut ids = Vec::with_capacity(domains.len());
        for d in domains {
            // A domain outside the universe cannot be cached: skip the shortcut.
            ids.push(all.binary_search_by(|x| x.as_str().cmp(d)).ok()? as u32);
        }
        Some((ki, ids))
    }

    /// Hostnames added from now on are NodeClaim placeholders.
    pub fn start_claims(&mut self) {
        self.first_claim_host = self.next_host_id();
    }

    /// True when a hostname constraint rejects every NodeClaim of this solve, so the scan can be skipped.
    pub fn blocks_every_claim(&self, pod: &PodTopology) -> bool {
        let claims = self.next_host_id() - self.first_claim_host;
        claims > 0
            && (pod.owned.iter().any(|&g| {
                let grp = &self.groups[g];
                grp.is_hostname
                    && matches!(grp.kind, GroupKind::AntiAffinity { .. })
                    && grp.busy_claim_hosts == claims
            }) || pod.inverse.iter().any(|&g| {
                let grp = &self.groups[g];
                grp.is_hostname && grp.busy_claim_owner_hosts == claims
            }))
    }

    /// Hands out `count` hostname domains (existing nodes: host id = node index).
    pub fn add_hosts(&mut self, count: usize) {
        self.hosts += HostId::try_from(count).expect("fewer than 2^32 nodes");
    }

    pub fn add_host(&mut self) -> HostId {
        self.hosts += 1;
        self.hosts - 1
    }

    pub fn next_host_id(&self) -> HostId {
        self.hosts
    }

    pub fn explain(&self, r: Rejected) -> TopologyError {
        self.groups[r.0].error()
    }

    pub fn has_groups(&self) -> bool {
        !self.groups.is_empty()
    }

    fn resolve_namespaces(scope: &NamespaceScope, own: &str) -> Namespaces {
        match scope {
            NamespaceScope::All => Namespaces::All,
            NamespaceScope::Listed(list) if list.is_empty() => {
                Namespaces::Set([own.to_string()].into_iter().collect())
            }
            NamespaceScope::Listed(list) => Namespaces::Set(list.iter().cloned().collect()),
        }
    }

    /// The identity of the group a required anti-affinity term of a pod in `pod_namespace`
    /// belongs to (what [`Topology::anti_affinity_group`] would intern).
    pub fn required_anti_affinity_identity(t: &PodAffinityTerm, pod_namespace: &str) -> String {
        group_identity(
            &t.topology_key,
            &GroupKind::AntiAffinity { required: true },
            &Self::resolve_namespaces(&t.namespaces, pod_namespace),
            &t.selector,
        )
    }

    fn intern(
        &mut self,
        key: &str,
        kind: GroupKind,
        namespaces: Namespaces,
        selector: LabelSelector,
    ) -> GroupId {
        let id = group_identity(key, &kind, &namespaces, &selector);
        if let Some(&g) = self.index.get(&id) {
            return g;
        }
        let is_hostname = key == HOSTNAME;
        let domain_counts = if is_hostname {
            BTreeMap::new()
        } else {
            self.universe
                .get(key)
                .map(|u| u.iter().map(|d| (d.clone(), 0)).collect())
                .unwrap_or_default()
        };
        self.groups.push(Group {
            identity: id.clone(),
            key: key.to_string(),
            is_hostname,
            kind,
            namespaces,
            selector,
            host_counts: Vec::new(),
            domain_owners: domain_counts.clone(),
            domain_counts,
            host_owners: Vec::new(),
            total: 0,
            busy_claim_hosts: 0,
            busy_claim_owner_hosts: 0,
        });
        let g = self.groups.len() - 1;
        self.index.insert(id, g);
        g
    }

    pub fn spread_group(
        &mut self,
        c: &TopologySpreadConstraint,
        pod_namespace: &str,
        pod_labels: &BTreeMap<String, String>,
        filter: NodeFilter,
    ) -> GroupId {
        let mut selector = c.selector.clone();
        for k in &c.match_label_keys {
            if let Some(v) = pod_labels.get(k) {
                selector.match_labels.insert(k.clone(), v.clone());
            }
        }
        self.intern(
            &c.topology_key,
            GroupKind::Spread {
                max_skew: c.max_skew,
                min_domains: c.min_domains,
                filter,
            },
            Namespaces::Set([pod_namespace.to_string()].into_iter().collect()),
            selector,
        )
    }

    pub fn affinity_group(&mut self, t: &PodAffinityTerm, pod_namespace: &str) -> GroupId {
        let ns = Self::resolve_namespaces(&t.namespaces, pod_namespace);
        self.intern(&t.topology_key, GroupKind::Affinity, ns, t.selector.clone())
    }

    pub fn anti_affinity_group(
        &mut self,
        t: &PodAffinityTerm,
        pod_namespace: &str,
        required: bool,
    ) -> GroupId {
        let ns = Self::resolve_namespaces(&t.namespaces, pod_namespace);
        self.intern(
            &t.topology_key,
            GroupKind::AntiAffinity { required },
            ns,
            t.selector.clone(),
        )
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    pub fn identity(&self, g: GroupId) -> &str {
        &self.groups[g].identity
    }

    /// Whether the group's selector and namespaces match a pod.
    pub fn group_matches(
        &self,
        g: GroupId,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        let grp = &self.groups[g];
        (match &grp.namespaces {
            Namespaces::All => true,
            Namespaces::Set(s) => s.contains(namespace),
        }) && grp.selector.matches(labels)
    }

    /// Groups whose selector and namespaces match a pod (sorted).
    pub fn matching_groups(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<GroupId> {
        (0..self.groups.len())
            .filter(|&g| self.group_matches(g, namespace, labels))
            .collect()
    }

    /// Required anti-affinity groups among `matching`.
    pub fn inverse_groups(&self, matching: &[GroupId]) -> Vec<GroupId> {
        matching
            .iter()
            .copied()
            .filter(|&g| {
                matches!(
                    self.groups[g].kind,
                    GroupKind::AntiAffinity { required: true }
                )
            })
            .collect()
    }

    /// Adds (`delta` 1) or takes back (`delta` -1) a pod running on an existing node that
    /// matches group `g`.
    #[allow(clippy::too_many_arguments)]
    pub fn count_existing(
        &self,
        g: GroupId,
        counts: &mut ExistingCounts,
        node_labels: &BTreeMap<String, String>,
        node_reqs: &Requirements,
        taints: &[Taint],
        host: HostId,
        delta: i32,
    ) {
        let grp = &self.groups[g];
        if let GroupKind::Spread { filter, .. } = &grp.kind
            && !filter.matches(node_reqs, taints)
        {
            return;
        }
        if grp.is_hostname {
            adjust(&mut counts.host_counts, host, delta);
        } else if let Some(v) = node_labels.get(&grp.key) {
            adjust_domain(&mut counts.domain_counts, v, delta);
        } else {
            return;
        }
        counts.total = counts
            .total
            .checked_add_signed(delta)
            .expect("existing counts never drop below zero");
    }

    /// Adds or takes back an existing pod's required anti-affinity term of group `g`, for the
    /// inverse check.
    pub fn count_existing_owner(
        &self,
        g: GroupId,
        counts: &mut ExistingCounts,
        node_labels: &BTreeMap<String, String>,
        host: HostId,
        delta: i32,
    ) {
        let grp = &self.groups[g];
        if grp.is_hostname {
            adjust(&mut counts.host_owners, host, delta);
        } else if let Some(v) = node_labels.get(&grp.key) {
            adjust_domain(&mut counts.domain_owners, v, delta);
        }
    }

    /// Installs what running pods contribute to group `g` (before any pod is placed). Domains
    /// outside this solve's universe carry no pods and are left out, as counting them one by
    /// one would.
    pub fn set_existing(&mut self, g: GroupId, counts: ExistingCounts) {
        fn merge(into: &mut BTreeMap<String, u32>, from: BTreeMap<String, u32>) {
            into.extend(from.into_iter().filter(|(_, c)| *c > 0));
        }
        let grp = &mut self.groups[g];
        grp.host_counts = counts.host_counts;
        grp.host_owners = counts.host_owners;
        merge(&mut grp.domain_counts, counts.domain_counts);
        merge(&mut grp.domain_owners, counts.domain_owners);
        grp.total = counts.total;
    }

    /// Cheap checks for hostname-keyed constraints on the node with hostname `host`.
    pub fn hostname_allows(&self, pod: &PodTopology, host: HostId) -> Result<(), Rejected> {
        for &g in pod.owned {
            let grp = &self.groups[g];
            if !grp.is_hostname {
                continue;
            }
            let count = at(&grp.host_counts, host);
            let ok = match &grp.kind {
                GroupKind::Spread { max_skew, .. } => {
                    count + u32::from(pod.selects_itself(g)) <= *max_skew
                }
                GroupKind::Affinity => count > 0 || (grp.total == 0 && pod.selects_itself(g)),
                GroupKind::AntiAffinity { .. } => count == 0,
            };
            if !ok {
                return Err(Rejected(g));
            }
        }
        for &g in pod.inverse {
            let grp = &self.groups[g];
            if grp.is_hostname && at(&grp.host_owners, host) > 0 {
                return Err(Rejected(g));
            }
        }
        Ok(())
    }

    /// Evaluates the pod's non-hostname constraints once per attempt: which domains each allows,
    /// independent of the node, so checking a node is a few lookups.
    pub fn prepare<'t>(&'t self, pod: &PodTopology) -> Result<Vec<PreparedGroup<'t>>, Rejected> {
        let mut out = Vec::new();
        for &g in pod.owned {
            let grp = &self.groups[g];
            if grp.is_hostname {
                continue;
            }
            let key = grp.key.as_str();
            let (pick, domains): (Pick, Vec<&'t str>) = match &grp.kind {
                GroupKind::Spread {
                    max_skew,
                    min_domains,
                    ..
                } => {
                    let strict = pod.strict.get(key);
                    let (mut n, mut min) = (0u32, u32::MAX);
                    for (_, c) in grp
                        .domain_counts
                        .iter()
                        .filter(|(d, _)| strict.is_none_or(|r| r.has(d)))
                    {
                        n += 1;
                        min = min.min(*c);
                    }
                    if n == 0 || min_domains.is_some_and(|m| n < m) {
                        min = 0;
                    }
                    let self_count = u32::from(pod.selects_itself(g));
                    let mut valid: Vec<(&'t str, u32)> = grp
                        .domain_counts
                        .iter()
                        .filter(|(_, c)| **c + self_count <= min + *max_skew)
                        .map(|(d, c)| (d.as_str(), *c))
                        .collect();
                    // Lowest count first; ties in name order (stable sort).
                    valid.sort_by_key(|(_, c)| *c);
                    (Pick::First, valid.into_iter().map(|(d, _)| d).collect())
                }
                GroupKind::Affinity => {
                    let strict = pod.strict.get(key);
                    let pods_in_pod_domains = grp
                        .domain_counts
                        .iter()
                        .any(|(d, c)| *c > 0 && strict.is_none_or(|r| r.has(d)));
                    if pod.selects_itself(g) && !pods_in_pod_domains {
                        // Bootstrap: the first pod of a self-affine group picks a domain.
                        (
                            Pick::First,
                            grp.domain_counts.keys().map(String::as_str).collect(),
                        )
                    } else {
                        (
                            Pick::All,
                            grp.domain_counts
                                .iter()
                                .filter(|(_, c)| **c > 0)
                                .map(|(d, _)| d.as_str())
                                .collect(),
                        )
                    }
                }
                GroupKind::AntiAffinity { .. } => (
                    Pick::All,
                    grp.domain_counts
                        .iter()
                        .filter(|(_, c)| **c == 0)
                        .map(|(d, _)| d.as_str())
                        .collect(),
                ),
            };
            let domains: Vec<&'t str> = domains
                .into_iter()
                .filter(|d| {
                    pod.always
                        .iter()
                        .all(|r| r.get(key).is_none_or(|x| x.has(d)))
                })
                .collect();
            if domains.is_empty() {
                return Err(Rejected(g));
            }
            out.push(PreparedGroup {
                group: g,
                key,
                pick,
                cached: self.cached_ids(key, &domains),
                domains,
            });
        }
        for &g in pod.inverse {
            let grp = &self.groups[g];
            if grp.is_hostname || grp.domain_owners.values().all(|c| *c == 0) {
                continue;
            }
            let domains: Vec<&'t str> = grp
                .domain_counts
                .keys()
                .filter(|d| grp.domain_owners.get(*d).copied().unwrap_or(0) == 0)
                .map(String::as_str)
                .collect();
            if domains.is_empty() {
                return Err(Rejected(g));
            }
            out.push(PreparedGroup {
                group: g,
                key: grp.key.as_str(),
                pick: Pick::All,
                cached: self.cached_ids(&grp.key, &domains),
                domains,
            });
        }
        Ok(out)
    }

    /// Requirements the prepared constraints add for a node whose requirements are the
    /// intersection of all of `node` (node, pod and volume requirements, not materialised).
    pub fn domain_requirements(
        prepared: &[PreparedGroup],
        node: &[&Requirements],
    ) -> Result<Vec<Requirement>, Rejected> {
        let mut out: Vec<Requirement> = Vec::new();
        for p in prepared {
            let mut limits: [Option<&Requirement>; 4] = [None; 4];
            for (slot, n) in limits.iter_mut().zip(node.iter()) {
                *slot = n.get(p.key);
            }
            let earlier = out.iter().filter(|r| r.key() == p.key);
            let admitted = |d: &str| {
                limits.iter().flatten().all(|r| r.has(d)) && earlier.clone().all(|r| r.has(d))
            };
            let chosen: Vec<String> = match p.pick {
                Pick::First => p
                    .domains
                    .iter()
                    .find(|d| admitted(d))
                    .map(|d| vec![d.to_string()])
                    .unwrap_or_default(),
                Pick::All => p
                    .domains
                    .iter()
                    .filter(|d| admitted(d))
                    .map(|d| d.to_string())
                    .collect(),
            };
            if chosen.is_empty() {
                return Err(Rejected(p.group));
            }
            out.push(Requirement::in_values(p.key, chosen));
        }
        Ok(out)
    }

    /// Records a pod placed on a node whose final requirements are `node`.
    pub fn record(
        &mut self,
        matching: &[GroupId],
        owned_required_anti: &[GroupId],
        node: &Requirements,
        taints: &[Taint],
        host: HostId,
    ) {
        let first_claim_host = self.first_claim_host;
        for &g in matching {
            let universe = self.universe.get(&self.groups[g].key);
            let grp = &mut self.groups[g];
            let recorded = match &grp.kind {
                GroupKind::Spread { filter, .. } if !filter.matches(node, taints) => false,
                GroupKind::Spread { .. } | GroupKind::Affinity => {
                    if grp.is_hostname {
                        bump(&mut grp.host_counts, host);
                        true
                    } else if let Some(d) = node.get(&grp.key).and_then(Requirement::single_value) {
                        *grp.domain_counts.entry(d.to_string()).or_insert(0) += 1;
                        true
                    } else {
                        false
                    }
                }
                GroupKind::AntiAffinity { .. } => {
                    if grp.is_hostname {
                        if bump(&mut grp.host_counts, host) && host >= first_claim_host {
                            grp.busy_claim_hosts += 1;
                        }
                    } else {
                        for d in possible_domains(node.get(&grp.key), universe) {
                            *grp.domain_counts.entry(d).or_insert(0) += 1;
                        }
                    }
                    true
                }
            };
            if recorded {
                grp.total += 1;
            }
        }
        for &g in owned_required_anti {
            let universe = self.universe.get(&self.groups[g].key);
            let grp = &mut self.groups[g];
            if grp.is_hostname {
                if bump(&mut grp.host_owners, host) && host >= first_claim_host {
                    grp.busy_claim_owner_hosts += 1;
                }
            } else {
                for d in possible_domains(node.get(&grp.key), universe) {
                    *grp.domain_owners.entry(d).or_insert(0) += 1;
                }
            }
        }
    }
}

/// Domains a node may still end up in: the finite values of its requirement, or the universe.
fn possible_domains(req: Option<&Requirement>, universe: Option<&BTreeSet<String>>) -> Vec<String> {
    match req {
        Some(r) if !r.is_complement() => r.values().to_vec(),
        _ => universe
            .map(|u| {
                u.iter()
                    .filter(|d| req.is_none_or(|r| r.has(d)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default(),
    }
}

impl Group {
    fn error(&self) -> TopologyError {
        let key = self.key.clone();
        match self.kind {
            GroupKind::Spread { .. } => TopologyError::Spread { key },
            GroupKind::Affinity => TopologyError::Affinity { key },
            GroupKind::AntiAffinity { .. } => TopologyError::AntiAffinity { key },
        }
    }
}
