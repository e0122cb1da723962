//! The README's "Try it locally", as written: the sandbox `hack/sandbox.sh` starts, the files
//! the README's `kubectl apply` line names are applied, NodeClass and NodePool turn Ready, the
//! pods get nodes and run, and after a scale to zero every node is consolidated away.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use karpenter_exoscale::apis::{ExoscaleNodeClass, NodeClaim, NodePool};
use karpenter_exoscale::exoscale::models::SksTemplateVariant;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Client, ResourceExt};
use serde_json::json;

use karpenter_exoscale::providers::template::parse_kubernetes_version;
use support::sandbox::Sandbox;

const WAIT: Duration = Duration::from_secs(300);

/// The files of the README's `kubectl apply -f … -f …` line in "Try it locally".
fn readme_apply_files() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let section = readme
        .split("## Try it locally")
        .nth(1)
        .expect("README has a Try it locally section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let line = section
        .lines()
        .find(|l| l.contains("kubectl apply"))
        .expect("Try it locally has a kubectl apply line");
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == '`')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "-f")
        .map(|w| w[1].to_string())
        .collect()
}

/// `kubectl apply --server-side` of every document of `file`.
async fn apply_file(client: &Client, file: &str) -> usize {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut applied = 0;
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: serde_json::Value =
            serde::Deserialize::deserialize(document).unwrap_or_else(|e| panic!("{file}: {e}"));
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(value.clone()).unwrap();
        let types = object.types.clone().expect("apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{file}: {} is not served: {e}", types.kind));
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                object.namespace().as_deref().unwrap_or("default"),
                &resource,
            ),
        };
        api.patch(
            &object.name_any(),
            &PatchParams::apply("readme-walkthrough"),
            &Patch::Apply(&value),
        )
        .await
        .unwrap_or_else(|e| panic!("{file}: applying {} {}: {e}", types.kind, object.name_any()));
        applied += 1;
    }
    applied
}

