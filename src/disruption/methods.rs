//! The four voluntary disruption methods, tried in upstream's order; the first that yields a
//! command ends the loop.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::apis::duration::parse_nillable_duration;
use crate::apis::nodepool::{ConsolidationPolicy, DisruptionReason};
use crate::scheduling::Requirement;
use crate::scheduling::labels::{CAPACITY_TYPE, CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT};

use super::balanced::{self, PoolTotals};
use super::budgets::{BudgetCounts, BudgetMapping, PoolBudget};
use super::candidates::{Candidate, candidates, sort_by_disruption_cost};
use super::command::{Command, Method, cheaper_than};
use super::conditions::{consolidate_after, quiet_since_pod_event};
use super::model::ClusterView;
use super::names;
use super::simulate::SimulationBase;

/// Multi-node consolidation looks at no more than this many candidates at once.
pub const MAX_MULTI_NODE_CANDIDATES: usize = 100;

/// Something the controller publishes while deciding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DisruptionEvent {
    /// A node that cannot be consolidated, and why (`Unconsolidatable`).
    Unconsolidatable {
        node: String,
        nodeclaim: String,
        message: String,
    },
    /// A node whose disruption is blocked (`DisruptionBlocked`).
    Blocked {
        node: String,
        nodeclaim: Option<String>,
        message: String,
    },
    /// A candidate of a `Balanced` NodePool whose move the policy approved
    /// (`ConsolidationApproved`), with the score.
    ConsolidationApproved {
        node: String,
        nodeclaim: Option<String>,
        message: String,
    },
    /// A candidate of the consolidation command a method computed (`ConsolidationCandidate`),
    /// with the command and its estimated savings.
    ConsolidationCandidate {
        node: String,
        nodeclaim: Option<String>,
        message: String,
    },
    /// About a pod's duration-valued `karpenter.sh/do-not-disrupt` (upstream's
    /// `InvalidDoNotDisruptAnnotation` warning, `DoNotDisruptUntil`,
    /// `DoNotDisruptGracePeriodElapsed`).
    DoNotDisrupt {
        namespace: String,
        name: String,
        uid: String,
        reason: &'static str,
        warning: bool,
        message: String,
    },
    /// A NodePool whose budget allows no disruption for a reason (`DisruptionBlocked`).
    NodePoolBlocked {
        node_pool: String,
        reason: DisruptionReason,
        /// Why some of its budgets could not be read (each then allows nothing), if any.
        invalid_budgets: Option<String>,
    },
}

impl DisruptionEvent {
    pub fn event_reason(&self) -> &'static str {
        match self {
            DisruptionEvent::Unconsolidatable { .. } => names::EVENT_UNCONSOLIDATABLE,
            DisruptionEvent::ConsolidationApproved { .. } => names::EVENT_CONSOLIDATION_APPROVED,
            DisruptionEvent::ConsolidationCandidate { .. } => names::EVENT_CONSOLIDATION_CANDIDATE,
            DisruptionEvent::DoNotDisrupt { reason, .. } => reason,
            _ => names::EVENT_DISRUPTION_BLOCKED,
        }
    }

    /// What a repeat is recognised by, and for how long it is dropped: upstream's dedupe
    /// values and timeouts. A node's `Unconsolidatable`, `DisruptionBlocked` and
    /// `ConsolidationApproved` are keyed by the node alone, so a message that changes between
    /// passes (a node nominated, then not initialized, then under `consolidateAfter`) is not
    /// published again inside the window: at 1 000 nodes that was ~3 000 events in a launch.
    pub fn dedupe(&self) -> (String, std::time::Duration) {
        let reason = self.event_reason();
        match self {
            DisruptionEvent::Unconsolidatable { node, .. } => (
                format!("{reason}/{node}"),
                names::UNCONSOLIDATABLE_EVENT_DEDUPE,
            ),
            DisruptionEvent::Blocked { node, .. }
            | DisruptionEvent::ConsolidationApproved { node, .. } => {
                (format!("{reason}/{node}"), names::EVENT_DEDUPE)
            }
            // Upstream keys a candidate by its command, which is the message.
            DisruptionEvent::ConsolidationCandidate { node, message, .. } => {
                (format!("{reason}/{node}/{message}"), names::EVENT_DEDUPE)
            }
            DisruptionEvent::DoNotDisrupt {
                namespace,
                name,
                message,
                ..
            } => (
                format!("{reason}/{namespace}/{name}/{message}"),
                names::EVENT_DEDUPE,
            ),
            // An unreadable budget is news beside a window that is merely closed.
            DisruptionEvent::NodePoolBlocked {
                node_pool,
                reason: why,
                invalid_budgets,
            } => (
                format!(
                    "{reason}/{node_pool}/{}/{}",
                    why.as_str(),
                    invalid_budgets.as_deref().unwrap_or_default()
                ),
                names::NODEPOOL_BLOCKED_EVENT_DEDUPE,
            ),
        }
    }
}

