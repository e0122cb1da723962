//! What the node, pod and cluster-state gauges should read, computed from the cluster index.
//! Pure: the caller copies what it needs out of the index ([`StateInput`], cheap `Arc` clones,
//! so the read lock is not held while requests are summed), passes the clock, and publishes.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::apis::labels::{NODEPOOL_LABEL, WELL_KNOWN_LABELS};
use crate::operator::metrics::{Labels, NodeGauge, NodeSeries, SharedLabels};
use crate::scheduling::Resources;
use crate::scheduling::convert::{pod_limits, pod_requests};
use crate::state::HeldPod as Pod;
use crate::state::pods::{is_daemonset_pod, is_terminal};
use crate::state::{ClusterIndex, nodeclaim_provider_id};

/// One gauge value.
pub type Sample = (Labels, f64);

/// How the pod gauges are labelled (`POD_METRICS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSeries {
    /// Bounded by nodes, not pods: `karpenter_pods_state` counts the pods of each node, phase
    /// and readiness; each `karpenter_pods_*_time_seconds` gauge is one series, the oldest
    /// waiting pod's. Sums over upstream's series read the same.
    #[default]
    Aggregated,
    /// As upstream: one series per pod, labelled with its name and namespace (and owner).
    PerPod,
}

/// A label pair, left out when its value is empty: Prometheus reads an empty label as an
/// absent one, and the per-node label sets carry many (a node without GPUs has four).
fn push_label(labels: &mut Labels, name: &str, value: String) {
    if !value.is_empty() {
        labels.push((name.to_string(), value));
    }
}
/// One value of a per-node gauge.
pub type NodeSample = (NodeSeries, f64);

/// Everything the state gauges should show at one instant.
#[derive(Debug, Default, PartialEq)]
pub struct StateSnapshot {
    /// Samples per [`NodeGauge`], indexed by [`NodeGauge::index`].
    pub nodes: [Vec<NodeSample>; NodeGauge::ALL.len()],
    pub utilization: Vec<Sample>,
    /// `karpenter_pods_state`: per pod (value 1) or per distinct label set (value: the count).
    pub pods: Vec<Sample>,
    /// Nodes and launched NodeClaims, merged by provider ID (upstream's state nodes).
    pub node_count: usize,
    pub synced: bool,
}

/// `topology.kubernetes.io/zone` → `zone`, `karpenter.sh/capacity-type` → `capacity_type`.
fn metric_label_name(key: &str) -> String {
    key.rsplit('/')
        .next()
        .unwrap_or(key)
        .replace(['-', '.'], "_")
}

/// Well-known node label keys with their metric label names; the first key to claim a name
/// wins, so deprecated aliases (`exoscale.com/instance-family`) do not clash with current ones.
fn well_known_metric_labels() -> Vec<(&'static str, String)> {
    let mut seen = BTreeSet::new();
    WELL_KNOWN_LABELS
        .iter()
        .filter_map(|key| {
            let name = metric_label_name(key);
            seen.insert(name.clone()).then_some((*key, name))
        })
        .collect()
}

fn is_managed(node: &Node) -> bool {
    node.labels().contains_key(NODEPOOL_LABEL)
}

