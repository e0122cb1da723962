//! The NodePool template hash against golden values computed by upstream's hashing
//! (`hashstructure` v2) over an ExoscaleNodeClass template: NodeClaims launched by the Go
//! provider must not drift on switch-over.

use std::collections::BTreeMap;

use karpenter_exoscale::apis::common::{NodeClassReference, Taint, TaintEffect};
use karpenter_exoscale::apis::nodepool::{
    NodeClaimTemplate, NodeClaimTemplateSpec, TemplateMetadata,
};
use karpenter_exoscale::disruption::hash::nodepool_hash;

fn template() -> NodeClaimTemplate {
    NodeClaimTemplate {
        metadata: None,
        spec: NodeClaimTemplateSpec {
            taints: vec![],
            startup_taints: vec![],
            requirements: vec![],
            node_class_ref: NodeClassReference {
                group: "karpenter.exoscale.com".into(),
                kind: "ExoscaleNodeClass".into(),
                name: "default".into(),
            },
            expire_after: "720h".into(),
            termination_grace_period: None,
        },
    }
}

// Golden values computed with github.com/mitchellh/hashstructure/v2 v2.0.2 over structs of
// the same shape as upstream's NodeClaimTemplate (the options of `NodePool.Hash()`).
#[test]
fn matches_upstream_for_a_minimal_template() {
    assert_eq!(nodepool_hash(&template()).unwrap(), "4277504077964601991");
}

#[test]
fn matches_upstream_with_metadata_taints_and_grace_period() {
    let mut t = template();
    t.metadata = Some(TemplateMetadata {
        labels: [("team", "a"), ("env", "prod")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        annotations: [("x".to_string(), "y".to_string())].into_iter().collect(),
    });
    t.spec.taints = vec![
        Taint::new("dedicated", Some("gpu"), TaintEffect::NoSchedule),
        Taint::new("b", None, TaintEffect::NoExecute),
    ];
    t.spec.startup_taints = vec![Taint::new("startup", None, TaintEffect::NoSchedule)];
    t.spec.termination_grace_period = Some("1h".into());
    assert_eq!(nodepool_hash(&t).unwrap(), "17142557462741585880");
    // Taints are a set: order does not matter.
    t.spec.taints.reverse();
    assert_eq!(nodepool_hash(&t).unwrap(), "17142557462741585880");
}

#[test]
fn matches_upstream_when_expire_after_is_never() {
    let mut t = template();
    t.spec.expire_after = "Never".into();
    assert_eq!(nodepool_hash(&t).unwrap(), "17880625386311419882");
}

#[test]
fn requirements_do_not_change_the_hash_but_labels_do() {
    let base = nodepool_hash(&template()).unwrap();
    let mut t = template();
    t.spec.requirements = vec![
        karpenter_exoscale::apis::NodeSelectorRequirementWithMinValues {
            key: "kubernetes.io/arch".into(),
            operator: karpenter_exoscale::apis::Operator::In,
            values: vec!["amd64".into()],
            min_values: None,
        },
    ];
    assert_eq!(nodepool_hash(&t).unwrap(), base);
    t.metadata = Some(TemplateMetadata {
        labels: [("a".to_string(), "b".to_string())].into_iter().collect(),
        annotations: BTreeMap::new(),
    });
    assert_ne!(nodepool_hash(&t).unwrap(), base);
}

#[test]
fn malformed_durations_are_errors_naming_the_value() {
    let mut t = template();
    t.spec.expire_after = "forever".into();
    let err = nodepool_hash(&t).unwrap_err();
    assert!(err.to_string().contains("forever"), "{err}");
}