/// One consolidation move a method evaluated, per NodePool of the move (upstream's
/// `karpenter_consolidation_moves_total` and, for `Balanced` pools, `karpenter_consolidation_score`).
#[derive(Clone, Debug, PartialEq)]
pub struct ConsolidationMove {
    pub nodepool: String,
    /// `approved` or `rejected`.
    pub decision: &'static str,
    /// The NodePool's consolidation policy, as spelt in its spec.
    pub policy: &'static str,
    /// The `Balanced` score; `None` for other policies.
    pub score: Option<f64>,
}

/// The moves of `cmd`, one per NodePool: a scored (`Balanced`) pool's own verdict, else the
/// command's. `scores` are [`balanced::scores`] of `cmd`.
pub(crate) fn moves_of(
    cmd: &Command,
    scores: &BTreeMap<String, balanced::Score>,
    approved: bool,
) -> Vec<ConsolidationMove> {
    let mut pools: BTreeMap<&str, &Candidate> = BTreeMap::new();
    for c in &cmd.candidates {
        pools.entry(c.node_pool.as_str()).or_insert(c);
    }
    pools
        .into_iter()
        .map(|(pool, c)| {
            let score = scores.get(pool).copied();
            let ok = score.map_or(approved, |s| s.approved());
            ConsolidationMove {
                nodepool: pool.to_string(),
                decision: if ok { "approved" } else { "rejected" },
                policy: c.consolidation_policy.as_str(),
                score: score.map(|s| s.value()),
            }
        })
        .collect()
}

/// Gauges the controller sets for one method.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MethodMetrics {
    pub eligible_nodes: usize,
    pub budgets: BTreeMap<String, PoolBudget>,
    pub timed_out: bool,
    /// How long the method took to evaluate (`..._decision_evaluation_duration_seconds`).
    pub evaluation: std::time::Duration,
    /// Each scheduling simulation the method ran
    /// (`karpenter_scheduler_scheduling_duration_seconds{controller="disruption"}`).
    pub simulations: Vec<std::time::Duration>,
}

/// The outcome of one method (or of a whole loop).
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub command: Option<Command>,
    pub events: Vec<DisruptionEvent>,
    /// Consolidation moves evaluated (single-node: each; multi-node: the chosen one).
    pub moves: Vec<ConsolidationMove>,
    pub metrics: BTreeMap<&'static str, MethodMetrics>,
    /// Candidates whose consolidation replacement was held back ([`hold_replacement`]).
    pub held_replacements: BTreeSet<String>,
    /// The nodes emptiness found eligible, within its budget or not.
    pub empty_nodes: BTreeSet<String>,
}

/// Runs the methods in order until one yields a command. `should_stop` is polled between
/// simulations: consolidation returns the best it found when it says stop (a timeout).
pub fn decide(view: &ClusterView, should_stop: &dyn Fn() -> bool) -> Outcome {
    let base = SimulationBase::new(view);
    let mut outcome = Outcome {
        events: do_not_disrupt_events(view),
        ..Outcome::default()
    };
    // An emptiness command of standby nodes only (its budget spent by nodes still being torn
    // down) is taken only if no other method has one: it decides nothing yet.
    let mut waiting = None;
    for method in Method::ORDER {
        let step = run_method(&base, method, should_stop);
        outcome.events.extend(step.events);
        outcome.moves.extend(step.moves);
        outcome.metrics.extend(step.metrics);
        outcome.empty_nodes.extend(step.empty_nodes);
        match step.command {
            Some(cmd) if cmd.candidates.is_empty() => waiting = Some(cmd),
            Some(cmd) => {
                outcome.command = Some(cmd);
                break;
            }
            None => {}
        }
    }
    if outcome.command.is_none() {
        outcome.command = waiting;
    }
    outcome.held_replacements = base.take_held();
    outcome
}

