use super::*;
use crate::scheduling::fixtures;

fn pool(name: &str) -> Arc<crate::apis::NodePool> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"nodeClassRef":
                {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "c"},
                "requirements": []}}}
        }))
        .unwrap(),
    )
}

#[test]
fn a_node_is_priced_at_its_own_offering() {
    let mut types = fixtures::instance_types(3);
    // fake-it-1 costs more on demand in zone 2 than anywhere else.
    let mut it = (*types[1]).clone();
    for o in &mut it.offerings {
        if o.zone == fixtures::FAKE_ZONES[1] && o.capacity_type == "on-demand" {
            o.price = 9.0;
        }
    }
    types[1] = Arc::new(it);
    let pools = vec![(pool("p"), types)];
    let labels = |zone: &str| -> BTreeMap<String, String> {
        [
            (crate::apis::labels::NODEPOOL_LABEL, "p"),
            (INSTANCE_TYPE, "fake-it-1"),
            (ZONE, zone),
            (CAPACITY_TYPE, "on-demand"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    assert_eq!(
        node_price(&pools, &labels(fixtures::FAKE_ZONES[1])),
        Some(9.0)
    );
    assert!(node_price(&pools, &labels(fixtures::FAKE_ZONES[0])).unwrap() < 9.0);
    let mut foreign = labels(fixtures::FAKE_ZONES[0]);
    foreign.insert(crate::apis::labels::NODEPOOL_LABEL.into(), "other".into());
    assert_eq!(node_price(&pools, &foreign), None);
}

#[test]
fn the_json_contract_tags_verdicts_and_the_table_names_each_nodepool() {
    let e = PodExplanation {
        pod: "default/web".into(),
        verdict: Verdict::Unschedulable {
            reason: "no nodepools found: nodepool \"gpu\" is not ready: NodeClass gpu is not ready"
                .into(),
            nodepools: vec![PoolVerdict {
                nodepool: "gpu".into(),
                reason: "is not ready: NodeClass gpu is not ready".into(),
            }],
        },
        currency: "EUR".into(),
        warnings: vec![],
    };
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["verdict"]["kind"], "unschedulable");
    assert_eq!(json["verdict"]["nodepools"][0]["nodepool"], "gpu");
    let table = render_pod(&e);
    assert!(table.contains("nodepool \"gpu\": is not ready"), "{table}");

    let launch = PlannedNode {
        nodepool: "p".into(),
        instance_type: "standard.small".into(),
        price_per_hour: 0.03,
        pods: 2,
        instance_types: vec!["standard.small".into()],
    };
    let json = serde_json::to_value(PodExplanation {
        verdict: Verdict::NewNode(launch.clone()),
        ..e
    })
    .unwrap();
    assert_eq!(json["verdict"]["kind"], "new_node");
    assert_eq!(json["verdict"]["instance_type"], "standard.small");

    let plan = Plan {
        launch: vec![],
        pods_nominated: 0,
        unschedulable: vec![],
        disruption: Some(DisruptionPlan {
            method: "MultiNodeConsolidation".into(),
            decision: "replace".into(),
            remove: vec![PlannedRemoval {
                node: "n1".into(),
                nodepool: "p".into(),
                instance_type: Some("standard.medium".into()),
                price_per_hour: 0.06,
            }],
            launch: vec![launch],
            savings_per_hour: 0.03,
            savings_per_month: 0.03 * HOURS_PER_MONTH,
        }),
        nodes: 1,
        cost_per_hour: 0.06,
        cost_per_month: 0.06 * HOURS_PER_MONTH,
        cost_per_hour_after: 0.03,
        cost_per_month_after: 0.03 * HOURS_PER_MONTH,
        currency: "EUR".into(),
        warnings: vec![],
    };
    let table = render_plan(&plan);
    assert!(
        table.contains("MultiNodeConsolidation (replace)"),
        "{table}"
    );
    assert!(
        table.contains("saves 0.0300 EUR/h (21.60 EUR per 30-day month)"),
        "{table}"
    );
    assert!(
        table.contains("1 node(s) at 0.0600 EUR/h (43.20 EUR/month) now"),
        "{table}"
    );
}

#[test]
fn a_bound_pod_is_told_which_of_its_constraints_the_node_met() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": "n", "containers": [],
            "nodeSelector": {"team": "a"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["ch-gva-2"]}]}]}}},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n", "labels": {"team": "a", "topology.kubernetes.io/zone": "ch-gva-2"}},
        "spec": {"taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "other", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    assert_eq!(
        landed_because(&pod, &node),
        [
            "nodeSelector team=a (node: team=a)",
            "node affinity topology.kubernetes.io/zone In [ch-gva-2] (node: topology.kubernetes.io/zone=ch-gva-2)",
            "tolerates taint dedicated=gpu:NoSchedule",
        ]
    );
    let bare: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "q"}, "spec": {"containers": []}
    }))
    .unwrap();
    assert!(landed_because(&bare, &node).is_empty());
}

#[test]
fn explain_node_names_the_drift_the_provider_detected() {
    use crate::state::testing;
    let mut index = crate::state::ClusterIndex::default();
    let mut claim = testing::nodeclaim("c1", "p", Some("exoscale://i1"));
    claim.status.as_mut().unwrap().node_name = Some("n1".into());
    let claim = testing::set_condition(
        claim,
        crate::apis::labels::conditions::DRIFTED,
        crate::apis::ConditionStatus::True,
        0,
    );
    index.apply_nodeclaim(claim);
    index.apply_node(testing::node("n1", Some("exoscale://i1"), &[]));
    index.apply_nodepool((*pool("p")).clone());
    let live = Live {
        index,
        node_classes: vec![],
        overlays: vec![],
        drift_notes: BTreeMap::from([(
            "c1".to_string(),
            "security groups [sg-a] differ from the NodeClass's [sg-b]".to_string(),
        )]),
        unread: vec![],
    };
    let env = Env::new("ch-gva-2", "EUR");
    let e = futures::executor::block_on(explain_node(&live, &env, "c1")).unwrap();
    assert_eq!(e.node, "n1");
    assert_eq!(e.nodeclaim.as_deref(), Some("c1"));
    let drifted = e.drifted.unwrap();
    assert!(drifted.starts_with("Drifted"), "{drifted}");
    assert!(
        drifted.contains("security groups [sg-a] differ"),
        "{drifted}"
    );
    assert_eq!(e.methods.len(), 5);
    // By Node name too.
    let by_node = futures::executor::block_on(explain_node(&live, &env, "n1")).unwrap();
    assert_eq!(by_node.nodeclaim.as_deref(), Some("c1"));
    assert!(matches!(
        futures::executor::block_on(explain_node(&live, &env, "nope")),
        Err(ExplainError::NotFound(_))
    ));
}
