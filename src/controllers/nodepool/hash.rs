//! The NodePool drift hash: a structural hash of `spec.template` minus `requirements`, with
//! taint lists treated as sets (karpenter-core §1.1). Version `v3` as upstream; the value need not
//! equal Go's, only be stable across restarts and replicas of this binary.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::apis::NodePool;
use crate::apis::labels::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
};

fn taint_set(taints: &[crate::apis::Taint]) -> Value {
    let mut items: Vec<String> = taints
        .iter()
        .map(|t| serde_json::to_string(&json!({"key": t.key, "value": t.value.clone().unwrap_or_default(), "effect": t.effect})).unwrap_or_default())
        .collect();
    items.sort();
    items.dedup();
    json!(items)
}

/// The drift hash of a NodePool's template, as a decimal string.
pub fn nodepool_hash(pool: &NodePool) -> String {
    let template = &pool.spec.template;
    let metadata = template.metadata.clone().unwrap_or_default();
    let spec = &template.spec;
    // Zero values are omitted so adding an empty field does not drift nodes (hashstructure's
    // IgnoreZeroValue); BTreeMaps serialize in key order.
    let mut doc = serde_json::Map::new();
    if !metadata.labels.is_empty() {
        doc.insert("labels".into(), json!(metadata.labels));
    }
    if !metadata.annotations.is_empty() {
        doc.insert("annotations".into(), json!(metadata.annotations));
    }
    if !spec.taints.is_empty() {
        doc.insert("taints".into(), taint_set(&spec.taints));
    }
    if !spec.startup_taints.is_empty() {
        doc.insert("startupTaints".into(), taint_set(&spec.startup_taints));
    }
    doc.insert("nodeClassRef".into(), json!(spec.node_class_ref));
    doc.insert("expireAfter".into(), json!(spec.expire_after));
    if let Some(tgp) = &spec.termination_grace_period {
        doc.insert("terminationGracePeriod".into(), json!(tgp));
    }
    let bytes = serde_json::to_vec(&Value::Object(doc)).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first).to_string()
}

/// Annotations the NodePool (and every NodeClaim created from it) carries.
pub fn hash_annotations(pool: &NodePool) -> [(String, String); 2] {
    [
        (NODEPOOL_HASH_ANNOTATION.to_string(), nodepool_hash(pool)),
        (
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        ),
    ]
}

/// Whether a NodeClaim's hash annotations must be rewritten after a hash-version change:
/// only when its version differs from ours and it is not already drifted (upstream rule).
pub fn needs_hash_migration(claim_version: Option<&str>, drifted: bool) -> bool {
    claim_version != Some(NODEPOOL_HASH_VERSION) && !drifted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::{Taint, TaintEffect};

    fn pool() -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {
                "template": {
                    "metadata": {"labels": {"team": "a"}},
                    "spec": {
                        "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
                        "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "default"},
                        "taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]
                    }
                },
                "limits": {"cpu": "10"}
            }
        }))
        .unwrap()
    }

    #[test]
    fn requirements_budgets_and_limits_do_not_change_the_hash() {
        let base = nodepool_hash(&pool());
        let mut p = pool();
        p.spec.template.spec.requirements.clear();
        p.spec.limits = None;
        p.spec.weight = Some(50);
        p.spec.disruption.budgets.clear();
        assert_eq!(nodepool_hash(&p), base);
    }

    #[test]
    fn template_labels_taints_and_expiry_change_the_hash() {
        let base = nodepool_hash(&pool());
        let mut p = pool();
        p.spec
            .template
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .insert("team".into(), "b".into());
        assert_ne!(nodepool_hash(&p), base);
        let mut p = pool();
        p.spec.template.spec.expire_after = "24h".into();
        assert_ne!(nodepool_hash(&p), base);
        let mut p = pool();
        p.spec
            .template
            .spec
            .taints
            .push(Taint::new("c", None, TaintEffect::NoSchedule));
        assert_ne!(nodepool_hash(&p), base);
    }

    #[test]
    fn taints_are_a_set() {
        let base = nodepool_hash(&pool());
        let mut p = pool();
        p.spec.template.spec.taints.reverse();
        assert_eq!(nodepool_hash(&p), base);
        assert_eq!(hash_annotations(&p)[1].1, "v3");
    }

    #[test]
    fn migration_skips_drifted_and_current_claims() {
        assert!(needs_hash_migration(Some("v2"), false));
        assert!(needs_hash_migration(None, false));
        assert!(!needs_hash_migration(Some("v2"), true));
        assert!(!needs_hash_migration(Some("v3"), false));
    }
}