/// Upstream reports every duration-valued `karpenter.sh/do-not-disrupt` it evaluates: an
/// unreadable value (ignored, so the pod is disruptable), the instant the grace period ends, or
/// that it has ended. `"true"` says nothing.
pub fn do_not_disrupt_events(view: &ClusterView) -> Vec<DisruptionEvent> {
    let mut events = Vec::new();
    for node in view.nodes.iter().filter(|n| n.nodeclaim.is_some()) {
        for p in node.pods.iter().filter(|p| p.is_active()) {
            let Some(value) = p.do_not_disrupt.as_deref().filter(|v| *v != "true") else {
                continue;
            };
            let event = |reason, warning, message| DisruptionEvent::DoNotDisrupt {
                namespace: p.pod.namespace.clone(),
                name: p.pod.name.clone(),
                uid: p.pod.uid.clone(),
                reason,
                warning,
                message,
            };
            let grace = crate::apis::duration::parse_duration(value)
                .ok()
                .filter(|d| !d.is_zero());
            match (grace, p.started_at) {
                (None, _) => events.push(event(
                    names::EVENT_INVALID_DO_NOT_DISRUPT,
                    true,
                    format!(
                        "Invalid karpenter.sh/do-not-disrupt annotation: {value:?} is not a positive duration (like 30m or 1h30m), ignoring annotation"
                    ),
                )),
                // Not started yet: protected, and no instant to report.
                (Some(_), None) => {}
                (Some(grace), Some(start)) => {
                    // Ends beyond the last representable instant: protected for good, as
                    // `do_not_disrupt_active` has it.
                    let Some(until) = super::model::do_not_disrupt_until(start, grace) else {
                        events.push(event(
                            names::EVENT_DO_NOT_DISRUPT_UNTIL,
                            false,
                            "The karpenter.sh/do-not-disrupt grace period ends too far in the future to represent, the pod is protected as by \"true\"".into(),
                        ));
                        continue;
                    };
                    events.push(if until > view.now {
                        event(
                            names::EVENT_DO_NOT_DISRUPT_UNTIL,
                            false,
                            format!(
                                "The karpenter.sh/do-not-disrupt grace period will elapse at {}",
                                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                            ),
                        )
                    } else {
                        event(
                            names::EVENT_DO_NOT_DISRUPT_ELAPSED,
                            false,
                            "The karpenter.sh/do-not-disrupt grace period has elapsed, pod is now disruptable".into(),
                        )
                    });
                }
            }
        }
    }
    events
}

/// Runs one method.
pub fn run_method(
    base: &SimulationBase,
    method: Method,
    should_stop: &dyn Fn() -> bool,
) -> Outcome {
    let started = std::time::Instant::now();
    let view = base.view();
    let (eligible, mut events) = eligible_candidates(view, method);
    let any_balanced = view
        .pools
        .values()
        .any(|p| p.nodepool.spec.disruption.consolidation_policy == ConsolidationPolicy::Balanced);
    let totals = if any_balanced
        && matches!(
            method,
            Method::MultiNodeConsolidation | Method::SingleNodeConsolidation
        ) {
        balanced::pool_totals(view, &candidates(view, method.class()).0)
    } else {
        BTreeMap::new()
    };
    let (mut budgets, pool_events) = budget_mapping(view, method.reason());
    events.extend(pool_events);
    let mut metrics = MethodMetrics {
        eligible_nodes: eligible.len(),
        budgets: budgets.pools.clone(),
        timed_out: false,
        evaluation: std::time::Duration::ZERO,
        simulations: Vec::new(),
    };
    // Simulations of an earlier method on this base (none in the controller's order) are not
    // this method's.
    base.take_timings();
    let mut moves = Vec::new();
    let empty_nodes = if method == Method::Emptiness {
        eligible.iter().map(|c| c.name.clone()).collect()
    } else {
        BTreeSet::new()
    };
    let command = match method {
        Method::Emptiness => emptiness(eligible, &mut budgets),
        Method::StaticDrift => static_drift(view, eligible, &budgets),
        Method::Drift => drift(base, eligible, &budgets, &mut events),
        Method::MultiNodeConsolidation => {
            let (cmd, timed_out) = multi_node(base, eligible, &mut budgets, &totals, should_stop);
            metrics.timed_out = timed_out;
            if let Some(cmd) = &cmd {
                moves = moves_of(cmd, &balanced::scores(cmd, &totals), true);
            }
            cmd
        }
        Method::SingleNodeConsolidation => {
            let (cmd, timed_out) = single_node(
                base,
                eligible,
                &budgets,
                &totals,
                &mut events,
                &mut moves,
                should_stop,
            );
            metrics.timed_out = timed_out;
            cmd
        }
    };
    metrics.evaluation = started.elapsed();
    metrics.simulations = base.take_timings();
    if let Some(cmd) = &command {
        if matches!(
            method,
            Method::MultiNodeConsolidation | Method::SingleNodeConsolidation
        ) {
            events.extend(candidate_events(cmd));
        }
        events.extend(approved_events(cmd, &totals));
    }
    let key = match method {
        Method::Emptiness => "emptiness",
        Method::StaticDrift => "static_drift",
        Method::Drift => "drift",
        Method::MultiNodeConsolidation => "multi",
        Method::SingleNodeConsolidation => "single",
    };
    Outcome {
        command,
        events,
        moves,
        metrics: [(key, metrics)].into_iter().collect(),
        held_replacements: BTreeSet::new(),
        empty_nodes,
    }
}

/// Upstream's `ConsolidationCandidate` for each candidate of a computed consolidation command.
fn candidate_events(cmd: &Command) -> Vec<DisruptionEvent> {
    let savings = cmd.estimated_savings();
    cmd.candidates
        .iter()
        .map(|c| DisruptionEvent::ConsolidationCandidate {
            node: c.name.clone(),
            nodeclaim: Some(c.nodeclaim.clone()),
            message: format!(
                "Consolidation candidate: {} (savings: ${savings:.2})",
                cmd.describe_for(&c.name)
            ),
        })
        .collect()
}

