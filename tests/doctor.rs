//! `doctor` against the simulated cloud: passes when healthy, fails with a named check otherwise.

use std::time::Duration;

use karpenter_exoscale::doctor::{self, CheckStatus, DoctorConfig, NodeClassRef, RefKind};
use karpenter_exoscale::exoscale::ApiSecret;
use karpenter_exoscale::exoscale::models::SksTemplateVariant;
use karpenter_exoscale::sim::{ExoscaleSim, SimConfig};

fn config_for(sim: &ExoscaleSim) -> DoctorConfig {
    DoctorConfig {
        api_key: sim.credentials().key.clone(),
        api_secret: sim.credentials().secret.clone(),
        zone: sim.zone().to_string(),
        sks_cluster_id: sim.cluster_id().to_string(),
        api_endpoint: Some(sim.endpoint().to_string()),
        api_environment: None,
        kubeconfig: None,
        cluster_endpoint: None,
        nodeclass_refs: None,
        request_timeout: Duration::from_secs(10),
    }
}

fn failed(report: &doctor::DoctorReport) -> Vec<String> {
    report
        .checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| c.name.clone())
        .collect()
}

#[tokio::test]
async fn passes_against_a_healthy_sim() {
    let sim = ExoscaleSim::start().await.unwrap();
    let cfg = config_for(&sim);
    let mut out = Vec::new();
    assert!(doctor::run(&cfg, &mut out).await);
    let text = String::from_utf8(out).unwrap();
    for name in [
        "endpoint",
        "credentials",
        "zone",
        "instance-types",
        "sks-cluster",
        "sks-template standard",
        "sks-template nvidia",
    ] {
        assert!(
            text.contains(&format!("✓ {name}: ")),
            "{name} missing in:\n{text}"
        );
    }
    assert!(text.contains("Kubernetes 1.34.1"));
    assert!(text.contains("- nodeclasses: skipped: no cluster reachable (KUBECONFIG unset)"));
    assert!(text.ends_with("all checks passed\n"));
    assert!(!text.contains(sim.credentials().secret.expose()));
}

#[tokio::test]
async fn wrong_secret_fails_the_credentials_check() {
    let sim = ExoscaleSim::start().await.unwrap();
    let mut cfg = config_for(&sim);
    cfg.api_secret = ApiSecret::new("definitely-wrong");
    let report = doctor::check(&cfg).await;
    assert!(!report.passed());
    assert_eq!(failed(&report), vec!["credentials"]);
    let line = report.check("credentials").unwrap().line();
    assert!(line.starts_with("✗ credentials: unauthorized (403): Invalid request signature — fix: check EXOSCALE_API_KEY"), "{line}");
    assert_eq!(report.check("zone").unwrap().status, CheckStatus::Skip);
    let mut out = Vec::new();
    assert!(!doctor::run(&cfg, &mut out).await);
    assert!(!String::from_utf8(out).unwrap().contains("definitely-wrong"));
}

#[tokio::test]
async fn unknown_zone_fails_the_zone_check() {
    let sim = ExoscaleSim::start().await.unwrap();
    let mut cfg = config_for(&sim);
    cfg.zone = "xx-nope-1".into();
    let report = doctor::check(&cfg).await;
    assert_eq!(failed(&report), vec!["zone"]);
    let zone = report.check("zone").unwrap();
    assert!(
        zone.detail.contains("\"xx-nope-1\" is not listed"),
        "{}",
        zone.detail
    );
    assert_eq!(
        zone.hint.as_deref(),
        Some("set EXOSCALE_ZONE to the zone of the SKS cluster")
    );
}

#[tokio::test]
async fn unknown_cluster_fails_the_cluster_check_and_skips_templates() {
    let sim = ExoscaleSim::start().await.unwrap();
    let mut cfg = config_for(&sim);
    cfg.sks_cluster_id = "00000000-0000-4000-8000-000000000000".into();
    let report = doctor::check(&cfg).await;
    assert_eq!(failed(&report), vec!["sks-cluster"]);
    assert_eq!(
        report.check("sks-template nvidia").unwrap().status,
        CheckStatus::Skip
    );
}

