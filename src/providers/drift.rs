//! Provider-side drift: does a running instance still match what its NodeClass asks for now?
//! Compared against the NodeClass's *desired* state (resolved template and group IDs), never
//! against the instance itself (the Go provider's template check could never fire).

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::apis::ExoscaleNodeClassSpec;
use crate::exoscale::models::{Instance, Labels};

/// Drift reasons, named as the Go provider names them (plus the NodeClass hash it lacked).
pub mod reasons {
    pub const IMAGE_ID: &str = "ImageID";
    pub const SECURITY_GROUPS: &str = "SecurityGroups";
    pub const ANTI_AFFINITY_GROUPS: &str = "AntiAffinityGroups";
    pub const PRIVATE_NETWORKS: &str = "PrivateNetworks";
    /// diskSize or kubelet settings changed since launch.
    pub const NODECLASS: &str = "NodeClassDrift";
}

/// What the NodeClass wants now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub template_id: String,
    pub security_groups: Vec<String>,
    pub anti_affinity_groups: Vec<String>,
    pub private_networks: Vec<String>,
    /// [`nodeclass_hash`] of the current spec.
    pub nodeclass_hash: String,
}

/// A detected drift: the reason and a message naming both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    pub reason: &'static str,
    pub message: String,
}

fn set(ids: impl IntoIterator<Item = impl Into<String>>) -> BTreeSet<String> {
    ids.into_iter().map(Into::into).collect()
}

fn set_drift(
    reason: &'static str,
    what: &str,
    desired: &[String],
    actual: BTreeSet<String>,
) -> Option<Drift> {
    let desired = set(desired.iter().cloned());
    (desired != actual).then(|| Drift {
        reason,
        message: format!("{what} changed: instance has {actual:?}, NodeClass wants {desired:?}"),
    })
}

/// The first drift found, in the order template, security groups, anti-affinity groups,
/// private networks, NodeClass hash. `launched_hash` is the NodeClaim's hash annotation
/// (absent on NodeClaims launched before hashing existed: never drifted by hash then).
pub fn detect(
    instance: &Instance,
    desired: &DesiredState,
    launched_hash: Option<&str>,
) -> Option<Drift> {
    if !desired.template_id.is_empty() && instance.template.id != desired.template_id {
        return Some(Drift {
            reason: reasons::IMAGE_ID,
            message: format!(
                "template changed: instance runs {}, NodeClass wants {}",
                instance.template.id, desired.template_id
            ),
        });
    }
    let ids = |refs: &[crate::exoscale::models::IdRef]| set(refs.iter().map(|r| r.id.clone()));
    set_drift(
        reasons::SECURITY_GROUPS,
        "security groups",
        &desired.security_groups,
        ids(&instance.security_groups),
    )
    .or_else(|| {
        set_drift(
            reasons::ANTI_AFFINITY_GROUPS,
            "anti-affinity groups",
            &desired.anti_affinity_groups,
            ids(&instance.anti_affinity_groups),
        )
    })
    .or_else(|| {
        set_drift(
            reasons::PRIVATE_NETWORKS,
            "private networks",
            &desired.private_networks,
            set(instance.private_networks.iter().map(|p| p.id.clone())),
        )
    })
    .or_else(|| {
        let launched = launched_hash?;
        (launched != desired.nodeclass_hash).then(|| Drift {
            reason: reasons::NODECLASS,
            message: format!(
                "NodeClass spec changed (hash {launched} at launch, {} now)",
                desired.nodeclass_hash
            ),
        })
    })
}

