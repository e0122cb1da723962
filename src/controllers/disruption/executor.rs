//! Performs the [`Action`]s an [`Orchestration`] returns against the API server: taints,
//! conditions, replacement NodeClaims, deletions, events and counters.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Taint as CoreTaint};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::apis::labels::conditions;
use crate::apis::{Condition, ConditionStatus, ConditionsExt, NodeClaim};
use crate::controllers::{
    Context, FIELD_MANAGER, Result, ignore_not_found, patch_nodeclaim_status,
};
use crate::disruption::orchestration::{Action, EventTarget, Orchestration, ReplacementStatus};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::provisioning::input::nodeclaim_to_create;

use super::decisions::{
    remove_condition, replacement_status, stale_disruptions, timestamp, with_disrupted_taint,
    without_disrupted_taint,
};
use super::metrics::DisruptionMetrics;

/// Optimistic-lock conflicts are retried this many times with a fresh read.
const CONFLICT_RETRIES: usize = 3;

/// The command being executed and the replacements it launched.
pub struct InFlight {
    pub orchestration: Orchestration,
    /// Names of the replacement NodeClaims, in `command.replacements` order.
    pub replacements: Vec<String>,
    /// The earliest instant the orchestration asked to be looked at again.
    pub requeue_at: Option<DateTime<Utc>>,
}

impl InFlight {
    pub fn new(orchestration: Orchestration) -> Self {
        InFlight {
            orchestration,
            replacements: Vec::new(),
            requeue_at: None,
        }
    }
}

