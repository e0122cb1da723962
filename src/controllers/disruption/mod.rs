//! The disruption controller: the I/O shell around `crate::disruption`. Leader only, one loop
//! every [`Settings::poll_interval`]: refresh the disruption conditions of NodeClaims, build a
//! [`ClusterView`](crate::disruption::model::ClusterView) from cluster state, let
//! [`methods::decide`] pick a command, publish its events and gauges, and drive one
//! [`Orchestration`] at a time through validation, replacement launches and deletion. Waiting
//! (validation delay, replacements initializing) is a requeue, never a sleep inside a step, so
//! shutdown is honoured between steps.

pub mod conditions;
pub mod decisions;
pub mod executor;
pub mod metrics;
pub mod view;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::apis::NodePool;
use crate::controllers::{Context, Shutdown};
use crate::disruption::memo::ConsolidationMemo;
use crate::disruption::methods::{self, DisruptionEvent, MethodMetrics, Outcome};
use crate::disruption::model::ClusterView;
use crate::disruption::names;
use crate::disruption::orchestration::{Orchestration, Phase};
use crate::disruption::validation;
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::provisioning::controller::Nominations;
use crate::provisioning::input::{pools_with_types, scheduler_options};
use crate::scheduling::{
    InstanceType, MinValuesPolicy, PreferencePolicy, TopologySpreadConstraint,
};

use self::conditions::ConditionsController;
use self::decisions::Dedupe;
use self::executor::{Executor, InFlight};
use self::metrics::DisruptionMetrics;
use self::view::{ViewInputs, build_view};

/// How the controller paces itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Between decision loops (upstream: 10 s).
    pub poll_interval: Duration,
    /// Between passes of the conditions controller.
    pub conditions_interval: Duration,
    /// Provider drift (`CloudProvider::is_drifted`) is asked at most this often per NodeClaim.
    pub provider_drift_interval: Duration,
    /// Consolidation stops simulating after this long and keeps the best it found.
    pub consolidation_timeout: Duration,
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    /// `SCHEDULER_CONFIG`'s default topology spread (consolidation places pods as provisioning
    /// would).
    pub default_topology_spread: Vec<TopologySpreadConstraint>,
    /// `IGNORE_DRA_REQUESTS`: pods claiming DRA devices cannot be moved, as in provisioning.
    pub ignore_dra_requests: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            poll_interval: Duration::from_secs(10),
            conditions_interval: Duration::from_secs(5),
            provider_drift_interval: Duration::from_secs(300),
            consolidation_timeout: Duration::from_secs(180),
            preference_policy: PreferencePolicy::Respect,
            min_values_policy: MinValuesPolicy::Strict,
            default_topology_spread: Vec::new(),
            ignore_dra_requests: true,
        }
    }
}

/// A command in flight that named no instant to come back is looked at this often.
const IN_FLIGHT_POLL: Duration = Duration::from_secs(1);
/// The orchestration's instants (validation after 15 s, replacement checks every second) are
/// honoured up to this bound, a guard against a clock step making one far in the future.
const IN_FLIGHT_MAX_WAIT: Duration = Duration::from_secs(15);

/// How long until `at` (zero when it has passed), capped at `IN_FLIGHT_MAX_WAIT`.
fn until(now: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    (at - now)
        .to_std()
        .unwrap_or(Duration::ZERO)
        .min(IN_FLIGHT_MAX_WAIT)
}

/// Runs the disruption conditions controller and the disruption loop until `shutdown`. Works
/// only while this replica leads; `nominations` are the provisioner's.
pub async fn run(
    ctx: Arc<Context>,
    settings: Settings,
    nominations: Arc<Nominations>,
    shutdown: Shutdown,
) {
    let mut controller = Disruption::new(ctx, settings, nominations);
    let mut conditions_due = Instant::now();
    loop {
        let mut wait = controller.settings.poll_interval;
        if controller.ctx.leadership.is_leader() && controller.ctx.cluster.synced() {
            // In turn, not side by side: a decision must see `Consolidatable` as of the pods
            // now on each node. Run beside it, the conditions lagged pod departures by a pass,
            // and a scale-down still emptying 900 nodes had 2 050 pods evicted from nodes whose
            // last pod event was seconds old (upstream stamps pod events as they happen).
            if Instant::now() >= conditions_due {
                controller.conditions.reconcile_all().await;
                conditions_due = Instant::now() + controller.settings.conditions_interval;
            }
            wait = controller.step().await;
            wait = wait.min(conditions_due.saturating_duration_since(Instant::now()));
        } else {
            // Not watching now: what earlier passes saw says nothing of the time until the
            // next one (leadership may come back hours later, a watch may have missed pods).
            controller.forget_watched();
        }
        tokio::select! {
            _ = shutdown.clone() => return,
            _ = tokio::time::sleep(wait.max(Duration::from_millis(100))) => {}
        }
    }
}

