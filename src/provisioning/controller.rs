//! The provisioning controller: watches cluster state for provisionable pods, batches them,
//! solves each batch with the shared scheduler and creates the NodeClaims it asks for.
//! Karpenter never binds pods; kube-scheduler does once the nodes are Ready.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::apis::labels::NODEPOOL_LABEL;
use crate::apis::{NodeClaim, NodePool};
use crate::controllers::{Context, Shutdown};
use crate::operator::events::Severity;
use crate::operator::metrics::{Labels, Metrics, labels};
use crate::scheduling::{
    InstanceType, MinValuesPolicy, PreferencePolicy, Scheduler, TopologySpreadConstraint,
};
use crate::state::ClusterIndex;

use super::backoff::LaunchBackoff;
use super::batcher::Batcher;
use super::displacement::{Displacements, PlannedPod};
use super::eligibility;
use super::input::nodeclaim_to_create;
use super::input::{
    Pending, PodsToPlace, Prepared, name_left_out_pools, pools_with_types, prepare,
    scheduler_options,
};

/// Pods still pending are re-planned by a round at least this often (upstream requeues a
/// pending pod every 10 s).
pub const REQUEUE_AFTER: Duration = Duration::from_secs(10);

/// NodeClaims of one round created at once: one per [`CLAIMS_PER_CREATE`] of the round, between
/// [`MIN_CREATES_AT_ONCE`] and [`MAX_CREATES_AT_ONCE`], so that a round's creates take about as
/// long whatever its size. Upstream creates all of a round's in parallel.
/// - One at a time, each waiting on the API server's answer, a round of 464 took 82 s on a
///   loaded control plane (1 000 nodes), and launches followed at that pace.
/// - With 32 every launch of a round waited on the Exoscale client's rate limit (10 a second
///   by default) at once, and RSS peaked at 102-105 MB against 96-98 at four.
/// - Four at a time, a 1 000-node launch's last round of 413 took 37 s (0.25 s a create in a
///   busy API server), so its NodeClaims came long after every pod existed (forty-second
///   session). Sixteen at a time for every round cost 17-28 % more CPU (forty-first session);
///   small rounds, most of them, gain nothing from it.
fn create_concurrency(claims: usize) -> usize {
    claims
        .div_ceil(CLAIMS_PER_CREATE)
        .clamp(MIN_CREATES_AT_ONCE, MAX_CREATES_AT_ONCE)
}

/// A round's NodeClaims per create in flight: at ~0.25 s a create, ~6 s a round.
const CLAIMS_PER_CREATE: usize = 25;
const MIN_CREATES_AT_ONCE: usize = 4;
const MAX_CREATES_AT_ONCE: usize = 16;

#[derive(Debug, Clone)]
pub struct Settings {
    pub batch_idle: Duration,
    pub batch_max: Duration,
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    /// `SCHEDULER_CONFIG`'s default topology spread.
    pub default_topology_spread: Vec<TopologySpreadConstraint>,
    /// `IGNORE_DRA_REQUESTS`: pods claiming DRA devices get no node.
    pub ignore_dra_requests: bool,
    /// How long pending pods wait, when no round ran, before they ask for one
    /// ([`REQUEUE_AFTER`]; no setting changes it, tests lengthen it).
    pub requeue_after: Duration,
}

/// Nodes that pods were nominated to, and until when (disruption leaves them alone).
#[derive(Debug, Default)]
pub struct Nominations(Mutex<HashMap<String, Instant>>);

impl Nominations {
    pub fn nominate(&self, node: &str, until: Instant) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_string(), until);
    }

    pub fn is_nominated(&self, node: &str, now: Instant) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, until| *until > now);
        map.contains_key(node)
    }
}

/// The scheduler metrics provisioning owns.
/// Numbers the scheduling rounds (`scheduling_id` of the in-progress gauges).
static ROUND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub struct ProvisioningMetrics {
    unschedulable_pods: Family<Labels, Gauge>,
    ignored_pods: Gauge,
    queue_depth: Family<Labels, Gauge>,
    unfinished_work: Family<Labels, Gauge<f64, AtomicU64>>,
    pending_by_zone: Family<Labels, Gauge>,
    decision_duration: Histogram,
}

