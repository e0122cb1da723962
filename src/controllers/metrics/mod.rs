//! Publishes the node, pod and cluster-state gauges (`karpenter_nodes_*`, `karpenter_pods_state`,
//! `karpenter_cluster_state_*`) from the cluster index whenever it changes, at most every few
//! seconds. Series of nodes and pods that are gone are removed, not left at their last value.
//! Every replica keeps a synced cache and says so; only the leader exports the per-node and
//! per-pod series (as upstream), so summing them across replicas does not double count.

pub mod conditions;
pub mod state;
pub mod transitions;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

pub use self::state::PodSeries;
use self::state::{PodTransitions, StateInput, StateSnapshot, snapshot};
use crate::clock::Clock;
use crate::operator::events::EventSink;
use crate::operator::leader::Leadership;
use crate::operator::metrics::{Labels, Metrics, NodeGauge, NodeSeries, SharedLabels};
use crate::state::{Cluster, Launching, SharedKinds};

/// Changes are coalesced: at most one refresh per interval (a busy cluster changes constantly).
const MIN_REFRESH: Duration = Duration::from_secs(5);
/// Refresh at least this often so lifetimes and the unsynced time keep moving.
const MAX_REFRESH: Duration = Duration::from_secs(30);
/// Unsynced this long is worth an error log (upstream: 30 s, then every 10 s).
const UNSYNCED_ERROR_AFTER: Duration = Duration::from_secs(30);

type GaugeFamily<S = Labels> = prometheus_client::metrics::family::Family<
    S,
    prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
>;

/// The label sets last written to one family, so vanished series can be removed.
struct Published<S = Labels>(BTreeSet<S>);

impl<S> Default for Published<S> {
    fn default() -> Self {
        Published(BTreeSet::new())
    }
}

impl<S: Clone + Ord + std::hash::Hash + Eq> Published<S> {
    fn replace(&mut self, family: &GaugeFamily<S>, samples: &[(S, f64)]) {
        let current: BTreeSet<S> = samples.iter().map(|(l, _)| l.clone()).collect();
        for (labels, value) in samples {
            family.get_or_create(labels).set(*value);
        }
        for gone in self.0.difference(&current) {
            family.remove(gone);
        }
        self.0 = current;
    }
}

/// Tracks how long the cluster state has been unsynced.
#[derive(Debug, Default)]
pub struct UnsyncedClock {
    since: Option<Timestamp>,
    synced_answers: u64,
}

impl UnsyncedClock {
    /// Seconds unsynced as of `now` (0 when synced). `synced_answers` is
    /// [`Cluster::synced_answers`]: if it moved since the last sample, a controller found the
    /// state synced in between, so the unsynced time starts again. Without it a long launch,
    /// whose overlapping launches leave some NodeClaim without its provider ID at every sample,
    /// read as "paused" while its rounds ran.
    pub fn update(&mut self, synced: bool, synced_answers: u64, now: Timestamp) -> f64 {
        let synced_between =
            std::mem::replace(&mut self.synced_answers, synced_answers) != synced_answers;
        if synced || synced_between {
            self.since = (!synced).then_some(now);
            return 0.0;
        }
        let since = *self.since.get_or_insert(now);
        now.duration_since(since).as_secs_f64().max(0.0)
    }
}

/// Whether an unsynced state is a launch making progress rather than a stall. A round's
/// NodeClaims get their provider IDs one by one behind the cloud API's rate limit (500 at 10
/// requests a second take 50 s), and no round runs until the last has its ID: unsynced the
/// whole time, truthfully, but going as fast as it can. Worth an error only when the launches
/// stop getting their IDs, or something else is missing.
#[derive(Debug, Default)]
pub struct LaunchProgress {
    last: Option<Launching>,
}

impl LaunchProgress {
    /// `only_launching` is [`crate::state::ClusterIndex::only_launching`] at this sample; true
    /// when launches are the only cause now and at the last sample, and some NodeClaim got its
    /// provider ID since. Not "fewer wait now": a round still creating its NodeClaims adds
    /// them faster than the rate limit lets them launch (a false ERROR at 1 000 nodes).
    pub fn progressing(&mut self, only_launching: Option<Launching>) -> bool {
        let last = std::mem::replace(&mut self.last, only_launching);
        matches!((last, only_launching), (Some(before), Some(now))
            if now.provider_ids_assigned > before.provider_ids_assigned)
    }
}