/// The disruption controller as an operator plug-in (started on the leader), sharing the
/// provisioner's `nominations`.
pub fn plugin(
    settings: Settings,
    nominations: Arc<Nominations>,
) -> crate::controllers::ExtraController {
    crate::controllers::ExtraController {
        name: "disruption",
        start: Box::new(move |ctx, shutdown| Box::pin(run(ctx, settings, nominations, shutdown))),
    }
}

struct Disruption {
    ctx: Arc<Context>,
    settings: Settings,
    nominations: Arc<Nominations>,
    conditions: ConditionsController,
    executor: Executor,
    metrics: Arc<DisruptionMetrics>,
    memo: ConsolidationMemo,
    /// Candidates whose replacement the last pass held back, and since when.
    held_replacements: BTreeMap<String, DateTime<Utc>>,
    /// Empty nodes found eligible in consecutive passes, since the first (`view.empty_since`).
    empty_since: BTreeMap<String, DateTime<Utc>>,
    /// When the last pass decided (the two maps above are as of then).
    last_pass: Option<DateTime<Utc>>,
    events: Dedupe,
    in_flight: Option<InFlight>,
}

impl Disruption {
    fn new(ctx: Arc<Context>, settings: Settings, nominations: Arc<Nominations>) -> Self {
        let metrics = Arc::new(DisruptionMetrics::register(&ctx.metrics));
        Disruption {
            conditions: ConditionsController::new(ctx.clone(), settings.provider_drift_interval),
            executor: Executor::new(ctx.clone(), metrics.clone()),
            ctx,
            settings,
            nominations,
            metrics,
            memo: ConsolidationMemo::default(),
            held_replacements: BTreeMap::new(),
            empty_since: BTreeMap::new(),
            last_pass: None,
            events: Dedupe::default(),
            in_flight: None,
        }
    }

