//! `hack/scale.sh`: the sandbox (`tests/support/sandbox.rs`: real control plane with
//! kube-controller-manager and kube-scheduler at 200 requests/s, the simulated cloud, simulated
//! kubelets that run pods, the real release binary) driven through named scenarios, printing
//! one Markdown row per scenario. A benchmark, not a test: figures depend on the machine.
//!
//!   scale <binary> pods:1000            1 000 pods of 250m/256Mi
//!   scale <binary> anti:300             300 pods with required hostname anti-affinity
//!   scale <binary> scaledown:1000:100   1 000 pods, then scaled to 100 (consolidation)

#[allow(unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use karpenter_exoscale::apis::NodeClaim;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(1800);

struct Process(u32);

impl Process {
    fn rss_mb(&self) -> (f64, f64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0)).unwrap_or_default();
        let kb = |key: &str| -> f64 {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
                / 1024.0
        };
        (kb("VmRSS:"), kb("VmHWM:"))
    }

    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        // Fields after the command name (which may hold spaces) start at state; utime and stime
        // are the 14th and 15th fields overall.
        let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (ticks(11) + ticks(12)) / 100.0
    }
}

async fn nodepool(client: &kube::Client) {
    let class: karpenter_exoscale::apis::ExoscaleNodeClass = serde_json::from_value(json!({
        "apiVersion": "karpenter.exoscale.com/v1", "kind": "ExoscaleNodeClass",
        "metadata": {"name": "scale"},
        "spec": {"imageTemplateSelector": {}, "diskSize": 50,
            "securityGroupSelectorTerms": [{"name": "sks-nodes"}]}
    }))
    .unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("NodeClass");
    let pool: karpenter_exoscale::apis::NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "scale"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "scale"},
            "requirements": [{"key": "karpenter.exoscale.com/instance-family", "operator": "In",
                "values": ["standard", "cpu", "memory"]}]}},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s"},
            "limits": {"cpu": "100000"}}
    }))
    .unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &pool)
        .await
        .expect("NodePool");
}

async fn deployment(client: &kube::Client, replicas: i32, anti: bool) {
    let mut spec = json!({"containers": [{"name": "c", "image": "registry.example.com/app:1",
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]});
    if anti {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "scale"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    }
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "scale"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "scale"}},
            "template": {"metadata": {"labels": {"app": "scale"}}, "spec": spec}}
    }))
    .unwrap();
    Api::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &d)
        .await
        .expect("Deployment");
}

struct Sample {
    names: Vec<String>,
    claim_names: Vec<String>,
    claims: usize,
    live_claims: usize,
    pods: usize,
    bound: usize,
    running: usize,
}