fn node_labels(node: &Node, well_known: &[(&'static str, String)]) -> Labels {
    let phase = node
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let mut labels = Labels::new();
    push_label(&mut labels, "node_name", node.name_any());
    push_label(&mut labels, "phase", phase);
    push_label(&mut labels, "managed", is_managed(node).to_string());
    for (key, name) in well_known {
        let value = node.labels().get(*key).cloned().unwrap_or_default();
        push_label(&mut labels, name, value);
    }
    labels
}

fn with_resource(labels: &Arc<Labels>, resource: &str, shared: &mut SharedLabels) -> NodeSeries {
    NodeSeries {
        node: labels.clone(),
        resource: Some(shared.values.intern(resource)),
    }
}

fn to_f64(q: crate::scheduling::Quantity) -> f64 {
    q.milli() as f64 / 1000.0
}

fn parse_list(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Resources {
    let mut out = Resources::new();
    for (name, q) in list.into_iter().flatten() {
        // A node reporting an unparsable quantity is the kubelet's problem; skip the entry.
        if let Ok(q) = crate::scheduling::Quantity::parse(&q.0) {
            out.set(name, q);
        }
    }
    out
}

fn is_pending(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        None | Some("Pending")
    )
}

fn condition_true(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == kind && c.status == "True")
}

/// Requests and limits of the non-terminal pods on a node, all and DaemonSet-only.
#[derive(Default)]
struct PodTotals {
    requests: Resources,
    limits: Resources,
    daemon_requests: Resources,
    daemon_limits: Resources,
}

fn pod_totals(pods: &[Arc<Pod>]) -> PodTotals {
    let mut totals = PodTotals::default();
    let mut one_pod = Resources::new();
    one_pod.set(
        crate::scheduling::quantity::PODS,
        crate::scheduling::Quantity::from_units(1),
    );
    for pod in pods.iter().filter(|p| !is_terminal(p)) {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        // A malformed quantity would have been rejected by the API server; skip defensively.
        let requests = pod_requests(&name, spec).unwrap_or_default();
        let mut limits = pod_limits(&name, spec).unwrap_or_default();
        // Upstream's LimitsForPods counts the pods as its requests do: every node's limits
        // have a `pods` series, also when no pod sets a limit.
        limits += &one_pod;
        if is_daemonset_pod(pod) {
            totals.daemon_requests += &requests;
            totals.daemon_limits += &limits;
        }
        totals.requests += &requests;
        totals.limits += &limits;
    }
    totals
}

fn samples(
    labels: &Arc<Labels>,
    resources: &Resources,
    shared: &mut SharedLabels,
) -> Vec<NodeSample> {
    resources
        .iter()
        .map(|(name, q)| (with_resource(labels, name, shared), to_f64(q)))
        .collect()
}

fn pod_state_labels(pod: &Pod, node: Option<&Node>, series: PodSeries) -> Labels {
    let mut labels = Labels::new();
    if series == PodSeries::PerPod {
        let owner = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .or_else(|| pod.owner_references().first())
            .map(|o| format!("{}/{}", o.kind, o.name))
            .unwrap_or_default();
        push_label(&mut labels, "name", pod.name_any());
        push_label(
            &mut labels,
            "namespace",
            pod.namespace().unwrap_or_default(),
        );
        push_label(&mut labels, "owner", owner);
    }
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let node_label = |key: &str| {
        node.and_then(|n| n.labels().get(key).cloned())
            .unwrap_or_default()
    };
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    use crate::apis::labels::{ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL};
    for (name, value) in [
        ("scheduled", (!node_name.is_empty()).to_string()),
        ("node", node_name),
        ("nodepool", node_label(NODEPOOL_LABEL)),
        ("zone", node_label(ZONE_LABEL)),
        ("arch", node_label(ARCH_LABEL)),
        ("capacity_type", node_label(CAPACITY_TYPE_LABEL)),
        ("instance_type", node_label(INSTANCE_TYPE_LABEL)),
        ("phase", phase),
        ("ready", condition_true(pod, "Ready").to_string()),
        ("managed", node.is_some_and(is_managed).to_string()),
    ] {
        push_label(&mut labels, name, value);
    }
    labels
}

/// What the snapshot reads from the cluster index.
pub struct StateInput {
    pub nodes: Vec<Arc<Node>>,
    pub pods: Vec<Arc<Pod>>,
    pub nodeclaims: Vec<Arc<crate::apis::NodeClaim>>,
    pub nodepools: Vec<Arc<crate::apis::NodePool>>,
    /// Provider IDs of NodeClaims that have one.
    pub claim_provider_ids: Vec<String>,
    pub synced: bool,
}

impl StateInput {
    pub fn from_index(index: &ClusterIndex) -> Self {
        let nodeclaims = index.nodeclaims();
        StateInput {
            nodes: index.nodes(),
            pods: index.pods(),
            nodepools: index.nodepools(),
            claim_provider_ids: nodeclaims
                .iter()
                .filter_map(|c| nodeclaim_provider_id(c).map(str::to_string))
                .collect(),
            synced: index.synced(),
            nodeclaims,
        }
    }
}

/// The gauges' values for `input` at `now`. Label values and each node's label set come from
/// `shared`, so refreshes reuse them.
pub fn snapshot(
    input: &StateInput,
    now: Timestamp,
    series: PodSeries,
    shared: &mut SharedLabels,
) -> StateSnapshot {
    let well_known = well_known_metric_labels();
    let mut out = StateSnapshot {
        synced: input.synced,
        ..StateSnapshot::default()
    };
    let mut pods_by_node: BTreeMap<&str, Vec<Arc<Pod>>> = BTreeMap::new();
    for pod in &input.pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            pods_by_node.entry(node).or_default().push(pod.clone());
        }
    }
    let mut cluster_requests = Resources::new();
    let mut cluster_allocatable = Resources::new();
    let nodes = &input.nodes;
    for node in nodes {
        let labels = shared.sets.intern(node_labels(node, &well_known));
        let status = node.status.as_ref();
        let allocatable = parse_list(status.and_then(|s| s.allocatable.as_ref()));
        let capacity = parse_list(status.and_then(|s| s.capacity.as_ref()));
        let on_node = pods_by_node.get(node.name_any().as_str());
        let totals = pod_totals(on_node.map(Vec::as_slice).unwrap_or_default());
        let overhead = capacity.saturating_minus(&allocatable);
        for (gauge, resources) in [
            (NodeGauge::Allocatable, &allocatable),
            (NodeGauge::TotalPodRequests, &totals.requests),
            (NodeGauge::TotalPodLimits, &totals.limits),
            (NodeGauge::TotalDaemonRequests, &totals.daemon_requests),
            (NodeGauge::TotalDaemonLimits, &totals.daemon_limits),
            (NodeGauge::SystemOverhead, &overhead),
        ] {
            out.nodes[gauge.index()].extend(samples(&labels, resources, shared));
        }
        if let Some(created) = node.metadata.creation_timestamp.as_ref() {
            let age = now.duration_since(created.0).as_secs_f64().max(0.0);
            out.nodes[NodeGauge::CurrentLifetime.index()].push((
                NodeSeries {
                    node: labels.clone(),
                    resource: None,
                },
                age,
            ));
        }
        cluster_requests += &totals.requests;
        cluster_allocatable += &allocatable;
    }
    for (resource, allocatable) in cluster_allocatable.iter() {
        if allocatable.is_zero() {
            continue;
        }
        let used = to_f64(cluster_requests.get(resource));
        out.utilization.push((
            vec![("resource_type".to_string(), resource.to_string())],
            used / to_f64(allocatable) * 100.0,
        ));
    }
    let by_name: BTreeMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), &**n)).collect();
    // Counted per label set as they are built, so the aggregated form never holds a label
    // set per pod.
    let mut pods: BTreeMap<Labels, f64> = BTreeMap::new();
    for pod in &input.pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| by_name.get(n).copied());
        *pods.entry(pod_state_labels(pod, node, series)).or_default() += 1.0;
    }
    out.pods = pods.into_iter().collect();
    let node_provider_ids: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|n| crate::state::node_provider_id(n))
        .collect();
    let unmatched_claims = input
        .claim_provider_ids
        .iter()
        .filter(|pid| !node_provider_ids.contains(pid.as_str()))
        .count();
    out.node_count = nodes.len() + unmatched_claims;
    out
}

