//! NodeOverlay status (upstream's nodeoverlay controller): `ValidationSucceeded` and `Ready` on
//! every overlay. False with reason `RuntimeValidation` when a field cannot be used (such an
//! overlay is left out of every price and capacity), or `Conflict` when another overlay of the
//! same weight sets the same offering's price or the same capacity resource (the name order
//! settles it; the loser is told which overlay won). A periodic pass on the leader, reading
//! overlays from cluster state and instance types from the provider.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use crate::apis::labels::conditions::{READY, VALIDATION_SUCCEEDED};
use crate::apis::{ConditionStatus, ConditionsExt, NodeOverlay, NodeOverlayStatus, NodePool};
use crate::cloudprovider::overlay::{conflicts, validate};
use crate::scheduling::InstanceType;

use super::{Context, Error, absent_ok, patch_status};

/// How often overlays are evaluated (upstream: on change and every 6 h; a pass is cheap).
pub const INTERVAL: Duration = Duration::from_secs(30);

/// What evaluation found for one overlay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    RuntimeValidation(String),
    Conflict(String),
}

/// The verdict of every overlay, by name, against the instance types of every NodePool.
pub fn verdicts(
    overlays: &[Arc<NodeOverlay>],
    pools: &[(Arc<NodePool>, Vec<Arc<InstanceType>>)],
) -> BTreeMap<String, Verdict> {
    let mut out = BTreeMap::new();
    let mut valid = Vec::new();
    for overlay in overlays {
        match validate(overlay) {
            Ok(()) => valid.push((**overlay).clone()),
            Err(error) => {
                out.insert(
                    overlay.name_any(),
                    Verdict::RuntimeValidation(error.to_string()),
                );
            }
        }
    }
    for (pool, types) in pools {
        let ties = conflicts(&pool.name_any(), &pool.template_labels(), types, &valid);
        // Only valid overlays are compared, so compiling them cannot fail.
        for (loser, message) in ties.unwrap_or_default() {
            out.entry(loser).or_insert(Verdict::Conflict(message));
        }
    }
    for overlay in valid {
        out.entry(overlay.name_any()).or_insert(Verdict::Valid);
    }
    out
}

/// The status `overlay` should have for `verdict`; `None` when it already has it.
pub fn desired_status(
    overlay: &NodeOverlay,
    verdict: &Verdict,
    now: Timestamp,
) -> Option<NodeOverlayStatus> {
    let mut status = overlay.status.clone().unwrap_or_default();
    let (state, reason, message) = match verdict {
        Verdict::Valid => (ConditionStatus::True, VALIDATION_SUCCEEDED, ""),
        Verdict::RuntimeValidation(m) => (ConditionStatus::False, "RuntimeValidation", m.as_str()),
        Verdict::Conflict(m) => (ConditionStatus::False, "Conflict", m.as_str()),
    };
    let generation = overlay.metadata.generation;
    let mut changed = false;
    for type_ in [VALIDATION_SUCCEEDED, READY] {
        let reason = if state == ConditionStatus::True {
            type_
        } else {
            reason
        };
        changed |= status
            .conditions
            .set_condition(type_, state, reason, message, generation, now);
    }
    changed.then_some(status)
}