/// `ConsolidationApproved` for each candidate of the `Balanced` NodePools that scored the
/// chosen command (none without totals: not a consolidation method, or no Balanced pool).
fn approved_events(cmd: &Command, totals: &BTreeMap<String, PoolTotals>) -> Vec<DisruptionEvent> {
    if totals.is_empty() {
        return Vec::new();
    }
    let scores = balanced::scores(cmd, totals);
    cmd.candidates
        .iter()
        .filter_map(|c| {
            let score = scores.get(&c.node_pool)?;
            Some(DisruptionEvent::ConsolidationApproved {
                node: c.name.clone(),
                nodeclaim: Some(c.nodeclaim.clone()),
                message: balanced::approved_message(*score),
            })
        })
        .collect()
}

/// Budgets of every NodePool for `reason`, plus events for pools that allow nothing.
pub fn budget_mapping(
    view: &ClusterView,
    reason: DisruptionReason,
) -> (BudgetMapping, Vec<DisruptionEvent>) {
    let mut counts: BTreeMap<&str, BudgetCounts> = BTreeMap::new();
    for n in &view.nodes {
        if n.nodeclaim.is_none() || !n.initialized || n.instance_terminating {
            continue;
        }
        let Some(pool) = n.node_pool() else { continue };
        let c = counts.entry(pool).or_default();
        c.nodes += 1;
        if !n.ready || n.marked_for_deletion {
            c.disrupting += 1;
        }
    }
    let mut mapping = BudgetMapping::default();
    let mut events = Vec::new();
    for (name, pool) in &view.pools {
        let c = counts.get(name.as_str()).copied().unwrap_or_default();
        // A budget that cannot be read fails closed (0 allowed); the blocked event names why.
        let (budget, errors) =
            PoolBudget::compute(&pool.nodepool.spec.disruption.budgets, c, view.now, reason);
        if budget.blocked {
            let invalid_budgets = (!errors.is_empty()).then(|| {
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            });
            events.push(DisruptionEvent::NodePoolBlocked {
                node_pool: name.clone(),
                reason,
                invalid_budgets,
            });
        }
        mapping.pools.insert(name.clone(), budget);
    }
    (mapping, events)
}

/// Candidates the method may act on (upstream `ShouldDisrupt`), sorted as the method wants.
pub fn eligible_candidates(
    view: &ClusterView,
    method: Method,
) -> (Vec<Candidate>, Vec<DisruptionEvent>) {
    let (all, rejected) = candidates(view, method.class());
    let mut events = blocked_events(rejected);
    let mut eligible = Vec::new();
    for c in all {
        match should_disrupt(view, method, &c) {
            Ok(()) => eligible.push(c),
            Err(Some(message)) => events.push(DisruptionEvent::Unconsolidatable {
                node: c.name.clone(),
                nodeclaim: c.nodeclaim.clone(),
                message,
            }),
            Err(None) => {}
        }
    }
    sort_by_disruption_cost(&mut eligible);
    if matches!(method, Method::Drift | Method::StaticDrift) {
        // Oldest drift first, empty nodes before the others.
        eligible.sort_by(|a, b| {
            let since = |c: &Candidate| view.nodes[c.index].drifted_since;
            (!a.is_empty(), since(a), &a.name).cmp(&(!b.is_empty(), since(b), &b.name))
        });
    }
    (eligible, events)
}

/// `DisruptionBlocked` for the rejected nodes this controller manages.
fn blocked_events(rejected: Vec<super::candidates::Rejection>) -> Vec<DisruptionEvent> {
    rejected
        .into_iter()
        .filter(|r| r.nodeclaim.is_some())
        .map(|r| DisruptionEvent::Blocked {
            node: r.node,
            nodeclaim: r.nodeclaim,
            message: r.reason,
        })
        .collect()
}

/// The events of a pass whose decision is skipped because nothing changed since a fruitless
/// one. Upstream evaluates candidates on every pass, so what blocks each node keeps being
/// reported (deduplicated) while consolidation rests. Without it a node first blocked as "not
/// initialized" kept that as its last word for the memo's five minutes after a PDB began to
/// hold it: its `DisruptionBlocked` shares one dedupe key per node, and no pass ran once the
/// window had passed.
pub fn resting_events(view: &ClusterView) -> Vec<DisruptionEvent> {
    let mut events = do_not_disrupt_events(view);
    let mut classes = Vec::new();
    for method in Method::ORDER {
        if !classes.contains(&method.class()) {
            classes.push(method.class());
            events.extend(blocked_events(candidates(view, method.class()).1));
        }
    }
    events
}

