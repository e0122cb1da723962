//! Prometheus metrics with upstream Karpenter's `karpenter_*` names (dashboards keep working)
//! plus `karpenter_exoscale_api_*` for the Exoscale API client.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label pairs in a fixed order.
pub type Labels = Vec<(String, String)>;
type CounterFamily = Family<Labels, Counter>;
type GaugeFamily = Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>;
/// The per-node gauges: one shared label set per node.
pub type NodeGaugeFamily = Family<NodeSeries, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// Labels of one node's series: the node's label set (node name, phase, ~18 well-known node
/// labels), shared by all of its ~30 series, then the series' own `resource_type`. Copied into
/// every series, as a plain label list, that was ~170 KB of memory a node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeSeries {
    pub node: Arc<Labels>,
    /// The `resource_type` label's value, for the gauges that have one.
    pub resource: Option<Arc<str>>,
}

/// The label name of [`NodeSeries::resource`].
const RESOURCE_TYPE: &str = "resource_type";

impl NodeSeries {
    pub fn contains(&self, (name, value): &(String, String)) -> bool {
        self.iter().any(|(n, v)| n == name && v == value)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let resource = self.resource.as_deref().map(|r| (RESOURCE_TYPE, r));
        self.node
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain(resource)
    }
}

impl prometheus_client::encoding::EncodeLabelSet for NodeSeries {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.node.as_slice().encode(encoder)?;
        let resource = self.resource.as_deref().map(|r| (RESOURCE_TYPE, r));
        resource.as_slice().encode(encoder)
    }
}

pub use crate::interner::Interner;

/// The interners a metrics publisher keeps from one refresh to the next.
#[derive(Debug, Default)]
pub struct SharedLabels {
    /// Label values: condition types, statuses, reasons, resource names.
    pub values: Interner<str>,
    /// Per-object label sets (a node's, a NodeClaim's).
    pub sets: Interner<Labels>,
}

impl SharedLabels {
    /// Forgets what no series holds any more; call between refreshes.
    pub fn prune(&mut self) {
        self.values.prune();
        self.sets.prune();
    }
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;
/// An unlabelled gauge with a fractional value.
pub type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// controller-runtime style buckets, 5 ms to 10 min.
const DURATION_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 300.0, 600.0,
];

pub fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The summary prometheus-client cannot register ([`super::summary`]).
const STARTUP_DURATION: &str = "karpenter_pods_startup_duration_seconds";
const STARTUP_DURATION_HELP: &str = "Time from pod creation until the pod is Ready.";

/// Scheduling simulations: 1 ms to a minute.
fn scheduling_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
    ])
}

/// Builds a label list from `(key, value)` pairs.
pub fn labels<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The per-node resource gauges (upstream `karpenter_nodes_*`), one family each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeGauge {
    Allocatable,
    TotalPodRequests,
    TotalPodLimits,
    TotalDaemonRequests,
    TotalDaemonLimits,
    SystemOverhead,
    CurrentLifetime,
}

impl NodeGauge {
    pub const ALL: [NodeGauge; 7] = [
        NodeGauge::Allocatable,
        NodeGauge::TotalPodRequests,
        NodeGauge::TotalPodLimits,
        NodeGauge::TotalDaemonRequests,
        NodeGauge::TotalDaemonLimits,
        NodeGauge::SystemOverhead,
        NodeGauge::CurrentLifetime,
    ];