/// What a refresh logged about an unsynced state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnsyncedLog {
    /// Synced, or not unsynced for [`UNSYNCED_ERROR_AFTER`] yet.
    Nothing,
    /// Info: only launches keep it unsynced, and they are getting their provider IDs.
    LaunchesProgressing,
    /// Error: provisioning and disruption are paused and nothing shows progress.
    Stalled,
}

/// The per-pod waiting gauges, in `Metrics::pods_waiting` order.
pub const WAITING_GAUGES: [&str; 5] = [
    "unbound",
    "unstarted",
    "provisioning_unbound",
    "provisioning_unstarted",
    "provisioning_scheduling_undecided",
];

/// What the publisher exports besides the cluster-state gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub pod_series: PodSeries,
    /// `DISABLE_CLUSTER_STATE_OBSERVABILITY` off: the node, pod and status-condition series.
    /// Off, as upstream, only `karpenter_cluster_state_*` is exported.
    pub observability: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pod_series: PodSeries::default(),
            observability: true,
        }
    }
}

#[derive(Default)]
struct Publisher {
    options: Options,
    /// Per kind: count and current status seconds (one series per condition of an object),
    /// termination time (one per object).
    condition_gauges: [[Published<conditions::ConditionSeries>; 2]; 3],
    termination_gauges: [Published; 3],
    conditions: conditions::ConditionTracker,
    /// Label values and per-object label sets, shared by every series and kept across
    /// refreshes.
    shared: SharedLabels,
    waiting: [Published; WAITING_GAUGES.len()],
    nodes: [Published<NodeSeries>; NodeGauge::ALL.len()],
    utilization: Published,
    pods: Published,
    transitions: PodTransitions,
    unsynced: UnsyncedClock,
    launch_progress: LaunchProgress,
}

impl Publisher {
    fn publish_cluster_state(&self, metrics: &Metrics, snapshot: &StateSnapshot, unsynced: f64) {
        metrics
            .cluster_state_synced
            .set(if snapshot.synced { 1.0 } else { 0.0 });
        metrics
            .cluster_state_node_count
            .set(snapshot.node_count as f64);
        metrics.cluster_state_unsynced_time.set(unsynced);
    }

    fn publish_workload(&mut self, metrics: &Metrics, snapshot: &StateSnapshot) {
        for gauge in NodeGauge::ALL {
            let i = gauge.index();
            self.nodes[i].replace(&metrics.node_gauges[i], &snapshot.nodes[i]);
        }
        self.utilization
            .replace(&metrics.cluster_utilization_percent, &snapshot.utilization);
        self.pods.replace(&metrics.pods_state, &snapshot.pods);
    }

    fn publish_conditions(
        &mut self,
        families: &conditions::StatusConditionMetrics,
        input: &StateInput,
        now: Timestamp,
    ) {
        let objects = conditions::objects(
            &input.nodeclaims,
            &input.nodepools,
            &input.nodes,
            &mut self.shared,
        );
        let out = self.conditions.observe(&objects, now, &mut self.shared);
        for (k, f) in families.kinds.iter().enumerate() {
            self.condition_gauges[k][0].replace(&f.count, &out.count[k]);
            self.condition_gauges[k][1]
                .replace(&f.current_status_seconds, &out.current_status_seconds[k]);
            self.termination_gauges[k].replace(&f.termination_current, &out.termination_current[k]);
            for (l, s) in &out.termination_durations[k] {
                f.termination_duration.get_or_create(l).observe(*s);
            }
        }
    }