/// Pods seen before they were bound / Ready, so the bound and startup durations are observed
/// once per pod and only for transitions this process saw happen (a restart does not replay
/// the age of every pod in the cluster).
#[derive(Debug, Default)]
pub struct PodTransitions {
    unbound: BTreeSet<String>,
    unready: BTreeSet<String>,
}

/// Durations to observe, in seconds.
#[derive(Debug, Default, PartialEq)]
pub struct Observed {
    pub bound: Vec<f64>,
    pub started: Vec<f64>,
}

/// From provisioning placing a pod to its binding / readiness
/// (`karpenter_pods_provisioning_bound_duration_seconds` / `_startup_duration_seconds`), once per
/// pod: provisioning saw every such pod unbound, so no transition needs to be seen here.
pub fn provisioning_durations(
    pods: &[Arc<Pod>],
    timeline: &crate::state::pod_times::PodTimeline,
) -> (Vec<f64>, Vec<f64>) {
    let mut bound = Vec::new();
    let mut started = Vec::new();
    for pod in pods {
        let key = pod_key(pod);
        if let Some(at) = condition_time(pod, "PodScheduled")
            && pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
            && let Some(placed) = timeline.report(&key, true)
            && let Some(s) = seconds_since(placed, at)
        {
            bound.push(s);
        }
        if let Some(at) = condition_time(pod, "Ready")
            && let Some(placed) = timeline.report(&key, false)
            && let Some(s) = seconds_since(placed, at)
        {
            started.push(s);
        }
    }
    (bound, started)
}

