//! Pure decisions of the disruption controller's I/O shell: the patches an action needs and
//! what the controller makes of the objects it observes.

use std::collections::HashSet;

use kube::ResourceExt;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Taint as CoreTaint;
use k8s_openapi::jiff::Timestamp;

use crate::apis::labels::{DISRUPTED_TAINT_KEY, conditions};
use crate::apis::{Condition, ConditionStatus, ConditionsExt, NodeClaim};
use crate::disruption::conditions::ConditionDecision;
use crate::disruption::orchestration::ReplacementStatus;
use crate::state::{ClusterIndex, node_provider_id};

pub fn timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp::from_second(t.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn is_disrupted_taint(t: &CoreTaint) -> bool {
    t.key == DISRUPTED_TAINT_KEY && t.effect == "NoSchedule"
}

/// The Node's taints with `karpenter.sh/disrupted:NoSchedule` added; `None` when present.
pub fn with_disrupted_taint(taints: &[CoreTaint]) -> Option<Vec<CoreTaint>> {
    if taints.iter().any(is_disrupted_taint) {
        return None;
    }
    let mut out = taints.to_vec();
    out.push(CoreTaint {
        key: DISRUPTED_TAINT_KEY.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    Some(out)
}

/// The Node's taints without the disrupted taint; `None` when absent.
pub fn without_disrupted_taint(taints: &[CoreTaint]) -> Option<Vec<CoreTaint>> {
    if !taints.iter().any(is_disrupted_taint) {
        return None;
    }
    Some(
        taints
            .iter()
            .filter(|t| !is_disrupted_taint(t))
            .cloned()
            .collect(),
    )
}

/// Where a replacement NodeClaim stands: gone (deleted, deleting or never seen after its
/// creation was confirmed), initialized, or still on its way.
pub fn replacement_status(claim: Option<&NodeClaim>) -> ReplacementStatus {
    let Some(claim) = claim else {
        return ReplacementStatus::Gone;
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return ReplacementStatus::Gone;
    }
    let initialized = claim
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.is_true(conditions::INITIALIZED));
    if initialized {
        ReplacementStatus::Initialized
    } else {
        ReplacementStatus::Pending
    }
}

/// Removes a condition; true when it was there.
pub fn remove_condition(conds: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conds.len();
    conds.retain(|c| c.type_ != type_);
    conds.len() != before
}

/// Applies a condition decision; true when anything changed.
pub fn apply_decision(
    conds: &mut Vec<Condition>,
    type_: &str,
    decision: &ConditionDecision,
    now: DateTime<Utc>,
) -> bool {
    match decision {
        ConditionDecision::SetTrue { reason, message } => conds.set_condition(
            type_,
            ConditionStatus::True,
            reason,
            message,
            None,
            timestamp(now),
        ),
        ConditionDecision::Remove | ConditionDecision::RemoveUntil(_) => {
            remove_condition(conds, type_)
        }
    }
}

/// Nodes left tainted (with their NodeClaims, which may carry `DisruptionReason`) by a command
/// this process no longer runs — a restart or a lost leadership mid-command — and not being
/// deleted: upstream restores them before each loop. `held` are the provider IDs of the command
/// in flight. Another Karpenter's nodes carry the same taint while it disrupts them: theirs.
pub fn stale_disruptions(
    index: &ClusterIndex,
    held: &HashSet<String>,
) -> Vec<(String, Option<String>)> {
    index
        .nodes()
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| {
            let taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default();
            taints.iter().any(is_disrupted_taint)
        })
        // After the taint test: finding a node's NodeClaim scans them all.
        .filter(|n| index.manages_node(n))
        .filter_map(|n| {
            let pid = node_provider_id(n)?;
            if held.contains(pid) {
                return None;
            }
            let claim = index.nodeclaim_by_provider_id(pid);
            if claim
                .as_ref()
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
            {
                return None;
            }
            Some((n.name_any(), claim.map(|c| c.name_any())))
        })
        .collect()
}

/// Remembers when an event was last published, to publish repeats only after `ttl`.
#[derive(Debug, Default)]
pub struct Dedupe {
    last: std::collections::HashMap<String, DateTime<Utc>>,
}

impl Dedupe {
    /// True when `key` was not published within `ttl` before `now` (and records it).
    pub fn admit(&mut self, key: String, now: DateTime<Utc>, ttl: std::time::Duration) -> bool {
        let ttl = chrono::Duration::from_std(ttl).unwrap_or_default();
        self.last
            .retain(|_, at| now - *at < ttl.max(chrono::Duration::minutes(15)));
        match self.last.get(&key) {
            Some(at) if now - *at < ttl => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    #[test]
    fn the_disrupted_taint_is_added_once_and_removed_alone() {
        let other = CoreTaint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            value: Some("gpu".into()),
            ..Default::default()
        };
        let tainted = with_disrupted_taint(std::slice::from_ref(&other)).unwrap();
        assert_eq!(tainted.len(), 2);
        assert_eq!(tainted[1].key, DISRUPTED_TAINT_KEY);
        assert_eq!(with_disrupted_taint(&tainted), None);
        assert_eq!(without_disrupted_taint(&tainted), Some(vec![other.clone()]));
        assert_eq!(without_disrupted_taint(&[other]), None);
    }

    #[test]
    fn replacements_are_gone_pending_or_initialized() {
        assert_eq!(replacement_status(None), ReplacementStatus::Gone);
        let mut claim = testing::nodeclaim("r", "p", Some("exoscale://r"));
        claim
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .retain(|c| c.type_ != conditions::INITIALIZED);
        assert_eq!(replacement_status(Some(&claim)), ReplacementStatus::Pending);
        claim
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .set_condition(
                conditions::INITIALIZED,
                ConditionStatus::True,
                conditions::INITIALIZED,
                "",
                None,
                timestamp(at(0)),
            );
        assert_eq!(
            replacement_status(Some(&claim)),
            ReplacementStatus::Initialized
        );
        claim.metadata.deletion_timestamp = Some(testing::ts(5));
        assert_eq!(replacement_status(Some(&claim)), ReplacementStatus::Gone);
    }

    #[test]
    fn condition_decisions_set_and_remove() {
        let mut conds = Vec::new();
        let set = ConditionDecision::SetTrue {
            reason: "NodePoolDrifted".into(),
            message: String::new(),
        };
        assert!(apply_decision(&mut conds, conditions::DRIFTED, &set, at(0)));
        assert!(!apply_decision(
            &mut conds,
            conditions::DRIFTED,
            &set,
            at(10)
        ));
        assert_eq!(conds[0].reason, "NodePoolDrifted");
        assert!(apply_decision(
            &mut conds,
            conditions::DRIFTED,
            &ConditionDecision::RemoveUntil(at(20)),
            at(10)
        ));
        assert!(conds.is_empty());
        assert!(!apply_decision(
            &mut conds,
            conditions::DRIFTED,
            &ConditionDecision::Remove,
            at(10)
        ));
    }

    #[test]
    fn stale_disruption_taints_are_those_no_command_holds_on_live_nodes() {
        let tainted = [(DISRUPTED_TAINT_KEY, "NoSchedule")];
        let mut index = testing::managed_index();
        // Another Karpenter's node, tainted by its own disruption.
        index.apply_node(testing::node("theirs", Some("kwok://6"), &tainted));
        index.apply_nodeclaim(testing::foreign(testing::nodeclaim(
            "c6",
            "kwok",
            Some("kwok://6"),
        )));
        index.apply_node(testing::node("held", Some("exoscale://1"), &tainted));
        index.apply_node(testing::node("stale", Some("exoscale://2"), &tainted));
        index.apply_node(testing::node("clean", Some("exoscale://3"), &[]));
        let mut deleting = testing::node("deleting", Some("exoscale://4"), &tainted);
        deleting.metadata.deletion_timestamp = Some(testing::ts(1));
        index.apply_node(deleting);
        index.apply_node(testing::node(
            "claim-deleting",
            Some("exoscale://5"),
            &tainted,
        ));
        index.apply_nodeclaim(testing::nodeclaim("c2", "p", Some("exoscale://2")));
        let mut c5 = testing::nodeclaim("c5", "p", Some("exoscale://5"));
        c5.metadata.deletion_timestamp = Some(testing::ts(1));
        index.apply_nodeclaim(c5);
        let held: HashSet<String> = ["exoscale://1".to_string()].into();
        assert_eq!(
            stale_disruptions(&index, &held),
            vec![("stale".to_string(), Some("c2".to_string()))]
        );
    }

    #[test]
    fn dedupe_admits_repeats_after_the_ttl() {
        let mut d = Dedupe::default();
        let ttl = std::time::Duration::from_secs(900);
        assert!(d.admit("n1/msg".into(), at(0), ttl));
        assert!(!d.admit("n1/msg".into(), at(899), ttl));
        assert!(d.admit("n2/msg".into(), at(899), ttl));
        assert!(d.admit("n1/msg".into(), at(900), ttl));
    }
}