    pub fn metric_name(self) -> &'static str {
        match self {
            NodeGauge::Allocatable => "karpenter_nodes_allocatable",
            NodeGauge::TotalPodRequests => "karpenter_nodes_total_pod_requests",
            NodeGauge::TotalPodLimits => "karpenter_nodes_total_pod_limits",
            NodeGauge::TotalDaemonRequests => "karpenter_nodes_total_daemon_requests",
            NodeGauge::TotalDaemonLimits => "karpenter_nodes_total_daemon_limits",
            NodeGauge::SystemOverhead => "karpenter_nodes_system_overhead",
            NodeGauge::CurrentLifetime => "karpenter_nodes_current_lifetime_seconds",
        }
    }

    fn help(self) -> &'static str {
        match self {
            NodeGauge::Allocatable => "Node allocatable, by resource type.",
            NodeGauge::TotalPodRequests => {
                "Requests of the pods bound to a node (DaemonSet pods included)."
            }
            NodeGauge::TotalPodLimits => {
                "Limits of the pods bound to a node (DaemonSet pods included)."
            }
            NodeGauge::TotalDaemonRequests => "Requests of the DaemonSet pods bound to a node.",
            NodeGauge::TotalDaemonLimits => "Limits of the DaemonSet pods bound to a node.",
            NodeGauge::SystemOverhead => {
                "Node capacity minus allocatable (kubelet and system reservations, eviction thresholds)."
            }
            NodeGauge::CurrentLifetime => "Seconds since the node was created.",
        }
    }

    /// Where this gauge lives in [`Metrics::node_gauges`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A registry that also keeps the names it exposes (an empty family writes nothing on
/// `/metrics`, so the text cannot list them).
#[derive(Default)]
struct Recorder {
    registry: Registry,
    names: Vec<String>,
}

impl Recorder {
    fn register(
        &mut self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        use prometheus_client::metrics::MetricType;
        // prometheus-client appends `_total` to counters.
        self.names.push(match metric.metric_type() {
            MetricType::Counter => format!("{name}_total"),
            _ => name.to_string(),
        });
        self.registry
            .register(name, help.trim_end_matches('.'), metric);
    }
}

