//! Bad input is rejected with a message naming the field: one test per schema or CEL rule.

use karpenter_exoscale::apis::validation::{self, ValidationError};
use karpenter_exoscale::apis::{ExoscaleNodeClass, NodeClaim, NodePool};
use serde_json::Value;

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

const NODECLASS: &str = r#"
apiVersion: karpenter.exoscale.com/v1
kind: ExoscaleNodeClass
metadata: {name: test}
spec:
  templateID: 8a3c2e1f-4b5d-4c6e-9f70-1a2b3c4d5e6f
"#;

const NODEPOOL: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: test}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: default}
      requirements:
        - {key: karpenter.exoscale.com/instance-family, operator: In, values: [standard]}
"#;

const NODECLAIM: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata: {name: test}
spec:
  nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: default}
  requirements:
    - {key: node.kubernetes.io/instance-type, operator: In, values: [standard.large]}
"#;

const OVERLAY: &str = r#"
apiVersion: karpenter.sh/v1alpha1
kind: NodeOverlay
metadata: {name: test}
spec:
  requirements:
    - {key: node.kubernetes.io/instance-type, operator: In, values: [standard.large]}
"#;

/// Applies a change (a JSON pointer and the value to put there) to a base object.
fn with(base: &str, pointer: &str, value: Value) -> Value {
    let mut object = yaml(base);
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = object
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"));
    match target {
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        Value::Object(map) => {
            map.insert(key.to_string(), value);
        }
        _ => panic!("{parent} is not a container"),
    }
    object
}

fn assert_rejected(object: &Value, path: &str, message: &str) {
    let error = validation::validate_value(object, None).expect_err("object must be rejected");
    let errors = error.field_errors();
    assert!(
        errors
            .iter()
            .any(|e| e.path.contains(path) && e.message.contains(message)),
        "expected an error at {path:?} containing {message:?}, got: {error}"
    );
}

fn assert_valid(object: &Value) {
    if let Err(e) = validation::validate_value(object, None) {
        panic!("object must be valid: {e}");
    }
}

#[test]
fn base_objects_are_valid() {
    for base in [NODECLASS, NODEPOOL, NODECLAIM, OVERLAY] {
        assert_valid(&yaml(base));
    }
}

#[test]
fn defaults_are_applied_as_the_apiserver_would() {
    let pool: NodePool = validation::parse(&yaml(NODEPOOL)).unwrap();
    assert_eq!(pool.spec.template.spec.expire_after, "720h");
    assert_eq!(pool.spec.disruption.consolidate_after, "0s");
    assert_eq!(pool.spec.disruption.budgets[0].nodes, "10%");
    let class: ExoscaleNodeClass = validation::parse(&yaml(NODECLASS)).unwrap();
    assert_eq!(class.spec.disk_size, 50);
    let kubelet = class.kubelet();
    assert_eq!(kubelet.cluster_dns, vec!["10.96.0.10"]);
    assert_eq!(
        (
            kubelet.image_gc_high_threshold_percent,
            kubelet.image_gc_low_threshold_percent
        ),
        (85, 80)
    );
    assert_eq!(kubelet.kube_reserved.memory, "300Mi");
    assert_eq!(kubelet.system_reserved.ephemeral_storage, "3Gi");
    assert_eq!(class.max_pods(), 110);
    let claim: NodeClaim = validation::parse(&yaml(NODECLAIM)).unwrap();
    assert_eq!(claim.spec.expire_after, "720h");
}

// --- unknown fields and wrong types -----------------------------------------------------------

#[test]
fn unknown_spec_field_is_rejected() {
    assert_rejected(
        &with(NODECLASS, "/spec/nodeSelector", yaml("{a: b}")),
        "spec.nodeSelector",
        "unknown field",
    );
}

#[test]
fn unknown_nested_field_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: Exists, extra: 1}"),
    );
    assert_rejected(&object, "requirements[0].extra", "unknown field");
}

#[test]
fn typed_parse_names_an_unknown_field_too() {
    let object = with(NODECLASS, "/spec/kubelet", yaml("{maxPod: 10}"));
    let err = validation::parse::<ExoscaleNodeClass>(&object).unwrap_err();
    assert!(err.to_string().contains("spec.kubelet.maxPod"), "{err}");
}