pub struct Executor {
    ctx: Arc<Context>,
    metrics: Arc<DisruptionMetrics>,
    /// Provider IDs marked for deletion by the command in flight, or whose NodeClaims were
    /// deleted and are not yet seen deleting: no other command may take them.
    held: HashSet<String>,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Executor {
    pub fn new(ctx: Arc<Context>, metrics: Arc<DisruptionMetrics>) -> Self {
        Executor {
            ctx,
            metrics,
            held: HashSet::new(),
        }
    }

    pub fn held(&self) -> HashSet<String> {
        self.held.clone()
    }

    /// Releases provider IDs whose NodeClaims are gone or visibly deleting.
    pub fn forget_deleted(&mut self) {
        let index = self.ctx.cluster.read();
        self.held.retain(|pid| {
            index
                .nodeclaim_by_provider_id(pid)
                .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
        });
    }

    /// Restores what [`stale_disruptions`] finds.
    pub async fn restore_stale(&mut self) {
        let stale = stale_disruptions(&self.ctx.cluster.read(), &self.held);
        for (node, claim) in stale {
            tracing::info!(%node, "removing a disruption taint no command holds");
            self.restore(vec![node], claim.into_iter().collect(), Vec::new())
                .await;
        }
    }

    /// Undoes a command's taints, `DisruptionReason` conditions and holds.
    async fn restore(
        &mut self,
        nodes: Vec<String>,
        nodeclaims: Vec<String>,
        provider_ids: Vec<String>,
    ) {
        for node in nodes {
            if let Err(error) = self.remove_taint_unless_terminating(&node).await {
                tracing::warn!(%node, %error, "removing the disrupted taint failed");
            }
        }
        for claim in nodeclaims {
            let result = self
                .update_conditions(&claim, |conds, _| {
                    remove_condition(conds, conditions::DISRUPTION_REASON)
                })
                .await;
            if let Err(error) = result {
                tracing::warn!(nodeclaim = %claim, %error, "clearing DisruptionReason failed");
            }
        }
        for pid in provider_ids {
            self.held.remove(&pid);
        }
    }

    /// The replacements' state as cluster state shows it.
    pub fn replacement_statuses(&self, in_flight: &InFlight) -> Vec<ReplacementStatus> {
        let index = self.ctx.cluster.read();
        in_flight
            .replacements
            .iter()
            .map(|name| replacement_status(index.nodeclaim(name).as_deref()))
            .collect()
    }

    /// Performs `actions` in order; actions that fail to launch feed the orchestration back.
    pub async fn execute(&mut self, in_flight: &mut InFlight, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::RequeueAt(at) => {
                    in_flight.requeue_at = Some(in_flight.requeue_at.map_or(at, |t| t.min(at)));
                }
                Action::Taint { nodes } => {
                    let mut failed = Vec::new();
                    for node in nodes {
                        if let Err(error) = self.update_taints(&node, with_disrupted_taint).await {
                            tracing::warn!(%node, %error, "tainting a disruption candidate failed");
                            failed.push(format!("{node}: {error}"));
                        }
                    }
                    // An untainted candidate takes new pods (do-not-disrupt ones too) while
                    // its replacement comes up, and they would be evicted with it: the command
                    // stops here and its taints come off; the next pass decides again.
                    if !failed.is_empty() {
                        queue.clear();
                        queue.extend(in_flight.orchestration.taint_failed(&failed.join("; ")));
                    }
                }
                Action::SetDisruptionReason { nodeclaims, reason } => {
                    for claim in nodeclaims {
                        let result = self
                            .update_conditions(&claim, |conds, now| {
                                conds.set_condition(
                                    conditions::DISRUPTION_REASON,
                                    ConditionStatus::True,
                                    reason.as_str(),
                                    "",
                                    None,
                                    now,
                                )
                            })
                            .await;
                        if let Err(error) = result {
                            tracing::warn!(nodeclaim = %claim, %error, "setting DisruptionReason failed");
                        }
                    }
                }
                Action::LaunchReplacements { claims, reason } => {
                    match self.launch(&claims, &reason).await {
                        Ok(names) => in_flight.replacements = names,
                        Err(message) => {
                            let more = in_flight.orchestration.launch_failed(&message);
                            queue.extend(more);
                        }
                    }
                }
                Action::MarkForDeletion { provider_ids } => self.held.extend(provider_ids),
                Action::DeleteNodeClaims { nodeclaims } => {
                    let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
                    for claim in nodeclaims {
                        match ignore_not_found(api.delete(&claim, &DeleteParams::default()).await) {
                            Ok(_) => {
                                tracing::info!(nodeclaim = %claim, "deleted disrupted NodeClaim")
                            }
                            Err(error) => {
                                // No longer held: the next pass takes its taint off (stale
                                // disruption) unless the delete went through after all, and
                                // may decide on the node again. Held, it stayed tainted and
                                // spent the budget until a restart.
                                tracing::warn!(nodeclaim = %claim, %error, "deleting a disrupted NodeClaim failed; its disruption is released");
                                let command = &in_flight.orchestration.command;
                                if let Some(c) =
                                    command.candidates.iter().find(|c| c.nodeclaim == claim)
                                {
                                    self.held.remove(&c.provider_id);
                                }
                            }
                        }
                    }
                }
                Action::Restore {
                    nodes,
                    nodeclaims,
                    provider_ids,
                } => self.restore(nodes, nodeclaims, provider_ids).await,
                Action::Event {
                    target,
                    reason,
                    message,
                } => match target {
                    EventTarget::Node(name) => {
                        self.event_on_node(&name, Severity::Normal, reason, &message)
                            .await
                    }
                    EventTarget::NodeClaim(name) => {
                        self.event_on_nodeclaim(&name, Severity::Normal, reason, &message)
                            .await
                    }
                    EventTarget::Replacements => {
                        for name in in_flight.replacements.clone() {
                            self.event_on_nodeclaim(&name, Severity::Normal, reason, &message)
                                .await
                        }
                    }
                },
                Action::Count { metric, labels } => self.metrics.count(metric, &labels),
                Action::Add {
                    metric,
                    labels,
                    amount,
                } => self.metrics.add(metric, &labels, amount),
            }
        }
    }

    /// Creates the replacement NodeClaims; the error names what failed.
    async fn launch(
        &self,
        claims: &[crate::scheduling::NewNodeClaim],
        reason: &str,
    ) -> std::result::Result<Vec<String>, String> {
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        let mut names = Vec::new();
        for claim in claims {
            let Some(pool) = self.ctx.cluster.read().nodepool(&claim.node_pool) else {
                return Err(format!("NodePool {} not found", claim.node_pool));
            };
            let object = nodeclaim_to_create(self.ctx.cloud.as_ref(), pool, claim);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            let made = api.create(&params, &object).await.map_err(|e| {
                self.ctx.lost_creates.failed(&e);
                format!("creating a NodeClaim for NodePool {}: {e}", claim.node_pool)
            })?;
            if let Some(uid) = made.metadata.uid.as_deref() {
                self.ctx.cloud.nodeclaim_created(uid);
            }
            let name = made.name_any();
            self.ctx
                .metrics
                .nodeclaims_created
                .get_or_create(&labels([
                    ("reason", reason),
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
            tracing::info!(nodeclaim = %name, nodepool = %claim.node_pool, %reason, "launched replacement NodeClaim");
            self.ctx
                .cluster
                .update(|index| index.apply_created_nodeclaim(made));
            names.push(name);
        }
        Ok(names)
    }

    /// Takes the disrupted taint off a Node, unless the Node or its NodeClaim is being deleted:
    /// its termination keeps the taint (kube-scheduler would bind pods to a draining node).
    async fn remove_taint_unless_terminating(&self, node: &str) -> Result<()> {
        self.change_taints(node, without_disrupted_taint, |current| {
            let pid = current.spec.as_ref().and_then(|s| s.provider_id.as_deref());
            let claim_deleting = pid
                .and_then(|pid| self.ctx.cluster.read().nodeclaim_by_provider_id(pid))
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some());
            current.metadata.deletion_timestamp.is_some() || claim_deleting
        })
        .await
    }

    /// Rewrites a Node's taints with `change` under an optimistic lock; a missing Node is fine.
    async fn update_taints(
        &self,
        node: &str,
        change: fn(&[CoreTaint]) -> Option<Vec<CoreTaint>>,
    ) -> Result<()> {
        self.change_taints(node, change, |_| false).await
    }

    /// [`Self::update_taints`], leaving alone a Node for which `leave_alone` says so.
    async fn change_taints(
        &self,
        node: &str,
        change: fn(&[CoreTaint]) -> Option<Vec<CoreTaint>>,
        leave_alone: impl Fn(&Node) -> bool,
    ) -> Result<()> {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        for _ in 0..CONFLICT_RETRIES {
            let Some(current) = api.get_opt(node).await? else {
                return Ok(());
            };
            if leave_alone(&current) {
                return Ok(());
            }
            let taints = current
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            let Some(taints) = change(&taints) else {
                return Ok(());
            };
            let patch = json!({
                "metadata": {"resourceVersion": current.resource_version()},
                "spec": {"taints": taints},
            });
            match api
                .patch(
                    node,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(updated) => {
                    self.ctx
                        .cluster
                        .update(|index| index.apply_written_node(&current, updated));
                    return Ok(());
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(crate::controllers::Error::Invalid(format!(
            "node {node} kept changing; taints not updated"
        )))
    }

    /// Rewrites a NodeClaim's conditions with `change` (true when it changed anything) under an
    /// optimistic lock; a missing NodeClaim is fine.
    async fn update_conditions(
        &self,
        name: &str,
        change: impl Fn(&mut Vec<Condition>, k8s_openapi::jiff::Timestamp) -> bool,
    ) -> Result<()> {
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        let now = timestamp(
            chrono::DateTime::from_timestamp(self.ctx.clock.now_unix(), 0).unwrap_or_default(),
        );
        for _ in 0..CONFLICT_RETRIES {
            let Some(current) = api.get_opt(name).await? else {
                return Ok(());
            };
            let mut conds = current
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            if !change(&mut conds, now) {
                return Ok(());
            }
            match patch_nodeclaim_status(&self.ctx, &current, &json!({ "conditions": conds })).await
            {
                Ok(updated) => {
                    self.ctx
                        .cluster
                        .update(|index| index.apply_nodeclaim(updated));
                    return Ok(());
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
        Err(crate::controllers::Error::Invalid(format!(
            "nodeclaim {name} kept changing; conditions not updated"
        )))
    }

    pub async fn event_on_node(&self, name: &str, severity: Severity, reason: &str, message: &str) {
        let node = self.ctx.cluster.read().node(name);
        if let Some(node) = node {
            self.ctx
                .event(node.as_ref(), severity, reason, message)
                .await;
        }
    }

    pub async fn event_on_nodeclaim(
        &self,
        name: &str,
        severity: Severity,
        reason: &str,
        message: &str,
    ) {
        let claim = self.ctx.cluster.read().nodeclaim(name);
        if let Some(claim) = claim {
            self.ctx
                .event(claim.as_ref(), severity, reason, message)
                .await;
        }
    }
}