/// All metrics this process exports.
pub struct Metrics {
    registry: Mutex<Recorder>,
    pub nodeclaims_created: CounterFamily,
    pub nodeclaims_terminated: CounterFamily,
    pub nodeclaims_disrupted: CounterFamily,
    pub nodeclaims_unhealthy_disrupted: CounterFamily,
    pub nodeclaims_termination_duration: HistogramFamily,
    pub nodeclaims_instance_termination_duration: HistogramFamily,
    pub nodes_created: CounterFamily,
    pub nodes_terminated: CounterFamily,
    pub nodes_drained: CounterFamily,
    pub nodes_termination_duration: HistogramFamily,
    pub nodes_lifetime_duration: HistogramFamily,
    pub pods_eviction_requests: CounterFamily,
    pub pods_drained: CounterFamily,
    pub pods_disruption_initiated: CounterFamily,
    pub nodepools_usage: GaugeFamily,
    pub nodepools_limit: GaugeFamily,
    pub nodepools_cost: GaugeFamily,
    pub nodepools_cost_errors: CounterFamily,
    pub cluster_state_synced: FloatGauge,
    pub cluster_state_node_count: FloatGauge,
    pub cluster_state_unsynced_time: FloatGauge,
    pub cluster_utilization_percent: GaugeFamily,
    /// Per-node resource gauges, in [`NodeGauge`] order.
    pub node_gauges: [NodeGaugeFamily; NodeGauge::ALL.len()],
    pub pods_state: GaugeFamily,
    /// A summary, as upstream's (see [`super::summary`]); encoded after the registry.
    pub pods_startup_duration: super::summary::Summary,
    pub pods_bound_duration: Histogram,
    pub pods_provisioning_startup_duration: Histogram,
    pub pods_provisioning_bound_duration: Histogram,
    /// Per-pod waiting gauges, in [`crate::controllers::metrics::WAITING_GAUGES`] order.
    pub pods_waiting: [GaugeFamily; 5],
    /// One scheduling simulation, by `controller` (provisioner: a round; disruption: one set
    /// of candidates).
    pub scheduling_duration: HistogramFamily,
    pub cloudprovider_duration: HistogramFamily,
    pub cloudprovider_errors: CounterFamily,
    pub reconcile_errors: CounterFamily,
    pub periodic_duration: HistogramFamily,
    pub exoscale_api_requests: CounterFamily,
    pub exoscale_api_duration: HistogramFamily,
    pub exoscale_api_errors: CounterFamily,
    pub exoscale_api_rate_limit_wait: Histogram,
    pub kube_client_rate_limit_wait: Histogram,
    pub build_info: GaugeFamily,
    pub leader: GaugeFamily,
    pub unowned_instances: GaugeFamily,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Recorder::default();
        let counter = |registry: &mut Recorder, name: &str, help: &str| {
            let family = CounterFamily::default();
            registry.register(name, help, family.clone());
            family
        };
        let gauge = |registry: &mut Recorder, name: &str, help: &str| {
            let family = GaugeFamily::default();
            registry.register(name, help, family.clone());
            family
        };
        let plain_gauge = |registry: &mut Recorder, name: &str, help: &str| {
            let gauge = FloatGauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let plain_histogram = |registry: &mut Recorder, name: &str, help: &str| {
            let histogram = duration_histogram();
            registry.register(name, help, histogram.clone());
            histogram
        };
        let histogram = |registry: &mut Recorder, name: &str, help: &str| {
            let family: HistogramFamily =
                Family::new_with_constructor(duration_histogram as fn() -> Histogram);
            registry.register(name, help, family.clone());
            family
        };
        let r = &mut registry;
        let metrics = Metrics {
            nodeclaims_created: counter(
                r,
                "karpenter_nodeclaims_created",
                "NodeClaims created, by reason and nodepool.",
            ),
            nodeclaims_terminated: counter(
                r,
                "karpenter_nodeclaims_terminated",
                "NodeClaims terminated, by nodepool, capacity type and zone.",
            ),
            nodeclaims_disrupted: counter(
                r,
                "karpenter_nodeclaims_disrupted",
                "NodeClaims disrupted, by reason.",
            ),
            nodeclaims_unhealthy_disrupted: counter(
                r,
                "karpenter_nodeclaims_unhealthy_disrupted",
                "NodeClaims deleted by node repair, by condition.",
            ),
            nodeclaims_termination_duration: histogram(
                r,
                "karpenter_nodeclaims_termination_duration_seconds",
                "Time from NodeClaim deletion to finalizer removal.",
            ),
            nodeclaims_instance_termination_duration: histogram(
                r,
                "karpenter_nodeclaims_instance_termination_duration_seconds",
                "Time from the first cloud delete to the instance being gone.",
            ),
            nodes_created: counter(
                r,
                "karpenter_nodes_created",
                "Nodes registered, by nodepool and zone.",
            ),
            nodes_terminated: counter(
                r,
                "karpenter_nodes_terminated",
                "Nodes terminated, by nodepool and zone.",
            ),
            nodes_drained: counter(r, "karpenter_nodes_drained", "Nodes drained, by nodepool."),
            nodes_termination_duration: histogram(
                r,
                "karpenter_nodes_termination_duration_seconds",
                "Time from Node deletion to finalizer removal.",
            ),
            nodes_lifetime_duration: histogram(
                r,
                "karpenter_nodes_lifetime_duration_seconds",
                "Node lifetime from creation to termination.",
            ),
            pods_eviction_requests: counter(
                r,
                "karpenter_pods_eviction_requests",
                "Eviction requests, by HTTP code.",
            ),
            pods_drained: counter(
                r,
                "karpenter_pods_drained",
                "Pods drained, by disruption reason.",
            ),
            pods_disruption_initiated: counter(
                r,
                "karpenter_pods_disruption_initiated",
                "Pods whose disruption was initiated.",
            ),
            nodepools_usage: gauge(
                r,
                "karpenter_nodepools_usage",
                "Resources provisioned by a NodePool.",
            ),
            nodepools_limit: gauge(
                r,
                "karpenter_nodepools_limit",
                "Resource limits of a NodePool.",
            ),
            nodepools_cost: gauge(
                r,
                "karpenter_nodepools_cost_total",
                "Hourly price of a NodePool's launched NodeClaims at the provider's current offerings (NodeOverlays included); not a bill.",
            ),
            nodepools_cost_errors: counter(
                r,
                "karpenter_nodepools_cost_tracker_errors",
                "NodeClaims whose price could not be found (instance type or offering unknown), by nodepool.",
            ),
            cluster_state_synced: plain_gauge(
                r,
                "karpenter_cluster_state_synced",
                "1 when the cluster state cache is synced.",
            ),
            cluster_state_node_count: plain_gauge(
                r,
                "karpenter_cluster_state_node_count",
                "Nodes known to the cluster state.",
            ),
            cluster_state_unsynced_time: plain_gauge(
                r,
                "karpenter_cluster_state_unsynced_time_seconds",
                "How long the cluster state cache has been unsynced (0 when synced).",
            ),
            cluster_utilization_percent: gauge(
                r,
                "karpenter_cluster_utilization_percent",
                "Pod requests as a percentage of allocatable, over all nodes, by resource type.",
            ),
            node_gauges: NodeGauge::ALL.map(|g| {
                let family = NodeGaugeFamily::default();
                r.register(g.metric_name(), g.help(), family.clone());
                family
            }),
            pods_state: gauge(
                r,
                "karpenter_pods_state",
                "Pods by node, NodePool, zone, phase and readiness (the count), or 1 per pod with its name, namespace and owner with POD_METRICS=per-pod.",
            ),
            pods_startup_duration: {
                r.names.push(STARTUP_DURATION.to_string());
                super::summary::Summary::default()
            },
            pods_bound_duration: plain_histogram(
                r,
                "karpenter_pods_bound_duration_seconds",
                "Time from pod creation until the pod is bound to a node.",
            ),
            pods_provisioning_startup_duration: plain_histogram(
                r,
                "karpenter_pods_provisioning_startup_duration_seconds",
                "Time from provisioning first placing the pod until it is Ready (from this process's memory, not the creation time).",
            ),
            pods_provisioning_bound_duration: plain_histogram(
                r,
                "karpenter_pods_provisioning_bound_duration_seconds",
                "Time from provisioning first placing the pod until it is bound (from this process's memory, not the creation time).",
            ),
            pods_waiting: [
                gauge(
                    r,
                    "karpenter_pods_unbound_time_seconds",
                    "Time since creation of a pod not yet bound: the oldest such pod's, or by name and namespace with POD_METRICS=per-pod.",
                ),
                gauge(
                    r,
                    "karpenter_pods_unstarted_time_seconds",
                    "Time since creation of a pod not yet running: the oldest such pod's, or by name and namespace with POD_METRICS=per-pod.",
                ),
                gauge(
                    r,
                    "karpenter_pods_provisioning_unbound_time_seconds",
                    "Time since provisioning first placed a pod not yet bound: the oldest such pod's, or by name and namespace with POD_METRICS=per-pod.",
                ),
                gauge(
                    r,
                    "karpenter_pods_provisioning_unstarted_time_seconds",
                    "Time since provisioning first placed a pod not yet running: the oldest such pod's, or by name and namespace with POD_METRICS=per-pod.",
                ),
                gauge(
                    r,
                    "karpenter_pods_provisioning_scheduling_undecided_time_seconds",
                    "Time since provisioning first saw a pod it has not decided about yet: the oldest such pod's, or by name and namespace with POD_METRICS=per-pod.",
                ),
            ],
            scheduling_duration: {
                let family: HistogramFamily =
                    Family::new_with_constructor(scheduling_histogram as fn() -> Histogram);
                r.register(
                    "karpenter_scheduler_scheduling_duration_seconds",
                    "Duration of one scheduling simulation, by controller (provisioner: a round; disruption: one set of candidates).",
                    family.clone(),
                );
                family
            },
            cloudprovider_duration: histogram(
                r,
                "karpenter_cloudprovider_duration_seconds",
                "Cloud provider call latency, by method.",
            ),
            cloudprovider_errors: counter(
                r,
                "karpenter_cloudprovider_errors",
                "Cloud provider call errors, by method and error.",
            ),
            reconcile_errors: counter(
                r,
                "karpenter_exoscale_reconcile_errors",
                "Reconcile errors, by controller and error kind.",
            ),
            periodic_duration: histogram(
                r,
                "karpenter_exoscale_periodic_duration_seconds",
                "Duration of one pass of a periodic controller (garbage collection, token cleanup, NodeOverlay status).",
            ),
            exoscale_api_requests: counter(
                r,
                "karpenter_exoscale_api_requests",
                "Exoscale API requests, by operation and status code.",
            ),
            exoscale_api_duration: histogram(
                r,
                "karpenter_exoscale_api_request_duration_seconds",
                "Exoscale API request latency, by operation.",
            ),
            exoscale_api_errors: counter(
                r,
                "karpenter_exoscale_api_errors",
                "Exoscale API errors, by operation and kind.",
            ),
            exoscale_api_rate_limit_wait: plain_histogram(
                r,
                "karpenter_exoscale_api_rate_limit_wait_seconds",
                "Time an Exoscale API request waited for the client's rate limiter (EXOSCALE_API_QPS/BURST).",
            ),
            kube_client_rate_limit_wait: plain_histogram(
                r,
                "karpenter_exoscale_kube_client_rate_limit_wait_seconds",
                "Time a Kubernetes API request waited for the client's rate limiter (KUBE_CLIENT_QPS/BURST).",
            ),
            build_info: gauge(r, "karpenter_build_info", "Build information."),
            leader: gauge(
                r,
                "karpenter_exoscale_leader",
                "1 while this replica holds the leader Lease.",
            ),
            unowned_instances: gauge(
                r,
                "karpenter_exoscale_unowned_instances",
                "Instances under this cluster's ID that garbage collection may not touch, by reason (unproven: no cluster identity label; foreign_cluster: another cluster's identity).",
            ),
            registry: Mutex::new(registry),
        };
        metrics
            .build_info
            .get_or_create(&labels([("version", env!("CARGO_PKG_VERSION"))]))
            .set(1.0);
        metrics
    }

