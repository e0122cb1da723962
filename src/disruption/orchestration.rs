//! Executing a decision, as a state machine the controller drives: it performs the returned
//! actions and reports what it observes. Replacements are launched and must be initialized
//! before any candidate is deleted; if a replacement fails, the candidates are restored.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::apis::nodepool::DisruptionReason;
use crate::scheduling::NewNodeClaim;

use super::command::Command;
use super::model::ClusterView;
use super::names;
use super::validation::{COMMAND_VALIDATION_DELAY, ValidationError, validate};

/// The object an event is recorded on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventTarget {
    Node(String),
    NodeClaim(String),
    /// Each replacement NodeClaim of the command (named once the provisioner created them).
    Replacements,
}

/// Something the controller must do, in order.
#[derive(Clone, Debug)]
pub enum Action {
    /// Come back (with a fresh view for validation, or an observation) at this instant.
    RequeueAt(DateTime<Utc>),
    /// Add `karpenter.sh/disrupted:NoSchedule` to these Nodes (optimistic-lock patch).
    Taint { nodes: Vec<String> },
    /// Set NodeClaim condition `DisruptionReason=True` with the method's reason.
    SetDisruptionReason {
        nodeclaims: Vec<String>,
        reason: DisruptionReason,
    },
    /// Create these NodeClaims through the provisioner (`reason` label = lower-case reason).
    LaunchReplacements {
        claims: Vec<NewNodeClaim>,
        reason: String,
    },
    /// Mark the candidates for deletion in cluster state and nominate the destinations; only
    /// after the replacements exist, or the provisioner would launch capacity twice.
    MarkForDeletion { provider_ids: Vec<String> },
    /// Delete the candidates' NodeClaims; node termination drains them.
    DeleteNodeClaims { nodeclaims: Vec<String> },
    /// Undo `Taint`, `SetDisruptionReason` and `MarkForDeletion`.
    Restore {
        nodes: Vec<String>,
        nodeclaims: Vec<String>,
        provider_ids: Vec<String>,
    },
    Event {
        target: EventTarget,
        reason: &'static str,
        message: String,
    },
    /// Increment a counter with these labels.
    Count {
        metric: &'static str,
        labels: Vec<(&'static str, String)>,
    },
    /// Add `amount` to a counter with these labels.
    Add {
        metric: &'static str,
        labels: Vec<(&'static str, String)>,
        amount: u64,
    },
}

/// What the controller saw of a replacement NodeClaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplacementStatus {
    /// Created, not yet initialized.
    Pending,
    Initialized,
    /// Deleted or failed to launch (e.g. insufficient capacity, liveness timeout).
    Gone,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Waiting for the validation delay to pass.
    Validating { at: DateTime<Utc> },
    /// Candidates tainted; replacements launched and awaited.
    WaitingForReplacements { since: DateTime<Utc> },
    /// Candidates deleted.
    Done,
    /// Abandoned; nothing was deleted.
    Failed { reason: String },
}

/// Longest a command may wait for its replacements: 80 ms per queued command, between 10 min
/// and 1 h.
pub fn command_timeout(queued_commands: usize) -> Duration {
    let scaled = Duration::from_millis(80).saturating_mul(queued_commands as u32);
    scaled.clamp(Duration::from_secs(600), Duration::from_secs(3600))
}

/// How soon watched empty nodes waiting for the budget look whether it was freed.
pub const STANDBY_RECHECK: Duration = Duration::from_secs(1);

/// One command on its way through validation and execution.
#[derive(Clone, Debug)]
pub struct Orchestration {
    pub command: Command,
    pub phase: Phase,
    pub timeout: Duration,
    /// Watched standby nodes looking again after [`STANDBY_RECHECK`], not after validation's
    /// delay: a pod pending by then sends them back to a validated command.
    pub standby_recheck: bool,
}

impl Orchestration {
    /// Begins a decision: consolidation and emptiness wait for validation first, drift starts
    /// at once.
    pub fn new(
        command: Command,
        now: DateTime<Utc>,
        queued_commands: usize,
    ) -> (Self, Vec<Action>) {
        Self::begin(command, now, queued_commands, false)
    }

