//! The disruption conditions of a NodeClaim (`Consolidatable`, `Drifted`) and emptiness, decided
//! from plain inputs at an injected instant; the `nodeclaim.disruption` controller writes them.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::apis::common::{ConditionsExt, NodeSelectorRequirementWithMinValues, Operator};
use crate::apis::duration::parse_nillable_duration;
use crate::apis::labels::{
    CAPACITY_TYPE_LABEL, CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_RESERVED, INSTANCE_TYPE_LABEL,
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION_ANNOTATION, ZONE_LABEL, conditions,
};
use crate::apis::nodeclaim::NodeClaim;
use crate::apis::nodepool::NodePool;
use crate::scheduling::InstanceType;

use super::DisruptionError;

/// What to do with a condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConditionDecision {
    /// Set the condition to True with this reason.
    SetTrue { reason: String, message: String },
    /// Remove the condition (it does not apply).
    Remove,
    /// Remove the condition and look again at this instant.
    RemoveUntil(DateTime<Utc>),
}

fn to_chrono(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// `Consolidatable`: True once `consolidateAfter` has passed since the last pod event (or since
/// initialization when no pod ever came or went). `Never`, static NodePools and uninitialized
/// NodeClaims never are.
pub fn consolidatable(
    nodeclaim: &NodeClaim,
    nodepool: &NodePool,
    now: DateTime<Utc>,
) -> Result<ConditionDecision, DisruptionError> {
    let Some(after) = parse_nillable_duration(&nodepool.spec.disruption.consolidate_after)? else {
        return Ok(ConditionDecision::Remove);
    };
    if nodepool.spec.replicas.is_some() {
        return Ok(ConditionDecision::Remove);
    }
    let status = nodeclaim.status.clone().unwrap_or_default();
    let Some(initialized) = status
        .conditions
        .get_condition(conditions::INITIALIZED)
        .filter(|c| c.status == crate::apis::ConditionStatus::True)
    else {
        return Ok(ConditionDecision::Remove);
    };
    let since = status
        .last_pod_event_time
        .as_ref()
        .map(to_chrono)
        .unwrap_or_else(|| to_chrono(&initialized.last_transition_time));
    let ready_at = quiet_from(since, after);
    if now >= ready_at {
        Ok(ConditionDecision::SetTrue {
            reason: conditions::CONSOLIDATABLE.into(),
            message: String::new(),
        })
    } else {
        Ok(ConditionDecision::RemoveUntil(ready_at))
    }
}

/// The instant `consolidateAfter` has passed since `since`.
fn quiet_from(since: DateTime<Utc>, after: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(after)
        .ok()
        .and_then(|after| since.checked_add_signed(after))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Whether `consolidateAfter` has passed since a node's last pod event as this process saw it.
/// `Consolidatable` is written by a pass every few seconds; disruption checks this too, so a
/// node emptied since that pass is not chosen only to be dropped by validation.
pub fn quiet_since_pod_event(
    last_pod_event: Option<DateTime<Utc>>,
    after: std::time::Duration,
    now: DateTime<Utc>,
) -> bool {
    last_pod_event.is_none_or(|at| now >= quiet_from(at, after))
}

/// The NodePool's `consolidateAfter`; `None` when it never consolidates (`Never`, or a value
/// the API should have refused).
pub fn consolidate_after(nodepool: &NodePool) -> Option<std::time::Duration> {
    parse_nillable_duration(&nodepool.spec.disruption.consolidate_after)
        .ok()
        .flatten()
}

/// Whether a node would be `Consolidatable` now: its dynamic NodePool consolidates, it is
/// initialized, and `consolidateAfter` has passed since `since` (its last pod event, or its
/// initialization when none).
pub fn consolidatable_now(
    nodepool: &NodePool,
    initialized: bool,
    since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    match consolidate_after(nodepool) {
        Some(after) if nodepool.spec.replicas.is_none() && initialized => {
            since.is_some() && quiet_since_pod_event(since, after, now)
        }
        _ => false,
    }
}

/// Whether a pod came to or left a node within its NodePool's `consolidateAfter`, so that
/// consolidation does not move running pods onto it (never for a zero `consolidateAfter` or an
/// uninitialized node, as upstream).
pub fn settling_now(
    nodepool: &NodePool,
    initialized: bool,
    since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    match consolidate_after(nodepool) {
        Some(after) if !after.is_zero() && initialized => !quiet_since_pod_event(since, after, now),
        _ => false,
    }
}

/// Why a NodeClaim drifted; the strings are the condition reasons upstream writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftReason {
    NodePoolDrifted,
    RequirementsDrifted,
    InstanceTypeNotFound,
    /// Reported by the cloud provider (image changed, NodeClass changed, ...).
    Provider(String),
}

impl DriftReason {
    pub fn as_str(&self) -> &str {
        match self {
            DriftReason::NodePoolDrifted => "NodePoolDrifted",
            DriftReason::RequirementsDrifted => "RequirementsDrifted",
            DriftReason::InstanceTypeNotFound => "InstanceTypeNotFound",
            DriftReason::Provider(r) => r,
        }
    }
}

/// What drift needs besides the two objects.
#[derive(Clone, Copy, Debug, Default)]
pub struct DriftInputs<'a> {
    pub now: DateTime<Utc>,
    /// The NodePool's current instance types; `None` skips the instance-type check (the
    /// controller runs it at most every 30 min).
    pub instance_types: Option<&'a [Arc<InstanceType>]>,
    /// The cloud provider's drift reason, if any.
    pub provider_drift: Option<&'a str>,
}