    fn now(&self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.ctx.clock.now_unix(), 0).unwrap_or_default()
    }

    async fn pools_with_types(&self) -> Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)> {
        let pools = self.ctx.cluster.read().nodepools();
        let (found, failed) =
            pools_with_types(self.ctx.cloud.as_ref(), &self.ctx.metrics, pools).await;
        for (pool, error) in failed {
            tracing::debug!(nodepool = %pool.name_any(), %error, "NodePool without instance types is not disrupted");
        }
        found
    }

    async fn view(&self) -> ClusterView {
        let pools = self.pools_with_types().await;
        let nominations = self.nominations.clone();
        let nominated = move |node: &str| nominations.is_nominated(node, Instant::now());
        let options = scheduler_options(
            self.settings.preference_policy,
            self.settings.min_values_policy,
            &self.settings.default_topology_spread,
            self.settings.ignore_dra_requests,
        );
        let index = self.ctx.cluster.read();
        build_view(
            &index,
            ViewInputs {
                now: self.now(),
                pools,
                nominated: &nominated,
                queued: self.executor.held(),
                options,
            },
        )
    }

    /// Whether what was just decided may be acted on: this replica still leads and cluster
    /// state still syncs. A pass awaits a lot between the loop's check and its writes (the
    /// conditions' drift reads, the provider's instance types, the decision itself); a Pod
    /// watch that failed meanwhile hides the pods bound since, and an empty node is not one.
    fn may_act(&self) -> bool {
        self.ctx.leadership.is_leader() && self.ctx.cluster.synced()
    }

    /// One step: advance the in-flight command, or decide a new one. Returns when to come back.
    async fn step(&mut self) -> Duration {
        self.executor.forget_deleted();
        if let Some(mut in_flight) = self.in_flight.take() {
            let now = self.now();
            if let Some(at) = in_flight.requeue_at
                && now < at
            {
                self.in_flight = Some(in_flight);
                return until(now, at);
            }
            in_flight.requeue_at = None;
            match in_flight.orchestration.phase.clone() {
                Phase::Validating { at } if now < at => {
                    in_flight.requeue_at = Some(at);
                    let wait = until(now, at);
                    self.in_flight = Some(in_flight);
                    return wait;
                }
                Phase::Validating { .. } => {
                    let fresh = self.view().await;
                    if !self.may_act() {
                        tracing::info!("cluster state stopped syncing before validation; it waits");
                        self.in_flight = Some(in_flight);
                        return IN_FLIGHT_POLL;
                    }
                    let actions = in_flight.orchestration.validate(&fresh);
                    self.executor.execute(&mut in_flight, actions).await;
                }
                Phase::WaitingForReplacements { .. } => {
                    if !self.may_act() {
                        self.in_flight = Some(in_flight);
                        return IN_FLIGHT_POLL;
                    }
                    let statuses = self.executor.replacement_statuses(&in_flight);
                    let actions = in_flight.orchestration.observe(&statuses, now);
                    self.executor.execute(&mut in_flight, actions).await;
                }
                Phase::Done | Phase::Failed { .. } => {}
            }
            if let Phase::Failed { reason } = &in_flight.orchestration.phase {
                tracing::info!(candidates = ?in_flight.orchestration.command.candidate_names(), %reason, "disruption command abandoned");
            }
            let active = matches!(
                in_flight.orchestration.phase,
                Phase::Validating { .. } | Phase::WaitingForReplacements { .. }
            );
            let wait = in_flight
                .requeue_at
                .map_or(IN_FLIGHT_POLL, |at| until(self.now(), at));
            if active {
                self.in_flight = Some(in_flight);
            }
            return wait;
        }
        self.decide().await
    }

    /// Forgets the nodes earlier passes watched: a hold or an empty node counts as watched only
    /// through passes close enough together.
    fn forget_watched(&mut self) {
        self.held_replacements.clear();
        self.empty_since.clear();
        self.last_pass = None;
    }

    async fn decide(&mut self) -> Duration {
        self.executor.restore_stale().await;
        // A replacement (or provisioning's NodeClaim) created unanswered must be in cluster
        // state first, or the same command launches it again (see `lost_creates`).
        let ctx = &self.ctx;
        if !ctx
            .lost_creates
            .caught_up(&ctx.client, &ctx.cluster, 1)
            .await
        {
            return self.settings.poll_interval;
        }
        let version = *self.ctx.cluster.subscribe().borrow();
        let now = self.now();
        if self.last_pass.is_some_and(|last| {
            !validation::passes_close_enough(last, now, self.settings.poll_interval)
        }) {
            self.forget_watched();
        }
        self.last_pass = Some(now);
        let mut view = self.view().await;
        view.held_replacements = self.held_replacements.clone();
        view.empty_since = self.empty_since.clone();
        if !self.memo.should_run(version, now) {
            // Nothing to decide, but what blocks each node is still reported, as upstream's
            // every pass does.
            let resting = Outcome {
                events: methods::resting_events(&view),
                ..Outcome::default()
            };
            self.publish(&resting, view.now).await;
            return self.settings.poll_interval;
        }
        let started = Instant::now();
        let timeout = self.settings.consolidation_timeout;
        let outcome = tokio::task::spawn_blocking(move || {
            let should_stop = move || started.elapsed() >= timeout;
            let outcome = methods::decide(&view, &should_stop);
            (view, outcome)
        })
        .await;
        let Ok((view, outcome)) = outcome else {
            tracing::warn!("disruption decision task failed");
            return self.settings.poll_interval;
        };
        self.publish(&outcome, view.now).await;
        self.memo.record(version, now, outcome.command.is_some());
        self.held_replacements = methods::carry_first_seen(
            &view.held_replacements,
            &outcome.held_replacements,
            view.now,
        );
        self.empty_since =
            methods::carry_first_seen(&view.empty_since, &outcome.empty_nodes, view.now);
        let Some(command) = outcome.command else {
            return self.settings.poll_interval;
        };
        if !self.may_act() {
            tracing::info!(candidates = ?command.candidate_names(), "cluster state stopped syncing while deciding; the decision is dropped");
            self.forget_watched();
            return self.settings.poll_interval;
        }
        let watched = validation::watched_long_enough(&command, &view);
        if command.candidates.is_empty() {
            tracing::debug!(
                standby = command.standby.len(),
                "empty nodes wait for the budget, until validation"
            );
        } else {
            tracing::info!(method = ?command.method, candidates = ?command.candidate_names(),
                standby = command.standby.len(), replacements = command.replacements.len(),
                savings = command.estimated_savings(), watched, "disrupting");
        }
        let (orchestration, actions) = Orchestration::begin(command, view.now, 0, watched);
        let mut in_flight = InFlight::new(orchestration);
        self.executor.execute(&mut in_flight, actions).await;
        let wait = in_flight
            .requeue_at
            .map_or(IN_FLIGHT_POLL, |at| until(self.now(), at));
        if matches!(
            in_flight.orchestration.phase,
            Phase::Validating { .. } | Phase::WaitingForReplacements { .. }
        ) {
            self.in_flight = Some(in_flight);
        }
        wait
    }

    /// Events (deduplicated) and gauges of one decision loop.
    async fn publish(&mut self, outcome: &Outcome, now: DateTime<Utc>) {
        for event in &outcome.events {
            let reason = event.event_reason();
            let (key, window) = event.dedupe();
            if !self.events.admit(key, now, window) {
                continue;
            }
            match event {
                DisruptionEvent::Unconsolidatable {
                    node,
                    nodeclaim,
                    message,
                } => {
                    self.executor
                        .event_on_node(node, Severity::Normal, reason, message)
                        .await;
                    self.executor
                        .event_on_nodeclaim(nodeclaim, Severity::Normal, reason, message)
                        .await;
                }
                DisruptionEvent::Blocked {
                    node,
                    nodeclaim,
                    message,
                }
                | DisruptionEvent::ConsolidationApproved {
                    node,
                    nodeclaim,
                    message,
                }
                | DisruptionEvent::ConsolidationCandidate {
                    node,
                    nodeclaim,
                    message,
                } => {
                    self.executor
                        .event_on_node(node, Severity::Normal, reason, message)
                        .await;
                    if let Some(claim) = nodeclaim {
                        self.executor
                            .event_on_nodeclaim(claim, Severity::Normal, reason, message)
                            .await;
                    }
                }
                DisruptionEvent::DoNotDisrupt {
                    namespace,
                    name,
                    uid,
                    warning,
                    message,
                    ..
                } => {
                    let object = k8s_openapi::api::core::v1::ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        namespace: Some(namespace.clone()),
                        name: Some(name.clone()),
                        uid: (!uid.is_empty()).then(|| uid.clone()),
                        ..Default::default()
                    };
                    self.ctx
                        .events
                        .publish(crate::operator::events::Recorded {
                            object,
                            severity: if *warning {
                                Severity::Warning
                            } else {
                                Severity::Normal
                            },
                            reason: reason.into(),
                            message: message.clone(),
                        })
                        .await;
                }
                DisruptionEvent::NodePoolBlocked {
                    node_pool,
                    reason: why,
                    invalid_budgets,
                } => {
                    let mut message = names::blocked_by_budget_message(*why);
                    let mut severity = Severity::Normal;
                    if let Some(invalid) = invalid_budgets {
                        // Upstream only logs this; a budget that never lets a node go deserves
                        // a word where the operator looks.
                        tracing::warn!(nodepool = %node_pool, error = %invalid, "a disruption budget cannot be read; it allows no disruption");
                        message.push_str(&format!(
                            " (a budget that cannot be read allows none: {invalid})"
                        ));
                        severity = Severity::Warning;
                    }
                    let pool = self.ctx.cluster.read().nodepool(node_pool);
                    if let Some(pool) = pool {
                        self.ctx
                            .event(pool.as_ref(), severity, reason, message)
                            .await;
                    }
                }
            }
        }
        for mv in &outcome.moves {
            let l = [
                ("decision", mv.decision.to_string()),
                ("nodepool", mv.nodepool.clone()),
                ("policy", mv.policy.to_string()),
            ];
            self.metrics.count(names::CONSOLIDATION_MOVES_TOTAL, &l);
            if let Some(score) = mv.score {
                self.metrics
                    .consolidation_score
                    .get_or_create(&labels([
                        ("decision", mv.decision),
                        ("nodepool", &mv.nodepool),
                        ("policy", mv.policy),
                    ]))
                    .observe(score.min(1000.0));
            }
        }
        let eligible_by_reason = eligible_nodes_by_reason(&outcome.metrics);
        {
            let simulations = self
                .ctx
                .metrics
                .scheduling_duration
                .get_or_create(&labels([("controller", "disruption")]));
            for took in outcome.metrics.values().flat_map(|m| &m.simulations) {
                simulations.observe(took.as_secs_f64());
            }
        }
        for (method, m) in &outcome.metrics {
            let (reason, consolidation_type) = reason_of(method);
            self.metrics
                .evaluation_duration
                .get_or_create(&labels([
                    ("reason", reason),
                    ("consolidation_type", consolidation_type),
                ]))
                .observe(m.evaluation.as_secs_f64());
            self.metrics
                .eligible_nodes
                .get_or_create(&labels([("reason", reason)]))
                .set(eligible_by_reason[reason] as i64);
            for (pool, budget) in &m.budgets {
                let l = labels([("nodepool", pool), ("reason", reason)]);
                self.metrics
                    .allowed_disruptions
                    .get_or_create(&l)
                    .set(budget.allowed as i64);
                self.metrics
                    .nodes_consuming_budgets
                    .get_or_create(&l)
                    .set(budget.disrupting as i64);
            }
            if m.timed_out {
                let ctype = if *method == "multi" {
                    names::CONSOLIDATION_TYPE_MULTI
                } else {
                    names::CONSOLIDATION_TYPE_SINGLE
                };
                self.metrics.count(
                    names::CONSOLIDATION_TIMEOUTS_TOTAL,
                    &[(names::LABEL_CONSOLIDATION_TYPE, ctype.to_string())],
                );
            }
        }
    }
}

