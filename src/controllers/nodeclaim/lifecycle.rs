//! Pure decisions of the NodeClaim lifecycle (karpenter-core §4.1): merging a launch result,
//! syncing the registered Node, the initialization checks and the liveness deadlines.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint as CoreTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::apis::labels::{
    DO_NOT_SYNC_TAINTS_LABEL, NODE_INITIALIZED_LABEL, NODE_REGISTERED_LABEL,
    NODECLAIM_TOKENS_ANNOTATION, TERMINATION_FINALIZER, UNREGISTERED_TAINT_KEY, conditions,
};
use crate::apis::{
    Condition, ConditionStatus, ConditionsExt, NodeClaim, NodeClaimStatus, Taint, TaintEffect,
};
use crate::state::node_ready;
use crate::state::quantity::parse_milli;

/// Taints that go away on their own while a node starts; initialization waits for them.
pub fn is_known_ephemeral_taint(taint: &CoreTaint) -> bool {
    let key = taint.key.as_str();
    let effect = taint.effect.as_str();
    (key == "node.kubernetes.io/not-ready" && (effect == "NoSchedule" || effect == "NoExecute"))
        || (key == "node.kubernetes.io/unreachable" && effect == "NoSchedule")
        || (key == "node.cloudprovider.kubernetes.io/uninitialized" && effect == "NoSchedule")
        || (key == UNREGISTERED_TAINT_KEY && effect == "NoExecute")
        || key.starts_with("readiness.k8s.io/")
}

fn effect_str(effect: TaintEffect) -> &'static str {
    match effect {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// Converts a CRD taint to a core/v1 taint.
pub fn to_core_taint(taint: &Taint) -> CoreTaint {
    CoreTaint {
        key: taint.key.clone(),
        value: taint.value.clone(),
        effect: effect_str(taint.effect).into(),
        time_added: taint.time_added.clone(),
    }
}

/// What the user data writes for a taint without a value (`providers::userdata`).
const AGENT_EMPTY_TAINT_VALUE: &str = "true";

/// A Node holds one taint per key and effect (the API server refuses a second), and that pair
/// is what identifies it, as upstream matches taints. The value may differ from the
/// NodeClaim's: the node agent refuses empty values, so user data writes them `true`.
/// Comparing values too made registration add a second `key:Effect` taint beside the
/// kubelet's `key=true:Effect`, which the API server refused on every pass: a NodePool with a
/// value-less startup taint never registered a node and launched more in their place.
fn same_taint(a: &CoreTaint, b: &CoreTaint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// Merges what the cloud provider returned from Create into the NodeClaim: provider labels
/// under the NodeClaim's own (which win), annotations likewise, and the status fields.
pub fn merge_launched(claim: &NodeClaim, launched: &NodeClaim) -> NodeClaim {
    let mut out = claim.clone();
    let mut labels = launched.labels().clone();
    labels.extend(claim.labels().clone());
    out.metadata.labels = Some(labels);
    let mut annotations = launched.annotations().clone();
    annotations.extend(claim.annotations().clone());
    // Both records of bootstrap tokens: a relaunch issues a token the claim's older record
    // lacks, and a name missing from the record is a token nothing deletes.
    let tokens = |c: &NodeClaim| {
        crate::providers::bootstrap_token::recorded(
            c.annotations()
                .get(NODECLAIM_TOKENS_ANNOTATION)
                .map(String::as_str),
        )
    };
    let mut recorded = tokens(claim);
    recorded.extend(tokens(launched));
    if !recorded.is_empty() {
        annotations.insert(
            NODECLAIM_TOKENS_ANNOTATION.to_string(),
            crate::providers::bootstrap_token::record(&recorded),
        );
    }
    out.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    let from = launched.status.clone().unwrap_or_default();
    let status = out.status.get_or_insert_with(NodeClaimStatus::default);
    status.provider_id = from.provider_id;
    status.image_id = from.image_id;
    status.capacity = from.capacity;
    status.allocatable = from.allocatable;
    out
}

/// Outcome of looking for the Node of a launched NodeClaim.
#[derive(Debug, PartialEq)]
pub enum Registration {
    /// No Node reports the provider ID yet.
    NodeNotFound,
    /// More than one Node claims the provider ID.
    MultipleNodesFound(Vec<String>),
    /// The Node as it must be after registration (only write it when it differs).
    Register(Box<Node>),
}

/// Decides registration given the Nodes with the NodeClaim's provider ID.
pub fn registration(claim: &NodeClaim, nodes: &[impl Borrow<Node>]) -> Registration {
    match nodes {
        [] => Registration::NodeNotFound,
        [node] => Registration::Register(Box::new(synced_node(claim, node.borrow()))),
        many => {
            Registration::MultipleNodesFound(many.iter().map(|n| n.borrow().name_any()).collect())
        }
    }
}

/// True when a Node Karpenter has not synced yet came up without the `unregistered` taint (the
/// `UnregisteredTaintMissing` warning). A Node carrying `karpenter.sh/registered=true` was
/// synced by an earlier pass that removed the taint itself: under a burst the NodeClaim cache
/// can lag behind the Node's, so registration runs again on a node it already synced, and must
/// not report the taint it removed as missing.
pub fn unregistered_taint_missing(node: &Node) -> bool {
    let synced = node
        .labels()
        .get(NODE_REGISTERED_LABEL)
        .is_some_and(|v| v == "true");
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNREGISTERED_TAINT_KEY));
    !synced && !tainted
}