/// NodeClaims younger than this are not checked for vanished instance types.
pub const INSTANCE_TYPE_DRIFT_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// `Drifted`, first reason found wins: NodePool template hash (same hash version on both, hashes
/// differ), then requirements no longer satisfied by the NodeClaim's labels, then an instance
/// type (or offering) no longer offered, then the provider's reason. Only launched NodeClaims
/// drift.
pub fn drifted(
    nodeclaim: &NodeClaim,
    nodepool: &NodePool,
    inputs: &DriftInputs,
) -> ConditionDecision {
    let launched = nodeclaim
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.is_true(conditions::LAUNCHED));
    if !launched {
        return ConditionDecision::Remove;
    }
    let reason = nodepool_hash_drift(nodeclaim, nodepool)
        .or_else(|| requirements_drift(nodeclaim, nodepool))
        .or_else(|| instance_type_drift(nodeclaim, inputs))
        .or_else(|| {
            inputs
                .provider_drift
                .filter(|r| !r.is_empty())
                .map(|r| DriftReason::Provider(r.to_string()))
        });
    match reason {
        Some(r) => ConditionDecision::SetTrue {
            reason: r.as_str().to_string(),
            message: String::new(),
        },
        None => ConditionDecision::Remove,
    }
}

fn nodepool_hash_drift(nodeclaim: &NodeClaim, nodepool: &NodePool) -> Option<DriftReason> {
    let np = nodepool.metadata.annotations.as_ref()?;
    let nc = nodeclaim.metadata.annotations.as_ref()?;
    let (np_hash, np_version) = (
        np.get(NODEPOOL_HASH_ANNOTATION)?,
        np.get(NODEPOOL_HASH_VERSION_ANNOTATION)?,
    );
    let (nc_hash, nc_version) = (
        nc.get(NODEPOOL_HASH_ANNOTATION)?,
        nc.get(NODEPOOL_HASH_VERSION_ANNOTATION)?,
    );
    (np_version == nc_version && np_hash != nc_hash).then_some(DriftReason::NodePoolDrifted)
}

