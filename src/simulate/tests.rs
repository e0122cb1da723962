use super::*;

fn manifests(text: &str) -> Manifests {
    let mut m = Manifests::default();
    manifests::load_text("test.yaml", text, &mut m).unwrap();
    m
}

const POOL: &str = r#"
apiVersion: karpenter.exoscale.com/v1
kind: ExoscaleNodeClass
metadata: {name: default}
spec: {imageTemplateSelector: {}}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: default}
      requirements:
        - {key: karpenter.exoscale.com/instance-family, operator: In, values: [standard]}
"#;

fn deployment(name: &str, replicas: u32, cpu: &str, memory: &str) -> String {
    format!(
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, resources: {{requests: {{cpu: '{cpu}', memory: {memory}}}}}}}]}}\n"
    )
}

#[test]
fn three_one_cpu_pods_share_one_cheapest_node() {
    let m = manifests(&format!("{POOL}{}", deployment("web", 3, "1", "1Gi")));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert_eq!(r.node_claims.len(), 1, "{}", render_table(&r));
    let claim = &r.node_claims[0];
    assert_eq!(
        claim.pods,
        ["default/web-0", "default/web-1", "default/web-2"]
    );
    assert_eq!(claim.instance_type, claim.instance_type_options[0]);
    assert!(
        claim.instance_type.starts_with("standard."),
        "{}",
        claim.instance_type
    );
    assert_eq!(claim.zone, "ch-gva-2");
    assert_eq!(claim.capacity_type, "on-demand");
    assert!(claim.price_per_hour > 0.0);
    assert_eq!(r.total_price_per_hour, claim.price_per_hour);
    assert_eq!(claim.requests["cpu"], "3");
}

#[test]
fn a_pod_larger_than_any_type_is_unschedulable_with_a_reason() {
    let m = manifests(&format!("{POOL}{}", deployment("huge", 1, "500", "1Gi")));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert!(r.node_claims.is_empty());
    assert_eq!(r.unschedulable.len(), 1);
    assert_eq!(r.unschedulable[0].pod, "default/huge-0");
    assert!(!r.unschedulable[0].reason.is_empty());
}

#[test]
fn currency_changes_prices_not_decisions() {
    let m = manifests(&format!("{POOL}{}", deployment("web", 2, "1", "1Gi")));
    let eur = simulate(&m, "ch-gva-2", "EUR").unwrap();
    let chf = simulate(&m, "ch-gva-2", "chf").unwrap();
    assert_eq!(chf.currency, "CHF");
    assert_eq!(
        eur.node_claims[0].instance_type,
        chf.node_claims[0].instance_type
    );
    // The public list has the same figures in every currency; the label must follow the choice.
    assert_eq!(eur.currency, "EUR");
}

#[test]
fn bad_zone_and_currency_are_named() {
    let m = manifests(POOL);
    let zone = simulate(&m, "xx-nowhere-1", "EUR").unwrap_err().to_string();
    assert!(
        zone.contains("xx-nowhere-1") && zone.contains("ch-gva-2"),
        "{zone}"
    );
    let currency = simulate(&m, "ch-gva-2", "GBP").unwrap_err().to_string();
    assert!(currency.contains("GBP"), "{currency}");
}

#[test]
fn a_pod_that_fits_an_existing_node_creates_nothing() {
    let node = r#"
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {kubernetes.io/hostname: node-a, topology.kubernetes.io/zone: ch-gva-2}}
status:
  allocatable: {cpu: "4", memory: 8Gi, pods: "110"}
  capacity: {cpu: "4", memory: 8Gi, pods: "110"}
"#;
    let m = manifests(&format!("{POOL}{node}{}", deployment("api", 1, "1", "1Gi")));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert!(r.node_claims.is_empty(), "{}", render_table(&r));
    assert_eq!(
        r.existing_nodes,
        vec![ExistingNodeReport {
            name: "node-a".into(),
            pods: vec!["default/api-0".into()]
        }]
    );
}