impl ProvisioningMetrics {
    /// Creates the metrics and registers them on `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let m = ProvisioningMetrics {
            unschedulable_pods: Family::default(),
            ignored_pods: Gauge::default(),
            queue_depth: Family::default(),
            unfinished_work: Family::default(),
            pending_by_zone: Family::default(),
            decision_duration: crate::operator::metrics::duration_histogram(),
        };
        metrics.register(
            "karpenter_scheduler_unschedulable_pods_count",
            "Pods the last simulation could not place.",
            m.unschedulable_pods.clone(),
        );
        metrics.register(
            "karpenter_scheduler_ignored_pods_count",
            "Pods that could not be simulated (invalid requests or selectors).",
            m.ignored_pods.clone(),
        );
        metrics.register(
            "karpenter_scheduler_queue_depth",
            "Pods of the scheduling round in progress not yet decided (the whole batch until its solve returns).",
            m.queue_depth.clone(),
        );
        metrics.register(
            "karpenter_scheduler_unfinished_work_seconds",
            "How long the scheduling round in progress has run (updated every second while it runs).",
            m.unfinished_work.clone(),
        );
        metrics.register(
            "karpenter_scheduler_pending_pods_by_effective_zone_count",
            "Pending pods of the last round by the zone their own and their volumes' constraints leave: a zone, flexible or none.",
            m.pending_by_zone.clone(),
        );
        metrics.register(
            "karpenter_pods_scheduling_decision_duration_seconds",
            "From provisioning first seeing a pod to its first scheduling decision.",
            m.decision_duration.clone(),
        );
        m
    }
}

/// The provisioner; one per process, active while leading.
pub struct Provisioner {
    ctx: Arc<Context>,
    settings: Settings,
    pub nominations: Arc<Nominations>,
    metrics: ProvisioningMetrics,
    /// Pods whose launched node registered but cannot take them wait before another launch.
    backoff: Mutex<LaunchBackoff>,
    /// Where the rounds placed the pods still waiting, to re-plan them when others take it.
    displacements: Mutex<Displacements>,
    /// kube-scheduler's verdicts on workloads, kept a while after their marked pods bound.
    marks: Mutex<eligibility::MarkMemory>,
}

/// How many times (a second apart) a round looks whether cluster state caught up with a
/// NodeClaim create whose answer was lost, before it gives way to the next round.
const CATCH_UP_CHECKS: usize = 10;

impl Provisioner {
    pub fn new(ctx: Arc<Context>, settings: Settings, nominations: Arc<Nominations>) -> Arc<Self> {
        let metrics = ProvisioningMetrics::register(&ctx.metrics);
        Arc::new(Provisioner {
            ctx,
            settings,
            nominations,
            metrics,
            backoff: Mutex::new(LaunchBackoff::default()),
            displacements: Mutex::new(Displacements::default()),
            marks: Mutex::new(eligibility::MarkMemory::default()),
        })
    }