/// `Err(Some(msg))`: not eligible, worth an `Unconsolidatable` event; `Err(None)`: silently not.
fn should_disrupt(view: &ClusterView, method: Method, c: &Candidate) -> Result<(), Option<String>> {
    let node = &view.nodes[c.index];
    let pool = &view.pools[&c.node_pool];
    if pool.is_static() != (method == Method::StaticDrift) {
        // Static NodePools keep their replicas: only a drifted node is ever replaced.
        return Err(None);
    }
    let disruption = &pool.nodepool.spec.disruption;
    let consolidate_after = parse_nillable_duration(&disruption.consolidate_after);
    let consolidate_after_never = matches!(consolidate_after, Ok(None));
    // `Consolidatable` as of the last conditions pass, and still quiet now.
    let quiet = node.consolidatable
        && match consolidate_after {
            Ok(Some(after)) => quiet_since_pod_event(node.last_pod_event, after, view.now),
            _ => false,
        };
    match method {
        Method::Drift | Method::StaticDrift => node.drifted_since.map(|_| ()).ok_or(None),
        Method::Emptiness => {
            if consolidate_after_never {
                return Err(Some(format!(
                    "NodePool {:?} has consolidation disabled",
                    c.node_pool
                )));
            }
            if !c.is_empty() || !quiet {
                return Err(None);
            }
            Ok(())
        }
        Method::MultiNodeConsolidation | Method::SingleNodeConsolidation => {
            if c.is_empty() {
                // Emptiness owns empty nodes.
                return Err(None);
            }
            if c.instance_type.is_none() {
                return Err(Some(format!(
                    "Instance Type {:?} not found",
                    node.label(crate::apis::labels::INSTANCE_TYPE_LABEL)
                        .unwrap_or_default()
                )));
            }
            if c.capacity_type.is_empty() {
                return Err(Some(format!(
                    "Node does not have label {:?}",
                    crate::apis::labels::CAPACITY_TYPE_LABEL
                )));
            }
            if c.zone.is_empty() {
                return Err(Some(format!(
                    "Node does not have label {:?}",
                    crate::apis::labels::ZONE_LABEL
                )));
            }
            if consolidate_after_never {
                return Err(Some(format!(
                    "NodePool {:?} has consolidation disabled",
                    c.node_pool
                )));
            }
            if disruption.consolidation_policy == ConsolidationPolicy::WhenEmpty {
                return Err(Some(format!(
                    "NodePool {:?} has non-empty consolidation disabled",
                    c.node_pool
                )));
            }
            if !quiet {
                return Err(None);
            }
            Ok(())
        }
    }
}

/// Emptiness: every eligible empty node its pool's budget allows, in one delete command. The
/// empty nodes the budget leaves out stand by for validation, up to what the budget allows when
/// nothing is being disrupted: nodes the previous command is still tearing down spend the
/// budget now, and are mostly gone when this one is validated 15 s later. A command may then
/// have only standby nodes; [`decide`] lets the other methods go first.
fn emptiness(eligible: Vec<Candidate>, budgets: &mut BudgetMapping) -> Option<Command> {
    let mut picked = Vec::new();
    let mut standby = Vec::new();
    let mut per_pool: BTreeMap<String, usize> = BTreeMap::new();
    for c in eligible {
        let allowed = budgets.pools.get(&c.node_pool).map_or(0, |b| b.allowed);
        let count = per_pool.entry(c.node_pool.clone()).or_default();
        if budgets.take(&c.node_pool) {
            picked.push(c);
            *count += 1;
        } else if *count < allowed {
            standby.push(c);
            *count += 1;
        }
    }
    (!picked.is_empty() || !standby.is_empty()).then(|| Command {
        method: Method::Emptiness,
        candidates: picked,
        replacements: Vec::new(),
        standby,
    })
}

/// Drift: the first drifted node whose pool has budget and whose pods all find a home;
/// replacements are whatever the simulation needs to launch.
fn drift(
    base: &SimulationBase,
    eligible: Vec<Candidate>,
    budgets: &BudgetMapping,
    events: &mut Vec<DisruptionEvent>,
) -> Option<Command> {
    for c in eligible {
        if budgets.remaining(&c.node_pool) == 0 {
            continue;
        }
        let sim = base.simulate(&[&c]);
        if !sim.all_non_pending_pods_scheduled() {
            events.push(DisruptionEvent::Blocked {
                node: c.name.clone(),
                nodeclaim: Some(c.nodeclaim.clone()),
                message: format!(
                    "Scheduling simulation failed to schedule all pods ({})",
                    sim.errors.join("; ")
                ),
            });
            continue;
        }
        return Some(Command {
            method: Method::Drift,
            candidates: vec![c],
            replacements: sim.results.new_node_claims,
            standby: Vec::new(),
        });
    }
    None
}