#[test]
fn wrong_type_is_rejected() {
    assert_rejected(
        &with(NODECLASS, "/spec/diskSize", yaml("big")),
        "spec.diskSize",
        "must be an integer",
    );
}

#[test]
fn missing_required_field_is_rejected() {
    let mut object = yaml(NODEPOOL);
    object["spec"]["template"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("nodeClassRef");
    assert_rejected(&object, "spec.template.spec.nodeClassRef", "required");
}

// --- enums ------------------------------------------------------------------------------------

#[test]
fn wrong_requirement_operator_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: Equals, values: [b]}"),
    );
    assert_rejected(
        &object,
        "requirements[0].operator",
        "unsupported value \"Equals\"",
    );
}

#[test]
fn wrong_consolidation_policy_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/disruption",
        yaml("{consolidationPolicy: Always}"),
    );
    assert_rejected(
        &object,
        "spec.disruption.consolidationPolicy",
        "unsupported value",
    );
}

#[test]
fn wrong_taint_effect_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/taints",
        yaml("[{key: a, effect: NoRun}]"),
    );
    assert_rejected(&object, "taints[0].effect", "unsupported value");
}

#[test]
fn wrong_budget_reason_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/disruption",
        yaml("{budgets: [{nodes: '1', reasons: [Expired]}]}"),
    );
    assert_rejected(&object, "budgets[0].reasons[0]", "unsupported value");
}

#[test]
fn wrong_template_variant_is_rejected() {
    let object = with(
        NODECLASS,
        "/spec",
        yaml("{imageTemplateSelector: {variant: invalid-variant}}"),
    );
    assert_rejected(
        &object,
        "imageTemplateSelector.variant",
        "unsupported value",
    );
}

// --- ExoscaleNodeClass rules ------------------------------------------------------------------

#[test]
fn template_id_and_selector_together_are_rejected() {
    let object = with(NODECLASS, "/spec/imageTemplateSelector", yaml("{}"));
    assert_rejected(
        &object,
        "spec",
        "exactly one of templateID or imageTemplateSelector",
    );
}

#[test]
fn neither_template_id_nor_selector_is_rejected() {
    let object = with(NODECLASS, "/spec", yaml("{diskSize: 50}"));
    assert_rejected(
        &object,
        "spec",
        "exactly one of templateID or imageTemplateSelector",
    );
}

#[test]
fn empty_template_selector_is_valid() {
    assert_valid(&with(
        NODECLASS,
        "/spec",
        yaml("{imageTemplateSelector: {}}"),
    ));
    assert_valid(&with(
        NODECLASS,
        "/spec",
        yaml("{imageTemplateSelector: {version: 1.33.0, variant: nvidia}}"),
    ));
}

#[test]
fn selector_term_with_id_and_name_is_rejected() {
    let object = with(
        NODECLASS,
        "/spec/securityGroupSelectorTerms",
        yaml("[{id: a, name: b}]"),
    );
    assert_rejected(
        &object,
        "securityGroupSelectorTerms",
        "exactly one of id or name",
    );
}

#[test]
fn empty_selector_term_is_rejected() {
    let object = with(NODECLASS, "/spec/privateNetworkSelectorTerms", yaml("[{}]"));
    assert_rejected(
        &object,
        "privateNetworkSelectorTerms",
        "exactly one of id or name",
    );
}

#[test]
fn image_gc_low_not_below_high_is_rejected() {
    let object = with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{imageGCHighThresholdPercent: 70, imageGCLowThresholdPercent: 80}"),
    );
    assert_rejected(
        &object,
        "spec",
        "imageGCLowThresholdPercent must be less than imageGCHighThresholdPercent",
    );
    let equal = with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{imageGCHighThresholdPercent: 80, imageGCLowThresholdPercent: 80}"),
    );
    assert_rejected(
        &equal,
        "spec",
        "imageGCLowThresholdPercent must be less than",
    );
}

#[test]
fn disk_size_below_minimum_is_rejected() {
    assert_rejected(
        &with(NODECLASS, "/spec/diskSize", yaml("5")),
        "spec.diskSize",
        "greater than or equal to 10",
    );
}

#[test]
fn disk_size_above_maximum_is_rejected() {
    assert_rejected(
        &with(NODECLASS, "/spec/diskSize", yaml("60000")),
        "spec.diskSize",
        "less than or equal to 8000",
    );
}

