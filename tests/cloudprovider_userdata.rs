//! User data golden files: the rendered TOML for fixed inputs is checked in under
//! `tests/golden/`; the encoded form must decode back to exactly that document.
//! Regenerate with `UPDATE_GOLDEN=1 cargo test --test cloudprovider_userdata`.

use std::collections::BTreeMap;
use std::path::PathBuf;

#[path = "support/regenerate.rs"]
mod regenerate;

use karpenter_exoscale::apis::nodeclass::KubeletConfiguration;
use karpenter_exoscale::apis::{Taint, TaintEffect};
use karpenter_exoscale::providers::bootstrap_token::BootstrapToken;
use karpenter_exoscale::providers::userdata::{self, MAX_USER_DATA_LEN, UserDataInput};

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAjMSEwHwYDVQQDDBhrM3Mtc2Vy\n-----END CERTIFICATE-----\n";

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if regenerate::requested("UPDATE_GOLDEN") {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(actual, expected, "{name} differs from the golden file");
}

fn standard_input() -> UserDataInput {
    UserDataInput {
        api_server: "https://4a2b9c3d-1111-2222-3333-444455556666.sks-ch-gva-2.exo.io:443".into(),
        bootstrap_token: BootstrapToken::from_parts("abcdef", "0123456789abcdef").unwrap(),
        cluster_ca_pem: CA.as_bytes().to_vec(),
        cluster_domain: "cluster.local".into(),
        kubelet: KubeletConfiguration::default(),
        labels: BTreeMap::from([
            ("karpenter.sh/nodepool".into(), "default".into()),
            ("karpenter.sh/capacity-type".into(), "on-demand".into()),
            (
                "node.kubernetes.io/instance-type".into(),
                "standard.medium".into(),
            ),
            ("topology.kubernetes.io/zone".into(), "ch-gva-2".into()),
            (
                "karpenter.exoscale.com/instance-family".into(),
                "standard".into(),
            ),
            ("kubernetes.io/arch".into(), "amd64".into()),
        ]),
        taints: vec![],
    }
}

fn gpu_input() -> UserDataInput {
    let mut kubelet = KubeletConfiguration {
        cluster_dns: vec!["10.96.0.10".into(), " 10.96.0.11 ".into()],
        image_gc_high_threshold_percent: 90,
        image_gc_low_threshold_percent: 70,
        image_minimum_gc_age: "5m".into(),
        max_pods: Some(64),
        ..KubeletConfiguration::default()
    };
    kubelet.feature_gates.insert("ImageVolume".into(), true);
    kubelet
        .feature_gates
        .insert("InPlacePodVerticalScaling".into(), false);
    kubelet.kube_reserved.cpu = "500m".into();
    kubelet.system_reserved.ephemeral_storage = String::new();
    let mut input = standard_input();
    input.kubelet = kubelet;
    input.cluster_domain = "corp.internal".into();
    input.labels.insert(
        "node.kubernetes.io/instance-type".into(),
        "gpua30.small".into(),
    );
    input
        .labels
        .insert("node-role.kubernetes.io/gpu".into(), "".into());
    input.taints = vec![
        Taint::new("nvidia.com/gpu", Some("present"), TaintEffect::NoSchedule),
        Taint::new("example.com/warming", None, TaintEffect::NoExecute),
        Taint::new("nvidia.com/gpu", Some("present"), TaintEffect::NoSchedule),
    ];
    input
}

#[test]
fn standard_node_matches_the_golden_file() {
    let toml = userdata::render_toml(&standard_input()).unwrap();
    golden("userdata-standard.toml", &toml);
    let encoded = userdata::render(&standard_input()).unwrap();
    assert!(encoded.len() <= MAX_USER_DATA_LEN);
    assert_eq!(userdata::decode(&encoded).unwrap(), toml);
}

#[test]
fn gpu_node_with_custom_kubelet_matches_the_golden_file() {
    let toml = userdata::render_toml(&gpu_input()).unwrap();
    golden("userdata-gpu-custom-kubelet.toml", &toml);
    assert_eq!(
        userdata::decode(&userdata::render(&gpu_input()).unwrap()).unwrap(),
        toml
    );
}