    /// Registers a metric owned by another module (provisioning, disruption) in the same registry.
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        let mut registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        registry.register(name, help, metric);
    }

    /// Every metric family registered, as exposed (counters with `_total`), in order.
    pub fn families(&self) -> Vec<String> {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        registry.names.clone()
    }

    /// The text exposition format served on `/metrics`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = self.render_into(&mut out);
        out
    }

    /// Writes the exposition into `out` as it is encoded.
    pub fn render_into(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        encode_registry(out, &registry.registry)?;
        self.pods_startup_duration
            .encode(out, STARTUP_DURATION, STARTUP_DURATION_HELP)?;
        encode_eof(out)
    }

    /// Records one cloud provider call.
    pub fn observe_cloud_call(&self, method: &str, elapsed: Duration, error: Option<&str>) {
        self.cloudprovider_duration
            .get_or_create(&labels([("method", method), ("provider", "exoscale")]))
            .observe(elapsed.as_secs_f64());
        if let Some(error) = error {
            self.cloudprovider_errors
                .get_or_create(&labels([
                    ("method", method),
                    ("provider", "exoscale"),
                    ("error", error),
                ]))
                .inc();
        }
    }

    /// The instances garbage collection found but may not touch, by `reason`.
    pub fn set_unowned_instances(&self, reason: &str, count: usize) {
        self.unowned_instances
            .get_or_create(&labels([("reason", reason)]))
            .set(count as f64);
    }

    /// Counts a NodeClaim deleted by a controller for `reason` (`expired`, `launch_timeout`...).
    pub fn nodeclaim_disrupted(&self, reason: &str, nodepool: &str, capacity_type: &str) {
        self.nodeclaims_disrupted
            .get_or_create(&labels([
                ("reason", reason),
                ("nodepool", nodepool),
                ("capacity_type", capacity_type),
            ]))
            .inc();
    }
}