/// The Node with the NodeClaim's labels, annotations, taints, finalizer and owner reference,
/// the unregistered taint removed and `karpenter.sh/registered=true`.
pub fn synced_node(claim: &NodeClaim, node: &Node) -> Node {
    let mut out = node.clone();
    let registered_before =
        claim.condition_is_true(conditions::REGISTERED) || synced_by(node, claim);
    let mut labels = out.labels().clone();
    labels.extend(claim.labels().clone());
    labels.insert(NODE_REGISTERED_LABEL.into(), "true".into());
    out.metadata.labels = Some(labels);
    let mut annotations = out.annotations().clone();
    // The bootstrap-token record is the NodeClaim's bookkeeping, not node metadata.
    annotations.extend(
        claim
            .annotations()
            .iter()
            .filter(|(k, _)| k.as_str() != NODECLAIM_TOKENS_ANNOTATION)
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    out.metadata.annotations = (!annotations.is_empty()).then_some(annotations);

    let finalizers = out.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.into());
    }
    let owner = OwnerReference {
        api_version: "karpenter.sh/v1".into(),
        kind: "NodeClaim".into(),
        name: claim.name_any(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: None,
    };
    let owners = out.metadata.owner_references.get_or_insert_with(Vec::new);
    if !owners
        .iter()
        .any(|o| o.uid == owner.uid && o.kind == owner.kind)
    {
        owners.push(owner);
    }

    let spec = out.spec.get_or_insert_with(Default::default);
    let mut taints = spec.taints.clone().unwrap_or_default();
    let do_not_sync = node
        .labels()
        .get(DO_NOT_SYNC_TAINTS_LABEL)
        .is_some_and(|v| v == "true");
    // Taints are synced once: startup taints removed later by daemons must not come back.
    if !do_not_sync && !registered_before {
        for taint in claim.spec.taints.iter().chain(&claim.spec.startup_taints) {
            let core = to_core_taint(taint);
            match taints.iter_mut().find(|t| same_taint(t, &core)) {
                // The node agent's `true` for a value-less taint (see [`same_taint`]) goes
                // back to the NodeClaim's empty value in this write, which is also the one
                // that lets pods onto the Node: a pod tolerating `key=""` lands where the
                // scheduler placed it. Another value on the Node is kept, as upstream merges.
                Some(held)
                    if held.value.as_deref() == Some(AGENT_EMPTY_TAINT_VALUE)
                        && core.value.as_deref().unwrap_or("").is_empty() =>
                {
                    *held = core;
                }
                Some(_) => {}
                None => taints.push(core),
            }
        }
    }
    taints.retain(|t| t.key != UNREGISTERED_TAINT_KEY);
    spec.taints = (!taints.is_empty()).then_some(taints);
    out
}