    /// Runs until shutdown: batches triggers and provisions each closed batch.
    ///
    /// A pod seen for the first time triggers (holding the window open while a Deployment's
    /// pods arrive). Pods already seen only nudge: every round re-plans every pending pod, so
    /// they need a round when none ran for `requeue_after` (upstream's 10 s requeue), or when
    /// others took the room planned for them; neither holds an open window back. As per-pod
    /// triggers, the requeues of hundreds of pods, each at its own time, kept every window of
    /// a 1 000-node launch open to its 10 s maximum.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut batcher = Batcher::new(self.settings.batch_idle, self.settings.batch_max);
        let mut seen: HashSet<String> = HashSet::new();
        let mut last_round = Instant::now();
        let mut revisions = self.ctx.cluster.subscribe();
        let mut ready_pools = super::batcher::ReadyPools::default();
        loop {
            // Read before the window's instant: a decision then comes at least the idle time
            // after the ack of the pod that opened the window (an owed round's window holds
            // no pod of its own: see `Batcher::resume`).
            let now_unix = self.ctx.clock.now_unix();
            let now = Instant::now();
            let mut first_seen = Vec::new();
            let mut pending = false;
            {
                // Runs on every cluster change: only a pod seen for the first time (or a
                // change in which NodePools are Ready) allocates.
                let index = self.ctx.cluster.read();
                let mut marks = self.marks();
                let provisionable =
                    eligibility::Provisionable::remembering(&index, &mut marks, now);
                for pod in index.pods_iter().filter(|p| provisionable.admits(p)) {
                    let Some(uid) = pod.metadata.uid.as_deref() else {
                        continue;
                    };
                    pending = true;
                    if !seen.contains(uid) {
                        first_seen.push(crate::controllers::metrics::state::pod_key(pod));
                        batcher.trigger(uid, now);
                        seen.insert(uid.to_string());
                    }
                }
                if ready_pools.newly_ready(index.nodepools_iter()) && pending {
                    batcher.nudge("nodepool ready", now);
                }
                // Pods others took the planned room of: a round now, not at the requeue.
                let displaced = self
                    .displacements
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .displaced(&index, &provisionable);
                if !displaced.is_empty() {
                    tracing::debug!(targets = ?displaced, "pods not planned there took room planned for pending pods");
                    batcher.nudge("room taken", now);
                }
            }
            let requeue_at = last_round + self.settings.requeue_after;
            if pending && now >= requeue_at {
                batcher.nudge("requeue", now);
            }
            // A pod's scheduling decision is timed from here, as upstream acks a pod when its
            // controller first sees it provisionable (not when a round starts).
            if !first_seen.is_empty() {
                let keys = first_seen.iter().map(String::as_str);
                self.ctx.cluster.pod_times.ack(keys, now_unix);
            }
            batcher.resume(|| self.deferral().is_none(), now);
            if batcher.take_if_ready(now).is_some() {
                if let Some(why) = self.deferral() {
                    tracing::debug!(reason = why, "provisioning round deferred");
                    batcher.defer();
                } else {
                    if let Err(error) = self.provision().await {
                        tracing::warn!(%error, "provisioning round failed");
                    }
                    last_round = Instant::now();
                }
                let index = self.ctx.cluster.read();
                let marks = self.marks();
                let provisionable =
                    eligibility::Provisionable::recalling(&index, &marks, Instant::now());
                let pending: HashSet<&str> = index
                    .pods_iter()
                    .filter(|p| provisionable.admits(p))
                    .filter_map(|p| p.metadata.uid.as_deref())
                    .collect();
                seen.retain(|uid| pending.contains(uid.as_str()));
                continue; // look again at once: the round took time
            }
            let now = Instant::now();
            let wait = match batcher.deadline() {
                Some(deadline) => deadline.saturating_duration_since(now),
                None if pending => {
                    (last_round + self.settings.requeue_after).saturating_duration_since(now)
                }
                None => self.settings.requeue_after,
            };
            tokio::select! {
                _ = shutdown.clone() => return,
                changed = revisions.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, eligibility::MarkMemory> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One provisioning round. Public for tests.
    pub async fn provision(&self) -> Result<usize, crate::controllers::Error> {
        if let Some(why) = self.deferral() {
            tracing::debug!(reason = why, "provisioning round skipped");
            return Ok(0);
        }
        // A create of an earlier round may have been committed unanswered (see `lost_creates`).
        let ctx = &self.ctx;
        if !ctx
            .lost_creates
            .caught_up(&ctx.client, &ctx.cluster, CATCH_UP_CHECKS)
            .await
        {
            return Ok(0);
        }
        let pools = self.nodepools_with_types().await;
        let options = scheduler_options(
            self.settings.preference_policy,
            self.settings.min_values_policy,
            &self.settings.default_topology_spread,
            self.settings.ignore_dra_requests,
        );
        let mut prepared = {
            let index = self.ctx.cluster.read();
            let marks = self.marks();
            let provisionable =
                eligibility::Provisionable::recalling(&index, &marks, Instant::now());
            prepare(&index, pools, options, PodsToPlace::Admitted(provisionable))
        };
        tracing::debug!(
            pods = prepared.pods.len(),
            existing = prepared.input.existing_nodes.len(),
            "provisioning round"
        );
        self.hold_back_runaways(&mut prepared).await;
        if prepared.pods.is_empty() {
            return Ok(0);
        }
        for (pool, why) in &prepared.skipped_pools {
            tracing::info!(nodepool = %pool, reason = %why, "NodePool left out of provisioning");
        }
        for what in &prepared.left_out {
            tracing::debug!(reason = %what, "left out of the simulation");
        }
        self.metrics.ignored_pods.set(prepared.invalid.len() as i64);
        let Prepared {
            input,
            pods,
            invalid,
            skipped_pools,
            ..
        } = prepared;
        let started = Instant::now();
        let now_unix = self.ctx.clock.now_unix();
        let keys: Vec<String> = pods
            .iter()
            .map(|p| format!("{}/{}", p.pod.namespace, p.pod.name))
            .collect();
        let unbound = |p: &Pending| p.object.spec.as_ref().is_none_or(|s| s.node_name.is_none());
        // The run loop acked these pods when it first saw them; this covers a round run
        // without it (an earlier ack is kept).
        self.ctx.cluster.pod_times.ack(
            pods.iter()
                .zip(&keys)
                .filter(|(p, _)| unbound(p))
                .map(|(_, k)| k.as_str()),
            now_unix,
        );
        self.metrics.pending_by_zone.clear();
        for p in pods.iter().filter(|p| unbound(p)) {
            self.metrics
                .pending_by_zone
                .get_or_create(&labels([
                    ("controller", "provisioner"),
                    ("zone", &super::effective_zone::effective_zone(&p.pod)),
                ]))
                .inc();
        }
        let round = ROUND
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_string();
        let round_labels = labels([("controller", "provisioner"), ("scheduling_id", &round)]);
        self.metrics
            .queue_depth
            .get_or_create(&round_labels)
            .set(pods.len() as i64);
        let domain_pods: Vec<_> = pods.iter().map(|p| p.pod.clone()).collect();
        let mut solve =
            tokio::task::spawn_blocking(move || Scheduler::new(input).solve(&domain_pods));
        let results = loop {
            self.metrics
                .unfinished_work
                .get_or_create(&round_labels)
                .set(started.elapsed().as_secs_f64());
            tokio::select! {
                done = &mut solve => break done,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        };
        self.metrics.queue_depth.remove(&round_labels);
        self.metrics.unfinished_work.remove(&round_labels);
        let results = results.map_err(|e| {
            crate::controllers::Error::Invalid(format!("scheduler task failed: {e}"))
        })?;
        tracing::debug!(
            new = results.new_node_claims.len(),
            existing = results.existing_nodes.len(),
            unschedulable = results.unschedulable.len(),
            seconds = started.elapsed().as_secs_f64(),
            "provisioning round solved"
        );
        // Every pod of the round is decided: placed (on a new or existing node) or not.
        let mut placed = vec![false; pods.len()];
        for i in results
            .new_node_claims
            .iter()
            .flat_map(|c| &c.pods)
            .chain(results.existing_nodes.iter().flat_map(|a| &a.pods))
        {
            placed[*i] = true;
        }
        let decided_unix = self.ctx.clock.now_unix();
        for (i, key) in keys.iter().enumerate() {
            if !unbound(&pods[i]) {
                continue;
            }
            if let Some(seconds) = self
                .ctx
                .cluster
                .pod_times
                .decide(key, placed[i], decided_unix)
            {
                self.metrics.decision_duration.observe(seconds);
            }
        }
        self.ctx
            .metrics
            .scheduling_duration
            .get_or_create(&labels([("controller", "provisioner")]))
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .unschedulable_pods
            .get_or_create(&labels([("controller", "provisioner")]))
            .set(results.unschedulable.len() as i64);

        let nominate_until =
            Instant::now() + (2 * self.settings.batch_max).max(Duration::from_secs(10));
        for assignment in &results.existing_nodes {
            self.nominations
                .nominate(&assignment.node_name, nominate_until);
        }

        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        let post = PostParams {
            field_manager: Some(crate::controllers::FIELD_MANAGER.into()),
            ..Default::default()
        };
        // By position in the results: a closure taking the claim by reference does not compile
        // as `Send` for every lifetime the task needs.
        let to_create: Vec<(usize, NodeClaim)> = results
            .new_node_claims
            .iter()
            .enumerate()
            .filter_map(|(i, claim)| {
                let pool = self.ctx.cluster.read().nodepool(&claim.node_pool)?;
                Some((i, nodeclaim_to_create(self.ctx.cloud.as_ref(), pool, claim)))
            })
            .collect();
        let concurrency = create_concurrency(to_create.len());
        let mut creations = futures::stream::iter(to_create)
            .map(|(i, object)| {
                let creating = api.clone();
                let post = post.clone();
                async move { (i, creating.create(&post, &object).await) }
            })
            .buffer_unordered(concurrency);
        let mut created = 0;
        let mut pod_events = Vec::new();
        let mut plans: Vec<(String, &Vec<usize>)> = Vec::new();
        while let Some((i, outcome)) = creations.next().await {
            let claim = &results.new_node_claims[i];
            match outcome {
                Ok(made) => {
                    created += 1;
                    if let Some(uid) = made.metadata.uid.as_deref() {
                        self.ctx.cloud.nodeclaim_created(uid);
                    }
                    let name = made.name_any();
                    self.ctx
                        .metrics
                        .nodeclaims_created
                        .get_or_create(&labels([
                            ("reason", "provisioned"),
                            ("nodepool", &claim.node_pool),
                            (
                                "min_values_relaxed",
                                if claim.min_values_relaxed {
                                    "true"
                                } else {
                                    "false"
                                },
                            ),
                        ]))
                        .inc();
                    tracing::info!(nodeclaim = %name, nodepool = %claim.node_pool, pods = claim.pods.len(),
                        instance_types = claim.instance_types.len(), "created NodeClaim");
                    self.ctx
                        .cluster
                        .update(|index| index.apply_created_nodeclaim(made));
                    {
                        let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
                        for &i in &claim.pods {
                            if let Some(uid) = pods[i].object.metadata.uid.as_deref() {
                                backoff.launched(uid, &name, Instant::now());
                            }
                        }
                    }
                    for &i in &claim.pods {
                        let message = format!("Pod should schedule on: nodeclaim/{name}");
                        pod_events.push((i, Severity::Normal, "Nominated", message));
                    }
                    plans.push((name, &claim.pods));
                }
                Err(error) => {
                    tracing::warn!(nodepool = %claim.node_pool, %error, "creating a NodeClaim failed");
                    self.ctx.lost_creates.failed(&error);
                }
            }
        }

        // Events only once every NodeClaim of the round exists: they are queued (the sink
        // never waits on the API), and none of them is worth delaying a launch for.
        {
            let index = self.ctx.cluster.read();
            for assignment in &results.existing_nodes {
                let target = nomination_target(&index, &assignment.node_name);
                for &i in &assignment.pods {
                    let message = format!("Pod should schedule on: {target}");
                    pod_events.push((i, Severity::Normal, "Nominated", message));
                }
            }
            let existing = results
                .existing_nodes
                .iter()
                .map(|a| (a.node_name.clone(), &a.pods));
            let mut displacements = self.displacements.lock().unwrap_or_else(|p| p.into_inner());
            for (target, placed) in plans.into_iter().chain(existing) {
                let waiting = placed
                    .iter()
                    .filter(|&&i| unbound(&pods[i]))
                    .filter_map(|&i| PlannedPod::of(&pods[i].object))
                    .collect();
                displacements.plan(&index, &target, waiting);
            }
        }
        for u in &results.unschedulable {
            let reason = name_left_out_pools(&u.reason, &skipped_pools);
            let message = format!("Failed to schedule pod, {reason}");
            pod_events.push((u.pod, Severity::Warning, "FailedScheduling", message));
        }
        for (i, severity, reason, message) in pod_events {
            self.ctx
                .event(pods[i].object.as_ref(), severity, reason, message)
                .await;
        }
        for (pod, why) in &invalid {
            let message = format!("Failed to schedule pod, {why}");
            self.ctx
                .event(pod.as_ref(), Severity::Warning, "FailedScheduling", message)
                .await;
        }
        Ok(created)
    }

    /// Leaves out of this round the pods whose last launched node registered with a taint they
    /// do not tolerate and their NodePool did not ask for (exponential backoff per pod), and
    /// tells each why when its backoff begins. Without this, every round would launch another
    /// node the pod cannot use.
    async fn hold_back_runaways(&self, prepared: &mut Prepared) {
        let now = Instant::now();
        let mut began = Vec::new();
        {
            let index = self.ctx.cluster.read();
            let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
            let marks = self.marks();
            let provisionable = eligibility::Provisionable::recalling(&index, &marks, now);
            let pending: std::collections::HashSet<String> = index
                .pods_iter()
                .filter(|p| provisionable.admits(p))
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            backoff.retain_pending(&|uid| pending.contains(uid), now);
            prepared.pods.retain(|pending| {
                let pod = pending.object.as_ref();
                let Some(uid) = pod.metadata.uid.as_deref() else {
                    return true;
                };
                let Some(claim_name) = backoff.last_claim(uid).map(str::to_string) else {
                    return true;
                };
                let refusal = index
                    .nodeclaim(&claim_name)
                    .and_then(|claim| unexpected_untolerated_taint(&index, &claim, pod));
                match backoff.check(uid, refusal.is_some(), now) {
                    None => true,
                    Some(blocked) => {
                        if blocked.began {
                            began.push((pending.object.clone(), claim_name, refusal, blocked));
                        }
                        false
                    }
                }
            });
        }
        for (pod, claim, refusal, blocked) in began {
            let (node, taint) = refusal.unwrap_or_default();
            let message = format!(
                "Failed to schedule pod, node {node} launched for it (nodeclaim/{claim}) has taint {taint} that the pod does not tolerate and its NodePool did not ask for; not launching another node for it for {}s",
                blocked.wait.as_secs()
            );
            tracing::warn!(pod = %pod.name_any(), %node, %taint, "pod cannot use the node launched for it; backing off");
            self.ctx
                .event(pod.as_ref(), Severity::Warning, "FailedScheduling", message)
                .await;
        }
    }

    /// Why a round may not run now, if it may not: decisions need the lease and synced state.
    /// Synced includes every NodeClaim having its providerID: a launch still in flight has
    /// capacity not known yet, and a new round could launch the same capacity twice.
    fn deferral(&self) -> Option<&'static str> {
        if !self.ctx.leadership.is_leader() {
            Some("not the leader")
        } else if !self.ctx.cluster.synced() {
            Some("cluster state not synced (or a NodeClaim without its providerID yet)")
        } else {
            None
        }
    }

    async fn nodepools_with_types(&self) -> Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)> {
        let pools = self.ctx.cluster.read().nodepools();
        let (found, failed) =
            pools_with_types(self.ctx.cloud.as_ref(), &self.ctx.metrics, pools).await;
        for (pool, error) in failed {
            tracing::warn!(nodepool = %pool.name_any(), %error, "no instance types for NodePool");
            self.ctx
                .event(
                    pool.as_ref(),
                    Severity::Warning,
                    "NoCompatibleInstanceTypes",
                    error.to_string(),
                )
                .await;
        }
        found
    }
}

/// Where a pod placed on existing capacity should land, as upstream names it: the NodeClaim,
/// the Node, or both (`nodeclaim/c, node/n`).
fn nomination_target(index: &ClusterIndex, name: &str) -> String {
    let Some(node) = index.node(name) else {
        // Capacity without a Node is a NodeClaim still on its way.
        return format!("nodeclaim/{name}");
    };
    let claim =
        crate::state::node_provider_id(&node).and_then(|p| index.nodeclaim_by_provider_id(p));
    match claim {
        Some(claim) => format!("nodeclaim/{}, node/{name}", claim.name_any()),
        None => format!("node/{name}"),
    }
}

/// Taints a node may carry for a while whatever its NodePool says.
const TRANSIENT_TAINTS: &[&str] = &[
    crate::apis::labels::UNREGISTERED_TAINT_KEY,
    crate::apis::labels::DISRUPTED_TAINT_KEY,
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.cloudprovider.kubernetes.io/uninitialized",
];

/// The registered Node of `claim` and the first of its taints that `pod` does not tolerate,
/// counting only taints neither the NodeClaim (taints, startup taints) nor the node lifecycle
/// explains: a node that came up different from what was launched.
fn unexpected_untolerated_taint(
    index: &crate::state::ClusterIndex,
    claim: &NodeClaim,
    pod: &crate::state::HeldPod,
) -> Option<(String, String)> {
    let provider_id = crate::state::nodeclaim_provider_id(claim)?;
    let node = index.nodes_by_provider_id(provider_id).into_iter().next()?;
    let expected = |key: &str, effect: &str| {
        TRANSIENT_TAINTS.contains(&key)
            || claim
                .spec
                .taints
                .iter()
                .chain(&claim.spec.startup_taints)
                .any(|t| t.key == key && format!("{:?}", t.effect) == effect)
    };
    let mut unexpected = node.as_ref().clone();
    if let Some(taints) = unexpected.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.retain(|t| !expected(&t.key, &t.effect));
    }
    let taint = crate::scheduling::convert::untolerated_node_taint(pod, &unexpected)?;
    Some((node.name_any(), taint.to_string()))
}