    fn refresh(
        &mut self,
        cluster: &Cluster,
        metrics: &Metrics,
        conditions: &conditions::StatusConditionMetrics,
        now: Timestamp,
        leading: bool,
    ) -> UnsyncedLog {
        // One read, so the launches counted for progress are those of the snapshot.
        let (input, only_launching) = {
            let index = cluster.read();
            (StateInput::from_index(&index), index.only_launching())
        };
        self.shared.prune();
        let snapshot = snapshot(&input, now, self.options.pod_series, &mut self.shared);
        let unsynced = self
            .unsynced
            .update(snapshot.synced, cluster.synced_answers(), now);
        let progressing = self.launch_progress.progressing(only_launching);
        let logged = if unsynced < UNSYNCED_ERROR_AFTER.as_secs_f64() {
            UnsyncedLog::Nothing
        } else if progressing {
            UnsyncedLog::LaunchesProgressing
        } else {
            UnsyncedLog::Stalled
        };
        let because = || cluster.read().unsynced_because().join("; ");
        match logged {
            UnsyncedLog::Nothing => {}
            UnsyncedLog::LaunchesProgressing => tracing::info!(
                unsynced_seconds = unsynced,
                because = %because(),
                "cluster state not synced while launches get their provider IDs; provisioning and disruption wait for them"
            ),
            UnsyncedLog::Stalled => tracing::error!(
                unsynced_seconds = unsynced,
                because = %because(),
                "cluster state has not synced; provisioning and disruption are paused"
            ),
        }
        self.publish_cluster_state(metrics, &snapshot, unsynced);
        if !leading || !self.options.observability {
            return logged;
        }
        let times = &cluster.pod_times;
        let observed = self.transitions.observe(&input.pods);
        for seconds in observed.bound {
            metrics.pods_bound_duration.observe(seconds);
        }
        for seconds in observed.started {
            metrics.pods_startup_duration.observe(seconds);
        }
        let (bound, started) = state::provisioning_durations(&input.pods, times);
        for seconds in bound {
            metrics.pods_provisioning_bound_duration.observe(seconds);
        }
        for seconds in started {
            metrics.pods_provisioning_startup_duration.observe(seconds);
        }
        let waiting = state::waiting_pods(
            &input.pods,
            &|key: &str| times.get(key),
            now,
            self.options.pod_series,
        );
        let samples = [
            &waiting.unbound,
            &waiting.unstarted,
            &waiting.provisioning_unbound,
            &waiting.provisioning_unstarted,
            &waiting.scheduling_undecided,
        ];
        for (i, samples) in samples.into_iter().enumerate() {
            self.waiting[i].replace(&metrics.pods_waiting[i], samples);
        }
        times.retain(&input.pods.iter().map(|p| state::pod_key(p)).collect());
        self.publish_conditions(conditions, &input, now);
        self.publish_workload(metrics, &snapshot);
        logged
    }
}