/// Hash of the NodeClass fields that change how a node is built but are not compared
/// directly: disk size and kubelet settings (defaults applied, so writing a default explicitly
/// does not drift nodes).
pub fn nodeclass_hash(spec: &ExoscaleNodeClassSpec) -> String {
    let kubelet = spec.kubelet.clone().unwrap_or_default();
    let mut canonical = serde_json::json!({
        "diskSize": spec.disk_size,
        "kubelet": kubelet,
    });
    // Added only when set, so classes without them keep the hash their nodes carry.
    if !spec.node_labels.is_empty() {
        canonical["nodeLabels"] = serde_json::json!(spec.node_labels);
    }
    if !spec.node_taints.is_empty() {
        canonical["nodeTaints"] = serde_json::json!(spec.node_taints);
    }
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Labels to write when the instance lacks (or has a different value for) any expected label;
/// `None` when nothing is missing. Extra labels on the instance are kept and never cause an
/// update (the Go provider's exact-equality check updated forever).
pub fn labels_to_heal(actual: &Labels, expected: &Labels) -> Option<Labels> {
    if expected.iter().all(|(k, v)| actual.get(k) == Some(v)) {
        return None;
    }
    let mut merged = actual.clone();
    merged.extend(expected.iter().map(|(k, v)| (k.clone(), v.clone())));
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exoscale::models::{IdRef, InstancePrivateNetwork, InstanceState};

    fn instance() -> Instance {
        Instance {
            id: "i".into(),
            name: "n".into(),
            state: InstanceState::Running,
            created_at: None,
            instance_type: IdRef::new("t"),
            template: IdRef::new("tpl-1"),
            disk_size: Some(50),
            labels: Labels::new(),
            user_data: None,
            security_groups: vec![IdRef::new("sg-1"), IdRef::new("sg-2")],
            anti_affinity_groups: vec![IdRef::new("aag-1")],
            private_networks: vec![InstancePrivateNetwork {
                id: "pn-1".into(),
                mac_address: None,
            }],
            public_ip: None,
            public_ip_assignment: None,
            ipv6_address: None,
            mac_address: None,
            manager: None,
        }
    }

    fn desired() -> DesiredState {
        DesiredState {
            template_id: "tpl-1".into(),
            security_groups: vec!["sg-2".into(), "sg-1".into()],
            anti_affinity_groups: vec!["aag-1".into()],
            private_networks: vec!["pn-1".into()],
            nodeclass_hash: "h1".into(),
        }
    }

    #[test]
    fn matching_instance_is_not_drifted_regardless_of_order() {
        assert_eq!(detect(&instance(), &desired(), Some("h1")), None);
        assert_eq!(detect(&instance(), &desired(), None), None);
    }

    #[test]
    fn each_reason_fires() {
        type Change = Box<dyn Fn(&mut DesiredState)>;
        let cases: Vec<(&str, Change)> = vec![
            (
                reasons::IMAGE_ID,
                Box::new(|d| d.template_id = "tpl-2".into()),
            ),
            (
                reasons::SECURITY_GROUPS,
                Box::new(|d| d.security_groups.pop().map(|_| ()).unwrap()),
            ),
            (
                reasons::ANTI_AFFINITY_GROUPS,
                Box::new(|d| d.anti_affinity_groups.push("aag-2".into())),
            ),
            (
                reasons::PRIVATE_NETWORKS,
                Box::new(|d| d.private_networks.clear()),
            ),
            (
                reasons::NODECLASS,
                Box::new(|d| d.nodeclass_hash = "h2".into()),
            ),
        ];
        for (reason, change) in cases {
            let mut d = desired();
            change(&mut d);
            let drift = detect(&instance(), &d, Some("h1")).expect(reason);
            assert_eq!(drift.reason, reason);
            assert!(!drift.message.is_empty());
        }
        let drift = detect(
            &instance(),
            &DesiredState {
                template_id: "tpl-9".into(),
                ..desired()
            },
            Some("h1"),
        )
        .unwrap();
        assert!(drift.message.contains("tpl-1") && drift.message.contains("tpl-9"));
    }

    #[test]
    fn hash_ignores_explicit_defaults_but_sees_changes() {
        use crate::apis::nodeclass::KubeletConfiguration;
        let yaml = "templateID: 11111111-2222-3333-4444-555555555555\n";
        let mut spec: ExoscaleNodeClassSpec = serde_yaml_ng::from_str(yaml).unwrap();
        let h = nodeclass_hash(&spec);
        spec.kubelet = Some(KubeletConfiguration::default());
        assert_eq!(nodeclass_hash(&spec), h);
        spec.node_labels.insert("team".into(), "ml".into());
        let labelled = nodeclass_hash(&spec);
        assert_ne!(labelled, h, "a node label is part of how nodes are built");
        spec.node_taints.push(crate::apis::Taint::new(
            "dedicated",
            Some("ml"),
            crate::apis::TaintEffect::NoSchedule,
        ));
        assert_ne!(nodeclass_hash(&spec), labelled);
        spec.node_labels.clear();
        spec.node_taints.clear();
        assert_eq!(nodeclass_hash(&spec), h);
        spec.disk_size = 100;
        assert_ne!(nodeclass_hash(&spec), h);
        spec.security_groups.push("x".into());
        let h100 = nodeclass_hash(&spec);
        spec.security_groups.clear();
        assert_eq!(
            nodeclass_hash(&spec),
            h100,
            "groups are compared directly, not hashed"
        );
    }

    #[test]
    fn labels_heal_only_when_something_is_missing() {
        let expected = Labels::from([("a".to_string(), "1".to_string())]);
        let mut actual = Labels::from([
            ("a".to_string(), "1".to_string()),
            ("extra".to_string(), "x".to_string()),
        ]);
        assert_eq!(labels_to_heal(&actual, &expected), None);
        actual.insert("a".into(), "2".into());
        let healed = labels_to_heal(&actual, &expected).unwrap();
        assert_eq!(healed["a"], "1");
        assert_eq!(healed["extra"], "x");
    }
}