/// Static drift (upstream `StaticDrift`): the oldest drifted node of a static NodePool with
/// budget is replaced by one NodeClaim from the template, no scheduling simulation — unless the
/// pool is above its replicas (a scale-down is under way; it removes nodes first).
fn static_drift(
    view: &ClusterView,
    eligible: Vec<Candidate>,
    budgets: &BudgetMapping,
) -> Option<Command> {
    for c in eligible {
        if budgets.remaining(&c.node_pool) == 0 {
            continue;
        }
        let pool = &view.pools[&c.node_pool];
        // Its replacement could not launch (no NodeClass, an invalid template): the drifted
        // node would be tainted and restored on every pass. It waits for the pool to be Ready.
        if !pool.nodepool.is_ready() {
            continue;
        }
        let replicas = pool.nodepool.spec.replicas.unwrap_or(0).max(0) as usize;
        let counted = view
            .nodes
            .iter()
            .filter(|n| n.nodeclaim.is_some() && n.node_pool() == Some(c.node_pool.as_str()))
            .count();
        if counted > replicas {
            continue;
        }
        let Some(replacement) =
            crate::scheduling::NewNodeClaim::from_template(&pool.template, &pool.instance_types)
        else {
            continue;
        };
        return Some(Command {
            method: Method::StaticDrift,
            candidates: vec![c],
            replacements: vec![replacement],
            standby: Vec::new(),
        });
    }
    None
}

/// Whether removing `candidates` works out: delete when their pods fit on the rest of the
/// cluster, replace when exactly one strictly cheaper NodeClaim takes them, else why not.
pub fn compute_consolidation(
    base: &SimulationBase,
    method: Method,
    candidates: &[&Candidate],
) -> Result<Command, String> {
    let sim = base.simulate_consolidation(candidates);
    if !sim.all_non_pending_pods_scheduled() {
        return Err(format!(
            "not all pods would schedule, {}",
            sim.errors.join("; ")
        ));
    }
    let owned = || candidates.iter().map(|c| (*c).clone()).collect::<Vec<_>>();
    let mut claims = sim.results.new_node_claims;
    match claims.len() {
        0 => {
            return Ok(Command {
                method,
                candidates: owned(),
                replacements: Vec::new(),
                standby: Vec::new(),
            });
        }
        1 => {
            if let Some(why) = hold_replacement(base, candidates) {
                return Err(why);
            }
        }
        n => return Err(format!("Can't remove without creating {n} candidates")),
    }
    let mut claim = claims.remove(0);
    let capacity_types = claim.requirements.get(CAPACITY_TYPE).cloned();
    let allows = |ct: &str| capacity_types.as_ref().is_none_or(|r| r.has(ct));
    let all_spot = candidates
        .iter()
        .all(|c| c.capacity_type == CAPACITY_TYPE_SPOT);
    if all_spot && allows(CAPACITY_TYPE_SPOT) {
        // Upstream gates spot-to-spot replacement behind a feature flag that is off by default.
        return Err(
            "SpotToSpotConsolidation is disabled, can't replace a spot node with a spot node"
                .into(),
        );
    }
    let total_price: f64 = candidates.iter().map(|c| c.price).sum();
    if allows(CAPACITY_TYPE_SPOT) && allows(CAPACITY_TYPE_ON_DEMAND) {
        // Prices are compared as if spot launches; never fall back to pricier on-demand.
        claim
            .requirements
            .add(Requirement::in_values(CAPACITY_TYPE, [CAPACITY_TYPE_SPOT]));
    }
    let cheaper = cheaper_than(&claim.instance_types, &claim.requirements, total_price);
    if cheaper.is_empty() {
        return Err("Can't replace with a cheaper node".into());
    }
    claim.instance_types = cheaper;
    Ok(Command {
        method,
        candidates: owned(),
        replacements: vec![claim],
        standby: Vec::new(),
    })
}

/// A replacement is held back for settling nodes at most this many times its NodePool's
/// `consolidateAfter`, and never longer than [`MAX_HOLD`].
const HOLD_FACTOR: u32 = 2;
const MAX_HOLD: Duration = Duration::from_secs(600);

/// Why a replacement waits instead (the `Unconsolidatable` event's message).
pub const HELD_FOR_SETTLING: &str = "Can't replace yet: the pods would fit on nodes that had pod events within consolidateAfter, waiting for them to settle";

/// Holds back a consolidation replacement when the candidates' pods would fit on the rest of
/// the cluster, with no new node, but for nodes that are settling (a pod event within
/// `consolidateAfter`; consolidation keeps running pods off those). After a consolidation
/// deletes a node, kube-scheduler spreads its pods over the others, so every node settles at
/// once; replacing the next candidate then launches a node that is itself consolidated away
/// once they settle, evicting the same pods twice. Waiting lets the candidate be deleted with
/// no new node. Nodes that keep settling (pods churning on them) hold a candidate back only
/// for [`HOLD_FACTOR`] × `consolidateAfter` (at most [`MAX_HOLD`]) since the first pass that
/// held it; then it is replaced, as upstream would at once.
fn hold_replacement(base: &SimulationBase, candidates: &[&Candidate]) -> Option<String> {
    if !base.any_active_node_settling() {
        return None;
    }
    let view = base.view();
    let still_held = |c: &&Candidate| {
        let since = view
            .held_replacements
            .get(&c.name)
            .copied()
            .unwrap_or(view.now);
        let limit = view
            .pools
            .get(&c.node_pool)
            .and_then(|p| consolidate_after(&p.nodepool))
            .map_or(Duration::ZERO, |after| (after * HOLD_FACTOR).min(MAX_HOLD));
        (view.now - since).to_std().unwrap_or_default() < limit
    };
    if !candidates.iter().any(still_held) {
        return None;
    }
    let anywhere = base.simulate(candidates);
    if !anywhere.all_non_pending_pods_scheduled() || !anywhere.new_node_claims().is_empty() {
        return None;
    }
    base.note_held(candidates);
    Some(HELD_FOR_SETTLING.to_string())
}