#[test]
fn malformed_template_id_is_rejected() {
    assert_rejected(
        &with(NODECLASS, "/spec/templateID", yaml("not-a-uuid")),
        "spec.templateID",
        "must match",
    );
}

#[test]
fn incomplete_template_version_is_rejected() {
    for version in ["1", "1.33"] {
        let object = with(
            NODECLASS,
            "/spec",
            yaml(&format!(
                "{{imageTemplateSelector: {{version: '{version}'}}}}"
            )),
        );
        assert_rejected(&object, "imageTemplateSelector.version", "must match");
    }
}

#[test]
fn too_many_security_groups_are_rejected() {
    let groups: Vec<String> = (0..51).map(|i| format!("sg-{i}")).collect();
    let object = with(NODECLASS, "/spec/securityGroups", serde_json::json!(groups));
    assert_rejected(&object, "spec.securityGroups", "at most 50 items");
}

#[test]
fn too_many_private_networks_are_rejected() {
    let networks: Vec<String> = (0..11).map(|i| format!("pn-{i}")).collect();
    let object = with(
        NODECLASS,
        "/spec/privateNetworks",
        serde_json::json!(networks),
    );
    assert_rejected(&object, "spec.privateNetworks", "at most 10 items");
}

#[test]
fn malformed_image_gc_age_is_rejected() {
    let object = with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{imageMinimumGCAge: 5 minutes}"),
    );
    assert_rejected(&object, "kubelet.imageMinimumGCAge", "must match");
}

#[test]
fn malformed_reservation_quantities_are_rejected() {
    let cpu = with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{kubeReserved: {cpu: 500 millicores}}"),
    );
    assert_rejected(&cpu, "kubeReserved.cpu", "must match");
    let memory = with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{systemReserved: {memory: 1 gigabyte}}"),
    );
    assert_rejected(&memory, "systemReserved.memory", "must match");
    assert_valid(&with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{kubeReserved: {cpu: 500m, memory: 1Gi, ephemeralStorage: 10Gi}}"),
    ));
}

#[test]
fn max_pods_out_of_range_is_rejected() {
    assert_rejected(
        &with(NODECLASS, "/spec/kubelet", yaml("{maxPods: 0}")),
        "kubelet.maxPods",
        "greater than or equal to 1",
    );
}

// --- durations --------------------------------------------------------------------------------

#[test]
fn invalid_expire_after_is_rejected() {
    let object = with(NODEPOOL, "/spec/template/spec/expireAfter", yaml("30d"));
    assert_rejected(&object, "spec.template.spec.expireAfter", "must match");
}

#[test]
fn invalid_consolidate_after_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/disruption",
        yaml("{consolidateAfter: 5 minutes}"),
    );
    assert_rejected(&object, "disruption.consolidateAfter", "must match");
}

#[test]
fn invalid_termination_grace_period_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/terminationGracePeriod",
        yaml("Never"),
    );
    assert_rejected(&object, "terminationGracePeriod", "must match");
}

#[test]
fn never_is_a_valid_expiry() {
    assert_valid(&with(
        NODEPOOL,
        "/spec/template/spec/expireAfter",
        yaml("Never"),
    ));
    assert_valid(&with(
        NODEPOOL,
        "/spec/disruption",
        yaml("{consolidateAfter: Never}"),
    ));
}

// --- NodePool rules ---------------------------------------------------------------------------

#[test]
fn negative_weight_is_rejected() {
    assert_rejected(
        &with(NODEPOOL, "/spec/weight", yaml("-1")),
        "spec.weight",
        "greater than or equal to 1",
    );
}

#[test]
fn weight_above_hundred_is_rejected() {
    assert_rejected(
        &with(NODEPOOL, "/spec/weight", yaml("101")),
        "spec.weight",
        "less than or equal to 100",
    );
}