#[test]
fn golden_documents_have_the_sks_node_agent_semantics() {
    let doc: toml::Table = userdata::render_toml(&gpu_input())
        .unwrap()
        .parse()
        .unwrap();
    let k = doc["settings"]["kubernetes"].as_table().unwrap();
    assert_eq!(
        k["api-server"].as_str(),
        Some("https://4a2b9c3d-1111-2222-3333-444455556666.sks-ch-gva-2.exo.io:443")
    );
    assert_eq!(
        k["bootstrap-token"].as_str(),
        Some("abcdef.0123456789abcdef")
    );
    assert_eq!(k["cloud-provider"].as_str(), Some("external"));
    let ca = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        k["cluster-certificate"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(ca, CA.as_bytes());
    assert_eq!(
        k["cluster-dns-ip"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["10.96.0.10", "10.96.0.11"]
    );
    assert_eq!(k["cluster-domain"].as_str(), Some("corp.internal"));
    assert_eq!(k["image-gc-high-threshold-percent"].as_integer(), Some(90));
    assert_eq!(k["image-gc-low-threshold-percent"].as_integer(), Some(70));
    assert_eq!(k["image-minimum-gc-age"].as_str(), Some("5m"));
    assert_eq!(k["max-pods"].as_integer(), Some(64));
    assert_eq!(k["feature-gates"]["ImageVolume"].as_bool(), Some(true));
    assert_eq!(
        k["feature-gates"]["InPlacePodVerticalScaling"].as_bool(),
        Some(false)
    );
    // Every key written is one the SKS node agent reads (its doc/user-data.md lists
    // `settings.kubernetes.*`; it has no eviction-threshold key, so none is written).
    const AGENT_KEYS: &[&str] = &[
        "api-server",
        "bootstrap-token",
        "cloud-provider",
        "cluster-certificate",
        "cluster-dns-ip",
        "cluster-domain",
        "cpu-manager-policy",
        "cpu-manager-policy-options",
        "cpu-manager-reconcile-period",
        "feature-gates",
        "image-gc-high-threshold-percent",
        "image-gc-low-threshold-percent",
        "image-minimum-gc-age",
        "kube-reserved",
        "max-pods",
        "node-labels",
        "node-taints",
        "static-pods",
        "standalone-mode",
        "system-reserved",
    ];
    for key in k.keys() {
        assert!(
            AGENT_KEYS.contains(&key.as_str()),
            "user data writes settings.kubernetes.{key}, which the SKS node agent does not read"
        );
    }
    assert!(k.get("eviction-hard").is_none());
    assert_eq!(k["kube-reserved"]["cpu"].as_str(), Some("500m"));
    assert!(k["system-reserved"].get("ephemeral-storage").is_none());
    let labels = k["node-labels"].as_table().unwrap();
    assert_eq!(
        labels["node.kubernetes.io/instance-type"].as_str(),
        Some("gpua30.small")
    );
    assert!(
        !labels.contains_key("node-role.kubernetes.io/gpu"),
        "kubelet may not set it"
    );
    let taints = k["node-taints"].as_table().unwrap();
    assert_eq!(taints["nvidia.com/gpu"].as_array().unwrap().len(), 1);
    assert_eq!(
        taints["example.com/warming"][0].as_str(),
        Some("true:NoExecute")
    );
    assert_eq!(
        taints["karpenter.sh/unregistered"][0].as_str(),
        Some("true:NoExecute")
    );
}

/// What the scheduler assumes a node can hold is what the node's kubelet will report: the
/// instance type built from a NodeClass and the simulated kubelet reading the user data rendered
/// from the same NodeClass (max-pods, reservations, the kubelet's default eviction thresholds)
/// agree on every resource.
#[test]
fn scheduler_allocatable_matches_what_the_kubelet_reports() {
    use karpenter_exoscale::apis::ExoscaleNodeClass;
    use karpenter_exoscale::providers::instance_types::{self, DiscoveredType};
    use karpenter_exoscale::scheduling::Quantity;
    use karpenter_exoscale::sim::kubelet::{
        InstanceShape, RunningInstance, decode_user_data, resources_for,
    };

    for kubelet_yaml in [
        "",
        "kubelet:\n  maxPods: 30\n  kubeReserved: {cpu: 500m, memory: 1Gi, ephemeralStorage: 2Gi}\n",
        "kubelet:\n  systemReserved: {cpu: 250m, memory: 512Mi, ephemeralStorage: 1Gi}\n",
    ] {
        let spec = serde_yaml_ng::from_str(&format!(
            "templateID: 11111111-2222-3333-4444-555555555555\ndiskSize: 80\n{kubelet_yaml}"
        ))
        .unwrap();
        let nodeclass = ExoscaleNodeClass::new("default", spec);
        let discovered = DiscoveredType {
            id: "t".into(),
            family: "standard".into(),
            size: "medium".into(),
            cpus: 2,
            memory_bytes: 4 << 30,
            gpus: 0,
        };
        let scheduled = instance_types::build(&discovered, &nodeclass, "ch-gva-2", 0.05, true)
            .unwrap()
            .allocatable();

        let mut input = standard_input();
        input.kubelet = nodeclass.kubelet();
        let instance = RunningInstance {
            id: "8a3c2e1f-4b5d-4c6e-9f70-1a2b3c4d5e6f".into(),
            name: "node".into(),
            zone: "ch-gva-2".into(),
            shape: InstanceShape {
                name: "standard.medium".into(),
                cpus: 2,
                memory_bytes: 4 << 30,
                gpus: 0,
                disk_gib: 80,
            },
            user_data: userdata::render(&input).unwrap(),
        };
        let settings = decode_user_data(&instance.user_data).unwrap();
        let reported = resources_for(&instance, &settings).unwrap().allocatable;
        for resource in ["cpu", "memory", "ephemeral-storage", "pods"] {
            let kubelet = Quantity::parse(&reported[resource].0).unwrap();
            assert_eq!(
                scheduled.get(resource),
                kubelet,
                "{resource} with {kubelet_yaml:?}: the scheduler assumes {:?}, the kubelet reports {}",
                scheduled.get(resource),
                reported[resource].0
            );
        }
    }
}
