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

const POOL: &str = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: default}\n      requirements: []\n";

fn simulate_cli(text: &str, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("input.yaml");
    std::fs::write(&file, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .args(["simulate", "-f"])
        .arg(&file)
        .args(extra)
        .output()
        .unwrap()
}

/// An invalid pod is reported with its field and makes the exit code 3, unless allowed.
#[test]
fn cli_exits_non_zero_for_invalid_pods_unless_allowed() {
    let text = format!(
        "{POOL}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: neg}}\nspec: {{containers: [{{name: c, resources: {{requests: {{cpu: '-1'}}}}}}]}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: ok}}\nspec: {{containers: [{{name: c, resources: {{requests: {{cpu: '1'}}}}}}]}}\n"
    );
    let output = simulate_cli(&text, &["-o", "json"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let report: Report = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report.node_claims.len(),
        1,
        "the valid pod still gets a node"
    );
    assert_eq!(report.invalid_pods(), 1);
    assert!(
        report.unschedulable[0].reason.contains(
            "spec.containers[0].resources.requests[cpu]: must be greater than or equal to 0"
        ),
        "{:?}",
        report.unschedulable
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("--allow-invalid-pods"));
    let allowed = simulate_cli(&text, &["--allow-invalid-pods"]);
    assert_eq!(allowed.status.code(), Some(0), "{allowed:?}");
}

/// Names reach the terminal with control characters escaped, and an empty total is `0`.
#[test]
fn cli_escapes_control_characters_and_prints_no_negative_zero() {
    let text = format!(
        "{POOL}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: \"evil\\e[2K\\rfake ✓\"}}\nspec: {{containers: [{{name: c, resources: {{requests: {{cpu: '500'}}}}}}]}}\n"
    );
    let output = simulate_cli(&text, &[]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        !stdout.contains('\u{1b}') && !stdout.contains('\r'),
        "{stdout:?}"
    );
    assert!(
        stdout.contains("default/evil\\u{1b}[2K\\rfake ✓"),
        "{stdout}"
    );
    assert!(stdout.contains("Total: 0.00000 EUR"), "{stdout}");
    let json = simulate_cli(&text, &["-o", "json"]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["totalPricePerHour"].to_string(), "0.0");
}

/// Input that used to hang or exhaust memory fails fast with the path.
#[test]
fn cli_refuses_devices_cycles_and_absurd_replicas() {
    let output = Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .args(["simulate", "-f", "/dev/zero"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/dev/zero: not a regular file"));

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pool.yaml"), POOL).unwrap();
    std::os::unix::fs::symlink(dir.path(), dir.path().join("loop")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .args(["simulate", "-f"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");

    let replicas = format!(
        "{POOL}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec:\n  replicas: 2147483647\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    spec: {{containers: [{{name: c}}]}}\n"
    );
    let output = simulate_cli(&replicas, &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("spec.replicas: 2147483647 pods would exceed"),
        "{output:?}"
    );
}

/// An ExoscaleNodeClass's `nodeLabels` and `nodeTaints` are known to the scheduler: a pod must
/// tolerate the taint and may select the label, and a pool whose class lacks them is not used
/// for a pod selecting the label.
#[test]
fn nodeclass_labels_and_taints_decide_placement() {
    let manifests = r#"
apiVersion: karpenter.exoscale.com/v1
kind: ExoscaleNodeClass
metadata: {name: tainted}
spec:
  templateID: 11111111-2222-3333-4444-555555555555
  nodeLabels: {example.com/team: ml}
  nodeTaints: [{key: example.com/dedicated, value: ml, effect: NoSchedule}]
---
apiVersion: karpenter.exoscale.com/v1
kind: ExoscaleNodeClass
metadata: {name: plain}
spec:
  templateID: 11111111-2222-3333-4444-555555555555
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: ml}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: tainted}
      requirements: []
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: general}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: plain}
      requirements: []
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: default}
spec:
  nodeSelector: {example.com/team: ml}
  tolerations: [{key: example.com/dedicated, operator: Equal, value: ml, effect: NoSchedule}]
  containers: [{name: c, image: x, resources: {requests: {cpu: "1"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: selects-but-does-not-tolerate, namespace: default}
spec:
  nodeSelector: {example.com/team: ml}
  containers: [{name: c, image: x, resources: {requests: {cpu: "1"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  containers: [{name: c, image: x, resources: {requests: {cpu: "1"}}}]
"#;
    let output = simulate_cli(manifests, &["-o", "json", "--allow-invalid-pods"]);
    let report: Report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let pool_of = |pod: &str| {
        report
            .node_claims
            .iter()
            .find(|c| c.pods.iter().any(|p| p == pod))
            .map(|c| c.node_pool.clone())
    };
    assert_eq!(pool_of("default/trainer").as_deref(), Some("ml"));
    assert_eq!(pool_of("default/web").as_deref(), Some("general"));
    let refused: Vec<_> = report.unschedulable.iter().map(|u| &u.pod).collect();
    assert_eq!(refused, ["default/selects-but-does-not-tolerate"]);
    let reason = &report.unschedulable[0].reason;
    assert!(reason.contains("example.com/dedicated"), "{reason}");
}