/// The `reason` and `consolidation_type` labels of a method's metrics.
fn reason_of(method: &str) -> (&'static str, &'static str) {
    match method {
        "emptiness" => ("empty", names::CONSOLIDATION_TYPE_EMPTY),
        "drift" | "static_drift" => ("drifted", ""),
        "multi" => ("underutilized", names::CONSOLIDATION_TYPE_MULTI),
        _ => ("underutilized", names::CONSOLIDATION_TYPE_SINGLE),
    }
}

/// `karpenter_voluntary_disruption_eligible_nodes` by reason. Drift and static drift look at
/// different nodes (static NodePools' and the others'), so both add up. Multi- and single-node
/// consolidation look at the same nodes: the count of the one that ran last (single, when it
/// ran) stands, as upstream sets the gauge once per method.
fn eligible_nodes_by_reason(
    metrics: &BTreeMap<&'static str, MethodMetrics>,
) -> BTreeMap<&'static str, usize> {
    let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for (method, m) in metrics {
        let reason = reason_of(method).0;
        let count = by_reason.entry(reason).or_default();
        match *method {
            "multi" if metrics.contains_key("single") => {}
            "multi" | "single" => *count = m.eligible_nodes,
            _ => *count += m.eligible_nodes,
        }
    }
    by_reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consolidation_candidates_count_once_and_both_drifts_add_up() {
        let eligible = |n| MethodMetrics {
            eligible_nodes: n,
            ..Default::default()
        };
        let metrics = BTreeMap::from([
            ("emptiness", eligible(4)),
            ("static_drift", eligible(2)),
            ("drift", eligible(3)),
            ("multi", eligible(683)),
            ("single", eligible(681)),
        ]);
        assert_eq!(
            eligible_nodes_by_reason(&metrics),
            BTreeMap::from([("drifted", 5), ("empty", 4), ("underutilized", 681)]),
            "a 1 000-node run reported 1 366 underutilized candidates: multi's and single's, added"
        );
        let multi_only = BTreeMap::from([("multi", eligible(683))]);
        assert_eq!(
            eligible_nodes_by_reason(&multi_only)["underutilized"],
            683,
            "single-node consolidation did not run (multi found a command)"
        );
    }

    #[test]
    fn waits_until_the_requested_instant_within_bounds() {
        let now = DateTime::from_timestamp(1_000, 0).unwrap();
        let at = |s: i64| DateTime::from_timestamp(1_000 + s, 0).unwrap();
        assert_eq!(until(now, at(15)), Duration::from_secs(15));
        assert_eq!(until(now, at(1)), Duration::from_secs(1));
        assert_eq!(
            until(now, at(-5)),
            Duration::ZERO,
            "a passed instant is due now"
        );
        assert_eq!(until(now, at(3_600)), IN_FLIGHT_MAX_WAIT);
    }

    /// The operator spawns `run` on the multi-threaded runtime: its future must be `Send`.
    #[allow(dead_code)]
    fn run_is_send(ctx: Arc<Context>, nominations: Arc<Nominations>, shutdown: Shutdown) {
        fn send<T: Send>(_: &T) {}
        let future = run(ctx, Settings::default(), nominations, shutdown);
        send(&future);
    }

    #[test]
    fn defaults_follow_upstream_pacing() {
        let s = Settings::default();
        assert_eq!(s.poll_interval, Duration::from_secs(10));
        assert!(s.provider_drift_interval >= Duration::from_secs(60));
    }
}