async fn sample(client: &kube::Client) -> Option<Sample> {
    let claims = Api::<NodeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    let pods = Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("app=scale"))
        .await
        .ok()?
        .items;
    let pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    Some(Sample {
        names: pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect(),
        claim_names: claims
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect(),
        claims: claims.len(),
        live_claims: claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .count(),
        pods: pods.len(),
        bound: pods
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count(),
        running: pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count(),
    })
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let binary = args.next().expect("usage: scale <binary> <scenario>");
    let scenario = args.next().unwrap_or_else(|| "pods:1000".into());
    let parts: Vec<&str> = scenario.split(':').collect();
    let (kind, count, down) = (
        parts[0],
        parts
            .get(1)
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(1000),
        parts.get(2).and_then(|v| v.parse::<i32>().ok()),
    );
    let bin_dir = support::control_plane::find_bin_dir().unwrap_or_else(|e| panic!("{e}"));
    let log = std::env::temp_dir().join(format!("scale-{}.log", scenario.replace(':', "-")));
    let sandbox = support::sandbox::Sandbox::start(&bin_dir, Path::new(&binary), Some(&log))
        .await
        .unwrap_or_else(|e| panic!("sandbox: {e}"));
    let process = Process(sandbox.controller.id().expect("controller pid"));
    let client = sandbox.client.clone();
    nodepool(&client).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle_rss, _) = process.rss_mb();
    let calls_before = sandbox.sim.calls().len();

    let started = Instant::now();
    deployment(&client, count, kind == "anti").await;
    let (mut first_claim, mut all_claims, mut all_bound, mut all_running) =
        (None, None, None, None);
    let mut last_claims = 0;
    while all_running.is_none() {
        assert!(
            started.elapsed() < LIMIT,
            "{scenario}: not all pods Running after {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Some(s) = sample(&client).await else {
            continue;
        };
        let now = started.elapsed();
        if s.claims > 0 && first_claim.is_none() {
            first_claim = Some(now);
        }
        if s.claims > last_claims {
            last_claims = s.claims;
            all_claims = Some(now);
        }
        if s.pods == count as usize && s.bound == s.pods && all_bound.is_none() {
            all_bound = Some(now);
        }
        if s.pods == count as usize && s.running == s.pods {
            all_running = Some(now);
        }
    }
    let nodes = sample(&client).await.map_or(0, |s| s.live_claims);
    let launch_calls = sandbox.sim.calls().len() - calls_before;
    let (rss, peak) = process.rss_mb();
    let metrics = reqwest::get(&sandbox.metrics_url)
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    println!(
        "| {scenario} | {} | {} | {} | {} | {nodes} | {:.1} | {idle_rss:.0} / {rss:.0} / {peak:.0} MB | {:.1} s | {} KB |",
        secs(first_claim),
        secs(all_claims),
        secs(all_bound),
        secs(all_running),
        launch_calls as f64 / nodes.max(1) as f64,
        process.cpu_seconds(),
        metrics.len() / 1024,
    );

    if let Some(down) = down {
        let calls_before = sandbox.sim.calls().len();
        let cpu_before = process.cpu_seconds();
        let (before, claims_before): (
            std::collections::HashSet<String>,
            std::collections::HashSet<String>,
        ) = sample(&client)
            .await
            .map(|s| {
                (
                    s.names.into_iter().collect(),
                    s.claim_names.into_iter().collect(),
                )
            })
            .unwrap_or_default();
        let mut new_claims = std::collections::HashSet::new();
        let mut moved = std::collections::HashSet::new();
        let scaled = Instant::now();
        Api::<Deployment>::namespaced(client.clone(), "default")
            .patch(
                "scale",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": down}})),
            )
            .await
            .expect("scale down");
        // Done when the NodeClaim count has not changed for 3 minutes with every pod running.
        let mut last_change = Instant::now();
        let mut last = (nodes, nodes);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(s) = sample(&client).await else {
                continue;
            };
            // A pod the ReplicaSet created after the scale-down replaces an evicted one.
            moved.extend(s.names.iter().filter(|n| !before.contains(*n)).cloned());
            // A NodeClaim created after the scale-down is a replacement.
            new_claims.extend(
                s.claim_names
                    .iter()
                    .filter(|n| !claims_before.contains(*n))
                    .cloned(),
            );
            if (s.live_claims, s.claims) != last {
                last = (s.live_claims, s.claims);
                last_change = Instant::now();
            }
            let settled = s.claims == s.live_claims && s.running == down as usize;
            if settled && last_change.elapsed() > Duration::from_secs(180) {
                break;
            }
            assert!(scaled.elapsed() < LIMIT, "scale-down did not settle");
        }
        let took = last_change.duration_since(scaled);
        let deletes = sandbox.sim.call_count("delete-instance");
        let (rss, peak) = process.rss_mb();
        println!(
            "| {scenario} scale-down to {down} | {nodes} → {} nodes in {:.0} s | {} replacement(s), {} pods evicted | {deletes} deletes | {} calls | {rss:.0} / {peak:.0} MB | {:.1} s CPU |",
            last.0,
            took.as_secs_f64(),
            new_claims.len(),
            moved.len(),
            sandbox.sim.calls().len() - calls_before,
            process.cpu_seconds() - cpu_before,
        );
    }
    eprintln!("controller log: {}", log.display());
    drop(sandbox);
}