fn instance_type_drift(nodeclaim: &NodeClaim, inputs: &DriftInputs) -> Option<DriftReason> {
    let types = inputs.instance_types?;
    let created = nodeclaim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(to_chrono)?;
    let min_age = chrono::Duration::from_std(INSTANCE_TYPE_DRIFT_MIN_AGE).unwrap_or_default();
    if inputs.now - created < min_age {
        return None;
    }
    let labels = nodeclaim.metadata.labels.as_ref()?;
    let name = labels.get(INSTANCE_TYPE_LABEL)?;
    let Some(it) = types.iter().find(|it| &it.name == name) else {
        return Some(DriftReason::InstanceTypeNotFound);
    };
    let zone = labels.get(ZONE_LABEL);
    let capacity_type = labels.get(CAPACITY_TYPE_LABEL).map(String::as_str);
    let offered = it.offerings.iter().any(|o| {
        zone.is_none_or(|z| *z == o.zone)
            && capacity_type.is_none_or(|ct| {
                ct == o.capacity_type
                    // A reserved node falls back to on-demand pricing once its reservation ends.
                    || (ct == CAPACITY_TYPE_RESERVED && o.capacity_type == CAPACITY_TYPE_ON_DEMAND)
            })
    });
    (!offered).then_some(DriftReason::InstanceTypeNotFound)
}

fn requirements_drift(nodeclaim: &NodeClaim, nodepool: &NodePool) -> Option<DriftReason> {
    let empty = Default::default();
    let labels = nodeclaim.metadata.labels.as_ref().unwrap_or(&empty);
    let drifted = nodepool
        .spec
        .template
        .spec
        .requirements
        .iter()
        .any(|r| !label_satisfies(labels.get(&r.key).map(String::as_str), r));
    drifted.then_some(DriftReason::RequirementsDrifted)
}

/// Whether a label value (absent = `None`) is compatible with a NodePool requirement, the way
/// upstream's strict compatibility treats NodeClaim labels as single-value `In` requirements.
pub fn label_satisfies(value: Option<&str>, req: &NodeSelectorRequirementWithMinValues) -> bool {
    let number = |s: &str| s.parse::<i64>().ok();
    let bound = || req.values.first().and_then(|v| number(v));
    match (req.operator, value) {
        (Operator::NotIn | Operator::DoesNotExist, None) => true,
        (_, None) => false,
        (Operator::In, Some(v)) => req.values.iter().any(|x| x == v),
        (Operator::NotIn, Some(v)) => !req.values.iter().any(|x| x == v),
        (Operator::Exists, Some(_)) => true,
        (Operator::DoesNotExist, Some(_)) => false,
        (op, Some(v)) => match (number(v), bound()) {
            (Some(v), Some(b)) => match op {
                Operator::Gt => v > b,
                Operator::Lt => v < b,
                Operator::Gte => v >= b,
                Operator::Lte => v <= b,
                _ => false,
            },
            _ => false,
        },
    }
}

/// The `Empty` decision: a node is empty when nothing on it would need rescheduling.
pub fn empty(reschedulable_pods: usize) -> ConditionDecision {
    if reschedulable_pods == 0 {
        ConditionDecision::SetTrue {
            reason: EMPTY.into(),
            message: String::new(),
        }
    } else {
        ConditionDecision::Remove
    }
}

/// Name of the `Empty` decision (a v1beta1 condition type, kept for events and logs).
pub const EMPTY: &str = "Empty";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ConditionStatus;
    use crate::apis::labels::{NODEPOOL_HASH_VERSION, ZONE_LABEL};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::collections::BTreeMap;

    pub(crate) fn nodepool(consolidate_after: &str) -> NodePool {
        let yaml = format!(
            r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: default}}
spec:
  disruption: {{consolidateAfter: {consolidate_after}}}
  template:
    spec:
      nodeClassRef: {{group: karpenter.test.sh, kind: TestNodeClass, name: default}}
      requirements:
        - {{key: topology.kubernetes.io/zone, operator: In, values: [ch-gva-2]}}