async fn eventually<T, F, Fut>(what: &str, started: Instant, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(value) = check().await {
            eprintln!("{:>6.1} s  {what}", started.elapsed().as_secs_f64());
            return value;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ready(conditions: &[karpenter_exoscale::apis::Condition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == karpenter_exoscale::apis::ConditionStatus::True)
}

#[test]
fn the_readme_names_the_files_to_apply() {
    assert_eq!(
        readme_apply_files(),
        ["examples/standard.yaml", "examples/workloads/web.yaml"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_through_works_in_the_sandbox() {
    let Some(bin_dir) = support::control_plane::bin_dir_or_skip("the README walk-through") else {
        return;
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let log = std::env::temp_dir().join(format!("sandbox-walkthrough-{}.log", std::process::id()));
    let binary = Path::new(env!("CARGO_BIN_EXE_karpenter-exoscale"));
    let started = Instant::now();
    let sandbox = Sandbox::start(&bin_dir, binary, Some(&log))
        .await
        .unwrap_or_else(|e| panic!("sandbox: {e}"));
    eprintln!(
        "{:>6.1} s  sandbox ready (controller log: {})",
        started.elapsed().as_secs_f64(),
        log.display()
    );
    let client = sandbox.client.clone();

    let started = Instant::now();
    let files = readme_apply_files();
    for file in &files {
        assert!(apply_file(&client, file).await > 0, "{file} holds nothing");
    }
    let classes: Api<ExoscaleNodeClass> = Api::all(client.clone());
    let pools: Api<NodePool> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");

    eventually("ExoscaleNodeClass standard Ready", started, || async {
        let class = classes.get("standard").await.ok()?;
        ready(&class.status?.conditions).then_some(())
    })
    .await;
    eventually("NodePool standard Ready", started, || async {
        let pool = pools.get("standard").await.ok()?;
        ready(&pool.status?.conditions).then_some(())
    })
    .await;
    let web = ListParams::default().labels("app=web");
    let placed: BTreeMap<String, String> =
        eventually("5 web pods Running and Ready", started, || async {
            let list = pods.list(&web).await.ok()?;
            let running: BTreeMap<String, String> = list
                .items
                .iter()
                .filter(|p| {
                    let status = p.status.as_ref();
                    status.and_then(|s| s.phase.as_deref()) == Some("Running")
                        && status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .filter_map(|p| Some((p.name_any(), p.spec.as_ref()?.node_name.clone()?)))
                .collect();
            (running.len() == 5).then_some(running)
        })
        .await;
    let all_nodes = nodes.list(&ListParams::default()).await.unwrap().items;
    for node_name in placed.values() {
        let node = all_nodes
            .iter()
            .find(|n| &n.name_any() == node_name)
            .expect("the pod's node exists");
        assert_eq!(
            node.labels()
                .get("karpenter.sh/nodepool")
                .map(String::as_str),
            Some("standard"),
            "web pods run on the standard NodePool's nodes"
        );
        assert_eq!(
            node.labels()
                .get("team.example.com/tier")
                .map(String::as_str),
            Some("general")
        );
    }
    let launched = claims.list(&ListParams::default()).await.unwrap().items;
    eprintln!(
        "         {} NodeClaim(s): {}",
        launched.len(),
        launched
            .iter()
            .map(|c| format!(
                "{} ({})",
                c.name_any(),
                c.labels()
                    .get("node.kubernetes.io/instance-type")
                    .cloned()
                    .unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // The sandbox serves the control plane's own version (imageTemplateSelector: {}).
    let version = client.apiserver_version().await.unwrap();
    let wanted = parse_kubernetes_version(&version.git_version).unwrap();
    let instances = sandbox.sim.instances();
    assert!(!instances.is_empty());
    let template = sandbox
        .sim
        .sks_template_id(&wanted, SksTemplateVariant::Standard)
        .expect("the sim serves the control plane's version");
    for instance in &instances {
        assert_eq!(instance.instance.template.id, template);
    }

    // The read-only commands against the sandbox: the output the README shows.
    let kubeconfig = sandbox.kubeconfig();
    let cli = |args: &[&str]| -> String {
        let out = std::process::Command::new(binary)
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("EXOSCALE_ZONE", sandbox.sim.zone())
            .output()
            .expect("the binary runs");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("$ karpenter-exoscale {}\n{stdout}", args.join(" "));
        stdout
    };
    let plan = cli(&["plan"]);
    assert!(plan.contains("nothing to launch"), "{plan}");
    let (web_pod, _) = placed.iter().next().unwrap();
    let bound = cli(&["explain", "pod", &format!("default/{web_pod}")]);
    assert!(bound.contains("bound to node"), "{bound}");
    let typo: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typo"},
        "spec": {"nodeSelector": {"team.example.com/teir": "general"},
            "containers": [{"name": "c", "image": "nginx:1.27",
                "resources": {"requests": {"cpu": "100m"}}}]}
    }))
    .unwrap();
    pods.create(&Default::default(), &typo).await.unwrap();
    let why = cli(&["explain", "pod", "default/typo"]);
    assert!(
        why.contains("(typo of \"team.example.com/tier\"?)"),
        "{why}"
    );
    pods.delete("typo", &Default::default()).await.unwrap();

    let scaled = Instant::now();
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale web to 0");
    eventually("web pods gone", scaled, || async {
        pods.list(&web).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    eventually(
        "every NodeClaim, Node and instance gone",
        scaled,
        || async {
            let claims_left = claims.list(&ListParams::default()).await.ok()?.items.len();
            let nodes_left = nodes.list(&ListParams::default()).await.ok()?.items.len();
            let instances_left = sandbox.sim.instances().len();
            (claims_left == 0 && nodes_left == 0 && instances_left == 0).then_some(())
        },
    )
    .await;
    eprintln!(
        "walk-through done in {:.1} s (controller log: {})",
        started.elapsed().as_secs_f64(),
        log.display()
    );
}