#[test]
fn restricted_template_labels_are_rejected() {
    let domain = with(
        NODEPOOL,
        "/spec/template/metadata",
        yaml("{labels: {karpenter.sh/custom: x}}"),
    );
    assert_rejected(
        &domain,
        "labels",
        "label domain \"karpenter.sh\" is restricted",
    );
    let nodepool = with(
        NODEPOOL,
        "/spec/template/metadata",
        yaml("{labels: {karpenter.sh/nodepool: x}}"),
    );
    assert_rejected(
        &nodepool,
        "labels",
        "label \"karpenter.sh/nodepool\" is restricted",
    );
    let hostname = with(
        NODEPOOL,
        "/spec/template/metadata",
        yaml("{labels: {kubernetes.io/hostname: x}}"),
    );
    assert_rejected(
        &hostname,
        "labels",
        "label \"kubernetes.io/hostname\" is restricted",
    );
    assert_valid(&with(
        NODEPOOL,
        "/spec/template/metadata",
        yaml("{labels: {karpenter.sh/capacity-type: on-demand}}"),
    ));
}

#[test]
fn invalid_template_label_value_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/metadata",
        yaml("{labels: {team: 'not valid!'}}"),
    );
    assert_rejected(&object, "labels.team", "must match");
}

#[test]
fn restricted_requirement_keys_are_rejected() {
    let hostname = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: kubernetes.io/hostname, operator: Exists}"),
    );
    assert_rejected(
        &hostname,
        "requirements",
        "label \"kubernetes.io/hostname\" is restricted",
    );
    let nodepool = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: karpenter.sh/nodepool, operator: Exists}"),
    );
    assert_rejected(
        &nodepool,
        "requirements",
        "label \"karpenter.sh/nodepool\" is restricted",
    );
}

#[test]
fn in_requirement_without_values_is_rejected() {
    let empty = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: In, values: []}"),
    );
    assert_rejected(
        &empty,
        "requirements",
        "operator 'In' must have a value defined",
    );
    // Without the field at all the rule cannot evaluate; an apiserver rejects that as well.
    let absent = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: In}"),
    );
    assert_rejected(&absent, "requirements", "values");
}

#[test]
fn comparison_requirement_needs_one_integer() {
    let two = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: Gt, values: ['1', '2']}"),
    );
    assert_rejected(&two, "requirements", "single positive integer value");
    let negative = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: Lt, values: ['-1']}"),
    );
    assert_rejected(&negative, "requirements", "single positive integer value");
}

#[test]
fn min_values_above_value_count_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: In, values: [x], minValues: 2}"),
    );
    assert_rejected(&object, "requirements", "at least that many values");
}

#[test]
fn min_values_out_of_range_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/requirements/0",
        yaml("{key: a, operator: Exists, minValues: 51}"),
    );
    assert_rejected(
        &object,
        "requirements[0].minValues",
        "less than or equal to 50",
    );
}

#[test]
fn budget_schedule_without_duration_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/disruption",
        yaml("{budgets: [{nodes: '0', schedule: '@daily'}]}"),
    );
    assert_rejected(&object, "budgets", "'schedule' must be set with 'duration'");
}

#[test]
fn malformed_budget_nodes_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/disruption",
        yaml("{budgets: [{nodes: '150%'}]}"),
    );
    assert_rejected(&object, "budgets[0].nodes", "must match");
}

#[test]
fn static_nodepool_rules_are_enforced() {
    let with_weight = with(NODEPOOL, "/spec/replicas", yaml("3"));
    let mut object = with_weight.clone();
    object["spec"]["weight"] = yaml("5");
    assert_rejected(
        &object,
        "spec",
        "'weight' is not supported on static NodePools",
    );
    let mut limits = with_weight;
    limits["spec"]["limits"] = yaml("{cpu: '10'}");
    assert_rejected(&limits, "spec", "only 'limits.nodes' is supported");
}

#[test]
fn invalid_limit_quantity_is_rejected() {
    let object = with(NODEPOOL, "/spec/limits", yaml("{cpu: lots}"));
    assert_rejected(&object, "spec.limits.cpu", "invalid quantity");
}

#[test]
fn empty_nodeclass_ref_name_is_rejected() {
    let object = with(
        NODEPOOL,
        "/spec/template/spec/nodeClassRef/name",
        yaml("''"),
    );
    assert_rejected(&object, "nodeClassRef.name", "name may not be empty");
}

#[test]
fn nodeclass_ref_kind_is_immutable() {
    let old = yaml(NODEPOOL);
    let new = with(
        NODEPOOL,
        "/spec/template/spec/nodeClassRef/kind",
        yaml("OtherNodeClass"),
    );
    let err = validation::validate_value(&new, Some(&old)).unwrap_err();
    assert!(
        err.to_string().contains("nodeClassRef.kind is immutable"),
        "{err}"
    );
}

