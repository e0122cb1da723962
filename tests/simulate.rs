//! `simulate` over `examples/`: golden output (JSON contract), and the CLI itself.

use std::path::PathBuf;
use std::process::Command;

#[path = "support/regenerate.rs"]
mod regenerate;

use karpenter_exoscale::simulate::{self, Options, Report};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn examples_report(currency: &str) -> Report {
    let options = Options {
        paths: vec![repo().join("examples")],
        zone: "ch-gva-2".into(),
        currency: currency.into(),
    };
    simulate::run(&options).unwrap()
}

#[test]
fn examples_match_the_golden_report() {
    let report = examples_report("EUR");
    let rendered = serde_json::to_string_pretty(&report).unwrap() + "\n";
    let golden = repo().join("tests/golden/simulate-examples.json");
    if regenerate::requested("UPDATE_GOLDEN") {
        std::fs::write(&golden, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    assert_eq!(
        rendered, expected,
        "simulate output changed; review and rerun with UPDATE_GOLDEN=1"
    );
}

#[test]
fn examples_place_every_pod() {
    let report = examples_report("EUR");
    assert!(
        report.unschedulable.is_empty(),
        "{:?}",
        report.unschedulable
    );
    let placed: usize = report.node_claims.iter().map(|c| c.pods.len()).sum();
    // web 5 + api 3 + inference 1 + report job 4
    assert_eq!(placed, 13);
    let gpu: Vec<_> = report
        .node_claims
        .iter()
        .filter(|c| c.node_pool == "gpu")
        .collect();
    assert_eq!(gpu.len(), 1);
    assert!(gpu[0].instance_type.starts_with("gpua30."));
    assert_eq!(gpu[0].pods, ["ml/inference"]);
    for claim in report.node_claims.iter().filter(|c| c.node_pool == "batch") {
        assert!(claim.pods.iter().all(|p| p.starts_with("batch/report-")));
    }
    let api_nodes = report
        .node_claims
        .iter()
        .filter(|c| c.pods.iter().any(|p| p.starts_with("default/api-")))
        .count();
    assert_eq!(api_nodes, 3, "hostname anti-affinity: one api pod per node");
    let total: f64 = report.node_claims.iter().map(|c| c.price_per_hour).sum();
    assert!((report.total_price_per_hour - total).abs() < 1e-6);
}

#[test]
fn cli_prints_json_with_the_contract_keys() {
    let output = Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .args(["simulate", "-f", "examples/", "-o", "json"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for key in [
        "zone",
        "currency",
        "nodeClaims",
        "existingNodes",
        "unschedulable",
        "totalPricePerHour",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    let claim = &json["nodeClaims"][0];
    for key in [
        "nodePool",
        "instanceType",
        "instanceTypeOptions",
        "zone",
        "capacityType",
        "pricePerHour",
        "pods",
        "requests",
    ] {
        assert!(claim.get(key).is_some(), "nodeClaims[0] missing {key}");
    }
}

#[test]
fn cli_reports_a_bad_manifest_with_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: karpenter.exoscale.com/v1\nkind: ExoscaleNodeClass\nmetadata: {name: x}\nspec: {diskSize: 5, imageTemplateSelector: {}}\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .args(["simulate", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.yaml: document 0") && stderr.contains("spec.diskSize"),
        "{stderr}"
    );
}
