//! The engine's plain domain types. Kubernetes objects are converted into these at the edge
//! (see `convert`), so the solver never touches `k8s_openapi` types.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::labels::{CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, NODE_POOL, ZONE};
use super::quantity::{MEMORY, Quantity, Resources};
use super::requirements::{Operator, Requirement, Requirements};
use super::taints::{Taint, Toleration};

/// `In`, `NotIn`, `Exists`, `DoesNotExist` over pod labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SelectorExpression {
    pub key: String,
    pub operator: SelectorOperator,
    pub values: Vec<String>,
}

/// A label selector; the empty selector matches every pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<SelectorExpression>,
}

impl LabelSelector {
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self {
            match_labels: labels
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            match_expressions: Vec::new(),
        }
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator {
                    SelectorOperator::In => value.is_some_and(|v| e.values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !e.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// Which namespaces an affinity term looks at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NamespaceScope {
    /// The listed namespaces; empty means the pod's own namespace.
    Listed(Vec<String>),
    /// An empty `namespaceSelector`: every namespace.
    All,
}

impl Default for NamespaceScope {
    fn default() -> Self {
        NamespaceScope::Listed(Vec::new())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodAffinityTerm {
    pub selector: LabelSelector,
    pub topology_key: String,
    pub namespaces: NamespaceScope,
}

impl PodAffinityTerm {
    pub fn new(selector: LabelSelector, topology_key: &str) -> Self {
        Self {
            selector,
            topology_key: topology_key.to_string(),
            namespaces: NamespaceScope::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightedPodAffinityTerm {
    pub weight: i32,
    pub term: PodAffinityTerm,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightedRequirements {
    pub weight: i32,
    pub requirements: Requirements,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenUnsatisfiable {
    #[default]
    DoNotSchedule,
    ScheduleAnyway,
}

/// `nodeAffinityPolicy` / `nodeTaintsPolicy` of a spread constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InclusionPolicy {
    Honor,
    Ignore,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopologySpreadConstraint {
    pub max_skew: u32,
    pub topology_key: String,
    pub when_unsatisfiable: WhenUnsatisfiable,
    pub selector: LabelSelector,
    pub min_domains: Option<u32>,
    /// Default `Honor`.
    pub node_affinity_policy: InclusionPolicy,
    /// Default `Ignore`.
    pub node_taints_policy: InclusionPolicy,
    /// Label keys whose values (taken from the pod) are appended to the selector.
    pub match_label_keys: Vec<String>,
}

impl TopologySpreadConstraint {
    pub fn new(topology_key: &str, max_skew: u32, selector: LabelSelector) -> Self {
        Self {
            max_skew,
            topology_key: topology_key.to_string(),
            when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            selector,
            min_domains: None,
            node_affinity_policy: InclusionPolicy::Honor,
            node_taints_policy: InclusionPolicy::Ignore,
            match_label_keys: Vec::new(),
        }
    }
}

/// A `hostPort` a pod binds on its node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Empty means every address (`0.0.0.0`).
    pub ip: String,
    pub port: i32,
    /// `TCP` (default), `UDP` or `SCTP`.
    pub protocol: String,
}

impl HostPort {
    pub fn tcp(port: i32) -> Self {
        Self {
            ip: String::new(),
            port,
            protocol: "TCP".into(),
        }
    }

    fn is_wildcard(&self) -> bool {
        matches!(self.ip.as_str(), "" | "0.0.0.0" | "::")
    }

    /// Same protocol and port, and the same address or either one a wildcard.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.is_wildcard() || other.is_wildcard())
    }
}

/// Whether any of `wanted` conflicts with any of `used`.
pub fn ports_conflict(wanted: &[HostPort], used: &[HostPort]) -> bool {
    wanted.iter().any(|w| used.iter().any(|u| w.conflicts(u)))
}

/// A pod's labels, one copy shared by its readings as a pod to place and as a bound pod (at
/// 10 000 pods a copy each was ~7 MB); edit through `Arc::make_mut`.
pub type PodLabels = Arc<BTreeMap<String, String>>;

/// A node's labels, one copy shared by every reading of the node in a pass (disruption's view,
/// its folded copies, each simulation's scheduler): at 1 000 nodes a copy each was ~2 MB.
pub type NodeLabels = Arc<BTreeMap<String, String>>;

/// A pod's tolerations, shared like its labels: most pods carry the same two (the admission
/// defaults for `not-ready` and `unreachable`).
pub type PodTolerations = Arc<Vec<Toleration>>;

/// A pod to place: who it is, and its [`PodShape`], which it reads as its own fields
/// (`pod.requests`); a write (`pod.requests = …`) gives it a shape of its own first.
#[derive(Debug, Clone, Default)]
pub struct Pod {
    pub uid: String,
    pub name: String,
    /// Creation time (any monotonic unit, e.g. Unix seconds); orders pods with equal requests.
    pub created_at: i64,
    /// Running now on a node a consolidation would remove: it does not land on a
    /// [`ExistingNode::settling`] node.
    pub moved_by_consolidation: bool,
    pub shape: Arc<PodShape>,
}

/// What a pod asks of a node and of its neighbours: all of it but its name, UID and age. The
/// pods of one workload have equal shapes and the held ones share one copy (`convert`): inline
/// it is ~400 B, most of it empty lists, and each simulation of a disruption copies every pod
/// it moves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PodShape {
    pub namespace: String,
    pub labels: PodLabels,
    /// Effective requests (init containers, sidecars, overhead included) plus `pods: 1`.
    pub requests: Resources,
    /// nodeSelector as `In` requirements.
    pub node_selector: Requirements,
    /// Required node-affinity terms (ORed).
    pub required_node_affinity: Vec<Requirements>,
    pub preferred_node_affinity: Vec<WeightedRequirements>,
    pub tolerations: PodTolerations,
    pub pod_affinity: Vec<PodAffinityTerm>,
    pub preferred_pod_affinity: Vec<WeightedPodAffinityTerm>,
    pub pod_anti_affinity: Vec<PodAffinityTerm>,
    pub preferred_pod_anti_affinity: Vec<WeightedPodAffinityTerm>,
    pub topology_spread: Vec<TopologySpreadConstraint>,
    pub host_ports: Vec<HostPort>,
    /// Node constraints from the pod's volumes (a bound PV's zone…); they narrow the node only,
    /// never the pod's own requirements used for spread counting.
    pub volume_requirements: Option<Requirements>,
    /// Claims Dynamic Resource Allocation devices (see [`SchedulerOptions::ignore_dra_requests`]).
    ///
    /// [`SchedulerOptions::ignore_dra_requests`]: super::SchedulerOptions::ignore_dra_requests
    pub uses_dynamic_resources: bool,
}

impl std::ops::Deref for Pod {
    type Target = PodShape;
    fn deref(&self) -> &PodShape {
        &self.shape
    }
}

impl std::ops::DerefMut for Pod {
    /// Copy on write: a pod edited (a test's, a volume's zone added) never changes the pods
    /// it shared its shape with.
    fn deref_mut(&mut self) -> &mut PodShape {
        Arc::make_mut(&mut self.shape)
    }
}

impl Pod {
    /// Upstream skips pods that require `karpenter.sh/nodepool DoesNotExist`: they refuse Karpenter nodes.
    pub fn refuses_karpenter_nodes(&self) -> bool {
        let refuses = |r: &Requirements| {
            r.get(NODE_POOL)
                .is_some_and(|req| req.operator() == Operator::DoesNotExist)
        };
        refuses(&self.node_selector) || self.required_node_affinity.iter().any(refuses)
    }
}

/// A pod already bound to an existing node: counted for topology and resources. The pods of
/// one workload read alike, and the held ones share one copy (`convert`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BoundPod {
    pub namespace: String,
    pub labels: PodLabels,
    pub requests: Resources,
    /// Required anti-affinity terms: they keep matching pods away from this node's domains.
    pub required_anti_affinity: Vec<PodAffinityTerm>,
    /// Name of the owning DaemonSet, if any.
    pub daemonset: Option<String>,
    pub host_ports: Vec<HostPort>,
}

impl BoundPod {
    /// `pod` as it counts once bound: what it requests, its labels for others' topology, the
    /// anti-affinity it imposes, its host ports.
    pub fn of(pod: &Pod, daemonset: Option<String>) -> BoundPod {
        BoundPod {
            namespace: pod.namespace.clone(),
            labels: pod.labels.clone(),
            requests: pod.requests.clone(),
            required_anti_affinity: pod.pod_anti_affinity.clone(),
            daemonset,
            host_ports: pod.host_ports.clone(),
        }
    }
}

/// A Node, or an in-flight NodeClaim that has a providerID but no Node yet.
#[derive(Debug, Clone, Default)]
pub struct ExistingNode {
    pub name: String,
    /// `kubernetes.io/hostname` (falls back to the name).
    pub hostname: String,
    pub labels: NodeLabels,
    /// Taints that block scheduling (for uninitialized managed nodes, startup and known
    /// ephemeral taints should already be left out by the caller).
    pub taints: Vec<Taint>,
    pub allocatable: Resources,
    /// Shared with the cluster state's reading of each pod (`convert::converted`).
    pub pods: Vec<Arc<BoundPod>>,
    pub node_pool: Option<String>,
    pub initialized: bool,
    /// A pod came or went within its NodePool's `consolidateAfter`: consolidation does not move
    /// running pods onto it, as upstream (pending pods and pods of deleting nodes still may).
    /// During a scale-down this keeps consolidation from refilling nodes that are emptying.
    pub settling: bool,
}

impl ExistingNode {
    /// The node's labels as requirements, its hostname from [`ExistingNode::hostname`].
    pub fn requirements(&self) -> Requirements {
        let labels = self
            .labels
            .iter()
            .filter(|(key, _)| key.as_str() != HOSTNAME);
        Requirements::from_requirements(
            labels
                .map(|(key, value)| Requirement::in_values(key, [value.clone()]))
                .chain([Requirement::in_values(HOSTNAME, [self.hostname.clone()])]),
        )
    }
}

/// One NodePool as the scheduler needs it; trivially filled from the CRD.
#[derive(Debug, Clone, Default)]
pub struct NodePoolTemplate {
    pub name: String,
    pub weight: i32,
    /// Template requirements, including `minValues`.
    pub requirements: Requirements,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Ignored for fit: they are removed once the node is initialized.
    pub startup_taints: Vec<Taint>,
    /// `spec.limits`; the `nodes` key caps the node count. Absent keys are unlimited.
    pub limits: BTreeMap<String, Quantity>,
    /// Current usage (capacity of existing nodes, plus `nodes`), subtracted from the limits.
    pub usage: Resources,
    pub node_class_ref: String,
}

/// A DaemonSet's pod template, reduced to what decides where it lands and what it costs.
#[derive(Debug, Clone, Default)]
pub struct DaemonSetPod {
    pub name: String,
    pub requests: Resources,
    pub tolerations: Vec<Toleration>,
    pub node_selector: Requirements,
    pub required_node_affinity: Vec<Requirements>,
    pub host_ports: Vec<HostPort>,
    /// Claims Dynamic Resource Allocation devices (see [`SchedulerOptions::ignore_dra_requests`]).
    ///
    /// [`SchedulerOptions::ignore_dra_requests`]: super::SchedulerOptions::ignore_dra_requests
    pub uses_dynamic_resources: bool,
}

/// Where and at what price an instance type can be launched.
#[derive(Debug, Clone, PartialEq)]
pub struct Offering {
    pub zone: String,
    pub capacity_type: String,
    pub price: f64,
    pub available: bool,
}

impl Offering {
    pub fn compatible(&self, reqs: &Requirements) -> bool {
        reqs.get(ZONE).is_none_or(|r| r.has(&self.zone))
            && reqs
                .get(CAPACITY_TYPE)
                .is_none_or(|r| r.has(&self.capacity_type))
    }
}

#[derive(Debug, Clone)]
pub struct InstanceType {
    pub name: String,
    /// Must define the instance-type, arch, os, zone and capacity-type keys (and provider labels).
    pub requirements: Requirements,
    pub offerings: Vec<Offering>,
    pub capacity: Resources,
    /// kube-reserved + system-reserved + eviction threshold.
    pub overhead: Resources,
    /// A NodeOverlay set or adjusted an offering's price (NodeClaims record it).
    pub price_overlaid: bool,
    /// A NodeOverlay added capacity (NodeClaims record it).
    pub capacity_overlaid: bool,
}

impl InstanceType {
    /// Capacity minus overhead; `hugepages-*` capacity is also taken out of memory.
    pub fn allocatable(&self) -> Resources {
        let mut a = self.capacity.saturating_minus(&self.overhead);
        let hugepages: i128 = self
            .capacity
            .iter()
            .filter(|(k, _)| k.starts_with("hugepages-"))
            .map(|(_, v)| v.milli())
            .sum();
        if hugepages > 0 {
            let mem = (a.memory().milli() - hugepages).max(0);
            a.set(MEMORY, Quantity::from_milli(mem));
        }
        a
    }

    /// Cheapest available offering compatible with the requirements.
    pub fn cheapest_price(&self, reqs: &Requirements) -> Option<f64> {
        self.offerings
            .iter()
            .filter(|o| o.available && o.compatible(reqs))
            .map(|o| o.price)
            .min_by(f64::total_cmp)
    }

    pub fn has_available_offering(&self, reqs: &Requirements) -> bool {
        self.offerings
            .iter()
            .any(|o| o.available && o.compatible(reqs))
    }

    /// The standard requirement set for a type: its name, zones and capacity types of available
    /// offerings, plus the given extra requirements.
    pub fn standard_requirements(
        name: &str,
        offerings: &[Offering],
        extra: impl IntoIterator<Item = Requirement>,
    ) -> Requirements {
        let available = || offerings.iter().filter(|o| o.available);
        let mut r = Requirements::from_requirements(extra);
        r.set(Requirement::in_values(INSTANCE_TYPE, [name]));
        r.set(Requirement::in_values(
            ZONE,
            available().map(|o| o.zone.clone()),
        ));
        r.set(Requirement::in_values(
            CAPACITY_TYPE,
            available().map(|o| o.capacity_type.clone()),
        ));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocatable_subtracts_overhead_and_hugepages() {
        let it = InstanceType {
            name: "t".into(),
            requirements: Requirements::new(),
            offerings: vec![],
            capacity: Resources::from_literals(&[
                ("cpu", "4"),
                ("memory", "8Gi"),
                ("hugepages-2Mi", "1Gi"),
            ]),
            overhead: Resources::from_literals(&[("cpu", "100m"), ("memory", "1Gi")]),
            price_overlaid: false,
            capacity_overlaid: false,
        };
        let a = it.allocatable();
        assert_eq!(a.cpu(), Quantity::parse("3900m").unwrap());
        assert_eq!(a.memory(), Quantity::parse("6Gi").unwrap());
    }

    #[test]
    fn host_ports_conflict_on_protocol_port_and_address() {
        let any = HostPort::tcp(80);
        let specific = HostPort {
            ip: "10.0.0.1".into(),
            ..HostPort::tcp(80)
        };
        let other_ip = HostPort {
            ip: "10.0.0.2".into(),
            ..HostPort::tcp(80)
        };
        let udp = HostPort {
            protocol: "UDP".into(),
            ..HostPort::tcp(80)
        };
        assert!(any.conflicts(&specific));
        assert!(!specific.conflicts(&other_ip));
        assert!(!any.conflicts(&udp));
        assert!(!any.conflicts(&HostPort::tcp(81)));
        assert!(ports_conflict(&[HostPort::tcp(81), any], &[specific]));
    }

    #[test]
    fn a_node_requires_its_labels_and_its_hostname() {
        let node = |labels: &[(&str, &str)]| ExistingNode {
            name: "n1".into(),
            hostname: "host-1".into(),
            labels: Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        // The hostname field wins over a label that says otherwise, and stands in for a missing one.
        for labels in [vec![(ZONE, "a"), (HOSTNAME, "stale")], vec![(ZONE, "a")]] {
            let reqs = node(&labels).requirements();
            assert_eq!(reqs.len(), 2, "{labels:?}");
            assert_eq!(reqs.get(HOSTNAME).unwrap().values(), ["host-1"]);
            assert_eq!(reqs.get(ZONE).unwrap().values(), ["a"]);
        }
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())]
            .into_iter()
            .collect();
        assert!(LabelSelector::default().matches(&labels));
        assert!(LabelSelector::from_labels([("app", "web")]).matches(&labels));
        let sel = LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![SelectorExpression {
                key: "tier".into(),
                operator: SelectorOperator::DoesNotExist,
                values: vec![],
            }],
        };
        assert!(sel.matches(&labels));
    }
}
