//! operatorpkg's status-condition metrics, which upstream Karpenter exports for NodeClaims,
//! NodePools and Nodes: `operator_<kind>_status_condition_count`, `_current_status_seconds`,
//! `_transitions_total`, `_transition_seconds`, and `operator_<kind>_termination_current_time_seconds`
//! / `_termination_duration_seconds`. Transitions are counted from each version the watch
//! delivers ([`super::transitions`]); the gauges and terminations from periodic looks. The
//! deprecated kind-less `operator_status_condition_*` copies are not exported (they double
//! every series).
//!
//! [`ConditionTracker::observe`] is pure over the objects and the clock; the publisher registers
//! the families ([`StatusConditionMetrics`]) and applies the output.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::interner::Interner;
use crate::operator::metrics::{Labels, Metrics, SharedLabels};

/// Labels of one condition series of one object: the object's own (name, NodeClass,
/// NodePool…), shared by the series of all its conditions, then the condition's type, status
/// and reason. Each series owning its copy of the object's labels was ~650 B a series, ~12 MB
/// for 1 000 nodes' and NodeClaims' conditions, kept twice (the family and what was
/// published) and built a third time on each refresh. The label set and the few distinct
/// types, statuses and reasons are interned ([`SharedLabels`]), so every copy is pointers.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConditionSeries {
    pub object: Arc<Labels>,
    pub type_: Arc<str>,
    pub status: Arc<str>,
    pub reason: Arc<str>,
}

impl ConditionSeries {
    /// Every label, in exposition order (empty values left out, as [`compact`] does).
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        let condition = [
            ("type", &*self.type_),
            ("status", &*self.status),
            ("reason", &*self.reason),
        ];
        self.object
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(condition)
            .filter(|(_, v)| !v.is_empty())
    }
}

impl prometheus_client::encoding::EncodeLabelSet for ConditionSeries {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.pairs().collect::<Vec<_>>().encode(encoder)
    }
}

/// One condition series' value.
pub type ConditionSample = (ConditionSeries, f64);

/// The kinds upstream reports, as they appear in the metric names.
pub const KINDS: [&str; 3] = ["nodeclaim", "nodepool", "node"];

/// One condition as the object states it (strings interned: see [`ConditionSeries`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ConditionState {
    pub type_: Arc<str>,
    pub status: Arc<str>,
    pub reason: Arc<str>,
    pub last_transition: Option<Timestamp>,
}

/// One object of a reported kind.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectConditions {
    /// Index into [`KINDS`].
    pub kind: usize,
    pub namespace: String,
    pub name: String,
    /// Object labels upstream adds to every series (`karpenter_sh_nodepool`, …).
    pub extra: Labels,
    pub conditions: Vec<ConditionState>,
    pub deleting_since: Option<Timestamp>,
}

/// What to write for one look at the objects, per kind.
#[derive(Debug, Default, PartialEq)]
pub struct ConditionOutput {
    pub count: [Vec<ConditionSample>; 3],
    pub current_status_seconds: [Vec<ConditionSample>; 3],
    pub termination_current: [Vec<(Labels, f64)>; 3],
    pub termination_durations: [Vec<(Labels, f64)>; 3],
}

pub(super) type Key = (usize, String, String);

/// The objects terminating at the previous look.
#[derive(Debug, Default)]
pub struct ConditionTracker {
    terminating: HashMap<Key, (Timestamp, Labels)>,
}

pub(super) fn label(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// Leaves out empty values (a cluster-scoped object's `namespace`, a label the object does not
/// have): Prometheus reads them as absent, and at 1 000 nodes they were ~10% of `/metrics`.
pub(super) fn compact(mut labels: Labels) -> Labels {
    labels.retain(|(_, v)| !v.is_empty());
    labels
}

/// operatorpkg's label name for an object label key.
pub fn prometheus_label(key: &str) -> String {
    key.replace(['/', '.', '-'], "_")
}

pub(super) fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64().max(0.0)
}

