//! NodePool CRD → the scheduler's `NodePoolTemplate`, and the scheduler's `NewNodeClaim` → a
//! NodeClaim object. Shared by the provisioning controller and `simulate`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use thiserror::Error;

use crate::apis::labels::WELL_KNOWN_LABELS;
use crate::apis::labels::{
    CAPACITY_OVERLAY_APPLIED_ANNOTATION, NODECLAIM_MIN_VALUES_RELAXED_ANNOTATION, NODECLASS_LABEL,
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
    NODEPOOL_LABEL, PRICE_OVERLAY_APPLIED_ANNOTATION, TERMINATION_FINALIZER,
};
use crate::apis::nodeclaim::ResourceRequirements;
use crate::apis::{
    NodeClaim, NodeClaimSpec, NodePool, NodeSelectorRequirementWithMinValues,
    Operator as CrdOperator, Taint as CrdTaint, TaintEffect as CrdEffect,
};
use crate::cloudprovider::requirements_from_api;
use crate::scheduling::model::NodePoolTemplate;
use crate::scheduling::quantity::{Quantity, Resources};
use crate::scheduling::requirements::{Operator, RequirementError, Requirements};
use crate::scheduling::taints::{Taint, TaintEffect};
use crate::scheduling::{NewNodeClaim, WellKnownLabels};

#[derive(Debug, Error)]
pub enum TemplateError {
    #[error("NodePool {pool}: requirement {index}: {source}")]
    Requirement {
        pool: String,
        index: usize,
        source: RequirementError,
    },
    #[error("NodePool {pool}: limit {resource}: {message}")]
    Limit {
        pool: String,
        resource: String,
        message: String,
    },
}

fn effect(effect: CrdEffect) -> TaintEffect {
    match effect {
        CrdEffect::NoSchedule => TaintEffect::NoSchedule,
        CrdEffect::PreferNoSchedule => TaintEffect::PreferNoSchedule,
        CrdEffect::NoExecute => TaintEffect::NoExecute,
    }
}

pub fn taint(t: &CrdTaint) -> Taint {
    Taint::new(
        &t.key,
        t.value.as_deref().unwrap_or_default(),
        effect(t.effect),
    )
}

/// Converts CRD requirements (NodePool or NodeClaim) into the scheduler's algebra.
pub fn requirements(
    owner: &str,
    list: &[NodeSelectorRequirementWithMinValues],
) -> Result<Requirements, TemplateError> {
    // One at a time, so that an error names the offending requirement.
    let mut out = Requirements::new();
    for (index, r) in list.iter().enumerate() {
        let one = requirements_from_api(std::slice::from_ref(r)).map_err(|source| {
            TemplateError::Requirement {
                pool: owner.to_string(),
                index,
                source,
            }
        })?;
        out.add_all(&one);
    }
    Ok(out)
}

/// The scheduler's view of a NodePool; `usage` is what its nodes and in-flight NodeClaims hold.
pub fn nodepool_template(
    pool: &NodePool,
    usage: Resources,
) -> Result<NodePoolTemplate, TemplateError> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let spec = &pool.spec.template.spec;
    let mut limits = BTreeMap::new();
    for (resource, value) in pool.spec.limits.iter().flatten() {
        let quantity = Quantity::parse(&value.0).map_err(|e| TemplateError::Limit {
            pool: name.clone(),
            resource: resource.clone(),
            message: e.to_string(),
        })?;
        limits.insert(resource.clone(), quantity);
    }
    Ok(NodePoolTemplate {
        name: name.clone(),
        weight: pool.weight(),
        requirements: requirements(&name, &spec.requirements)?,
        labels: pool.template_labels(),
        taints: spec.taints.iter().map(taint).collect(),
        startup_taints: spec.startup_taints.iter().map(taint).collect(),
        limits,
        usage,
        node_class_ref: spec.node_class_ref.name.clone(),
    })
}

fn crd_operator(op: Operator) -> CrdOperator {
    match op {
        Operator::In => CrdOperator::In,
        Operator::NotIn => CrdOperator::NotIn,
        Operator::Exists => CrdOperator::Exists,
        Operator::DoesNotExist => CrdOperator::DoesNotExist,
        Operator::Gt => CrdOperator::Gt,
        Operator::Lt => CrdOperator::Lt,
        Operator::Gte => CrdOperator::Gte,
        Operator::Lte => CrdOperator::Lte,
    }
}