/// Every Exoscale API request the client sends (`Client` calls this once the answer is in).
impl crate::exoscale::RequestObserver for Metrics {
    fn observe(
        &self,
        operation: &str,
        status: Option<u16>,
        error: Option<&'static str>,
        elapsed: Duration,
    ) {
        // `none`: no answer arrived (timeout, connection lost).
        let code = status.map_or_else(|| "none".to_string(), |s| s.to_string());
        self.exoscale_api_requests
            .get_or_create(&labels([("operation", operation), ("code", &code)]))
            .inc();
        self.exoscale_api_duration
            .get_or_create(&labels([("operation", operation)]))
            .observe(elapsed.as_secs_f64());
        if let Some(kind) = error {
            self.exoscale_api_errors
                .get_or_create(&labels([("operation", operation), ("kind", kind)]))
                .inc();
        }
    }

    fn waited(&self, wait: Duration) {
        self.exoscale_api_rate_limit_wait
            .observe(wait.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_series_share_one_label_set_and_render_like_plain_labels() {
        let metrics = Metrics::new();
        let node = Arc::new(labels([("node_name", "n1"), ("nodepool", "default")]));
        let series = |resource: Option<&str>| NodeSeries {
            node: node.clone(),
            resource: resource.map(Arc::from),
        };
        metrics.node_gauges[NodeGauge::Allocatable.index()]
            .get_or_create(&series(Some("cpu")))
            .set(3.5);
        metrics.node_gauges[NodeGauge::CurrentLifetime.index()]
            .get_or_create(&series(None))
            .set(60.0);
        let text = metrics.render();
        assert!(
            text.contains(
                r#"karpenter_nodes_allocatable{node_name="n1",nodepool="default",resource_type="cpu"} 3.5"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"karpenter_nodes_current_lifetime_seconds{node_name="n1",nodepool="default"} 60.0"#),
            "{text}"
        );
        assert_eq!(Arc::strong_count(&node), 3, "one label set, shared");
        assert!(series(Some("cpu")).contains(&("resource_type".into(), "cpu".into())));
        assert!(!series(None).contains(&("resource_type".into(), "cpu".into())));
    }

    #[test]
    fn exports_upstream_names() {
        let metrics = Metrics::new();
        metrics.nodeclaim_disrupted("expired", "default", "on-demand");
        use crate::exoscale::RequestObserver;
        metrics.observe("POST /instance", Some(200), None, Duration::from_millis(20));
        metrics.observe(
            "GET /instance/{id}",
            None,
            Some("timeout"),
            Duration::from_secs(30),
        );
        metrics.observe_cloud_call(
            "Create",
            Duration::from_millis(5),
            Some("InsufficientCapacityError"),
        );
        let text = metrics.render();
        for name in [
            "karpenter_nodeclaims_disrupted_total{reason=\"expired\",nodepool=\"default\",capacity_type=\"on-demand\"} 1",
            "karpenter_exoscale_api_requests_total{operation=\"POST /instance\",code=\"200\"} 1",
            "karpenter_exoscale_api_requests_total{operation=\"GET /instance/{id}\",code=\"none\"} 1",
            "karpenter_exoscale_api_errors_total{operation=\"GET /instance/{id}\",kind=\"timeout\"} 1",
            "karpenter_exoscale_api_request_duration_seconds_count{operation=\"POST /instance\"} 1",
            "karpenter_cloudprovider_errors_total{method=\"Create\",provider=\"exoscale\",error=\"InsufficientCapacityError\"} 1",
            "karpenter_cloudprovider_duration_seconds_bucket",
            "karpenter_build_info{version=",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
