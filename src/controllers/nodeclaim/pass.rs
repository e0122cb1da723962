//! One reconcile of a live NodeClaim: the state its sub-steps (launch, registration,
//! initialization, consistency, liveness) share, as upstream's sub-reconcilers do. Each step reads
//! and updates `status`; the status is written once, at the end, if it changed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;

use crate::apis::{ConditionStatus, ConditionsExt, NodeClaim, NodeClaimStatus};
use crate::controllers::Context;

use super::arrivals::Arrival;

/// What a sub-step asks of the reconcile.
pub enum Step {
    /// Go on with the next sub-step.
    Continue,
    /// Stop here (the NodeClaim was deleted, or the step wrote what it needed).
    Done(Action),
}

pub struct Pass<'a> {
    pub ctx: &'a Context,
    pub name: String,
    /// The NodeClaim as last read or written.
    pub claim: NodeClaim,
    /// The status being built; compared with `claim.status` before writing.
    pub status: NodeClaimStatus,
    pub now: Timestamp,
    /// When to look again at the latest; steps only shorten it.
    pub requeue: Duration,
    /// The Node registration did not find, should it register before the pass ends.
    pub arrival: Option<Arrival>,
}

impl Pass<'_> {
    pub fn generation(&self) -> Option<i64> {
        self.claim.metadata.generation
    }

    /// Sets a condition on the status being built; true when it changed.
    pub fn set(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> bool {
        let generation = self.generation();
        self.status
            .conditions
            .set_condition(type_, status, reason, message, generation, self.now)
    }

    pub fn is_true(&self, type_: &str) -> bool {
        self.status.conditions.is_true(type_)
    }

    /// The NodeClaim with the status built so far (the pure lifecycle checks read it whole).
    pub fn with_status(&self) -> NodeClaim {
        let mut claim = self.claim.clone();
        claim.status = Some(self.status.clone());
        claim
    }

    /// Nodes registered with the provider ID the status holds.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        let provider_id = self.status.provider_id.as_deref().unwrap_or_default();
        self.ctx.cluster.read().nodes_by_provider_id(provider_id)
    }

    /// Takes the NodeClaim as a write of this pass returned it; the version it replaced is
    /// recorded as superseded, so a pass over a cached copy at that version decides from this
    /// answer instead ([`crate::controllers::superseded::SupersededVersions::current`]).
    pub fn wrote(&mut self, written: NodeClaim) {
        self.ctx.superseded.record_written(
            &self.claim.metadata,
            &written,
            std::time::Instant::now(),
        );
        self.claim = written;
    }

    pub fn requeue_within(&mut self, after: Duration) {
        self.requeue = self.requeue.min(after);
    }
}