/// The NodePool a NodeClaim belongs to (label), for callers that group claims.
pub fn nodepool_of(claim: &NodeClaim) -> Option<&str> {
    claim.labels().get(NODEPOOL_LABEL).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_creates_more_nodeclaims_at_once_the_bigger_it_is_within_bounds() {
        let at_once: Vec<usize> = [0, 1, 50, 100, 101, 150, 237, 400, 413, 5000]
            .into_iter()
            .map(create_concurrency)
            .collect();
        assert_eq!(at_once, [4, 4, 4, 4, 5, 6, 10, 16, 16, 16]);
    }

    #[test]
    fn nominations_expire() {
        let n = Nominations::default();
        let now = Instant::now();
        n.nominate("node-a", now + Duration::from_secs(20));
        assert!(n.is_nominated("node-a", now));
        assert!(!n.is_nominated("node-a", now + Duration::from_secs(21)));
        assert!(!n.is_nominated("node-b", now));
    }

    #[test]
    fn nominations_name_the_nodeclaim_the_node_or_both_as_upstream() {
        use crate::state::testing;
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(testing::nodeclaim(
            "p-on-its-way",
            "p",
            Some("exoscale://1"),
        ));
        index.apply_nodeclaim(testing::nodeclaim("p-joined", "p", Some("exoscale://2")));
        index.apply_node(testing::node("node-joined", Some("exoscale://2"), &[]));
        index.apply_node(testing::node("unmanaged", Some("other://3"), &[]));
        assert_eq!(
            nomination_target(&index, "p-on-its-way"),
            "nodeclaim/p-on-its-way"
        );
        assert_eq!(
            nomination_target(&index, "node-joined"),
            "nodeclaim/p-joined, node/node-joined"
        );
        assert_eq!(nomination_target(&index, "unmanaged"), "node/unmanaged");
    }
}
