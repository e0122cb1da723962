//! The NodePool drift hash annotations (karpenter-core §1.1), version `v3` as upstream.

use crate::apis::NodePool;
use crate::apis::labels::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
};

/// The drift hash of a NodePool's template, as a decimal string: upstream's exact value (one
/// implementation, shared with disruption's drift check), so a Go and a Rust controller agree.
pub fn nodepool_hash(pool: &NodePool) -> String {
    crate::disruption::hash::nodepool_hash(&pool.spec.template).unwrap_or_else(|error| {
        // Only an invalid duration fails, which CRD validation already refuses.
        tracing::warn!(%error, "cannot hash NodePool template");
        String::new()
    })
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
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {
                "template": {
                    "metadata": {"labels": {"team": "a"}},
                    "spec": {
                        "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
                        "nodeClassRef": {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "default"},
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