fn condition_time(pod: &Pod, kind: &str) -> Option<Timestamp> {
    Some(
        pod.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == kind && c.status == "True")?
            .last_transition_time
            .as_ref()?
            .0,
    )
}

/// `namespace/name`, the key of [`crate::state::pod_times::PodTimeline`].
pub fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn seconds_since(unix: i64, at: Timestamp) -> Option<f64> {
    let from = Timestamp::from_second(unix).ok()?;
    Some(at.duration_since(from).as_secs_f64().max(0.0))
}

/// Gauges of pods still on their way (upstream's `karpenter_pods_*_time_seconds`): per pod,
/// labelled `name`, `namespace`, or aggregated, one unlabelled series (the oldest pod's); a
/// pod leaves a gauge once it is bound / running.
#[derive(Debug, Default, PartialEq)]
pub struct WaitingPods {
    pub unbound: Vec<Sample>,
    pub unstarted: Vec<Sample>,
    pub provisioning_unbound: Vec<Sample>,
    pub provisioning_unstarted: Vec<Sample>,
    pub scheduling_undecided: Vec<Sample>,
}

/// The waiting-pod gauges at `now`; `times` gives provisioning's instants for a pod key.
pub fn waiting_pods(
    pods: &[Arc<Pod>],
    times: &dyn Fn(&str) -> Option<crate::state::pod_times::PodTimes>,
    now: Timestamp,
    series: PodSeries,
) -> WaitingPods {
    let mut out = WaitingPods::default();
    for pod in pods {
        if is_terminal(pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(created) = pod.metadata.creation_timestamp.as_ref().map(|t| t.0) else {
            continue;
        };
        let labels: Labels = match series {
            PodSeries::PerPod => vec![
                ("name".to_string(), pod.name_any()),
                ("namespace".to_string(), pod.namespace().unwrap_or_default()),
            ],
            PodSeries::Aggregated => Labels::new(),
        };
        let age = now.duration_since(created).as_secs_f64().max(0.0);
        let key = pod_key(pod);
        let t = times(&key).unwrap_or_default();
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        let started = !is_pending(pod) || condition_true(pod, "Ready");
        if !bound {
            out.unbound.push((labels.clone(), age));
            if let Some(s) = t.schedulable.and_then(|u| seconds_since(u, now)) {
                out.provisioning_unbound.push((labels.clone(), s));
            }
            if t.decided.is_none()
                && let Some(s) = t.acked.and_then(|u| seconds_since(u, now))
            {
                out.scheduling_undecided.push((labels.clone(), s));
            }
        }
        if !started {
            out.unstarted.push((labels.clone(), age));
            if let Some(s) = t.schedulable.and_then(|u| seconds_since(u, now)) {
                out.provisioning_unstarted.push((labels, s));
            }
        }
        if series == PodSeries::Aggregated {
            out.keep_oldest();
        }
    }
    out
}

impl WaitingPods {
    /// Keeps the largest value of each gauge (aggregated series have no labels to tell pods
    /// apart, and the oldest waiting pod is what an alert wants).
    fn keep_oldest(&mut self) {
        for samples in [
            &mut self.unbound,
            &mut self.unstarted,
            &mut self.provisioning_unbound,
            &mut self.provisioning_unstarted,
            &mut self.scheduling_undecided,
        ] {
            if samples.len() > 1 {
                let oldest = samples
                    .drain(..)
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .expect("more than one sample");
                samples.push(oldest);
            }
        }
    }
}

fn transition_seconds(pod: &Pod, kind: &str) -> Option<f64> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let at = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")?
        .last_transition_time
        .as_ref()?
        .0;
    Some(at.duration_since(created).as_secs_f64().max(0.0))
}