/// What to remember after a pass, for held replacements and for empty nodes alike: each node
/// the pass held (or found empty), since the first of the consecutive passes that did. A node
/// the pass did not is forgotten.
pub fn carry_first_seen(
    previous: &BTreeMap<String, DateTime<Utc>>,
    held_now: &BTreeSet<String>,
    now: DateTime<Utc>,
) -> BTreeMap<String, DateTime<Utc>> {
    held_now
        .iter()
        .map(|name| (name.clone(), previous.get(name).copied().unwrap_or(now)))
        .collect()
}

/// Multi-node replacements must not be a node type being removed unless it is cheaper than
/// the cheapest removed node of that type: deleting fewer nodes would do the same with less churn.
fn filter_out_same_type(cmd: &mut Command) -> bool {
    let Some(claim) = cmd.replacements.first_mut() else {
        return true;
    };
    let mut cheapest_removed: BTreeMap<&str, f64> = BTreeMap::new();
    for c in &cmd.candidates {
        if let Some(it) = &c.instance_type
            && let Some(o) = it
                .offerings
                .iter()
                .find(|o| o.zone == c.zone && o.capacity_type == c.capacity_type)
        {
            let e = cheapest_removed.entry(it.name.as_str()).or_insert(f64::MAX);
            *e = e.min(o.price);
        }
    }
    let max_price = claim
        .instance_types
        .iter()
        .filter_map(|it| cheapest_removed.get(it.name.as_str()).copied())
        .fold(f64::MAX, f64::min);
    claim.instance_types = cheaper_than(&claim.instance_types, &claim.requirements, max_price);
    !claim.instance_types.is_empty()
}

/// Multi-node consolidation: binary search for the longest prefix of the cheapest-to-disrupt
/// candidates (at least two) that can go with at most one cheaper replacement.
fn multi_node(
    base: &SimulationBase,
    eligible: Vec<Candidate>,
    budgets: &mut BudgetMapping,
    totals: &BTreeMap<String, PoolTotals>,
    should_stop: &dyn Fn() -> bool,
) -> (Option<Command>, bool) {
    let within_budget: Vec<Candidate> = eligible
        .into_iter()
        .filter(|c| budgets.take(&c.node_pool))
        .take(MAX_MULTI_NODE_CANDIDATES)
        .collect();
    if within_budget.len() < 2 {
        return (None, false);
    }
    let (mut min, mut max) = (1usize, within_budget.len() - 1);
    let mut best = None;
    while min <= max {
        if should_stop() {
            return (best, true);
        }
        let mid = (min + max) / 2;
        let prefix: Vec<&Candidate> = within_budget[..=mid].iter().collect();
        let ok = match compute_consolidation(base, Method::MultiNodeConsolidation, &prefix) {
            Ok(mut cmd) => {
                (filter_out_same_type(&mut cmd) && balanced::approve(&cmd, totals)).then_some(cmd)
            }
            Err(_) => None,
        };
        match ok {
            Some(cmd) => {
                best = Some(cmd);
                min = mid + 1;
            }
            None => max = mid - 1,
        }
    }
    (best, false)
}

/// Single-node consolidation: candidates cheapest to disrupt first, NodePools interleaved; the
/// first node that can be deleted or replaced by something strictly cheaper wins.
fn single_node(
    base: &SimulationBase,
    eligible: Vec<Candidate>,
    budgets: &BudgetMapping,
    totals: &BTreeMap<String, PoolTotals>,
    events: &mut Vec<DisruptionEvent>,
    moves: &mut Vec<ConsolidationMove>,
    should_stop: &dyn Fn() -> bool,
) -> (Option<Command>, bool) {
    for c in interleave_by_pool(eligible) {
        if budgets.remaining(&c.node_pool) == 0 || !balanced::can_pass_threshold(&c, totals) {
            continue;
        }
        if should_stop() {
            return (None, true);
        }
        match compute_consolidation(base, Method::SingleNodeConsolidation, &[&c]) {
            Ok(cmd) => {
                let scores = balanced::scores(&cmd, totals);
                let approved = scores.values().all(|s| s.approved());
                // Every evaluated move is counted; Balanced rejections are not published.
                moves.extend(moves_of(&cmd, &scores, approved));
                if approved {
                    return (Some(cmd), false);
                }
            }
            Err(message) => events.push(DisruptionEvent::Unconsolidatable {
                node: c.name.clone(),
                nodeclaim: c.nodeclaim.clone(),
                message,
            }),
        }
    }
    (None, false)
}