/// One evaluation pass; returns how many statuses were written.
pub async fn update_once(ctx: &Context) -> Result<usize, Error> {
    if !ctx.cluster.synced() || !ctx.leadership.is_leader() {
        return Ok(0);
    }
    let (overlays, pools) = {
        let index = ctx.cluster.read();
        (index.overlays(), index.nodepools())
    };
    if overlays.is_empty() {
        return Ok(0);
    }
    let mut pools_with_types = Vec::new();
    for pool in pools {
        // A NodePool without instance types right now cannot hold a conflict.
        if let Ok(types) = ctx.cloud.instance_types(&pool).await {
            pools_with_types.push((pool, types));
        }
    }
    let verdicts = verdicts(&overlays, &pools_with_types);
    let api: Api<NodeOverlay> = Api::all(ctx.client.clone());
    let mut written = 0;
    for overlay in &overlays {
        let Some(verdict) = verdicts.get(&overlay.name_any()) else {
            continue;
        };
        if let Some(status) = desired_status(overlay, verdict, ctx.now()) {
            if let Verdict::RuntimeValidation(m) | Verdict::Conflict(m) = verdict {
                tracing::warn!(nodeoverlay = %overlay.name_any(), problem = %m, "NodeOverlay not valid");
            }
            absent_ok(patch_status(&api, overlay, &status).await)?;
            written += 1;
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;

    fn overlay(name: &str, spec: serde_json::Value) -> Arc<NodeOverlay> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
                "metadata": {"name": name, "generation": 3}, "spec": spec
            }))
            .unwrap(),
        )
    }

    fn pool(name: &str) -> Arc<NodePool> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"template": {"spec": {"nodeClassRef":
                    {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "x"},
                    "requirements": []}}}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn ties_of_equal_weight_conflict_and_unusable_fields_fail_runtime_validation() {
        let it0 = serde_json::json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["fake-it-0"]}]);
        let overlays = vec![
            // b and a both price fake-it-0 at weight 5: b wins by name, a conflicts.
            overlay(
                "a",
                serde_json::json!({"requirements": it0, "price": "1", "weight": 5}),
            ),
            overlay(
                "b",
                serde_json::json!({"requirements": [], "priceAdjustment": "+10%", "weight": 5}),
            ),
            // A higher weight is no tie.
            overlay(
                "c",
                serde_json::json!({"requirements": it0, "price": "2", "weight": 9}),
            ),
            // Capacity ties count per resource.
            overlay(
                "d",
                serde_json::json!({"requirements": [], "capacity": {"example.com/x": "1"}}),
            ),
            overlay(
                "e",
                serde_json::json!({"requirements": [], "capacity": {"example.com/x": "2", "example.com/y": "1"}}),
            ),
            overlay(
                "f",
                serde_json::json!({"requirements": [], "capacity": {"example.com/z": "many"}}),
            ),
        ];
        let pools = vec![(pool("default"), fixtures::instance_types(2))];
        let got = verdicts(&overlays, &pools);
        let conflict = |name: &str| match &got[name] {
            Verdict::Conflict(m) => m.clone(),
            other => panic!("{name}: {other:?}"),
        };
        assert!(
            conflict("a").contains("NodeOverlay b (same weight 5)"),
            "{}",
            conflict("a")
        );
        assert!(conflict("a").contains("the price of fake-it-0"));
        assert_eq!(got["b"], Verdict::Valid);
        assert_eq!(got["c"], Verdict::Valid);
        assert!(conflict("d").contains("NodeOverlay e"), "{}", conflict("d"));
        assert!(conflict("d").contains("capacity example.com/x"));
        assert_eq!(got["e"], Verdict::Valid);
        assert!(matches!(&got["f"], Verdict::RuntimeValidation(m) if m.contains("example.com/z")));
    }

    #[test]
    fn status_is_written_only_when_a_verdict_changes() {
        let now = Timestamp::from_second(1_000).unwrap();
        let mut o = (*overlay("a", serde_json::json!({"requirements": [], "price": "1"}))).clone();
        let status = desired_status(&o, &Verdict::Valid, now).expect("first evaluation");
        assert!(status.conditions.is_true(VALIDATION_SUCCEEDED));
        assert!(status.conditions.is_true(READY));
        assert_eq!(status.conditions[0].observed_generation, Some(3));
        o.status = Some(status);
        assert_eq!(desired_status(&o, &Verdict::Valid, now), None);
        let failed = desired_status(&o, &Verdict::Conflict("tie".into()), now).unwrap();
        let ready = failed.conditions.get_condition(READY).unwrap();
        assert_eq!(
            (ready.status, ready.reason.as_str(), ready.message.as_str()),
            (ConditionStatus::False, "Conflict", "tie")
        );
    }
}