impl PodTransitions {
    pub fn observe(&mut self, pods: &[Arc<Pod>]) -> Observed {
        let mut observed = Observed::default();
        // Borrowed: at 10 000 pods an owned copy of every uid was ~1 MB each pass.
        let mut present: HashSet<&str> = HashSet::with_capacity(pods.len());
        for pod in pods {
            let Some(uid) = pod.metadata.uid.as_deref() else {
                continue;
            };
            present.insert(uid);
            let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
            if !bound {
                if !self.unbound.contains(uid) {
                    self.unbound.insert(uid.to_string());
                }
            } else if self.unbound.remove(uid)
                && let Some(s) = transition_seconds(pod, "PodScheduled")
            {
                observed.bound.push(s);
            }
            if !condition_true(pod, "Ready") {
                // Only a pod still starting: a running pod failing its readiness probe and
                // recovering has not started again.
                if is_pending(pod) && !self.unready.contains(uid) {
                    self.unready.insert(uid.to_string());
                }
            } else if self.unready.remove(uid)
                && let Some(s) = transition_seconds(pod, "Ready")
            {
                observed.started.push(s);
            }
        }
        self.unbound.retain(|uid| present.contains(uid.as_str()));
        self.unready.retain(|uid| present.contains(uid.as_str()));
        observed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::held_pod::{
        Container, PodCondition, PodSpec, PodStatus, ResourceRequirements,
    };
    use crate::state::testing::*;

    fn value(samples: &[NodeSample], node: &str, resource: &str) -> Option<f64> {
        samples
            .iter()
            .find(|(labels, _)| {
                labels.contains(&("node_name".into(), node.into()))
                    && labels.contains(&("resource_type".into(), resource.into()))
            })
            .map(|(_, v)| *v)
    }

    fn with_container(mut pod: Pod, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
        pod.spec.get_or_insert_with(PodSpec::default).containers = vec![Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(resources(requests).into()),
                limits: Some(resources(limits).into()),
                claims: None,
            }),
            ..Default::default()
        }]
        .into();
        pod
    }

    fn daemon(pod: Pod) -> Pod {
        crate::state::testing::owned_by_daemonset(pod)
    }

    fn managed_node(name: &str) -> Node {
        let mut n = with_node_capacity(
            node(name, Some("exoscale://1"), &[]),
            &[("cpu", "4"), ("memory", "8Gi")],
        );
        let status = n.status.get_or_insert_with(Default::default);
        status.allocatable = Some(resources(&[("cpu", "3500m"), ("memory", "7Gi")]));
        n.metadata.labels = Some(
            [
                (NODEPOOL_LABEL.to_string(), "default".to_string()),
                ("topology.kubernetes.io/zone".into(), "ch-gva-2".into()),
                ("exoscale.com/instance-family".into(), "legacy".into()),
                (
                    "karpenter.exoscale.com/instance-family".into(),
                    "standard".into(),
                ),
            ]
            .into(),
        );
        n.metadata.creation_timestamp = Some(ts(1_000));
        n
    }

    #[test]
    fn node_gauges_sum_pods_and_daemons_and_derive_overhead() {
        let mut index = ClusterIndex::default();
        index.apply_node(managed_node("n1"));
        index.apply_pod(with_container(
            pod("default", "web", Some("n1")),
            &[("cpu", "500m"), ("memory", "1Gi")],
            &[("cpu", "1")],
        ));
        index.apply_pod(daemon(with_container(
            pod("kube-system", "agent", Some("n1")),
            &[("cpu", "100m")],
            &[("cpu", "200m")],
        )));
        let mut done = with_container(pod("default", "job", Some("n1")), &[("cpu", "2")], &[]);
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        index.apply_pod(done);

        let s = snapshot(
            &StateInput::from_index(&index),
            ts(1_060).0,
            PodSeries::PerPod,
            &mut SharedLabels::default(),
        );
        let gauge = |g: NodeGauge| &s.nodes[g.index()];
        assert_eq!(value(gauge(NodeGauge::Allocatable), "n1", "cpu"), Some(3.5));
        assert_eq!(
            value(gauge(NodeGauge::TotalPodRequests), "n1", "cpu"),
            Some(0.6)
        );
        assert_eq!(
            value(gauge(NodeGauge::TotalPodRequests), "n1", "pods"),
            Some(2.0)
        );
        assert_eq!(
            value(gauge(NodeGauge::TotalPodLimits), "n1", "cpu"),
            Some(1.2)
        );
        assert_eq!(
            value(gauge(NodeGauge::TotalPodLimits), "n1", "pods"),
            Some(2.0),
            "limits count the pods as upstream's LimitsForPods does"
        );
        assert_eq!(
            value(gauge(NodeGauge::TotalDaemonRequests), "n1", "cpu"),
            Some(0.1)
        );
        assert_eq!(
            value(gauge(NodeGauge::TotalDaemonLimits), "n1", "cpu"),
            Some(0.2)
        );
        assert_eq!(
            value(gauge(NodeGauge::SystemOverhead), "n1", "cpu"),
            Some(0.5)
        );
        assert_eq!(
            value(gauge(NodeGauge::SystemOverhead), "n1", "memory"),
            Some(1024.0 * 1024.0 * 1024.0)
        );
        let (labels, age) = &gauge(NodeGauge::CurrentLifetime)[0];
        assert_eq!(*age, 60.0);
        assert!(labels.contains(&("nodepool".into(), "default".into())));
        assert!(labels.contains(&("zone".into(), "ch-gva-2".into())));
        assert!(labels.contains(&("managed".into(), "true".into())));
        // The current key wins over its deprecated alias.
        assert!(labels.contains(&("instance_family".into(), "standard".into())));
        assert_eq!(
            labels
                .iter()
                .filter(|(k, _)| *k == "instance_family")
                .count(),
            1
        );

        let cpu = s
            .utilization
            .iter()
            .find(|(l, _)| l[0].1 == "cpu")
            .map(|(_, v)| *v)
            .unwrap();
        assert!((cpu - 0.6 / 3.5 * 100.0).abs() < 1e-9, "{cpu}");
    }

    #[test]
    fn pod_state_carries_node_labels_and_readiness() {
        let mut index = ClusterIndex::default();
        index.apply_node(managed_node("n1"));
        let mut ready = pod("default", "web", Some("n1"));
        ready.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        index.apply_pod(ready);
        index.apply_pod(pod("default", "pending", None));
        let s = snapshot(
            &StateInput::from_index(&index),
            ts(2_000).0,
            PodSeries::PerPod,
            &mut SharedLabels::default(),
        );
        let find = |name: &str| {
            s.pods
                .iter()
                .find(|(l, _)| l.contains(&("name".into(), name.into())))
                .unwrap()
                .0
                .clone()
        };
        let web = find("web");
        for pair in [
            ("node", "n1"),
            ("scheduled", "true"),
            ("nodepool", "default"),
            ("zone", "ch-gva-2"),
            ("phase", "Running"),
            ("ready", "true"),
            ("managed", "true"),
        ] {
            assert!(
                web.contains(&(pair.0.into(), pair.1.into())),
                "{pair:?} in {web:?}"
            );
        }
        let pending = find("pending");
        assert!(pending.contains(&("scheduled".into(), "false".into())));
        assert!(pending.contains(&("managed".into(), "false".into())));
        assert!(
            !pending.iter().any(|(k, _)| k == "node" || k == "zone"),
            "empty labels are left out: {pending:?}"
        );
    }

    #[test]
    fn aggregated_pod_state_counts_pods_per_node_phase_and_readiness() {
        let mut index = ClusterIndex::default();
        index.apply_node(managed_node("n1"));
        let running = |name: &str| {
            let mut p = pod("default", name, Some("n1"));
            p.status = Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            });
            p
        };
        for name in ["a", "b", "c"] {
            index.apply_pod(running(name));
        }
        index.apply_pod(pod("other", "pending-1", None));
        index.apply_pod(pod("other", "pending-2", None));
        let input = StateInput::from_index(&index);
        let aggregated = snapshot(
            &input,
            ts(2_000).0,
            PodSeries::Aggregated,
            &mut SharedLabels::default(),
        )
        .pods;
        let count = |pairs: &[(&str, &str)]| {
            aggregated
                .iter()
                .filter(|(l, _)| {
                    pairs
                        .iter()
                        .all(|(k, v)| l.contains(&(k.to_string(), v.to_string())))
                })
                .map(|(_, v)| *v)
                .sum::<f64>()
        };
        assert_eq!(
            aggregated.len(),
            2,
            "one series per node and state: {aggregated:?}"
        );
        assert_eq!(count(&[("node", "n1"), ("phase", "Running")]), 3.0);
        assert_eq!(count(&[("scheduled", "false")]), 2.0);
        assert!(
            aggregated.iter().all(|(l, _)| !l
                .iter()
                .any(|(k, _)| k == "name" || k == "namespace" || k == "owner")),
            "{aggregated:?}"
        );
        // The same totals as upstream's one series per pod.
        let per_pod = snapshot(
            &input,
            ts(2_000).0,
            PodSeries::PerPod,
            &mut SharedLabels::default(),
        )
        .pods;
        assert_eq!(per_pod.len(), 5);
        assert_eq!(per_pod.iter().map(|(_, v)| v).sum::<f64>(), 5.0);
    }

    #[test]
    fn aggregated_waiting_gauges_report_the_oldest_pod() {
        const BASE: i64 = 1_700_000_000; // `ts` counts from here
        let pods = [
            Arc::new(created(pod("default", "old", None), "u1", 100)),
            Arc::new(created(pod("default", "new", None), "u2", 150)),
        ];
        let now = Timestamp::from_second(BASE + 160).unwrap();
        let gauges = waiting_pods(&pods, &|_| None, now, PodSeries::Aggregated);
        assert_eq!(gauges.unbound, vec![(Labels::new(), 60.0)]);
        assert_eq!(gauges.unstarted, vec![(Labels::new(), 60.0)]);
        assert!(gauges.provisioning_unbound.is_empty(), "never placed");
        let per_pod = waiting_pods(&pods, &|_| None, now, PodSeries::PerPod);
        assert_eq!(per_pod.unbound.len(), 2);
    }

    #[test]
    fn node_count_merges_nodes_and_claims_by_provider_id() {
        let mut index = ClusterIndex::default();
        index.apply_node(node("n1", Some("exoscale://1"), &[]));
        index.apply_node(node("unmanaged", None, &[]));
        index.apply_nodeclaim(nodeclaim("c1", "p", Some("exoscale://1")));
        index.apply_nodeclaim(nodeclaim("c2", "p", Some("exoscale://2")));
        index.apply_nodeclaim(nodeclaim("launching", "p", None));
        let s = snapshot(
            &StateInput::from_index(&index),
            Timestamp::UNIX_EPOCH,
            PodSeries::PerPod,
            &mut SharedLabels::default(),
        );
        assert_eq!(s.node_count, 3, "n1 (= c1), unmanaged, c2");
        assert!(!s.synced, "nothing was listed");
    }

    fn with_condition(mut pod: Pod, kind: &str, at: i64) -> Pod {
        let status = pod.status.get_or_insert_with(Default::default);
        status
            .conditions
            .get_or_insert_with(Vec::new)
            .push(PodCondition {
                type_: kind.into(),
                status: "True".into(),
                last_transition_time: Some(ts(at)),
                ..Default::default()
            });
        pod
    }

    fn created(mut pod: Pod, uid: &str, at: i64) -> Pod {
        pod.metadata.uid = Some(uid.into());
        pod.metadata.creation_timestamp = Some(ts(at));
        pod
    }

    #[test]
    fn bound_and_startup_durations_are_observed_once_for_transitions_seen() {
        use std::sync::Arc;
        let mut transitions = PodTransitions::default();
        let pending = created(pod("default", "p", None), "u1", 100);
        let old = with_condition(
            with_condition(
                created(pod("default", "old", Some("n1")), "u2", 0),
                "PodScheduled",
                1,
            ),
            "Ready",
            5,
        );
        let first = transitions.observe(&[Arc::new(pending.clone()), Arc::new(old.clone())]);
        assert_eq!(
            first,
            Observed::default(),
            "pods already running are not replayed"
        );

        let bound = with_condition(
            {
                let mut p = pending.clone();
                p.spec.get_or_insert_with(Default::default).node_name = Some("n1".into());
                p
            },
            "PodScheduled",
            103,
        );
        let second = transitions.observe(&[Arc::new(bound.clone()), Arc::new(old.clone())]);
        assert_eq!(second.bound, vec![3.0]);
        assert!(second.started.is_empty());

        let ready = with_condition(bound, "Ready", 110);
        let third = transitions.observe(&[Arc::new(ready.clone())]);
        assert_eq!(third.started, vec![10.0]);
        assert!(third.bound.is_empty());
        assert_eq!(
            transitions.observe(&[Arc::new(ready.clone())]),
            Observed::default()
        );

        // A running pod whose readiness probe fails and recovers has not started again.
        let mut flapping = ready.clone();
        let status = flapping.status.get_or_insert_with(Default::default);
        status.phase = Some("Running".into());
        status.conditions = Some(vec![]);
        assert_eq!(
            transitions.observe(&[Arc::new(flapping)]),
            Observed::default()
        );
        let mut recovered = with_condition(ready, "Ready", 5_000);
        recovered.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(
            transitions.observe(&[Arc::new(recovered)]),
            Observed::default(),
            "no second startup duration for a readiness flap"
        );
    }

    #[test]
    fn provisioning_durations_and_waiting_gauges_count_from_provisionings_instants() {
        use crate::state::pod_times::PodTimes;
        use std::sync::Arc;
        const BASE: i64 = 1_700_000_000; // `ts` counts from here
        let at = |s: i64| Timestamp::from_second(BASE + s).unwrap();
        let waiting = created(pod("default", "w", None), "u1", 100);
        let undecided = created(pod("default", "u", None), "u2", 100);
        let times = |key: &str| match key {
            "default/w" => Some(PodTimes {
                acked: Some(BASE + 101),
                decided: Some(BASE + 102),
                schedulable: Some(BASE + 102),
                ..PodTimes::default()
            }),
            "default/u" => Some(PodTimes {
                acked: Some(BASE + 101),
                ..PodTimes::default()
            }),
            _ => None,
        };
        let pods = [Arc::new(waiting.clone()), Arc::new(undecided)];
        let gauges = waiting_pods(&pods, &times, at(110), PodSeries::PerPod);
        let one = |samples: &[Sample], name: &str| {
            samples
                .iter()
                .find(|(l, _)| l.contains(&("name".to_string(), name.to_string())))
                .map(|(_, v)| *v)
        };
        assert_eq!(one(&gauges.unbound, "w"), Some(10.0));
        assert_eq!(one(&gauges.unstarted, "w"), Some(10.0));
        assert_eq!(one(&gauges.provisioning_unbound, "w"), Some(8.0));
        assert_eq!(one(&gauges.provisioning_unstarted, "w"), Some(8.0));
        assert_eq!(one(&gauges.scheduling_undecided, "w"), None, "decided");
        assert_eq!(one(&gauges.scheduling_undecided, "u"), Some(9.0));
        assert_eq!(one(&gauges.provisioning_unbound, "u"), None, "never placed");

        // Bound at 105, Ready at 120: 3 s and 18 s after provisioning placed it at 102.
        let timeline = crate::state::pod_times::PodTimeline::default();
        timeline.ack(["default/w"], BASE + 101);
        timeline.decide("default/w", true, BASE + 102);
        let bound = with_condition(
            {
                let mut p = waiting;
                p.spec.get_or_insert_with(Default::default).node_name = Some("n1".into());
                p
            },
            "PodScheduled",
            105,
        );
        let ready = with_condition(bound, "Ready", 120);
        let pods = [Arc::new(ready.clone())];
        assert_eq!(
            provisioning_durations(&pods, &timeline),
            (vec![3.0], vec![18.0])
        );
        assert_eq!(
            provisioning_durations(&pods, &timeline),
            (vec![], vec![]),
            "once"
        );
        let gauges = waiting_pods(&[Arc::new(ready)], &times, at(130), PodSeries::PerPod);
        assert_eq!(
            gauges,
            WaitingPods::default(),
            "a running pod waits for nothing"
        );
    }

    #[test]
    fn metric_label_names_are_snake_cased_suffixes() {
        assert_eq!(
            metric_label_name("karpenter.sh/capacity-type"),
            "capacity_type"
        );
        assert_eq!(metric_label_name("topology.kubernetes.io/zone"), "zone");
        assert_eq!(
            metric_label_name("node.kubernetes.io/windows-build"),
            "windows_build"
        );
    }
}