impl ConditionTracker {
    /// The series for one look at `objects`; each object's label set comes from `shared`, so
    /// its series keep one copy from look to look.
    pub fn observe(
        &mut self,
        objects: &[ObjectConditions],
        now: Timestamp,
        shared: &mut SharedLabels,
    ) -> ConditionOutput {
        let mut out = ConditionOutput::default();
        let mut present = BTreeSet::new();
        for o in objects {
            let k = o.kind;
            let key = (k, o.namespace.clone(), o.name.clone());
            let object_labels = || {
                let mut l = vec![label("namespace", &o.namespace), label("name", &o.name)];
                l.extend(o.extra.iter().cloned());
                compact(l)
            };
            let object = shared.sets.intern(object_labels());
            for c in &o.conditions {
                let series = ConditionSeries {
                    object: object.clone(),
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                };
                out.count[k].push((series.clone(), 1.0));
                let since = c.last_transition.map_or(0.0, |t| seconds(t, now));
                out.current_status_seconds[k].push((series, since));
            }
            if let Some(since) = o.deleting_since {
                out.termination_current[k].push((object_labels(), seconds(since, now)));
                self.terminating
                    .insert(key.clone(), (since, object_labels()));
            }
            present.insert(key);
        }
        // Objects gone since the last look: the termination took until now.
        let gone: Vec<Key> = self
            .terminating
            .keys()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some((since, labels)) = self.terminating.remove(&key) {
                out.termination_durations[key.0].push((labels, seconds(since, now)));
            }
        }
        out
    }
}

fn status_str(s: crate::apis::ConditionStatus) -> &'static str {
    match s {
        crate::apis::ConditionStatus::True => "True",
        crate::apis::ConditionStatus::False => "False",
        crate::apis::ConditionStatus::Unknown => "Unknown",
    }
}

fn extra_labels(labels: &std::collections::BTreeMap<String, String>, keys: &[&str]) -> Labels {
    keys.iter()
        .map(|k| {
            label(
                &prometheus_label(k),
                labels.get(*k).map_or("", String::as_str),
            )
        })
        .collect()
}

/// A NodeClaim's conditions, with the object labels upstream adds (NodeClass and NodePool).
pub fn of_nodeclaim(
    claim: &crate::apis::NodeClaim,
    values: &mut Interner<str>,
) -> ObjectConditions {
    use crate::apis::labels::{NODECLASS_LABEL, NODEPOOL_LABEL};
    use kube::ResourceExt;
    ObjectConditions {
        kind: 0,
        namespace: String::new(),
        name: claim.name_any(),
        extra: extra_labels(claim.labels(), &[NODECLASS_LABEL, NODEPOOL_LABEL]),
        conditions: ours(claim.status.iter().flat_map(|s| &s.conditions), values),
        deleting_since: deleting(&claim.metadata),
    }
}

/// A NodePool's conditions.
pub fn of_nodepool(pool: &crate::apis::NodePool, values: &mut Interner<str>) -> ObjectConditions {
    use kube::ResourceExt;
    ObjectConditions {
        kind: 1,
        namespace: String::new(),
        name: pool.name_any(),
        extra: Vec::new(),
        conditions: ours(pool.status.iter().flat_map(|s| &s.conditions), values),
        deleting_since: deleting(&pool.metadata),
    }
}

/// A Node's conditions, with NodeClass, NodePool and `initialized` labels.
pub fn of_node(
    node: &k8s_openapi::api::core::v1::Node,
    values: &mut Interner<str>,
) -> ObjectConditions {
    use crate::apis::labels::{NODE_INITIALIZED_LABEL, NODECLASS_LABEL, NODEPOOL_LABEL};
    use kube::ResourceExt;
    ObjectConditions {
        kind: 2,
        namespace: String::new(),
        name: node.name_any(),
        extra: extra_labels(
            node.labels(),
            &[NODECLASS_LABEL, NODEPOOL_LABEL, NODE_INITIALIZED_LABEL],
        ),
        conditions: node
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .map(|c| ConditionState {
                type_: values.intern(c.type_.as_str()),
                status: values.intern(c.status.as_str()),
                reason: values.intern(c.reason.as_deref().unwrap_or_default()),
                last_transition: c.last_transition_time.as_ref().map(|t| t.0),
            })
            .collect(),
        deleting_since: deleting(&node.metadata),
    }
}

fn ours<'a>(
    conditions: impl Iterator<Item = &'a crate::apis::Condition>,
    values: &mut Interner<str>,
) -> Vec<ConditionState> {
    conditions
        .map(|c| ConditionState {
            type_: values.intern(c.type_.as_str()),
            status: values.intern(status_str(c.status)),
            reason: values.intern(c.reason.as_str()),
            last_transition: Some(c.last_transition_time.0),
        })
        .collect()
}