/// Refreshes the state gauges, and counts status-condition transitions from `kinds`' watch
/// (recording their events while leading), until dropped. Runs on every replica.
pub async fn run(
    cluster: Arc<Cluster>,
    kinds: SharedKinds,
    metrics: Arc<Metrics>,
    events: Arc<dyn EventSink>,
    clock: Arc<dyn Clock>,
    leadership: Leadership,
    options: Options,
) {
    let mut revisions = cluster.subscribe();
    let mut publisher = Publisher {
        options,
        ..Publisher::default()
    };
    let conditions = conditions::StatusConditionMetrics::register(&metrics);
    let transitions = async {
        if options.observability {
            let (families, leading) = (conditions.clone(), leadership.clone());
            transitions::count(kinds, families, events, leading, clock.clone()).await;
        }
    };
    let refreshes = async {
        loop {
            let now = Timestamp::from_second(clock.now_unix()).unwrap_or(Timestamp::UNIX_EPOCH);
            publisher.refresh(&cluster, &metrics, &conditions, now, leadership.is_leader());
            tokio::time::sleep(MIN_REFRESH).await;
            // Either the state changed since the last refresh, or it is time anyway.
            let _ = tokio::time::timeout(MAX_REFRESH - MIN_REFRESH, revisions.changed()).await;
            revisions.borrow_and_update();
        }
    };
    // The refreshes never end; the transitions end only when the watch does.
    tokio::join!(refreshes, transitions);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::metrics::labels;

    #[test]
    fn vanished_series_are_removed_and_current_ones_updated() {
        let metrics = Metrics::new();
        let mut published = Published::default();
        let family = &metrics.pods_state;
        published.replace(
            family,
            &[
                (labels([("name", "a")]), 1.0),
                (labels([("name", "b")]), 1.0),
            ],
        );
        published.replace(family, &[(labels([("name", "b")]), 1.0)]);
        let text = metrics.render();
        assert!(
            text.contains("karpenter_pods_state{name=\"b\"} 1"),
            "{text}"
        );
        assert!(!text.contains("name=\"a\""), "{text}");
    }

    #[test]
    fn unsynced_time_counts_from_the_first_unsynced_observation() {
        let mut clock = UnsyncedClock::default();
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        assert_eq!(clock.update(false, 0, at(100)), 0.0);
        assert_eq!(clock.update(false, 0, at(130)), 30.0);
        assert_eq!(clock.update(true, 1, at(131)), 0.0);
        assert_eq!(clock.update(false, 1, at(200)), 0.0);
        assert_eq!(clock.update(false, 1, at(205)), 5.0);
    }

    /// A 1 000-node launch: some NodeClaim waits for its provider ID at every sample, but the
    /// provisioning loop finds the state synced between samples and runs its rounds.
    #[test]
    fn unsynced_time_restarts_when_a_controller_found_the_state_synced_between_samples() {
        use crate::state::testing::{list_every_kind, nodeclaim};
        let cluster = Cluster::default();
        cluster.update(|index| {
            list_every_kind(index);
            index.apply_nodeclaim(nodeclaim("a", "default", None));
        });
        let metrics = Metrics::new();
        let conditions = conditions::StatusConditionMetrics::register(&metrics);
        let mut publisher = Publisher::default();
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let unsynced_seconds = |metrics: &Metrics| {
            let text = metrics.render();
            text.lines()
                .find_map(|l| l.strip_prefix("karpenter_cluster_state_unsynced_time_seconds "))
                .map(|v| v.parse::<f64>().unwrap())
                .unwrap_or_else(|| panic!("no unsynced gauge in {text}"))
        };
        publisher.refresh(&cluster, &metrics, &conditions, at(100), true);
        // a's launch ends, a round finds the state synced, b's launch starts.
        cluster.update(|index| index.delete_nodeclaim("a"));
        assert!(cluster.synced(), "the round between the samples");
        cluster.update(|index| index.apply_nodeclaim(nodeclaim("b", "default", None)));
        publisher.refresh(&cluster, &metrics, &conditions, at(140), true);
        assert_eq!(
            unsynced_seconds(&metrics),
            0.0,
            "synced since the last sample"
        );
        // Nobody found it synced since: the time counts from that sample.
        publisher.refresh(&cluster, &metrics, &conditions, at(175), true);
        assert_eq!(unsynced_seconds(&metrics), 35.0);
    }

    /// A leader's publisher over `cluster`: refreshes it at second `s`, and says what it logged.
    fn leader_refreshes(cluster: &Cluster) -> impl FnMut(i64) -> UnsyncedLog + '_ {
        let metrics = Metrics::new();
        let conditions = conditions::StatusConditionMetrics::register(&metrics);
        let mut publisher = Publisher::default();
        move |s| {
            let at = Timestamp::from_second(s).unwrap();
            publisher.refresh(cluster, &metrics, &conditions, at, true)
        }
    }

    /// The NodeClaim `name` as its launch leaves it: with its provider ID.
    fn launched(cluster: &Cluster, name: &str) {
        let id = format!("exoscale://{name}");
        let claim = crate::state::testing::nodeclaim(name, "default", Some(&id));
        cluster.update(|index| index.apply_nodeclaim(claim));
    }

    /// anti:500 in the thirty-eighth sitting: one round of 500 NodeClaims whose provider IDs
    /// arrived at the rate limit's pace was logged as a stall at ERROR from 30 s on.
    #[test]
    fn launches_getting_their_provider_ids_log_progress_and_a_stuck_or_stale_state_an_error() {
        use crate::state::Kind;
        use crate::state::testing::{list_every_kind, nodeclaim};
        let cluster = Cluster::default();
        cluster.update(|index| {
            list_every_kind(index);
            for name in ["a", "b", "c", "d"] {
                index.apply_nodeclaim(nodeclaim(name, "default", None));
            }
        });
        let launched = |name: &str| launched(&cluster, name);
        let mut refresh_at = leader_refreshes(&cluster);
        assert_eq!(refresh_at(100), UnsyncedLog::Nothing);
        launched("a");
        assert_eq!(refresh_at(105), UnsyncedLog::Nothing, "under 30 s");
        launched("b");
        assert_eq!(
            refresh_at(135),
            UnsyncedLog::LaunchesProgressing,
            "35 s unsynced, but one more launch got its provider ID"
        );
        assert_eq!(
            refresh_at(140),
            UnsyncedLog::Stalled,
            "no launch got its provider ID since the last sample"
        );
        launched("c");
        cluster.update(|index| index.mark_stale(Kind::Pod));
        assert_eq!(
            refresh_at(145),
            UnsyncedLog::Stalled,
            "a failed watch, whatever the launches do"
        );
        cluster.update(|index| {
            list_every_kind(index);
            index.apply_nodeclaim(nodeclaim("d", "default", Some("exoscale://d")));
        });
        assert!(cluster.synced());
        assert_eq!(refresh_at(150), UnsyncedLog::Nothing);
    }

    /// dense:1000:100 in the fortieth sitting: a round still creating its NodeClaims added them
    /// faster than the rate limit let them launch, so more waited at each sample while they
    /// kept getting their provider IDs, and the launch was logged as a stall at ERROR.
    #[test]
    fn a_round_adding_nodeclaims_faster_than_they_launch_logs_progress() {
        use crate::state::testing::{list_every_kind, nodeclaim};
        let cluster = Cluster::default();
        let created = |names: &[&str]| {
            cluster.update(|index| {
                for name in names {
                    index.apply_nodeclaim(nodeclaim(name, "default", None));
                }
            })
        };
        let launched = |name: &str| launched(&cluster, name);
        cluster.update(list_every_kind);
        created(&["a", "b"]);
        let mut refresh_at = leader_refreshes(&cluster);
        assert_eq!(refresh_at(100), UnsyncedLog::Nothing);
        created(&["c", "d"]);
        assert_eq!(
            refresh_at(130),
            UnsyncedLog::Stalled,
            "nothing launched yet"
        );
        launched("a");
        created(&["e", "f", "g"]);
        assert_eq!(
            refresh_at(135),
            UnsyncedLog::LaunchesProgressing,
            "six wait where four did, but one more got its provider ID"
        );
        created(&["h"]);
        assert_eq!(
            refresh_at(140),
            UnsyncedLog::Stalled,
            "more NodeClaims and none launched since the last sample"
        );
    }

    #[test]
    fn publishing_sets_the_cluster_state_gauges() {
        let metrics = Metrics::new();
        let publisher = Publisher::default();
        let snapshot = StateSnapshot {
            node_count: 3,
            synced: true,
            ..StateSnapshot::default()
        };
        publisher.publish_cluster_state(&metrics, &snapshot, 0.0);
        let text = metrics.render();
        assert!(
            text.contains("karpenter_cluster_state_synced 1.0"),
            "{text}"
        );
        assert!(
            text.contains("karpenter_cluster_state_node_count 3.0"),
            "{text}"
        );
        assert!(
            text.contains("karpenter_cluster_state_unsynced_time_seconds 0.0"),
            "{text}"
        );
    }

    #[test]
    fn only_the_leader_exports_node_and_pod_series() {
        use crate::state::testing::{node, pod};
        let cluster = Cluster::default();
        let mut n1 = node("n1", Some("exoscale://1"), &[]);
        n1.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }]);
        cluster.update(|index| {
            index.apply_node(n1);
            index.apply_pod(pod("default", "web", Some("n1")));
        });
        let now = Timestamp::from_second(1_000).unwrap();
        let standby = Metrics::new();
        let standby_conditions = conditions::StatusConditionMetrics::register(&standby);
        Publisher::default().refresh(&cluster, &standby, &standby_conditions, now, false);
        let text = standby.render();
        assert!(
            text.contains("karpenter_cluster_state_node_count 1.0"),
            "{text}"
        );
        assert!(!text.contains("karpenter_pods_state{"), "{text}");
        assert!(
            !text.contains("operator_node_status_condition_count{"),
            "{text}"
        );
        let publish = |options: Options| {
            let leader = Metrics::new();
            let leader_conditions = conditions::StatusConditionMetrics::register(&leader);
            Publisher {
                options,
                ..Publisher::default()
            }
            .refresh(&cluster, &leader, &leader_conditions, now, true);
            leader.render()
        };
        let text = publish(Options::default());
        // Aggregated by default, and empty labels (namespace, absent node labels) left out.
        assert!(
            text.contains("karpenter_pods_state{scheduled=\"true\",node=\"n1\",ready=\"false\",managed=\"false\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("operator_node_status_condition_count{name=\"n1\",type=\"Ready\",status=\"True\",reason=\"KubeletReady\"} 1"),
            "{text}"
        );
        let text = publish(Options {
            pod_series: PodSeries::PerPod,
            observability: true,
        });
        assert!(
            text.contains(
                "karpenter_pods_state{name=\"web\",namespace=\"default\",scheduled=\"true\""
            ),
            "{text}"
        );
        // DISABLE_CLUSTER_STATE_OBSERVABILITY: the cluster-state gauges only.
        let text = publish(Options {
            observability: false,
            ..Options::default()
        });
        assert!(
            text.contains("karpenter_cluster_state_node_count 1.0"),
            "{text}"
        );
        for family in [
            "karpenter_pods_state{",
            "karpenter_nodes_allocatable{",
            "operator_node_status_condition_count{",
        ] {
            assert!(!text.contains(family), "{family} in {text}");
        }
    }
}