/// True when `node` carries this NodeClaim's sync: `karpenter.sh/registered=true` and an owner
/// reference to its UID, which registration writes in one patch. The NodeClaim's `Registered`
/// condition follows later (a Node that arrives during the launch's status write is synced
/// beside it, and the condition set by the next pass), and a startup taint that a daemon
/// removed in between must not come back.
fn synced_by(node: &Node, claim: &NodeClaim) -> bool {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    node.labels()
        .get(NODE_REGISTERED_LABEL)
        .is_some_and(|v| v == "true")
        && !uid.is_empty()
        && node
            .owner_references()
            .iter()
            .any(|o| o.kind == "NodeClaim" && o.uid == uid)
}

/// Why a registered NodeClaim is not initialized yet.
#[derive(Debug, PartialEq, Eq)]
pub struct NotInitialized {
    pub reason: &'static str,
    pub message: String,
}

/// Initialization: the Node is Ready, startup and ephemeral taints are gone, and every
/// requested resource is present in allocatable (device plugins registered).
pub fn initialization(claim: &NodeClaim, node: Option<&Node>) -> Result<(), NotInitialized> {
    let Some(node) = node else {
        return Err(NotInitialized {
            reason: "NodeNotFound",
            message: "Node not registered with cluster".into(),
        });
    };
    if !node_ready(node) {
        return Err(NotInitialized {
            reason: "NodeNotReady",
            message: "Node status is NotReady".into(),
        });
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if let Some(t) = claim
        .spec
        .startup_taints
        .iter()
        .map(to_core_taint)
        .find(|st| taints.iter().any(|t| same_taint(t, st)))
    {
        return Err(NotInitialized {
            reason: "StartupTaintsExist",
            message: format!("StartupTaint {:?} still exists", t.key),
        });
    }
    if let Some(t) = taints.iter().find(|t| is_known_ephemeral_taint(t)) {
        return Err(NotInitialized {
            reason: "KnownEphemeralTaintsExist",
            message: format!("KnownEphemeralTaint {:?} still exists", t.key),
        });
    }
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.clone())
        .unwrap_or_default();
    for (name, quantity) in &claim.spec.resources.requests {
        if parse_milli(&quantity.0).unwrap_or(0) == 0 {
            continue;
        }
        let present = allocatable
            .get(name)
            .and_then(|q| parse_milli(&q.0))
            .unwrap_or(0);
        if present == 0 {
            return Err(NotInitialized {
                reason: "ResourceNotRegistered",
                message: format!("Resource {name:?} was requested but not registered"),
            });
        }
    }
    Ok(())
}

/// Labels the Node initialized.
pub fn initialized_node(node: &Node) -> Node {
    let mut out = node.clone();
    out.labels_mut()
        .insert(NODE_INITIALIZED_LABEL.into(), "true".into());
    out
}

/// The liveness verdict for an unregistered NodeClaim.
#[derive(Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Registered (or nothing to watch): no deadline.
    Alive,
    /// Check again after this long.
    RecheckAfter(Duration),
    /// Delete the NodeClaim: `launch_timeout` or `registration_timeout`.
    Expired(&'static str),
}

fn condition<'a>(claim: &'a NodeClaim, type_: &str) -> Option<&'a Condition> {
    claim.status.as_ref()?.conditions.get_condition(type_)
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let secs = now.duration_since(since).as_secs();
    Duration::from_secs(secs.max(0) as u64)
}

/// Why a launched NodeClaim whose Node never registered is deleted (the disruption reason).
pub const REGISTRATION_TIMEOUT: &str = "registration_timeout";