// --- NodeClaim and NodeOverlay rules ------------------------------------------------------------

#[test]
fn nodeclaim_spec_is_immutable() {
    let old = yaml(NODECLAIM);
    let new = with(NODECLAIM, "/spec/expireAfter", yaml("1h"));
    let err = validation::validate_value(&new, Some(&old)).unwrap_err();
    assert!(err.to_string().contains("spec is immutable"), "{err}");
    assert!(validation::validate_value(&old, Some(&old)).is_ok());
}

#[test]
fn nodeclaim_may_name_its_nodepool_in_requirements() {
    let object = with(
        NODECLAIM,
        "/spec/requirements/0",
        yaml("{key: karpenter.sh/nodepool, operator: In, values: [default]}"),
    );
    assert_valid(&object);
}

#[test]
fn overlay_price_and_adjustment_together_are_rejected() {
    let mut object = with(OVERLAY, "/spec/price", yaml("'0.5'"));
    object["spec"]["priceAdjustment"] = yaml("-10%");
    assert_rejected(
        &object,
        "spec",
        "cannot set both 'price' and 'priceAdjustment'",
    );
}

#[test]
fn overlay_capacity_may_not_touch_core_resources() {
    let object = with(OVERLAY, "/spec/capacity", yaml("{cpu: '2'}"));
    assert_rejected(&object, "spec.capacity", "invalid resource restricted");
    assert_valid(&with(
        OVERLAY,
        "/spec/capacity",
        yaml("{example.com/fpga: '1'}"),
    ));
}

#[test]
fn overlay_not_in_requires_values() {
    let object = with(
        OVERLAY,
        "/spec/requirements/0",
        yaml("{key: a, operator: NotIn, values: []}"),
    );
    assert_rejected(
        &object,
        "requirements",
        "operator 'NotIn' must have a value defined",
    );
}

#[test]
fn unknown_kind_is_reported() {
    let object = yaml("{apiVersion: v1, kind: ConfigMap, metadata: {name: x}}");
    assert_eq!(
        validation::validate_value(&object, None).unwrap_err(),
        ValidationError::UnknownKind("v1/ConfigMap".into())
    );
}

#[test]
fn nodeclass_node_labels_and_taints_are_validated_like_a_nodepools() {
    let valid = with(
        NODECLASS,
        "/spec/nodeLabels",
        yaml("{example.com/team: gpu, workload: training}"),
    );
    let valid = {
        let mut v = valid;
        v.pointer_mut("/spec")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(
                "nodeTaints".into(),
                yaml("[{key: nvidia.com/gpu, value: 'true', effect: NoSchedule}]"),
            );
        v
    };
    assert_valid(&valid);
    let parsed: ExoscaleNodeClass = validation::parse(&valid).unwrap();
    assert_eq!(parsed.spec.node_labels["workload"], "training");
    assert_eq!(parsed.spec.node_taints[0].key, "nvidia.com/gpu");

    for (labels, message) in [
        (
            "{karpenter.sh/nodepool: x}",
            "label domain \"karpenter.sh\" is restricted",
        ),
        (
            "{karpenter.exoscale.com/instance-family: gpu}",
            "label domain \"karpenter.exoscale.com\" is restricted",
        ),
        (
            "{kubernetes.io/hostname: x}",
            "label \"kubernetes.io/hostname\" is restricted",
        ),
    ] {
        let object = with(NODECLASS, "/spec/nodeLabels", yaml(labels));
        assert_rejected(&object, "nodeLabels", message);
    }
    let bad_value = with(NODECLASS, "/spec/nodeLabels", yaml("{team: 'has spaces'}"));
    assert_rejected(&bad_value, "nodeLabels", "");
    let bad_effect = with(
        NODECLASS,
        "/spec/nodeTaints",
        yaml("[{key: dedicated, effect: Sometimes}]"),
    );
    assert_rejected(&bad_effect, "nodeTaints", "");
}

#[test]
fn eviction_hard_is_not_offered_the_node_agent_has_no_such_setting() {
    let object = with(
        NODECLASS,
        "/spec/kubelet",
        yaml("{evictionHard: {memory.available: 500Mi}}"),
    );
    assert_rejected(&object, "evictionHard", "");
}
