//! NodePool status: runtime validation, NodeClass readiness, registration health, resource
//! counters and the root Ready condition (karpenter-core §1.1, §4.6, behaviour 40).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use crate::apis::labels::{
    CAPACITY_TYPE_LABEL, NODEPOOL_LABEL, conditions, is_restricted_label, normalize_label,
    validate_label_key, validate_label_value,
};
use crate::apis::{ConditionStatus, ConditionsExt, NodePool, NodePoolStatus, Operator};
use crate::cloudprovider::NodeClassState;
use crate::state::NodePoolUsage;

/// Runtime validation beyond the CRD schema; `Err` names every problem.
pub fn validate(pool: &NodePool) -> Result<(), String> {
    let mut problems = Vec::new();
    let template = &pool.spec.template;
    let labels = template.metadata.as_ref().map(|m| &m.labels);
    for (key, value) in labels.into_iter().flatten() {
        if key == NODEPOOL_LABEL || is_restricted_label(key) {
            problems.push(format!("label {key:?} is restricted"));
        }
        // An invalid label would make every NodeClaim create of the pool fail with a 422.
        if let Err(why) = validate_label_key(key) {
            problems.push(format!("invalid label key {key:?}: {why}"));
        }
        if let Err(why) = validate_label_value(value) {
            problems.push(format!("invalid value {value:?} for label {key:?}: {why}"));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for taint in template
        .spec
        .taints
        .iter()
        .chain(&template.spec.startup_taints)
    {
        if !seen.insert((taint.key.clone(), taint.effect as u8)) {
            problems.push(format!("duplicate taint {}:{:?}", taint.key, taint.effect));
        }
    }
    for req in &template.spec.requirements {
        let key = normalize_label(&req.key);
        if key == NODEPOOL_LABEL || is_restricted_label(key) {
            problems.push(format!("requirement key {:?} is restricted", req.key));
        }
        if let Err(why) = validate_label_key(key) {
            problems.push(format!("invalid requirement key {:?}: {why}", req.key));
        }
        if matches!(req.operator, Operator::In | Operator::NotIn) {
            for value in &req.values {
                if let Err(why) = validate_label_value(value) {
                    problems.push(format!(
                        "invalid value {value:?} for requirement {:?}: {why}",
                        req.key
                    ));
                }
            }
        }
        match req.operator {
            Operator::In if req.values.is_empty() => problems.push(format!(
                "requirement {:?} with operator In needs values",
                req.key
            )),
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte
                if req.values.len() != 1 || req.values[0].parse::<u64>().is_err() =>
            {
                problems.push(format!(
                    "requirement {:?} needs one non-negative integer",
                    req.key
                ))
            }
            _ => {}
        }
        if let Some(min) = req.min_values
            && req.operator == Operator::In
            && (req.values.len() as i64) < min
        {
            problems.push(format!(
                "requirement {:?} has fewer values than minValues {min}",
                req.key
            ));
        }
        if key == CAPACITY_TYPE_LABEL && req.operator == Operator::In {
            let valid = req
                .values
                .iter()
                .filter(|v| ["on-demand", "spot", "reserved"].contains(&v.as_str()))
                .count();
            if valid == 0 {
                problems.push(format!(
                    "requirement {CAPACITY_TYPE_LABEL:?} has no valid capacity type"
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// NodeClassReady from the referenced NodeClass (None = not found).
pub fn nodeclass_readiness(
    nodeclass: Option<&NodeClassState>,
) -> (ConditionStatus, String, String) {
    let Some(nc) = nodeclass else {
        return (
            ConditionStatus::False,
            "NodeClassNotFound".into(),
            "NodeClass not found on cluster".into(),
        );
    };
    if nc.terminating {
        return (
            ConditionStatus::False,
            "NodeClassTerminating".into(),
            "NodeClass is terminating".into(),
        );
    }
    match &nc.ready {
        Some(c) if c.status == ConditionStatus::True => (
            ConditionStatus::True,
            conditions::NODECLASS_READY.into(),
            String::new(),
        ),
        Some(c) if c.status == ConditionStatus::False => {
            (ConditionStatus::False, c.reason.clone(), c.message.clone())
        }
        _ => (
            ConditionStatus::Unknown,
            "NodeClassReadinessUnknown".into(),
            "Node Class Readiness Unknown".into(),
        ),
    }
}

/// Outcomes of the last launches per NodePool (upstream keeps 4; 2 failures is unhealthy).
#[derive(Default)]
pub struct RegistrationHealth {
    buffers: Mutex<BTreeMap<String, (String, VecDeque<bool>)>>,
}

const WINDOW: usize = 4;
const UNHEALTHY_FAILURES: usize = 2;

/// The registration-health verdict for a NodePool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthVerdict {
    Unknown,
    Healthy,
    Unhealthy,
}

impl RegistrationHealth {
    /// Records one launch outcome. `epoch` identifies the NodePool+NodeClass generations: a new
    /// epoch clears the buffer.
    pub fn record(&self, pool: &str, epoch: &str, success: bool) {
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let entry = buffers
            .entry(pool.to_string())
            .or_insert_with(|| (epoch.to_string(), VecDeque::new()));
        if entry.0 != epoch {
            *entry = (epoch.to_string(), VecDeque::new());
        }
        entry.1.push_back(success);
        while entry.1.len() > WINDOW {
            entry.1.pop_front();
        }
    }

    pub fn verdict(&self, pool: &str, epoch: &str) -> HealthVerdict {
        let buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        match buffers.get(pool) {
            Some((e, outcomes)) if e == epoch && !outcomes.is_empty() => {
                if outcomes.iter().filter(|ok| !**ok).count() >= UNHEALTHY_FAILURES {
                    HealthVerdict::Unhealthy
                } else if *outcomes.back().unwrap_or(&false) {
                    HealthVerdict::Healthy
                } else {
                    HealthVerdict::Unknown
                }
            }
            _ => HealthVerdict::Unknown,
        }
    }
}

/// The epoch of a NodePool: its generation and its NodeClass's.
pub fn epoch(pool: &NodePool, nodeclass: Option<&NodeClassState>) -> String {
    format!(
        "{}/{}",
        pool.metadata.generation.unwrap_or(0),
        nodeclass.and_then(|n| n.generation).unwrap_or(0)
    )
}

/// The whole status the NodePool controller writes.
pub fn desired_status(
    pool: &NodePool,
    nodeclass: Option<&NodeClassState>,
    usage: &NodePoolUsage,
    health: HealthVerdict,
    now: Timestamp,
) -> NodePoolStatus {
    let mut status = pool.status.clone().unwrap_or_default();
    let generation = pool.metadata.generation;
    status.resources = usage.resources.clone();
    status.nodes = usage.nodes;
    let nodeclass_generation = nodeclass.and_then(|n| n.generation);
    let conds = &mut status.conditions;
    match validate(pool) {
        Ok(()) => conds.set_condition(
            conditions::VALIDATION_SUCCEEDED,
            ConditionStatus::True,
            conditions::VALIDATION_SUCCEEDED,
            "",
            generation,
            now,
        ),
        Err(why) => conds.set_condition(
            conditions::VALIDATION_SUCCEEDED,
            ConditionStatus::False,
            "NodePoolValidationFailed",
            &why,
            generation,
            now,
        ),
    };
    let (st, reason, message) = nodeclass_readiness(nodeclass);
    conds.set_condition(
        conditions::NODECLASS_READY,
        st,
        &reason,
        &message,
        generation,
        now,
    );
    // A changed NodeClass generation resets registration health to Unknown.
    let reset = status.node_class_observed_generation != nodeclass_generation;
    let (st, reason, message) = match (health, reset) {
        (HealthVerdict::Unhealthy, false) => (
            ConditionStatus::False,
            "RegistrationFailed",
            "Failed to register 2 of the last 4 launched nodes",
        ),
        (HealthVerdict::Healthy, false) => (
            ConditionStatus::True,
            conditions::NODE_REGISTRATION_HEALTHY,
            "",
        ),
        _ => (
            ConditionStatus::Unknown,
            "AwaitingReconciliation",
            "Awaiting node registrations",
        ),
    };
    let keep = !reset
        && health == HealthVerdict::Unknown
        && conds
            .get_condition(conditions::NODE_REGISTRATION_HEALTHY)
            .is_some();
    if !keep {
        conds.set_condition(
            conditions::NODE_REGISTRATION_HEALTHY,
            st,
            reason,
            message,
            generation,
            now,
        );
    }
    status.node_class_observed_generation = nodeclass_generation;
    let blocking = [
        conditions::VALIDATION_SUCCEEDED,
        conditions::NODECLASS_READY,
    ]
    .into_iter()
    .find(|t| !status.conditions.is_true(t));
    match blocking {
        None => status.conditions.set_condition(
            conditions::READY,
            ConditionStatus::True,
            conditions::READY,
            "",
            generation,
            now,
        ),
        Some(part) => {
            let c = status.conditions.get_condition(part).cloned();
            let st = c
                .as_ref()
                .map(|c| c.status)
                .unwrap_or(ConditionStatus::Unknown);
            let st = if st == ConditionStatus::True {
                ConditionStatus::Unknown
            } else {
                st
            };
            status.conditions.set_condition(
                conditions::READY,
                st,
                &format!("{part}NotTrue"),
                &c.map(|c| c.message)
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| format!("{part} is not True")),
                generation,
                now,
            )
        }
    };
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::{resources, ts};
    use serde_json::json;

    fn pool() -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default", "generation": 1},
            "spec": {"template": {"spec": {
                "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
                "nodeClassRef": {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "default"}
            }}}
        }))
        .unwrap()
    }

    fn nodeclass(ready: Option<ConditionStatus>) -> NodeClassState {
        let mut conditions = Vec::new();
        if let Some(st) = ready {
            conditions.set_condition(
                "Ready",
                st,
                "SecurityGroupResolutionFailed",
                "security group with name web not found",
                None,
                ts(0).0,
            );
        }
        NodeClassState {
            generation: Some(3),
            terminating: false,
            ready: conditions.pop(),
            node_labels: Default::default(),
            node_taints: Vec::new(),
        }
    }

    #[test]
    fn validation_names_every_problem() {
        let mut p = pool();
        p.spec.template.spec.requirements.push(
            serde_json::from_value(
                json!({"key": "karpenter.sh/nodepool", "operator": "In", "values": ["x"]}),
            )
            .unwrap(),
        );
        p.spec.template.spec.requirements.push(
            serde_json::from_value(
                json!({"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["cheap"]}),
            )
            .unwrap(),
        );
        let err = validate(&p).unwrap_err();
        assert!(err.contains("karpenter.sh/nodepool"), "{err}");
        assert!(err.contains("no valid capacity type"), "{err}");
        assert_eq!(validate(&pool()), Ok(()));
    }

    #[test]
    fn invalid_label_keys_and_values_fail_validation_and_block_ready() {
        let mut p = pool();
        p.spec.template.metadata = Some(
            serde_json::from_value(json!({"labels": {
                "team/a/b": "x", "good.example.com/app": "-bad", "fine": "ok"
            }}))
            .unwrap(),
        );
        for req in [
            json!({"key": "Bad_Prefix.com/zone", "operator": "Exists"}),
            json!({"key": "tier", "operator": "NotIn", "values": ["ok", "not ok"]}),
            // Gt/Lt values are integers, not label values: checked by their own rule only.
            json!({"key": "size", "operator": "Gt", "values": ["4"]}),
        ] {
            p.spec
                .template
                .spec
                .requirements
                .push(serde_json::from_value(req).unwrap());
        }
        let err = validate(&p).unwrap_err();
        for named in [
            "invalid label key \"team/a/b\"",
            "invalid value \"-bad\" for label \"good.example.com/app\"",
            "invalid requirement key \"Bad_Prefix.com/zone\"",
            "invalid value \"not ok\" for requirement \"tier\"",
        ] {
            assert!(err.contains(named), "{named} in {err}");
        }
        assert!(!err.contains("fine") && !err.contains("size"), "{err}");

        let status = desired_status(
            &p,
            Some(&nodeclass(Some(ConditionStatus::True))),
            &NodePoolUsage::default(),
            HealthVerdict::Unknown,
            ts(0).0,
        );
        let validation = status
            .conditions
            .get_condition(conditions::VALIDATION_SUCCEEDED)
            .unwrap();
        assert_eq!(validation.status, ConditionStatus::False);
        assert!(validation.message.contains("team/a/b"));
        let ready = status.conditions.get_condition(conditions::READY).unwrap();
        assert_eq!(
            ready.status,
            ConditionStatus::False,
            "provisioning skips a NodePool whose Ready is False"
        );
    }

    #[test]
    fn ready_needs_validation_and_a_ready_nodeclass() {
        let usage = NodePoolUsage {
            resources: resources(&[("cpu", "4")]),
            nodes: 2,
        };
        let status = desired_status(
            &pool(),
            Some(&nodeclass(Some(ConditionStatus::True))),
            &usage,
            HealthVerdict::Unknown,
            ts(0).0,
        );
        assert!(status.conditions.is_true("Ready"));
        assert_eq!(status.nodes, 2);
        assert_eq!(status.resources["cpu"].0, "4");
        assert_eq!(status.node_class_observed_generation, Some(3));

        let status = desired_status(
            &pool(),
            Some(&nodeclass(Some(ConditionStatus::False))),
            &usage,
            HealthVerdict::Unknown,
            ts(0).0,
        );
        let ready = status.conditions.get_condition("Ready").unwrap();
        assert_eq!(ready.status, ConditionStatus::False);
        assert!(ready.message.contains("web"), "{}", ready.message);

        let status = desired_status(&pool(), None, &usage, HealthVerdict::Unknown, ts(0).0);
        assert_eq!(
            status
                .conditions
                .get_condition("NodeClassReady")
                .unwrap()
                .reason,
            "NodeClassNotFound"
        );
    }

    #[test]
    fn two_failed_registrations_of_four_are_unhealthy_and_a_new_epoch_resets() {
        let health = RegistrationHealth::default();
        health.record("p", "1/1", true);
        assert_eq!(health.verdict("p", "1/1"), HealthVerdict::Healthy);
        health.record("p", "1/1", false);
        health.record("p", "1/1", true);
        assert_eq!(health.verdict("p", "1/1"), HealthVerdict::Healthy);
        health.record("p", "1/1", false);
        assert_eq!(health.verdict("p", "1/1"), HealthVerdict::Unhealthy);
        // Window of 4: [F, T, F, T] is still unhealthy; the next success pushes a failure out.
        health.record("p", "1/1", true);
        assert_eq!(health.verdict("p", "1/1"), HealthVerdict::Unhealthy);
        health.record("p", "1/1", true);
        assert_eq!(health.verdict("p", "1/1"), HealthVerdict::Healthy);
        assert_eq!(health.verdict("p", "2/1"), HealthVerdict::Unknown);
        health.record("p", "2/1", false);
        assert_eq!(health.verdict("p", "2/1"), HealthVerdict::Unknown);
    }

    #[test]
    fn unhealthy_registration_sets_the_condition_false() {
        let usage = NodePoolUsage::default();
        let nc = nodeclass(Some(ConditionStatus::True));
        let first = desired_status(&pool(), Some(&nc), &usage, HealthVerdict::Unknown, ts(0).0);
        let mut p = pool();
        p.status = Some(first);
        let status = desired_status(&p, Some(&nc), &usage, HealthVerdict::Unhealthy, ts(1).0);
        let c = status
            .conditions
            .get_condition("NodeRegistrationHealthy")
            .unwrap();
        assert_eq!(c.status, ConditionStatus::False);
        assert!(
            status.conditions.is_true("Ready"),
            "registration health is not part of Ready"
        );
    }
}