#[test]
fn missing_nodeclass_is_simulated_with_defaults_and_a_warning() {
    let pool_only = POOL.split("---").nth(1).unwrap();
    let m = manifests(&format!("{pool_only}{}", deployment("web", 1, "1", "1Gi")));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert_eq!(r.node_claims.len(), 1);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("ExoscaleNodeClass default")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn a_pod_whose_claim_is_not_in_the_manifests_is_unschedulable_not_invalid() {
    // The same adapter as provisioning: a claim no node can satisfy keeps the pod from being
    // placed, and the reason names the claim.
    let pod = r#"
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: default}
spec:
  containers: [{name: c, resources: {requests: {cpu: "1"}}}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data-db}}]
"#;
    let m = manifests(&format!("{POOL}{pod}{}", deployment("web", 1, "1", "1Gi")));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert_eq!(r.node_claims.len(), 1, "{}", render_table(&r));
    assert_eq!(r.node_claims[0].pods, ["default/web-0"]);
    assert_eq!(r.unschedulable.len(), 1);
    assert_eq!(r.unschedulable[0].pod, "default/db");
    assert!(!r.unschedulable[0].invalid);
    assert!(
        r.unschedulable[0].reason.contains("\"data-db\" not found"),
        "{}",
        r.unschedulable[0].reason
    );
}

#[test]
fn nodes_of_a_nodepool_count_against_its_limits() {
    // An existing 4-CPU node of the pool uses its whole `limits.cpu: 5`, so one more 2-CPU pod
    // cannot get a node from it.
    let limited = POOL.replace(
        "spec:\n  template:",
        "spec:\n  limits: {cpu: \"5\"}\n  template:",
    );
    let node = r#"
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {karpenter.sh/nodepool: default, kubernetes.io/hostname: node-a, topology.kubernetes.io/zone: ch-gva-2}}
status:
  allocatable: {cpu: "4", memory: 8Gi, pods: "110"}
  capacity: {cpu: "4", memory: 8Gi, pods: "110"}
"#;
    let busy = r#"
---
apiVersion: v1
kind: Pod
metadata: {name: busy, namespace: default}
spec:
  nodeName: node-a
  containers: [{name: c, resources: {requests: {cpu: "3500m"}}}]
"#;
    let m = manifests(&format!(
        "{limited}{node}{busy}{}",
        deployment("web", 1, "2", "1Gi")
    ));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert!(r.node_claims.is_empty(), "{}", render_table(&r));
    assert_eq!(r.unschedulable.len(), 1, "{}", render_table(&r));
    assert_eq!(r.unschedulable[0].pod, "default/web-0");
}

#[test]
fn a_nodeoverlay_price_goes_through_the_providers_decorator() {
    let plain = manifests(&format!("{POOL}{}", deployment("web", 3, "1", "1Gi")));
    let before = simulate(&plain, "ch-gva-2", "EUR").unwrap();
    assert_eq!(before.node_claims.len(), 1);
    assert_ne!(before.node_claims[0].instance_type, "standard.huge");
    let overlay = r#"
---
apiVersion: karpenter.sh/v1alpha1
kind: NodeOverlay
metadata: {name: cheap-huge}
spec:
  requirements:
    - {key: node.kubernetes.io/instance-type, operator: In, values: [standard.huge]}
  price: "0.00001"
"#;
    let m = manifests(&format!(
        "{POOL}{overlay}{}",
        deployment("web", 3, "1", "1Gi")
    ));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert_eq!(r.node_claims.len(), 1, "{}", render_table(&r));
    assert_eq!(r.node_claims[0].instance_type, "standard.huge");
    assert_eq!(r.node_claims[0].price_per_hour, 0.00001);
}

#[test]
fn a_nodepool_whose_status_says_not_ready_launches_nothing() {
    let not_ready = format!(
        "{POOL}status:\n  conditions:\n    - {{type: Ready, status: 'False', reason: NodeClassNotReady, message: gone, lastTransitionTime: '2026-01-01T00:00:00Z'}}\n"
    );
    let m = manifests(&format!("{not_ready}{}", deployment("web", 1, "1", "1Gi")));
    let r = simulate(&m, "ch-gva-2", "EUR").unwrap();
    assert!(r.node_claims.is_empty(), "{}", render_table(&r));
    assert!(
        r.warnings
            .contains(&"NodePool default skipped: is not ready: gone".to_string()),
        "{:?}",
        r.warnings
    );
}