fn deleting(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Timestamp> {
    meta.deletion_timestamp.as_ref().map(|t| t.0)
}

/// The NodeClaims, NodePools and Nodes of the index as the tracker reads them.
pub fn objects(
    nodeclaims: &[Arc<crate::apis::NodeClaim>],
    nodepools: &[Arc<crate::apis::NodePool>],
    nodes: &[Arc<k8s_openapi::api::core::v1::Node>],
    shared: &mut SharedLabels,
) -> Vec<ObjectConditions> {
    let values = &mut shared.values;
    let mut out: Vec<_> = nodeclaims.iter().map(|c| of_nodeclaim(c, values)).collect();
    out.extend(nodepools.iter().map(|p| of_nodepool(p, values)));
    out.extend(nodes.iter().map(|n| of_node(n, values)));
    out
}

type GaugeFamily<S = Labels> = Family<S, Gauge<f64, std::sync::atomic::AtomicU64>>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Upstream's buckets for these histograms: 0.5 s doubling to 8192 s.
fn buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.5, 2.0, 15))
}

/// The six families of one kind.
#[derive(Clone)]
pub struct KindFamilies {
    pub count: GaugeFamily<ConditionSeries>,
    pub current_status_seconds: GaugeFamily<ConditionSeries>,
    pub transitions: Family<Labels, Counter>,
    pub transition_seconds: HistogramFamily,
    pub termination_current: GaugeFamily,
    pub termination_duration: HistogramFamily,
}

/// The families of every reported kind, registered on the process's registry.
#[derive(Clone)]
pub struct StatusConditionMetrics {
    pub kinds: [KindFamilies; 3],
}