/// Round-robin across NodePools, keeping each pool's order, so one big pool cannot starve
/// the others when time runs out.
pub fn interleave_by_pool(sorted: Vec<Candidate>) -> Vec<Candidate> {
    let mut queues: BTreeMap<String, std::collections::VecDeque<Candidate>> = BTreeMap::new();
    let mut pool_order: Vec<String> = Vec::new();
    for c in sorted {
        if !queues.contains_key(&c.node_pool) {
            pool_order.push(c.node_pool.clone());
        }
        queues.entry(c.node_pool.clone()).or_default().push_back(c);
    }
    let mut out = Vec::new();
    loop {
        let mut progressed = false;
        for pool in &pool_order {
            if let Some(c) = queues.get_mut(pool).and_then(|q| q.pop_front()) {
                out.push(c);
                progressed = true;
            }
        }
        if !progressed {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::nodepool::DisruptionReason;

    fn blocked(node: &str, message: &str) -> DisruptionEvent {
        DisruptionEvent::Blocked {
            node: node.into(),
            nodeclaim: Some(format!("{node}-claim")),
            message: message.into(),
        }
    }

    #[test]
    fn a_do_not_disrupt_duration_beyond_representable_time_protects_without_panicking() {
        use crate::disruption::fixtures::{
            instance_type, instance_types, node, nodepool, pod, pool, view,
        };
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("valid instant");
        let mut pinned = pod("pinned", "100m", "64Mi");
        pinned.do_not_disrupt = Some("9999999999h".into());
        pinned.started_at = Some(now);
        assert!(pinned.do_not_disrupt_active(now));
        assert!(!pinned.is_evictable(now));

        let v = view(
            now,
            vec![pool(
                nodepool("default", "{budgets: [{nodes: \"100%\"}]}"),
                instance_types(),
            )],
            vec![node(
                "n",
                "default",
                &instance_type("large", 4),
                vec![pinned],
                now,
            )],
        );
        let events = do_not_disrupt_events(&v);
        assert!(
            matches!(
                events.as_slice(),
                [DisruptionEvent::DoNotDisrupt { reason, warning: false, .. }]
                    if *reason == names::EVENT_DO_NOT_DISRUPT_UNTIL
            ),
            "{events:?}"
        );
    }

    #[test]
    fn a_node_s_blocked_and_unconsolidatable_events_repeat_by_node_not_by_message() {
        let (nominated, window) = blocked("n1", "node is nominated for a pending pod").dedupe();
        let (uninitialized, _) = blocked("n1", "node is not initialized").dedupe();
        assert_eq!(nominated, uninitialized, "a new message is still a repeat");
        assert_eq!(window, names::EVENT_DEDUPE);
        assert_ne!(
            nominated,
            blocked("n2", "node is nominated for a pending pod")
                .dedupe()
                .0
        );

        let unconsolidatable = |message: &str| DisruptionEvent::Unconsolidatable {
            node: "n1".into(),
            nodeclaim: "n1-claim".into(),
            message: message.into(),
        };
        let (a, window) = unconsolidatable("Can't replace with a cheaper node").dedupe();
        let (b, _) = unconsolidatable("not all pods would schedule").dedupe();
        assert_eq!(a, b);
        assert_eq!(window, names::UNCONSOLIDATABLE_EVENT_DEDUPE);
        assert_ne!(a, nominated, "the reason is part of the key");
    }

    #[test]
    fn candidates_repeat_by_command_and_pools_by_disruption_reason() {
        let candidate = |message: &str| DisruptionEvent::ConsolidationCandidate {
            node: "n1".into(),
            nodeclaim: None,
            message: message.into(),
        };
        assert_ne!(
            candidate("Delete/n1").dedupe().0,
            candidate("Replace/n1 with standard.small").dedupe().0
        );
        let pool = |reason| DisruptionEvent::NodePoolBlocked {
            node_pool: "default".into(),
            reason,
            invalid_budgets: None,
        };
        let (empty, window) = pool(DisruptionReason::Empty).dedupe();
        assert_ne!(empty, pool(DisruptionReason::Drifted).dedupe().0);
        let unreadable = DisruptionEvent::NodePoolBlocked {
            node_pool: "default".into(),
            reason: DisruptionReason::Empty,
            invalid_budgets: Some("invalid budget schedule".into()),
        };
        assert_ne!(empty, unreadable.dedupe().0);
        assert_eq!(window, names::NODEPOOL_BLOCKED_EVENT_DEDUPE);
    }
}