/// Launch timeout counts from the Launched condition's last transition (or creation); the
/// registration TTL from the Registered condition's (set Unknown at launch).
pub fn liveness(
    claim: &NodeClaim,
    now: Timestamp,
    launch_timeout: Duration,
    registration_ttl: Duration,
) -> Liveness {
    if condition(claim, conditions::REGISTERED).is_some_and(|c| c.status == ConditionStatus::True) {
        return Liveness::Alive;
    }
    let created = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    let launched = condition(claim, conditions::LAUNCHED);
    if !launched.is_some_and(|c| c.status == ConditionStatus::True) {
        let since = launched
            .map(|c| c.last_transition_time.0)
            .unwrap_or(created);
        let age = elapsed(since, now);
        return if age >= launch_timeout {
            Liveness::Expired("launch_timeout")
        } else {
            Liveness::RecheckAfter(launch_timeout - age)
        };
    }
    let since = condition(claim, conditions::REGISTERED)
        .map(|c| c.last_transition_time.0)
        .or(launched.map(|c| c.last_transition_time.0))
        .unwrap_or(created);
    let age = elapsed(since, now);
    if age >= registration_ttl {
        Liveness::Expired(REGISTRATION_TIMEOUT)
    } else {
        Liveness::RecheckAfter(registration_ttl - age)
    }
}

/// Sets Ready from Launched, Registered and Initialized; returns whether anything changed.
pub fn set_ready(status: &mut NodeClaimStatus, generation: Option<i64>, now: Timestamp) -> bool {
    let parts = [
        conditions::LAUNCHED,
        conditions::REGISTERED,
        conditions::INITIALIZED,
    ];
    let blocking = parts
        .iter()
        .find(|t| !status.conditions.is_true(t))
        .copied();
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
            let (st, reason) = status
                .conditions
                .get_condition(part)
                .map(|c| (c.status, c.reason.clone()))
                .unwrap_or((ConditionStatus::Unknown, "AwaitingReconciliation".into()));
            let st = if st == ConditionStatus::False {
                ConditionStatus::False
            } else {
                ConditionStatus::Unknown
            };
            let reason = if reason.is_empty() {
                format!("{part}NotTrue")
            } else {
                reason
            };
            status.conditions.set_condition(
                conditions::READY,
                st,
                &reason,
                &format!("{part} is not True"),
                generation,
                now,
            )
        }
    }
}