impl StatusConditionMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let kinds = KINDS.map(|kind| {
            let f = KindFamilies {
                count: Family::default(),
                current_status_seconds: Family::default(),
                transitions: Family::default(),
                transition_seconds: Family::new_with_constructor(buckets as fn() -> Histogram),
                termination_current: Family::default(),
                termination_duration: Family::new_with_constructor(buckets as fn() -> Histogram),
            };
            let name = |suffix: &str| format!("operator_{kind}_{suffix}");
            metrics.register(
                &name("status_condition_count"),
                "The number of a condition for a given object, type and status.",
                f.count.clone(),
            );
            metrics.register(
                &name("status_condition_current_status_seconds"),
                "Seconds a status condition has been in its current state.",
                f.current_status_seconds.clone(),
            );
            metrics.register(
                &name("status_condition_transitions"),
                "Transitions of a condition type to a status seen by this process.",
                f.transitions.clone(),
            );
            metrics.register(
                &name("status_condition_transition_seconds"),
                "Seconds a condition was in a state before it transitioned.",
                f.transition_seconds.clone(),
            );
            metrics.register(
                &name("termination_current_time_seconds"),
                "Seconds an object has been terminating.",
                f.termination_current.clone(),
            );
            metrics.register(
                &name("termination_duration_seconds"),
                "Seconds an object took to terminate completely.",
                f.termination_duration.clone(),
            );
            f
        });
        StatusConditionMetrics { kinds }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::controllers::metrics) fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    pub(in crate::controllers::metrics) fn object(
        status: &str,
        since: i64,
        deleting: Option<i64>,
    ) -> ObjectConditions {
        ObjectConditions {
            kind: 0,
            namespace: String::new(),
            name: "claim".into(),
            extra: vec![label("karpenter_sh_nodepool", "default")],
            conditions: vec![ConditionState {
                type_: "Ready".into(),
                status: status.into(),
                reason: if status == "True" {
                    "Ready"
                } else {
                    "NotReady"
                }
                .into(),
                last_transition: Some(at(since)),
            }],
            deleting_since: deleting.map(at),
        }
    }

    #[test]
    fn counts_current_seconds_and_termination() {
        let mut tracker = ConditionTracker::default();
        let mut shared = SharedLabels::default();
        let first = tracker.observe(&[object("False", 0, None)], at(10), &mut shared);
        assert_eq!(first.count[0].len(), 1);
        assert_eq!(first.current_status_seconds[0][0].1, 10.0);
        let second = tracker.observe(&[object("True", 30, None)], at(50), &mut shared);
        assert_eq!(second.current_status_seconds[0][0].1, 20.0);
        assert_eq!(&*second.count[0][0].0.status, "True");

        let deleting = tracker.observe(&[object("True", 30, Some(60))], at(65), &mut shared);
        assert_eq!(deleting.termination_current[0][0].1, 5.0);
        let still = tracker.observe(&[object("True", 30, Some(60))], at(70), &mut shared);
        assert!(still.termination_durations[0].is_empty());
        let gone = tracker.observe(&[], at(90), &mut shared);
        assert_eq!(gone.termination_durations[0].len(), 1);
        assert_eq!(gone.termination_durations[0][0].1, 30.0);
        assert!(gone.count[0].is_empty());
        let after = tracker.observe(&[], at(95), &mut shared);
        assert!(after.termination_durations[0].is_empty(), "timed once");
    }

    #[test]
    fn an_objects_condition_series_share_its_labels_and_print_as_before() {
        let mut two = object("True", 0, None);
        two.conditions.push(ConditionState {
            type_: "Drifted".into(),
            status: "False".into(),
            reason: "".into(),
            last_transition: Some(at(0)),
        });
        let out = ConditionTracker::default().observe(&[two], at(10), &mut SharedLabels::default());
        let (ready, drifted) = (&out.count[0][0].0, &out.count[0][1].0);
        assert!(Arc::ptr_eq(&ready.object, &drifted.object));
        assert!(Arc::ptr_eq(
            &ready.object,
            &out.current_status_seconds[0][0].0.object
        ));

        let family = GaugeFamily::<ConditionSeries>::default();
        for (series, value) in &out.count[0] {
            family.get_or_create(series).set(*value);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("operator_nodeclaim_status_condition_count", "", family);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // No namespace (cluster-scoped) and no empty reason: empty values are left out.
        assert!(text.contains(
            "operator_nodeclaim_status_condition_count{name=\"claim\",karpenter_sh_nodepool=\"default\",type=\"Ready\",status=\"True\",reason=\"Ready\"} 1.0\n"
        ), "{text}");
        assert!(text.contains(
            "operator_nodeclaim_status_condition_count{name=\"claim\",karpenter_sh_nodepool=\"default\",type=\"Drifted\",status=\"False\"} 1.0\n"
        ), "{text}");
    }

    #[test]
    fn series_keep_one_copy_of_their_labels_from_look_to_look() {
        let mut tracker = ConditionTracker::default();
        let mut shared = SharedLabels::default();
        let mut other = object("True", 0, None);
        other.name = "other".into();
        let first = tracker.observe(&[object("True", 0, None), other], at(10), &mut shared);
        let second = tracker.observe(&[object("True", 0, None)], at(20), &mut shared);
        let (before, after) = (&first.count[0][0].0, &second.count[0][0].0);
        assert_eq!(before, after);
        assert!(Arc::ptr_eq(&before.object, &after.object), "one label set");
        assert!(!Arc::ptr_eq(&before.object, &first.count[0][1].0.object));

        drop((first, second));
        shared.prune();
        assert!(
            shared.sets.is_empty(),
            "nothing holds the label sets any more"
        );
    }

    #[test]
    fn objects_share_the_strings_of_equal_conditions() {
        let ready = |name: &str| {
            let mut node = crate::state::testing::node(name, None, &[]);
            node.status.get_or_insert_default().conditions =
                Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("KubeletReady".into()),
                    ..Default::default()
                }]);
            Arc::new(node)
        };
        let mut shared = SharedLabels::default();
        let read = objects(&[], &[], &[ready("n1"), ready("n2")], &mut shared);
        let (a, b) = (&read[0].conditions[0], &read[1].conditions[0]);
        assert_eq!(&*a.reason, "KubeletReady");
        assert!(Arc::ptr_eq(&a.reason, &b.reason) && Arc::ptr_eq(&a.type_, &b.type_));
        assert!(Arc::ptr_eq(&a.status, &b.status));
    }

    #[test]
    fn label_keys_become_prometheus_names() {
        assert_eq!(
            prometheus_label("karpenter.exoscale.com/exoscalenodeclass"),
            "karpenter_exoscale_com_exoscalenodeclass"
        );
    }
}
