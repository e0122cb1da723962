//! `karpenter-exoscale explain pod` and `plan`, the real binary against a real control plane
//! (read-only: no controller runs, kube-scheduler marks the pods unschedulable): a pod pending
//! because of a NodePool limit, a typo'd nodeSelector, a missing toleration and a volume zone
//! each get the right explanation; a pod that fits gets the cheapest type and its price.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use karpenter_exoscale::apis::{ExoscaleNodeClass, NodePool};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn create<K>(api: &Api<K>, value: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).expect("a valid object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("created");
}

fn pod(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c", "image": "registry.example.com/app:1",
        "resources": {"requests": {"cpu": spec.get("cpu").cloned().unwrap_or(json!("500m")), "memory": "512Mi"}}}]);
    spec.as_object_mut().unwrap().remove("cpu");
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn run(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, Value, String) {
    run_with(kubeconfig, args, &[])
}

fn run_with(
    kubeconfig: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, Value, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"));
    command
        .args(args)
        .args(["-o", "json", "--zone", "ch-gva-2"])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("EXOSCALE_ZONE")
        .env_remove("EXOSCALE_API_KEY")
        .env_remove("EXOSCALE_API_SECRET");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), value, stderr)
}

async fn wait_unschedulable(pods: &Api<Pod>, names: &[&str]) {
    let started = Instant::now();
    loop {
        let mut all = true;
        for name in names {
            let pod = pods.get(name).await.unwrap();
            let marked = pod
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"));
            all &= marked;
        }
        if all {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "kube-scheduler did not mark the pods unschedulable"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_and_plan_name_why_each_pod_waits_and_what_would_launch() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client: Client = plane.client_without_retries().await;
    let ns = plane.namespace(&client, "explain").await;
    let suffix = &ns[ns.len() - 6..];
    let class = format!("explain-{suffix}");
    create(
        &Api::<ExoscaleNodeClass>::all(client.clone()),
        json!({"apiVersion": "karpenter.exoscale.com/v1", "kind": "ExoscaleNodeClass",
            "metadata": {"name": class},
            "spec": {"imageTemplateSelector": {}, "diskSize": 50,
                "securityGroupSelectorTerms": [{"name": "sks-nodes"}]}}),
    )
    .await;
    let pools: Api<NodePool> = Api::all(client.clone());
    let pool = |name: &str, extra: Value| {
        let mut p = json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": {"team.example.com/tier": "general"}},
                "spec": {
                "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": class},
                "requirements": [{"key": "karpenter.exoscale.com/instance-family", "operator": "In", "values": ["standard"]}]}}}});
        for (k, v) in extra.as_object().unwrap() {
            match k.as_str() {
                "taints" => p["spec"]["template"]["spec"]["taints"] = v.clone(),
                _ => p["spec"][k] = v.clone(),
            }
        }
        p
    };
    let limited = format!("limited-{suffix}");
    let tainted = format!("tainted-{suffix}");
    let open = format!("open-{suffix}");
    create(&pools, pool(&limited, json!({"limits": {"cpu": "1"}}))).await;
    create(
        &pools,
        pool(
            &tainted,
            json!({"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}),
        ),
    )
    .await;
    create(&pools, pool(&open, json!({}))).await;
    // Ready, as the NodePool controller (not running here) would mark them: nothing is
    // planned from a NodePool before that.
    for name in [&limited, &tainted, &open] {
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        pools
            .patch_status(name, &PatchParams::default(), &Patch::Merge(ready))
            .await
            .expect("NodePool status");
    }

    // A volume pinned to a zone no NodePool offers here.
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("pv-{suffix}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "", "csi": {"driver": "csi.exoscale.com", "volumeHandle": format!("de-fra-1/{suffix}")},
                "claimRef": {"namespace": ns, "name": "data"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["de-fra-1"]}]}]}}}}),
    )
    .await;
    create(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data",
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": format!("pv-{suffix}"),
                "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;

    // Bound, as the PV controller (not running here) would mark it.
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "1Gi"}}}),
            ),
        )
        .await
        .expect("PVC status");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let select = |pool: &str| json!({"karpenter.sh/nodepool": pool});
    create(
        &pods,
        pod(
            "over-limit",
            json!({"cpu": "4", "nodeSelector": select(&limited)}),
        ),
    )
    .await;
    create(
        &pods,
        pod(
            "typo",
            json!({"nodeSelector": {"team.example.com/teir": "general"}}),
        ),
    )
    .await;
    create(
        &pods,
        pod("untolerated", json!({"nodeSelector": select(&tainted)})),
    )
    .await;
    create(
        &pods,
        pod(
            "zonal-volume",
            json!({"nodeSelector": select(&open),
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}),
        ),
    )
    .await;
    create(&pods, pod("fits", json!({"nodeSelector": select(&open)}))).await;
    let names = ["over-limit", "typo", "untolerated", "zonal-volume", "fits"];
    wait_unschedulable(&pods, &names).await;

    let kubeconfig = plane.kubeconfig_file.clone();
    let explain = |name: &str| {
        let (ok, value, stderr) = run(&kubeconfig, &["explain", "pod", &format!("{ns}/{name}")]);
        assert!(ok, "explain pod {name} failed: {stderr}");
        eprintln!("{name}: {}", value["verdict"]);
        value["verdict"].clone()
    };
    let text = |v: &Value| v.to_string();

    let v = explain("over-limit");
    assert_eq!(v["kind"], "unschedulable", "{v}");
    let why = v["nodepools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["nodepool"] == limited.as_str())
        .unwrap_or_else(|| panic!("no verdict for {limited}: {v}"));
    assert!(text(&why["reason"]).contains("limit"), "{why}");

    let v = explain("typo");
    assert_eq!(v["kind"], "unschedulable", "{v}");
    assert!(
        text(&v).contains("typo of \\\"team.example.com/tier\\\""),
        "no typo hint: {v}"
    );

    let v = explain("untolerated");
    assert_eq!(v["kind"], "unschedulable", "{v}");
    assert!(text(&v).contains("dedicated=gpu:NoSchedule"), "{v}");

    let v = explain("zonal-volume");
    assert!(
        v["kind"] == "unschedulable" || v["kind"] == "invalid",
        "{v}"
    );
    assert!(
        text(&v).contains("de-fra-1"),
        "the volume's zone is named: {v}"
    );

    let v = explain("fits");
    assert_eq!(v["kind"], "new_node", "{v}");
    assert_eq!(v["nodepool"], open.as_str());
    assert!(v["price_per_hour"].as_f64().unwrap() > 0.0, "{v}");
    assert!(text(&v["instance_type"]).starts_with("\"standard."), "{v}");

    // With credentials, the account's instance types come from the Exoscale API: a type it may
    // not use is not offered.
    let sim = karpenter_exoscale::sim::ExoscaleSim::start()
        .await
        .expect("simulated cloud");
    assert!(sim.set_authorized("standard.tiny", false));
    let credentials = sim.credentials();
    let secret = credentials.secret.expose().to_string();
    let api_env = [
        ("EXOSCALE_API_KEY", credentials.key.as_str()),
        ("EXOSCALE_API_SECRET", secret.as_str()),
        ("EXOSCALE_API_ENDPOINT", sim.endpoint()),
    ];
    let (ok, value, stderr) = run_with(
        &kubeconfig,
        &["explain", "pod", &format!("{ns}/fits")],
        &api_env,
    );
    assert!(ok, "{stderr}");
    assert_eq!(
        value["verdict"]["instance_type"], "standard.small",
        "{value}"
    );
    assert!(
        text(&value["warnings"]).contains("from the Exoscale API"),
        "{value}"
    );
    assert!(sim.call_count("list-instance-types") >= 1);
    // The NodeClass's template is resolved through the API as the controller would: the sim
    // serves no template for this control plane's version yet, then it does.
    let class_warning = |value: &Value| {
        value["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w.as_str())
            .any(|w| {
                w.contains(&format!(
                    "ExoscaleNodeClass {class}: its template cannot be used"
                ))
            })
    };
    assert!(class_warning(&value), "{value}");
    let version = client.apiserver_version().await.unwrap().git_version;
    sim.add_kubernetes_version(
        &karpenter_exoscale::providers::template::parse_kubernetes_version(&version).unwrap(),
    );
    let (ok, value, stderr) = run_with(
        &kubeconfig,
        &["explain", "pod", &format!("{ns}/fits")],
        &api_env,
    );
    assert!(ok, "{stderr}");
    assert!(!class_warning(&value), "{value}");
    // Credentials the API refuses: one attempt, a warning, and the catalogue's answer.
    let refused = [
        ("EXOSCALE_API_KEY", credentials.key.as_str()),
        ("EXOSCALE_API_SECRET", "not-the-secret"),
        ("EXOSCALE_API_ENDPOINT", sim.endpoint()),
    ];
    let (ok, value, stderr) = run_with(
        &kubeconfig,
        &["explain", "pod", &format!("{ns}/fits")],
        &refused,
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("could not be read") && stderr.contains("embedded catalogue"),
        "{stderr}"
    );
    assert_eq!(
        value["verdict"]["instance_type"], "standard.tiny",
        "{value}"
    );

    let (ok, missing, stderr) = run(&kubeconfig, &["explain", "pod", &format!("{ns}/nope")]);
    assert!(
        !ok && missing.is_null() && stderr.contains("not found"),
        "{stderr}"
    );

    let (ok, plan, stderr) = run(&kubeconfig, &["plan"]);
    assert!(ok, "plan failed: {stderr}");
    let launch = plan["launch"].as_array().unwrap();
    assert!(
        launch.iter().any(|n| n["nodepool"] == open.as_str()),
        "plan launches for the pod that fits: {plan}"
    );
    let blocked: Vec<&str> = plan["unschedulable"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["pod"].as_str())
        .collect();
    for name in ["over-limit", "typo", "untolerated", "zonal-volume"] {
        assert!(
            blocked.contains(&format!("{ns}/{name}").as_str()),
            "{name} missing from {blocked:?}"
        );
    }
    assert!(
        plan["disruption"].is_null(),
        "no node, nothing to disrupt: {plan}"
    );
    assert!(plan["cost_per_hour_after"].as_f64().unwrap() > 0.0);
}