/// Labels a merged map without empty entries (helper for patches).
pub fn non_empty(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::*;
    use k8s_openapi::api::core::v1::NodeCondition;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn ready(mut n: Node) -> Node {
        n.status.get_or_insert_with(Default::default).conditions = Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        n
    }

    #[test]
    fn launch_merges_provider_labels_without_overwriting_the_claims() {
        let mut claim = nodeclaim("c", "pool", None);
        claim.labels_mut().insert("team".into(), "mine".into());
        let mut launched = with_capacity(
            nodeclaim("c", "pool", Some("exoscale://i")),
            &[("cpu", "2")],
        );
        launched.metadata.labels = Some(BTreeMap::from([
            ("team".to_string(), "provider".to_string()),
            (
                "node.kubernetes.io/instance-type".to_string(),
                "standard.small".to_string(),
            ),
        ]));
        let merged = merge_launched(&claim, &launched);
        assert_eq!(merged.labels()["team"], "mine");
        assert_eq!(
            merged.labels()["node.kubernetes.io/instance-type"],
            "standard.small"
        );
        assert_eq!(merged.labels()["karpenter.sh/nodepool"], "pool");
        // A relaunch's token joins the record the claim already had.
        let mut relaunched = claim.clone();
        relaunched.annotations_mut().insert(
            NODECLAIM_TOKENS_ANNOTATION.into(),
            "bootstrap-token-aaaaaa".into(),
        );
        let mut second = launched.clone();
        second.annotations_mut().insert(
            NODECLAIM_TOKENS_ANNOTATION.into(),
            "bootstrap-token-bbbbbb".into(),
        );
        let record =
            merge_launched(&relaunched, &second).annotations()[NODECLAIM_TOKENS_ANNOTATION].clone();
        assert_eq!(record, "bootstrap-token-aaaaaa,bootstrap-token-bbbbbb");
        let status = merged.status.unwrap();
        assert_eq!(status.provider_id.as_deref(), Some("exoscale://i"));
        assert_eq!(status.capacity["cpu"], Quantity("2".into()));
    }

    #[test]
    fn registration_syncs_the_node() {
        let mut claim = nodeclaim("c", "pool", Some("exoscale://i"));
        claim.spec.taints = vec![Taint::new(
            "dedicated",
            Some("gpu"),
            TaintEffect::NoSchedule,
        )];
        claim.spec.startup_taints = vec![Taint::new("cni/not-ready", None, TaintEffect::NoExecute)];
        claim.annotations_mut().insert("a".into(), "b".into());
        claim.annotations_mut().insert(
            NODECLAIM_TOKENS_ANNOTATION.into(),
            "bootstrap-token-abcdef".into(),
        );
        let n = node(
            "n",
            Some("exoscale://i"),
            &[(UNREGISTERED_TAINT_KEY, "NoExecute")],
        );
        let Registration::Register(synced) = registration(&claim, &[n]) else {
            panic!("expected registration");
        };
        assert_eq!(synced.labels()[NODE_REGISTERED_LABEL], "true");
        assert_eq!(synced.labels()["karpenter.sh/nodepool"], "pool");
        assert_eq!(synced.annotations()["a"], "b");
        assert!(
            !synced
                .annotations()
                .contains_key(NODECLAIM_TOKENS_ANNOTATION)
        );
        assert_eq!(synced.finalizers(), &[TERMINATION_FINALIZER.to_string()]);
        let owner = &synced.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("NodeClaim", "c")
        );
        let keys: Vec<&str> = synced
            .spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(keys, vec!["dedicated", "cni/not-ready"]);
        // Idempotent: syncing again changes nothing.
        assert_eq!(synced_node(&claim, &synced), *synced);
    }

    #[test]
    fn a_node_synced_under_a_stale_nodeclaim_is_not_reported_as_missing_its_taint() {
        let claim = nodeclaim("c", "pool", Some("exoscale://i"));
        let joined = node(
            "n",
            Some("exoscale://i"),
            &[(UNREGISTERED_TAINT_KEY, "NoExecute")],
        );
        assert!(!unregistered_taint_missing(&joined));
        let Registration::Register(synced) = registration(&claim, &[joined]) else {
            panic!("expected registration");
        };
        // The burst race: the Node watch already shows our sync (taint gone) while the cached
        // NodeClaim is still unregistered, so registration runs again on the synced Node.
        assert!(!unregistered_taint_missing(&synced));
        let Registration::Register(again) = registration(&claim, &[(*synced).clone()]) else {
            panic!("expected registration");
        };
        assert_eq!(*again, *synced);
        // A node that joined without the taint and was never synced is reported.
        let bare = node("n", Some("exoscale://i"), &[]);
        assert!(unregistered_taint_missing(&bare));
    }

    #[test]
    fn registered_claims_do_not_re_add_removed_startup_taints_and_respect_do_not_sync() {
        let mut claim = registered(nodeclaim("c", "pool", Some("exoscale://i")));
        claim.spec.startup_taints = vec![Taint::new("cni/not-ready", None, TaintEffect::NoExecute)];
        let n = node("n", Some("exoscale://i"), &[]);
        let synced = synced_node(&claim, &n);
        assert!(synced.spec.unwrap().taints.is_none());

        let fresh = nodeclaim("c", "pool", Some("exoscale://i"));
        let mut claim = fresh.clone();
        claim.spec.taints = vec![Taint::new("x", None, TaintEffect::NoSchedule)];
        let mut n = node("n", Some("exoscale://i"), &[]);
        n.labels_mut()
            .insert(DO_NOT_SYNC_TAINTS_LABEL.into(), "true".into());
        assert!(synced_node(&claim, &n).spec.unwrap().taints.is_none());
    }

    #[test]
    fn a_node_this_nodeclaim_synced_does_not_get_removed_startup_taints_back() {
        let mut claim = nodeclaim("c", "pool", Some("exoscale://i"));
        claim.metadata.uid = Some("uid-c".into());
        claim.spec.startup_taints = vec![Taint::new("cni/not-ready", None, TaintEffect::NoExecute)];
        let joined = node(
            "n",
            Some("exoscale://i"),
            &[(UNREGISTERED_TAINT_KEY, "NoExecute")],
        );
        let synced = synced_node(&claim, &joined);
        assert_eq!(
            synced.spec.as_ref().unwrap().taints.as_ref().unwrap()[0].key,
            "cni/not-ready"
        );
        // A daemon removes the startup taint before the NodeClaim says Registered.
        let mut ready = synced.clone();
        ready.spec.as_mut().unwrap().taints = None;
        assert!(synced_node(&claim, &ready).spec.unwrap().taints.is_none());
        // The label alone, or another NodeClaim's owner reference, proves no sync of ours.
        let mut other = claim.clone();
        other.metadata.uid = Some("uid-other".into());
        assert_eq!(
            synced_node(&other, &ready).spec.unwrap().taints.unwrap()[0].key,
            "cni/not-ready"
        );
        let mut labelled = joined.clone();
        labelled
            .labels_mut()
            .insert(NODE_REGISTERED_LABEL.into(), "true".into());
        labelled.spec.as_mut().unwrap().taints = None;
        assert_eq!(
            synced_node(&claim, &labelled).spec.unwrap().taints.unwrap()[0].key,
            "cni/not-ready"
        );
    }

    #[test]
    fn multiple_nodes_are_a_conflict() {
        let claim = nodeclaim("c", "pool", Some("exoscale://i"));
        let nodes = [
            node("a", Some("exoscale://i"), &[]),
            node("b", Some("exoscale://i"), &[]),
        ];
        assert_eq!(
            registration(&claim, &nodes),
            Registration::MultipleNodesFound(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            registration(&claim, &Vec::<Node>::new()),
            Registration::NodeNotFound
        );
    }

    #[test]
    fn a_value_less_taint_the_node_agent_wrote_as_true_is_the_same_taint_and_gets_its_value_back() {
        // Value-less taints, as most CNIs' startup taints are; the user data writes them
        // `true` (the node agent refuses empty values) and the kubelet registers them so.
        let mut claim = nodeclaim("c", "pool", Some("exoscale://i"));
        claim.spec.taints = vec![Taint::new("dedicated", None, TaintEffect::NoSchedule)];
        claim.spec.startup_taints =
            vec![Taint::new("cni/not-ready", None, TaintEffect::NoSchedule)];
        let agent = crate::sim::kubelet::NodeAgentSettings {
            node_taints: crate::providers::userdata::kubelet_taints(
                &claim
                    .spec
                    .taints
                    .iter()
                    .chain(&claim.spec.startup_taints)
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
            ..Default::default()
        };
        let mut joined = node("n", Some("exoscale://i"), &[]);
        joined.spec.as_mut().unwrap().taints =
            Some(crate::sim::kubelet::taints_from(&agent).unwrap());
        let Registration::Register(synced) = registration(&claim, &[joined]) else {
            panic!("expected registration");
        };
        let held: std::collections::BTreeSet<(String, String, Option<String>)> = synced
            .spec
            .as_ref()
            .unwrap()
            .taints
            .iter()
            .flatten()
            .map(|t| (t.key.clone(), t.effect.clone(), t.value.clone()))
            .collect();
        // One taint per key and effect (the API server refuses a second), with the
        // NodeClaim's empty value back.
        let expected = [
            ("cni/not-ready".to_string(), "NoSchedule".to_string(), None),
            ("dedicated".to_string(), "NoSchedule".to_string(), None),
        ];
        assert_eq!(held, expected.into_iter().collect());
        // Idempotent, and a value another writer set is kept.
        assert_eq!(synced_node(&claim, &synced), *synced);
        let mut other = node("n", Some("exoscale://i"), &[]);
        other.spec.as_mut().unwrap().taints = Some(vec![CoreTaint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        let kept = synced_node(&claim, &other);
        assert_eq!(
            kept.spec.unwrap().taints.unwrap()[0].value.as_deref(),
            Some("db")
        );
        // While the Node holds the startup taint it has not been removed.
        assert_eq!(
            initialization(&claim, Some(&ready((*synced).clone())))
                .unwrap_err()
                .reason,
            "StartupTaintsExist"
        );
    }

    #[test]
    fn initialization_waits_for_ready_taints_and_resources() {
        let mut claim = nodeclaim("c", "pool", Some("exoscale://i"));
        claim.spec.startup_taints = vec![Taint::new("cni/not-ready", None, TaintEffect::NoExecute)];
        claim.spec.resources.requests = resources(&[("cpu", "1"), ("nvidia.com/gpu", "1")]);
        assert_eq!(
            initialization(&claim, None).unwrap_err().reason,
            "NodeNotFound"
        );
        let n = node("n", Some("exoscale://i"), &[("cni/not-ready", "NoExecute")]);
        assert_eq!(
            initialization(&claim, Some(&n)).unwrap_err().reason,
            "NodeNotReady"
        );
        let n = ready(n);
        assert_eq!(
            initialization(&claim, Some(&n)).unwrap_err().reason,
            "StartupTaintsExist"
        );
        let n = ready(node(
            "n",
            Some("exoscale://i"),
            &[("readiness.k8s.io/net", "NoSchedule")],
        ));
        assert_eq!(
            initialization(&claim, Some(&n)).unwrap_err().reason,
            "KnownEphemeralTaintsExist"
        );
        let n = ready(with_node_capacity(
            node("n", Some("exoscale://i"), &[]),
            &[("cpu", "2")],
        ));
        let err = initialization(&claim, Some(&n)).unwrap_err();
        assert_eq!(err.reason, "ResourceNotRegistered");
        assert!(err.message.contains("nvidia.com/gpu"));
        let n = ready(with_node_capacity(
            node("n", Some("exoscale://i"), &[]),
            &[("cpu", "2"), ("nvidia.com/gpu", "1")],
        ));
        assert_eq!(initialization(&claim, Some(&n)), Ok(()));
        assert_eq!(
            initialized_node(&n).labels()[NODE_INITIALIZED_LABEL],
            "true"
        );
    }

    #[test]
    fn liveness_deadlines() {
        let launch = Duration::from_secs(300);
        let ttl = Duration::from_secs(900);
        // Not launched, Launched=Unknown since t=0.
        let claim = set_condition(
            nodeclaim("c", "p", None),
            conditions::LAUNCHED,
            ConditionStatus::Unknown,
            0,
        );
        assert_eq!(
            liveness(&claim, ts(100).0, launch, ttl),
            Liveness::RecheckAfter(Duration::from_secs(200))
        );
        assert_eq!(
            liveness(&claim, ts(300).0, launch, ttl),
            Liveness::Expired("launch_timeout")
        );
        // Launched at t=10, Registered Unknown since t=10.
        let claim = set_condition(
            nodeclaim("c", "p", Some("exoscale://i")),
            conditions::LAUNCHED,
            ConditionStatus::True,
            10,
        );
        let claim = set_condition(claim, conditions::REGISTERED, ConditionStatus::Unknown, 10);
        assert_eq!(
            liveness(&claim, ts(500).0, launch, ttl),
            Liveness::RecheckAfter(Duration::from_secs(410))
        );
        assert_eq!(
            liveness(&claim, ts(910).0, launch, ttl),
            Liveness::Expired("registration_timeout")
        );
        let claim = registered(nodeclaim("c", "p", Some("exoscale://i")));
        assert_eq!(
            liveness(&claim, ts(100_000).0, launch, ttl),
            Liveness::Alive
        );
    }

    #[test]
    fn ready_follows_the_lifecycle_conditions() {
        let mut status = NodeClaimStatus::default();
        let now = ts(0).0;
        status.conditions.set_condition(
            conditions::LAUNCHED,
            ConditionStatus::True,
            "Launched",
            "",
            None,
            now,
        );
        status.conditions.set_condition(
            conditions::REGISTERED,
            ConditionStatus::Unknown,
            "NodeNotFound",
            "",
            None,
            now,
        );
        set_ready(&mut status, None, now);
        let ready = status.conditions.get_condition(conditions::READY).unwrap();
        assert_eq!(
            (ready.status, ready.reason.as_str()),
            (ConditionStatus::Unknown, "NodeNotFound")
        );
        status.conditions.set_condition(
            conditions::REGISTERED,
            ConditionStatus::True,
            "Registered",
            "",
            None,
            now,
        );
        status.conditions.set_condition(
            conditions::INITIALIZED,
            ConditionStatus::True,
            "Initialized",
            "",
            None,
            now,
        );
        assert!(set_ready(&mut status, None, now));
        assert!(status.conditions.is_true(conditions::READY));
    }
}