/// The scheduler's requirements written back as NodeClaim requirements.
pub fn crd_requirements(reqs: &Requirements) -> Vec<NodeSelectorRequirementWithMinValues> {
    let mut out = Vec::new();
    for r in reqs.iter() {
        for (key, op, values) in r.to_node_selector_terms() {
            out.push(NodeSelectorRequirementWithMinValues {
                key,
                operator: crd_operator(op),
                values,
                min_values: r.min_values().map(|m| m as i64),
            });
        }
    }
    out
}

/// Kubernetes quantities for a resource set (`cpu: 1500m`, `memory: 2Gi`): the same
/// conversion the cloud provider uses for NodeClaim capacity.
pub use crate::providers::instance_types::to_resource_list as resource_list;

/// Builds the NodeClaim to create for one scheduler result: labels from the template and the
/// resolved requirements, hash annotations, owner reference and termination finalizer.
pub fn build_nodeclaim(pool: &NodePool, claim: &NewNodeClaim) -> NodeClaim {
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let template = &pool.spec.template;
    let mut labels = pool.template_labels();
    labels.insert(NODEPOOL_LABEL.to_string(), pool_name.clone());
    labels.insert(
        NODECLASS_LABEL.to_string(),
        template.spec.node_class_ref.name.clone(),
    );
    // One concrete value per custom requirement key (upstream); well-known labels come from the
    // provider once the instance exists.
    let well_known = WellKnownLabels::with_provider_labels(WELL_KNOWN_LABELS.iter().copied());
    for (key, value) in claim.labels(&well_known) {
        labels.entry(key).or_insert(value);
    }
    let mut annotations = template
        .metadata
        .as_ref()
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    if let Some(hash) = pool
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODEPOOL_HASH_ANNOTATION))
    {
        annotations.insert(NODEPOOL_HASH_ANNOTATION.to_string(), hash.clone());
        annotations.insert(
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        );
    }
    if claim.min_values_relaxed {
        annotations.insert(
            NODECLAIM_MIN_VALUES_RELAXED_ANNOTATION.to_string(),
            "true".into(),
        );
    }
    // Upstream: the NodeClaim says when a NodeOverlay shaped any of its instance-type options.
    if claim.instance_types.iter().any(|it| it.price_overlaid) {
        annotations.insert(PRICE_OVERLAY_APPLIED_ANNOTATION.to_string(), "true".into());
    }
    if claim.instance_types.iter().any(|it| it.capacity_overlaid) {
        annotations.insert(
            CAPACITY_OVERLAY_APPLIED_ANNOTATION.to_string(),
            "true".into(),
        );
    }
    let owner = OwnerReference {
        api_version: NodePool::api_version(&()).into_owned(),
        kind: NodePool::kind(&()).into_owned(),
        name: pool_name.clone(),
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: None,
    };
    NodeClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!("{pool_name}-")),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            finalizers: Some(vec![TERMINATION_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: NodeClaimSpec {
            taints: template.spec.taints.clone(),
            startup_taints: template.spec.startup_taints.clone(),
            requirements: crd_requirements(&claim.node_claim_requirements()),
            resources: ResourceRequirements {
                requests: resource_list(&claim.requests),
            },
            node_class_ref: template.spec.node_class_ref.clone(),
            termination_grace_period: template.spec.termination_grace_period.clone(),
            expire_after: template.spec.expire_after.clone(),
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::validation;
    use std::sync::Arc;

    fn pool() -> NodePool {
        validation::parse(&serde_yaml_ng::from_str(
            r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: general, uid: "1234", annotations: {karpenter.sh/nodepool-hash: "42"}}
spec:
  template:
    metadata: {labels: {team: a}}
    spec:
      nodeClassRef: {group: karpenter.test.sh, kind: TestNodeClass, name: standard}
      requirements:
        - {key: karpenter.exoscale.com/instance-family, operator: In, values: [standard, cpu], minValues: 2}
        - {key: karpenter.exoscale.com/instance-cpu, operator: Gt, values: ["3"]}
      taints: [{key: dedicated, value: batch, effect: NoSchedule}]
  limits: {cpu: "100", memory: 400Gi}
  weight: 7
"#,
        )
        .unwrap())
        .unwrap()
    }

    #[test]
    fn nodepool_becomes_a_scheduler_template() {
        let t = nodepool_template(&pool(), Resources::new()).unwrap();
        assert_eq!((t.name.as_str(), t.weight), ("general", 7));
        let family = t
            .requirements
            .get("karpenter.exoscale.com/instance-family")
            .unwrap();
        assert!(family.has("cpu") && !family.has("memory"));
        assert_eq!(family.min_values(), Some(2));
        let cpu = t
            .requirements
            .get("karpenter.exoscale.com/instance-cpu")
            .unwrap();
        assert!(cpu.has("4") && !cpu.has("3"));
        assert_eq!(
            t.taints,
            vec![Taint::new("dedicated", "batch", TaintEffect::NoSchedule)]
        );
        assert_eq!(t.limits["memory"], Quantity::parse("400Gi").unwrap());
        assert_eq!(t.labels["team"], "a");
    }

    #[test]
    fn requirements_round_trip_to_the_crd() {
        let t = nodepool_template(&pool(), Resources::new()).unwrap();
        let back = requirements("x", &crd_requirements(&t.requirements)).unwrap();
        assert_eq!(back, t.requirements);
    }

    #[test]
    fn resource_lists_use_kubernetes_units() {
        let r = Resources::from_literals(&[("cpu", "1500m"), ("memory", "3Gi"), ("pods", "3")]);
        let list = resource_list(&r);
        assert_eq!(list["cpu"].0, "1500m");
        assert_eq!(list["memory"].0, "3Gi");
        assert_eq!(list["pods"].0, "3");
    }

    #[test]
    fn nodeclaims_say_when_an_overlay_shaped_their_instance_types() {
        let p = pool();
        let overlay: crate::apis::NodeOverlay = serde_yaml_ng::from_str(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: o}\nspec:\n  requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [fake-it-1]}]\n  price: \"1\"\n",
        )
        .unwrap();
        let types = crate::scheduling::fixtures::instance_types(2);
        let (types, _) =
            crate::cloudprovider::overlay::apply("general", &BTreeMap::new(), &types, &[overlay])
                .unwrap();
        let claim = |instance_types: Vec<Arc<crate::scheduling::InstanceType>>| NewNodeClaim {
            node_pool: "general".into(),
            requirements: requirements("x", &p.spec.template.spec.requirements).unwrap(),
            instance_types,
            pods: vec![0],
            requests: Resources::new(),
            daemon_overhead: Resources::new(),
            min_values_relaxed: false,
        };
        let annotations = |c: &NewNodeClaim| build_nodeclaim(&p, c).metadata.annotations.unwrap();
        let plain = annotations(&claim(vec![types[0].clone()]));
        assert!(!plain.contains_key(PRICE_OVERLAY_APPLIED_ANNOTATION));
        let overlaid = annotations(&claim(types.clone()));
        assert_eq!(overlaid[PRICE_OVERLAY_APPLIED_ANNOTATION], "true");
        assert!(!overlaid.contains_key(CAPACITY_OVERLAY_APPLIED_ANNOTATION));
    }

    #[test]
    fn nodeclaims_carry_labels_hash_owner_and_finalizer() {
        let p = pool();
        let reqs = requirements("x", &p.spec.template.spec.requirements).unwrap();
        let claim = NewNodeClaim {
            node_pool: "general".into(),
            requirements: reqs,
            instance_types: Vec::new(),
            pods: vec![0],
            requests: Resources::from_literals(&[("cpu", "2")]),
            daemon_overhead: Resources::new(),
            min_values_relaxed: true,
        };
        let nc = build_nodeclaim(&p, &claim);
        let labels = nc.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[NODEPOOL_LABEL], "general");
        assert_eq!(labels["team"], "a");
        let annotations = nc.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[NODEPOOL_HASH_ANNOTATION], "42");
        assert_eq!(annotations[NODECLAIM_MIN_VALUES_RELAXED_ANNOTATION], "true");
        assert!(!annotations.contains_key(PRICE_OVERLAY_APPLIED_ANNOTATION));
        assert!(!annotations.contains_key(CAPACITY_OVERLAY_APPLIED_ANNOTATION));
        assert_eq!(nc.metadata.generate_name.as_deref(), Some("general-"));
        assert_eq!(
            nc.metadata.owner_references.as_ref().unwrap()[0].uid,
            "1234"
        );
        assert_eq!(
            nc.metadata.finalizers.as_ref().unwrap(),
            &vec![TERMINATION_FINALIZER.to_string()]
        );
        assert_eq!(nc.spec.resources.requests["cpu"].0, "2");
        // The object we create must pass the CRD's own validation.
        let mut value = serde_json::to_value(&nc).unwrap();
        value["metadata"]["name"] = "general-abc".into();
        validation::validate_value(&value, None).unwrap();
    }
}