    /// As [`Orchestration::new`]; `watched` says the command was already re-checked over the
    /// validation delay ([`super::validation::watched_long_enough`]): it is validated at once
    /// (against a fresh view, not after the delay), and empty nodes waiting for the budget
    /// (standby only) look again after [`STANDBY_RECHECK`].
    pub fn begin(
        command: Command,
        now: DateTime<Utc>,
        queued_commands: usize,
        watched: bool,
    ) -> (Self, Vec<Action>) {
        let timeout = command_timeout(queued_commands);
        let standby_recheck = watched && command.candidates.is_empty();
        let wait = if standby_recheck {
            Some(STANDBY_RECHECK)
        } else if command.method.needs_validation() {
            // Watched: the delay is waived, not the re-check. Deciding may have taken long
            // (up to the consolidation timeout) from a view taken before: the command is
            // checked at once against a view taken after it (a pod bound to a candidate
            // meanwhile, a do-not-disrupt pod, a budget spent).
            Some(if watched {
                Duration::ZERO
            } else {
                COMMAND_VALIDATION_DELAY
            })
        } else {
            None
        };
        if let Some(wait) = wait {
            let at = now + chrono::Duration::from_std(wait).unwrap_or_default();
            let o = Orchestration {
                command,
                phase: Phase::Validating { at },
                timeout,
                standby_recheck,
            };
            return (o, vec![Action::RequeueAt(at)]);
        }
        let mut o = Orchestration {
            command,
            phase: Phase::Done,
            timeout,
            standby_recheck: false,
        };
        let actions = o.start(now);
        (o, actions)
    }

    /// After the validation delay, with a view gathered after it: start, or abandon.
    pub fn validate(&mut self, fresh: &ClusterView) -> Vec<Action> {
        let Phase::Validating { at } = self.phase else {
            return Vec::new();
        };
        if fresh.now < at {
            return vec![Action::RequeueAt(at)];
        }
        if self.standby_recheck && !fresh.pending_pods.is_empty() {
            // Nothing was decided yet: the next pass decides with validation.
            self.phase = Phase::Done;
            return Vec::new();
        }
        match validate(&self.command, fresh) {
            Ok(validated) => {
                self.command = validated;
                self.start(fresh.now)
            }
            // Only standby nodes and the budget still spent: nothing was decided, so nothing
            // is rejected (no event, no failed validation).
            Err(ValidationError::Empty) if self.command.candidates.is_empty() => {
                self.phase = Phase::Done;
                Vec::new()
            }
            Err(e) => self.reject(e),
        }
    }

    fn reject(&mut self, e: ValidationError) -> Vec<Action> {
        let mut actions: Vec<Action> = self
            .command
            .candidates
            .iter()
            .flat_map(|c| {
                let message = format!(
                    "Consolidation rejected ({}): {e}",
                    self.command.decision().as_str()
                );
                [
                    Action::Event {
                        target: EventTarget::Node(c.name.clone()),
                        reason: names::EVENT_CONSOLIDATION_REJECTED,
                        message: message.clone(),
                    },
                    Action::Event {
                        target: EventTarget::NodeClaim(c.nodeclaim.clone()),
                        reason: names::EVENT_CONSOLIDATION_REJECTED,
                        message,
                    },
                ]
            })
            .collect();
        actions.push(Action::Count {
            metric: names::FAILED_VALIDATIONS_TOTAL,
            labels: vec![(
                names::LABEL_CONSOLIDATION_TYPE,
                self.command.method.consolidation_type().to_string(),
            )],
        });
        self.phase = Phase::Failed {
            reason: e.to_string(),
        };
        actions
    }

    fn start(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let cmd = &self.command;
        let reason = cmd.method.reason();
        let mut actions = vec![
            Action::Taint {
                nodes: cmd.candidates.iter().map(|c| c.name.clone()).collect(),
            },
            Action::SetDisruptionReason {
                nodeclaims: cmd.candidates.iter().map(|c| c.nodeclaim.clone()).collect(),
                reason,
            },
        ];
        if !cmd.replacements.is_empty() {
            actions.push(Action::LaunchReplacements {
                claims: cmd.replacements.clone(),
                reason: reason.as_str().to_lowercase(),
            });
            actions.push(Action::Event {
                target: EventTarget::Replacements,
                reason: names::EVENT_DISRUPTION_LAUNCHING,
                message: format!("Launching NodeClaim: {}", reason.as_str()),
            });
        }
        actions.push(Action::MarkForDeletion {
            provider_ids: cmd
                .candidates
                .iter()
                .map(|c| c.provider_id.clone())
                .collect(),
        });
        let decision = cmd.decision().as_str().to_string();
        let ctype = cmd.method.consolidation_type().to_string();
        actions.push(Action::Count {
            metric: names::DECISIONS_TOTAL,
            labels: vec![
                (names::LABEL_DECISION, decision.clone()),
                (names::LABEL_REASON, reason.as_str().to_lowercase()),
                (names::LABEL_CONSOLIDATION_TYPE, ctype.clone()),
            ],
        });
        let mut pools: Vec<&str> = cmd
            .candidates
            .iter()
            .map(|c| c.node_pool.as_str())
            .collect();
        pools.sort_unstable();
        pools.dedup();
        for pool in pools {
            actions.push(Action::Count {
                metric: names::DECISIONS_BY_NODEPOOL_TOTAL,
                labels: vec![
                    (names::LABEL_NODEPOOL, pool.to_string()),
                    (names::LABEL_DECISION, decision.clone()),
                    (names::LABEL_REASON, reason.as_str().to_lowercase()),
                    (names::LABEL_CONSOLIDATION_TYPE, ctype.clone()),
                ],
            });
        }
        self.phase = Phase::WaitingForReplacements { since: now };
        // A delete has nothing to wait for.
        if cmd.replacements.is_empty() {
            actions.extend(self.finish());
        }
        actions
    }

