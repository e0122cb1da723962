//! Re-checking a decision after `COMMAND_VALIDATION_DELAY`: the cluster may have changed while
//! the decision waited (pods landed, a node got nominated, the budget got spent).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};

use thiserror::Error;

use super::candidates::Candidate;
use super::command::{Command, Decision, Method, instance_types_subset};
use super::methods::{budget_mapping, eligible_candidates};
use super::model::ClusterView;
use super::simulate::SimulationBase;

/// How long emptiness and consolidation decisions wait before they are re-checked.
pub const COMMAND_VALIDATION_DELAY: Duration = Duration::from_secs(15);

/// Whether a deletion was already watched for the validation delay by the passes before the one
/// that decided it (`view` is that pass's), so the re-check after [`COMMAND_VALIDATION_DELAY`]
/// has been made and waiting it again would only slow every deletion of a scale-down:
/// - a consolidation deletion, each of whose candidates had its replacement held back for
///   settling nodes (`methods::hold_replacement`) in consecutive passes since at least the
///   delay ago: those passes found it eligible and its pods a place on the settling nodes, and
///   this pass places them on settled ones;
/// - an emptiness command (its standby included), each of whose nodes every pass found empty
///   and eligible since at least the delay ago, while no pod is pending: a pending pod could be
///   about to be nominated to an empty node, which validation is there to see.
///
/// In both, no pod may have come to or left the node within the delay: passes are samples
/// (10 s apart, or further while a command runs), and a pod that came and went between two of
/// them is seen only in the node's pod events, which the watch records as they happen.
///
/// Replacements, and commands with a node not watched that long, wait for validation.
pub fn watched_long_enough(command: &Command, view: &ClusterView) -> bool {
    let delay = chrono::Duration::from_std(COMMAND_VALIDATION_DELAY).unwrap_or_default();
    let watched = |since: &BTreeMap<String, DateTime<Utc>>, c: &Candidate| {
        let quiet = view
            .nodes
            .get(c.index)
            .is_some_and(|n| n.last_pod_event.is_none_or(|at| view.now - at >= delay));
        quiet
            && since
                .get(&c.name)
                .is_some_and(|first| view.now - *first >= delay)
    };
    if !command.method.needs_validation() || command.decision() != Decision::Delete {
        return false;
    }
    if command.method == Method::Emptiness {
        let mut nodes = command.candidates.iter().chain(&command.standby).peekable();
        return view.pending_pods.is_empty()
            && nodes.peek().is_some()
            && nodes.all(|c| watched(&view.empty_since, c));
    }
    !command.candidates.is_empty()
        && command
            .candidates
            .iter()
            .all(|c| watched(&view.held_replacements, c))
}

/// Whether what the pass at `last_pass` watched still counts at `now`: passes come every
/// `poll_interval`, or one validation delay apart around a command. A longer gap (a wait for
/// replacements, lost leadership) left the held candidates unwatched meanwhile.
pub fn passes_close_enough(
    last_pass: DateTime<Utc>,
    now: DateTime<Utc>,
    poll_interval: Duration,
) -> bool {
    let max_gap = chrono::Duration::from_std(COMMAND_VALIDATION_DELAY + poll_interval * 2)
        .unwrap_or_default();
    now - last_pass <= max_gap
}

/// Why a decision was abandoned; the message goes into `ConsolidationRejected` events.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ValidationError {
    #[error("candidates are no longer eligible for disruption ({0})")]
    Churn(String),
    #[error("a disruption budget no longer allows disrupting {0}")]
    Budget(String),
    #[error("scheduling simulation changed: {0}")]
    Scheduling(String),
    #[error("no candidate is still eligible")]
    Empty,
}

/// Recomputes the decision against a fresh view. Emptiness keeps the candidates that are still
/// empty and within budget, then fills the budget freed meanwhile from its standby nodes (empty
/// at the decision too, so they waited as long); consolidation must find every candidate still
/// eligible and within budget, and the same outcome: a delete still needs no new node, a
/// replace still needs exactly one whose instance types include every option of the original.
/// Drift is not re-validated.
pub fn validate(command: &Command, fresh: &ClusterView) -> Result<Command, ValidationError> {
    if !command.method.needs_validation() {
        return Ok(command.clone());
    }
    let (eligible, _) = eligible_candidates(fresh, command.method);
    let (mut budgets, _) = budget_mapping(fresh, command.method.reason());
    let by_name: HashMap<&str, &Candidate> =
        eligible.iter().map(|c| (c.name.as_str(), c)).collect();
    let find = |name: &str| by_name.get(name).map(|c| (*c).clone());
    if command.method == Method::Emptiness {
        // The decided candidates first: the standby only takes what is left.
        let kept: Vec<Candidate> = command
            .candidates
            .iter()
            .chain(&command.standby)
            .filter_map(|c| find(&c.name))
            .filter(|c| budgets.take(&c.node_pool))
            .collect();
        if kept.is_empty() {
            return Err(ValidationError::Empty);
        }
        return Ok(Command {
            method: command.method,
            candidates: kept,
            replacements: Vec::new(),
            standby: Vec::new(),
        });
    }
    let mut current = Vec::with_capacity(command.candidates.len());
    for c in &command.candidates {
        let fresh_candidate =
            find(&c.name).ok_or_else(|| ValidationError::Churn(c.name.clone()))?;
        if !budgets.take(&fresh_candidate.node_pool) {
            return Err(ValidationError::Budget(c.name.clone()));
        }
        current.push(fresh_candidate);
    }
    let base = SimulationBase::new(fresh);
    let refs: Vec<&Candidate> = current.iter().collect();
    let sim = base.simulate_consolidation(&refs);
    if !sim.all_non_pending_pods_scheduled() {
        return Err(ValidationError::Scheduling(sim.errors.join("; ")));
    }
    let claims = sim.new_node_claims();
    match command.decision() {
        Decision::Delete if !claims.is_empty() => {
            return Err(ValidationError::Scheduling(format!(
                "deleting now needs {} new node(s)",
                claims.len()
            )));
        }
        Decision::Replace if claims.len() != 1 => {
            return Err(ValidationError::Scheduling(format!(
                "replacing now needs {} new nodes instead of 1",
                claims.len()
            )));
        }
        Decision::Replace
            if !instance_types_subset(
                &command.replacements[0].instance_types,
                &claims[0].instance_types,
            ) =>
        {
            return Err(ValidationError::Scheduling(
                "the replacement's instance types no longer fit the pods".into(),
            ));
        }
        _ => {}
    }
    Ok(Command {
        method: command.method,
        candidates: current,
        replacements: command.replacements.clone(),
        standby: Vec::new(),
    })
}