#[tokio::test]
async fn templates_follow_the_cluster_version_and_a_missing_one_is_named() {
    let sim = ExoscaleSim::start_with(SimConfig {
        kubernetes_version: "1.36.0".into(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let report = doctor::check(&config_for(&sim)).await;
    assert!(report.passed(), "{report:?}");
    assert!(
        report
            .check("sks-template standard")
            .unwrap()
            .detail
            .contains("Kubernetes 1.36.0")
    );

    assert!(sim.remove_sks_template("1.36.0", SksTemplateVariant::Nvidia));
    let report = doctor::check(&config_for(&sim)).await;
    assert_eq!(failed(&report), vec!["sks-template nvidia"]);
    let line = report.check("sks-template nvidia").unwrap().line();
    assert!(
        line.contains("no active nvidia template for Kubernetes 1.36.0"),
        "{line}"
    );
}

#[tokio::test]
async fn no_authorized_types_in_the_zone_fails_instance_types() {
    let sim = ExoscaleSim::start_with(SimConfig {
        zone: "at-vie-2".into(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let catalogue = karpenter_exoscale::catalogue::Catalogue::embedded();
    for t in catalogue.instance_types_in_zone("at-vie-2") {
        sim.set_authorized(&t.name(), false);
    }
    let report = doctor::check(&config_for(&sim)).await;
    assert_eq!(failed(&report), vec!["instance-types"]);
}

#[tokio::test]
async fn nodeclass_references_are_resolved_by_id_or_name() {
    let sim = ExoscaleSim::start().await.unwrap();
    let pn = sim.add_private_network("db");
    let mut cfg = config_for(&sim);
    cfg.nodeclass_refs = Some(vec![
        NodeClassRef {
            nodeclass: "default".into(),
            kind: RefKind::SecurityGroup,
            id_or_name: "karpenter-nodes".into(),
        },
        NodeClassRef {
            nodeclass: "default".into(),
            kind: RefKind::PrivateNetwork,
            id_or_name: pn.clone(),
        },
        NodeClassRef {
            nodeclass: "gpu".into(),
            kind: RefKind::AntiAffinityGroup,
            id_or_name: "missing-group".into(),
        },
    ]);
    let report = doctor::check(&cfg).await;
    assert_eq!(
        failed(&report),
        vec!["nodeclass gpu anti-affinity group missing-group"]
    );
    let pn_check = report
        .check(&format!("nodeclass default private network {pn}"))
        .unwrap();
    assert_eq!(pn_check.status, CheckStatus::Pass);
    assert!(pn_check.detail.starts_with("db ("));
    assert!(
        report
            .check("nodeclass gpu anti-affinity group missing-group")
            .unwrap()
            .hint
            .as_deref()
            .unwrap()
            .contains("ExoscaleNodeClass gpu")
    );
}

#[tokio::test]
async fn invalid_endpoint_configuration_is_named() {
    let cfg = DoctorConfig {
        api_key: "EXOk".into(),
        api_secret: ApiSecret::new("s"),
        zone: "Not A Zone".into(),
        sks_cluster_id: "c".into(),
        api_endpoint: None,
        api_environment: None,
        kubeconfig: None,
        cluster_endpoint: None,
        nodeclass_refs: None,
        request_timeout: Duration::from_secs(1),
    };
    let report = doctor::check(&cfg).await;
    assert_eq!(failed(&report), vec!["endpoint"]);
}

/// A `CLUSTER_ENDPOINT` other than the SKS cluster's own is a failed, named check: the
/// configured cluster ID probably names another cluster.
#[tokio::test]
async fn a_cluster_endpoint_of_another_cluster_fails_a_named_check() {
    let sim = ExoscaleSim::start().await.unwrap();
    let own = format!("https://{}.sks-{}.exo.io", sim.cluster_id(), sim.zone());
    let mut cfg = config_for(&sim);
    cfg.cluster_endpoint = Some(format!("{own}:443/"));
    let report = doctor::check(&cfg).await;
    assert!(failed(&report).is_empty(), "{:?}", failed(&report));
    assert_eq!(
        report.check("cluster-endpoint").map(|c| c.status),
        Some(CheckStatus::Pass)
    );
    cfg.cluster_endpoint = Some("https://other-cluster.sks-ch-gva-2.exo.io:443".into());
    let report = doctor::check(&cfg).await;
    assert_eq!(failed(&report), vec!["cluster-endpoint"]);
    let check = report.check("cluster-endpoint").unwrap();
    assert!(check.detail.contains("other-cluster"), "{}", check.detail);
}
