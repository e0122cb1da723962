//! Our metric families against the ones upstream Karpenter documents
//! (`tests/upstream-metrics.txt`, vendored from the reference notes): prints both differences,
//! and fails when a family the list says we produce is gone, or one it says we lack appears (the
//! list must then be updated, with the closing note's table of what is still missing).

use std::collections::BTreeSet;

use karpenter_exoscale::controllers::disruption::metrics::DisruptionMetrics;
use karpenter_exoscale::controllers::metrics::conditions::StatusConditionMetrics;
use karpenter_exoscale::operator::metrics::Metrics;
use karpenter_exoscale::provisioning::controller::ProvisioningMetrics;

/// Family names as exposed: counters carry `_total` on their samples, as upstream names them.
fn ours() -> BTreeSet<String> {
    let metrics = Metrics::new();
    let _disruption = DisruptionMetrics::register(&metrics);
    let _provisioning = ProvisioningMetrics::register(&metrics);
    let _conditions = StatusConditionMetrics::register(&metrics);
    metrics.families().into_iter().collect()
}

#[test]
fn upstream_metric_families_are_produced_or_listed_as_missing() {
    let list = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/upstream-metrics.txt"
    ))
    .expect("vendored list");
    let ours = ours();
    let mut produced = BTreeSet::new();
    let mut missing = BTreeSet::new();
    for line in list.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once(" missing:") {
            Some((name, _why)) => missing.insert(name.trim().to_string()),
            None => produced.insert(line.to_string()),
        };
    }
    let upstream: BTreeSet<String> = produced.union(&missing).cloned().collect();
    let not_produced: Vec<&String> = upstream.difference(&ours).collect();
    let only_ours: Vec<&String> = ours
        .iter()
        .filter(|n| n.starts_with("karpenter_") && !n.starts_with("karpenter_exoscale_"))
        .filter(|n| !upstream.contains(*n))
        .collect();
    println!("upstream families we do not produce: {not_produced:#?}");
    println!("karpenter_* families upstream does not document: {only_ours:#?}");
    let gone: Vec<&String> = produced.difference(&ours).collect();
    assert!(
        gone.is_empty(),
        "listed as produced but not registered: {gone:?}"
    );
    let appeared: Vec<&String> = missing.intersection(&ours).collect();
    assert!(
        appeared.is_empty(),
        "now produced, drop their 'missing:' note: {appeared:?}"
    );
}