    /// A candidate could not be tainted: the command is abandoned before anything else.
    pub fn taint_failed(&mut self, message: &str) -> Vec<Action> {
        self.fail(format!("tainting candidates: {message}"))
    }

    /// The provisioner could not create the replacements.
    pub fn launch_failed(&mut self, message: &str) -> Vec<Action> {
        self.fail(format!("launching replacement nodeclaims: {message}"))
    }

    /// Reports the replacements' state (in `command.replacements` order) at `now`.
    pub fn observe(&mut self, statuses: &[ReplacementStatus], now: DateTime<Utc>) -> Vec<Action> {
        let Phase::WaitingForReplacements { since } = self.phase else {
            return Vec::new();
        };
        if statuses.contains(&ReplacementStatus::Gone) {
            return self.fail("a replacement nodeclaim was deleted before it initialized".into());
        }
        let deadline = since + chrono::Duration::from_std(self.timeout).unwrap_or_default();
        if now >= deadline {
            return self.fail(format!(
                "replacements did not initialize within {}",
                crate::apis::duration::format_duration(self.timeout)
            ));
        }
        if statuses.len() == self.command.replacements.len()
            && statuses
                .iter()
                .all(|s| *s == ReplacementStatus::Initialized)
        {
            return self.finish();
        }
        // On the replacements, as upstream: they are what is being waited for.
        vec![
            Action::Event {
                target: EventTarget::Replacements,
                reason: names::EVENT_DISRUPTION_WAITING_READINESS,
                message: "Waiting on readiness to continue disruption".into(),
            },
            Action::RequeueAt(now + chrono::Duration::seconds(1)),
        ]
    }

    fn finish(&mut self) -> Vec<Action> {
        let cmd = &self.command;
        let reason = cmd.method.reason();
        let title = reason.as_str();
        let mut actions = vec![Action::DeleteNodeClaims {
            nodeclaims: cmd.candidates.iter().map(|c| c.nodeclaim.clone()).collect(),
        }];
        for c in &cmd.candidates {
            actions.push(Action::Event {
                target: EventTarget::Node(c.name.clone()),
                reason: names::EVENT_DISRUPTION_TERMINATING,
                message: format!("Disrupting Node: {title}"),
            });
            actions.push(Action::Event {
                target: EventTarget::NodeClaim(c.nodeclaim.clone()),
                reason: names::EVENT_DISRUPTION_TERMINATING,
                message: format!("Disrupting NodeClaim: {title}"),
            });
            actions.push(Action::Count {
                metric: names::NODECLAIMS_DISRUPTED_TOTAL,
                labels: vec![
                    (names::LABEL_REASON, title.to_lowercase()),
                    (names::LABEL_NODEPOOL, c.node_pool.clone()),
                    (names::LABEL_CAPACITY_TYPE, c.capacity_type.clone()),
                    (
                        names::LABEL_CONSOLIDATION_POLICY,
                        format!("{:?}", c.consolidation_policy),
                    ),
                    (
                        names::LABEL_TERMINATION_MODE,
                        names::termination_mode(c.termination_grace_period).to_string(),
                    ),
                ],
            });
            if !c.reschedulable.is_empty() {
                actions.push(Action::Add {
                    metric: names::PODS_DISRUPTION_INITIATED_TOTAL,
                    labels: vec![
                        (names::LABEL_REASON, title.to_lowercase()),
                        (names::LABEL_NODEPOOL, c.node_pool.clone()),
                    ],
                    amount: c.reschedulable.len() as u64,
                });
            }
        }
        self.phase = Phase::Done;
        actions
    }

    fn fail(&mut self, reason: String) -> Vec<Action> {
        let cmd = &self.command;
        let actions = vec![
            Action::Restore {
                nodes: cmd.candidates.iter().map(|c| c.name.clone()).collect(),
                nodeclaims: cmd.candidates.iter().map(|c| c.nodeclaim.clone()).collect(),
                provider_ids: cmd
                    .candidates
                    .iter()
                    .map(|c| c.provider_id.clone())
                    .collect(),
            },
            Action::Count {
                metric: names::QUEUE_FAILURES_TOTAL,
                labels: vec![
                    (names::LABEL_DECISION, cmd.decision().as_str().to_string()),
                    (
                        names::LABEL_REASON,
                        cmd.method.reason().as_str().to_lowercase(),
                    ),
                    (
                        names::LABEL_CONSOLIDATION_TYPE,
                        cmd.method.consolidation_type().to_string(),
                    ),
                ],
            },
        ];
        self.phase = Phase::Failed { reason };
        actions
    }
}