"#
        );
        serde_yaml_ng::from_str(&yaml).unwrap()
    }

    fn ts(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn nodeclaim(initialized_at: Option<i64>, last_pod_event: Option<i64>) -> NodeClaim {
        let mut nc: NodeClaim = serde_yaml_ng::from_str(
            r#"
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata: {name: nc, labels: {topology.kubernetes.io/zone: ch-gva-2}}
spec:
  nodeClassRef: {group: karpenter.test.sh, kind: TestNodeClass, name: default}
  requirements: []
"#,
        )
        .unwrap();
        let mut status = crate::apis::NodeClaimStatus::default();
        let t0 = k8s_openapi::jiff::Timestamp::from_second(0).unwrap();
        status.conditions.set_condition(
            conditions::LAUNCHED,
            ConditionStatus::True,
            "Launched",
            "",
            None,
            t0,
        );
        if let Some(at) = initialized_at {
            status.conditions.set_condition(
                conditions::INITIALIZED,
                ConditionStatus::True,
                "Initialized",
                "",
                None,
                ts(at).0,
            );
        }
        status.last_pod_event_time = last_pod_event.map(ts);
        nc.status = Some(status);
        nc
    }

    fn secs(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap()
    }

    #[test]
    fn consolidatable_after_quiet_period_since_last_pod_event() {
        let np = nodepool("30s");
        let nc = nodeclaim(Some(100), Some(1000));
        assert_eq!(
            consolidatable(&nc, &np, secs(1010)).unwrap(),
            ConditionDecision::RemoveUntil(secs(1030))
        );
        assert!(matches!(
            consolidatable(&nc, &np, secs(1030)).unwrap(),
            ConditionDecision::SetTrue { .. }
        ));
        // Without pod events the clock starts at initialization.
        let nc = nodeclaim(Some(100), None);
        assert_eq!(
            consolidatable(&nc, &np, secs(110)).unwrap(),
            ConditionDecision::RemoveUntil(secs(130))
        );
    }

    #[test]
    fn never_and_uninitialized_are_never_consolidatable() {
        let nc = nodeclaim(Some(0), None);
        assert_eq!(
            consolidatable(&nc, &nodepool("Never"), secs(1_000_000)).unwrap(),
            ConditionDecision::Remove
        );
        let nc = nodeclaim(None, None);
        assert_eq!(
            consolidatable(&nc, &nodepool("0s"), secs(1_000_000)).unwrap(),
            ConditionDecision::Remove
        );
    }

    fn annotate(meta: &mut kube::api::ObjectMeta, hash: &str, version: &str) {
        let a = meta.annotations.get_or_insert_with(BTreeMap::new);
        a.insert(NODEPOOL_HASH_ANNOTATION.into(), hash.into());
        a.insert(NODEPOOL_HASH_VERSION_ANNOTATION.into(), version.into());
    }

    #[test]
    fn hash_drift_needs_equal_versions() {
        let mut np = nodepool("0s");
        let mut nc = nodeclaim(Some(0), None);
        annotate(&mut np.metadata, "1", NODEPOOL_HASH_VERSION);
        annotate(&mut nc.metadata, "2", NODEPOOL_HASH_VERSION);
        assert_eq!(
            drifted(&nc, &np, &DriftInputs::default()),
            ConditionDecision::SetTrue {
                reason: "NodePoolDrifted".into(),
                message: String::new()
            }
        );
        annotate(&mut nc.metadata, "2", "v2");
        assert_eq!(
            drifted(&nc, &np, &DriftInputs::default()),
            ConditionDecision::Remove
        );
        annotate(&mut nc.metadata, "1", NODEPOOL_HASH_VERSION);
        assert_eq!(
            drifted(&nc, &np, &DriftInputs::default()),
            ConditionDecision::Remove
        );
    }

    #[test]
    fn requirement_and_provider_drift() {
        let mut np = nodepool("0s");
        let nc = nodeclaim(Some(0), None);
        assert_eq!(
            drifted(&nc, &np, &DriftInputs::default()),
            ConditionDecision::Remove
        );
        np.spec.template.spec.requirements[0].values = vec!["de-fra-1".into()];
        assert!(matches!(
            drifted(&nc, &np, &provider("ImageDrifted")),
            ConditionDecision::SetTrue { reason, .. } if reason == "RequirementsDrifted"
        ));
        let np = nodepool("0s");
        assert!(matches!(
            drifted(&nc, &np, &provider("ImageDrifted")),
            ConditionDecision::SetTrue { reason, .. } if reason == "ImageDrifted"
        ));
    }

    fn provider(reason: &str) -> DriftInputs<'_> {
        DriftInputs {
            provider_drift: Some(reason),
            ..Default::default()
        }
    }

    #[test]
    fn vanished_instance_types_drift_old_nodeclaims_only() {
        let np = nodepool("0s");
        let mut nc = nodeclaim(Some(0), None);
        nc.metadata.creation_timestamp = Some(ts(0));
        let labels = nc.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(INSTANCE_TYPE_LABEL.into(), "large".into());
        labels.insert(CAPACITY_TYPE_LABEL.into(), "on-demand".into());
        let offered = vec![crate::disruption::fixtures::instance_type("large", 4)];
        let mut other_zone = (*crate::disruption::fixtures::instance_type("large", 4)).clone();
        other_zone.offerings[0].zone = "elsewhere".into();
        let other_zone = vec![Arc::new(other_zone)];
        let inputs = |types: &'static [Arc<InstanceType>], at: i64| DriftInputs {
            now: secs(at),
            instance_types: Some(types),
            provider_drift: None,
        };
        // The fixture zone is test-zone-1; the NodeClaim's is ch-gva-2: retarget it.
        nc.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(ZONE_LABEL.into(), crate::disruption::fixtures::ZONE.into());
        let mut np_same_zone = np.clone();
        np_same_zone.spec.template.spec.requirements.clear();
        let offered: &'static [Arc<InstanceType>] = Box::leak(offered.into_boxed_slice());
        let other_zone: &'static [Arc<InstanceType>] = Box::leak(other_zone.into_boxed_slice());
        assert_eq!(
            drifted(&nc, &np_same_zone, &inputs(offered, 7200)),
            ConditionDecision::Remove
        );
        assert!(
            matches!(drifted(&nc, &np_same_zone, &inputs(other_zone, 7200)),
            ConditionDecision::SetTrue { reason, .. } if reason == "InstanceTypeNotFound")
        );
        assert!(matches!(drifted(&nc, &np_same_zone, &inputs(&[], 7200)),
            ConditionDecision::SetTrue { reason, .. } if reason == "InstanceTypeNotFound"));
        assert_eq!(
            drifted(&nc, &np_same_zone, &inputs(&[], 600)),
            ConditionDecision::Remove,
            "younger than 1 h"
        );
    }

    #[test]
    fn label_compatibility_follows_operators() {
        let req = |op, values: &[&str]| NodeSelectorRequirementWithMinValues {
            key: ZONE_LABEL.into(),
            operator: op,
            values: values.iter().map(|s| s.to_string()).collect(),
            min_values: None,
        };
        assert!(label_satisfies(Some("a"), &req(Operator::In, &["a", "b"])));
        assert!(!label_satisfies(None, &req(Operator::In, &["a"])));
        assert!(label_satisfies(None, &req(Operator::NotIn, &["a"])));
        assert!(!label_satisfies(Some("a"), &req(Operator::NotIn, &["a"])));
        assert!(label_satisfies(None, &req(Operator::DoesNotExist, &[])));
        assert!(!label_satisfies(None, &req(Operator::Exists, &[])));
        assert!(label_satisfies(Some("8"), &req(Operator::Gt, &["4"])));
        assert!(!label_satisfies(Some("4"), &req(Operator::Gt, &["4"])));
        assert!(label_satisfies(Some("4"), &req(Operator::Gte, &["4"])));
        assert!(!label_satisfies(Some("x"), &req(Operator::Lt, &["4"])));
    }

    #[test]
    fn emptiness_is_about_reschedulable_pods() {
        assert!(matches!(empty(0), ConditionDecision::SetTrue { .. }));
        assert_eq!(empty(3), ConditionDecision::Remove);
    }
}
