//! `hack/scale.sh`: one controller on a real control plane (kube-controller-manager and
//! kube-scheduler at 200 requests/s, kube-apiserver writing an audit log) driven through named
//! scenarios, printing Markdown rows. A benchmark, not a test: figures depend on the machine.
//!
//!   scale ours <binary> <scenario>      the sandbox (`tests/support/sandbox.rs`): the simulated
//!                                       cloud, simulated kubelets that run pods, our binary
//!   scale upstream <dir> <scenario>     upstream Karpenter's KWOK provider and kwok, from
//!                                       `hack/upstream-kwok.sh`, given our instance types
//!
//! Scenarios:
//!   pods:1000            1 000 pods of 250m/256Mi
//!   anti:500             500 pods with required hostname anti-affinity (one node each)
//!   scaledown:1000:100   1 000 pods, then scaled to 100 (consolidation)
//!   dense:1000:100       1 000 standard.medium nodes × 10 pods, then only the pods of 100
//!                        nodes are kept (pod-deletion-cost): 900 empty nodes to remove

#[allow(unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

mod audit;
mod machine;
mod upstream;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use audit::Requests;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(2400);
const ZONE: &str = "ch-gva-2";
/// The instance type of the dense scenario and how many of its pods fill one.
const DENSE_TYPE: &str = "standard.medium";
const DENSE_PODS_PER_NODE: i128 = 10;

struct Process(u32);

impl Process {
    /// The `/proc/<pid>/status` fields named by `keys` (e.g. `VmRSS:`), in MB; `None` for a
    /// field the kernel does not report (or a process that is gone).
    fn status_mb<const N: usize>(&self, keys: [&str; N]) -> [Option<f64>; N] {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0)).unwrap_or_default();
        keys.map(|key| {
            let kb: f64 = status
                .lines()
                .find(|l| l.starts_with(key))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(kb / 1024.0)
        })
    }

    fn rss_mb(&self) -> (f64, f64) {
        let [rss, peak] = self.status_mb(["VmRSS:", "VmHWM:"]);
        (rss.unwrap_or(0.0), peak.unwrap_or(0.0))
    }

    /// What the RSS is made of now: heap and stacks (anonymous) against the binary's own pages
    /// (file-backed, shared and reclaimable).
    fn rss_split(&self) -> String {
        let keys = ["RssAnon:", "RssFile:", "RssShmem:"];
        keys.iter()
            .zip(self.status_mb(keys))
            .filter_map(|(key, mb)| Some(format!("{} {:.0} MB", key.trim_end_matches(':'), mb?)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Starts VmHWM over from the current RSS, so a phase's peak is its own and not, say, the
    /// harness's plain-text `/metrics` scrape at the end of the launch.
    fn reset_peak(&self) {
        if let Err(error) = std::fs::write(format!("/proc/{}/clear_refs", self.0), "5") {
            eprintln!("cannot reset the controller's peak RSS: {error}");
        }
    }

    fn cpu_seconds(&self) -> f64 {
        machine::process_ticks(self.0).map_or(0.0, |(_, ticks)| ticks as f64 / machine::TICKS)
    }
}

/// The controller under test and what runs around it.
enum Rig {
    Ours(Box<support::sandbox::Sandbox>),
    Upstream(Box<upstream::Upstream>),
}

impl Rig {
    fn client(&self) -> kube::Client {
        match self {
            Rig::Ours(s) => s.client.clone(),
            Rig::Upstream(u) => u.client.clone(),
        }
    }

    fn process(&self) -> Process {
        Process(match self {
            Rig::Ours(s) => s.controller.id().expect("controller pid"),
            Rig::Upstream(u) => u.controller.id().expect("controller pid"),
        })
    }

    fn metrics_url(&self) -> &str {
        match self {
            Rig::Ours(s) => &s.metrics_url,
            Rig::Upstream(u) => &u.metrics_url,
        }
    }

    /// The controller's User-Agent prefix in the audit log.
    fn agent(&self) -> &'static str {
        match self {
            Rig::Ours(_) => "karpenter-exoscale/",
            Rig::Upstream(_) => "karpenter/",
        }
    }

    /// Calls to the (simulated) Exoscale API, and instance deletions; upstream's KWOK provider
    /// has no cloud API: it writes Node objects.
    fn cloud_calls(&self) -> Option<Vec<String>> {
        match self {
            Rig::Ours(s) => Some(s.sim.calls().into_iter().map(|c| c.operation).collect()),
            Rig::Upstream(_) => None,
        }
    }

    async fn nodepool(&self, dense: bool) {
        let disruption =
            json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s"});
        let (family_key, ours) = match self {
            Rig::Ours(_) => ("karpenter.exoscale.com/instance-family", true),
            Rig::Upstream(_) => ("karpenter.kwok.sh/instance-family", false),
        };
        let requirements = if dense {
            json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [DENSE_TYPE]}])
        } else {
            json!([{"key": family_key, "operator": "In", "values": upstream::FAMILIES}])
        };
        match self {
            Rig::Upstream(u) => u
                .nodepool(requirements, disruption)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            Rig::Ours(_) => {
                assert!(ours);
                let client = self.client();
                let class: karpenter_exoscale::apis::ExoscaleNodeClass =
                    serde_json::from_value(json!({
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
                        "requirements": requirements}},
                        "disruption": disruption,
                        "limits": {"cpu": "100000"}}
                }))
                .unwrap();
                Api::all(client)
                    .create(&PostParams::default(), &pool)
                    .await
                    .expect("NodePool");
            }
        }
    }
}

async fn deployment(client: &kube::Client, replicas: i32, pod: &Value) {
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "scale"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "scale"}},
            "template": {"metadata": {"labels": {"app": "scale"}}, "spec": pod}}
    }))
    .unwrap();
    Api::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &d)
        .await
        .expect("Deployment");
}

fn pod_spec(kind: &str) -> Value {
    let (cpu, memory) = if kind == "dense" {
        let (cpu, _) = upstream::allocatable(ZONE, DENSE_TYPE);
        (
            format!("{}m", cpu / DENSE_PODS_PER_NODE),
            "64Mi".to_string(),
        )
    } else {
        ("250m".to_string(), "256Mi".to_string())
    };
    let mut spec = json!({"containers": [{"name": "c", "image": "registry.example.com/app:1",
        "resources": {"requests": {"cpu": cpu, "memory": memory}}}]});
    if kind == "anti" {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "scale"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    }
    spec
}

/// Marks the pods of the first `nodes` nodes (by name) as costly to delete, so that the
/// ReplicaSet's scale-down removes every pod of the other nodes and leaves them empty, as a
/// batch job finishing on most of a pool would.
async fn keep_pods_of_nodes(client: &kube::Client, nodes: i32) {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let all = pods
        .list(&ListParams::default().labels("app=scale"))
        .await
        .expect("pods")
        .items;
    let mut node_names: Vec<&str> = all
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
        .collect();
    node_names.sort_unstable();
    node_names.dedup();
    let kept: HashSet<&str> = node_names.into_iter().take(nodes.max(0) as usize).collect();
    for pod in &all {
        let on_kept = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| kept.contains(n));
        if !on_kept {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        pods.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "controller.kubernetes.io/pod-deletion-cost": "1000"}}})),
        )
        .await
        .expect("pod-deletion-cost");
    }
}

struct Sample {
    claims: usize,
    live_claims: usize,
    pods: usize,
    bound: usize,
    running: usize,
}

/// Which pods and NodeClaims exist, by name: only the scale-down reads them, so the launch's
/// samples (every 500 ms over 10 000 pods) do not copy every name each time.
struct Names {
    pods: Vec<String>,
    /// Bound pods' nodes, by pod name.
    nodes: HashMap<String, String>,
    claims: Vec<String>,
}

/// The scenario's pods and the NodeClaims as two watches keep them here. Listing 10 000 pods
/// each second loaded the API server both rigs share: in a `dense:1000` run each list took
/// ~5 s on the saturated machine (37 lists, 200 s of requests), so the harness both slowed
/// what it measured and saw it up to 23 s late.
struct Watched {
    pods: reflector::Store<Pod>,
    claims: reflector::Store<PartialObjectMeta<DynamicObject>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

impl Watched {
    async fn start(client: &kube::Client) -> Watched {
        let (pods, pods_writer) = reflector::store();
        let pod_stream = reflector::reflector(
            pods_writer,
            watcher(
                Api::<Pod>::namespaced(client.clone(), "default"),
                watcher::Config::default().labels("app=scale"),
            ),
        )
        .default_backoff()
        .for_each(|_| async {});
        let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "nodeclaims");
        let claims_writer = reflector::store::Writer::new(resource.clone());
        let claims = claims_writer.as_reader();
        let claim_stream = reflector::reflector(
            claims_writer,
            watcher(
                Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), &resource),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .for_each(|_| async {});
        let watched = Watched {
            pods,
            claims,
            tasks: vec![tokio::spawn(pod_stream), tokio::spawn(claim_stream)],
        };
        for ready in [
            watched.pods.wait_until_ready().await,
            watched.claims.wait_until_ready().await,
        ] {
            ready.expect("the harness's watches list once");
        }
        watched
    }

    /// How many pods and NodeClaims the watches hold now, and in which state (both have
    /// listed once: [`Watched::start`] waits for it).
    fn sample(&self) -> Sample {
        let claims = self.claims.state();
        let live = |p: &&std::sync::Arc<Pod>| p.metadata.deletion_timestamp.is_none();
        let pods = self.pods.state();
        let (mut count, mut bound, mut running) = (0, 0, 0);
        for pod in pods.iter().filter(live) {
            count += 1;
            bound += usize::from(pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()));
            running += usize::from(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
            );
        }
        Sample {
            claims: claims.len(),
            live_claims: claims
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .count(),
            pods: count,
            bound,
            running,
        }
    }

    /// The names of the pods (not being deleted), their nodes, and the NodeClaims' names.
    fn names(&self) -> Names {
        let pods: Vec<_> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        Names {
            pods: pods
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect(),
            nodes: pods
                .iter()
                .filter_map(|p| {
                    Some((
                        p.metadata.name.clone()?,
                        p.spec.as_ref()?.node_name.clone()?,
                    ))
                })
                .collect(),
            claims: self
                .claims
                .state()
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect(),
        }
    }
}

/// `placed` (pod → second first seen bound, node) grouped into waves: pods seen within 10 s of
/// the previous one are one wave, listed with how many landed on each node.
fn placements(placed: &HashMap<String, (u64, String)>) -> String {
    let mut seen: Vec<&(u64, String)> = placed.values().collect();
    seen.sort();
    let mut waves: Vec<(u64, BTreeMap<&str, usize>)> = Vec::new();
    let mut last = None;
    for (at, node) in seen {
        if last.is_none_or(|l| at - l > 10) {
            waves.push((*at, BTreeMap::new()));
        }
        last = Some(*at);
        if let Some((_, nodes)) = waves.last_mut() {
            *nodes.entry(node.as_str()).or_default() += 1;
        }
    }
    waves
        .iter()
        .map(|(at, nodes)| {
            let pods: usize = nodes.values().sum();
            let each: Vec<String> = nodes.iter().map(|(n, c)| format!("{n}×{c}")).collect();
            format!(
                "{at} s: {pods} pods on {} nodes ({})",
                nodes.len(),
                each.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn by_operation(calls: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for c in calls {
        *counts.entry(c.as_str()).or_insert(0) += 1;
    }
    counts
        .iter()
        .map(|(op, n)| format!("{op} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn per_node(n: usize, nodes: usize) -> String {
    format!("{:.1}", n as f64 / nodes.max(1) as f64)
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let usage = "usage: scale ours <binary> <scenario> | scale upstream <dir> <scenario>";
    let which = args.next().expect(usage);
    let path = PathBuf::from(args.next().expect(usage));
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
    // dense:N is N nodes of DENSE_PODS_PER_NODE pods each.
    let pods = if kind == "dense" {
        count * DENSE_PODS_PER_NODE as i32
    } else {
        count
    };
    let down = down.map(|d| {
        if kind == "dense" {
            d * DENSE_PODS_PER_NODE as i32
        } else {
            d
        }
    });
    let bin_dir = support::control_plane::find_bin_dir().unwrap_or_else(|e| panic!("{e}"));
    let stem = format!("scale-{which}-{}", scenario.replace(':', "-"));
    let log = std::env::temp_dir().join(format!("{stem}.log"));
    let audit_log = std::env::temp_dir().join(format!("{stem}.audit.jsonl"));
    let _ = std::fs::remove_file(&audit_log);
    let rig = match which.as_str() {
        "ours" => Rig::Ours(Box::new(
            support::sandbox::Sandbox::start_audited(&bin_dir, &path, Some(&log), Some(&audit_log))
                .await
                .unwrap_or_else(|e| panic!("sandbox: {e}")),
        )),
        "upstream" => Rig::Upstream(Box::new(
            upstream::Upstream::start(&bin_dir, &path, ZONE, &log, &audit_log)
                .await
                .unwrap_or_else(|e| panic!("upstream: {e}")),
        )),
        _ => panic!("{usage}"),
    };
    let metrics_dump = std::env::temp_dir().join(format!("{stem}.metrics.txt"));
    let files = Files {
        audit: &audit_log,
        controller_log: &log,
        metrics_dump: &metrics_dump,
    };
    run(&rig, &scenario, kind, pods, down, files).await;
    eprintln!(
        "controller log: {}, audit log: {}, /metrics after the launch: {}",
        log.display(),
        audit_log.display(),
        metrics_dump.display()
    );
}

/// Where a run's evidence is: the API server's audit log, the controller's log, and the
/// `/metrics` dump written after the launch.
struct Files<'a> {
    audit: &'a Path,
    controller_log: &'a Path,
    metrics_dump: &'a Path,
}

async fn run(
    rig: &Rig,
    scenario: &str,
    kind: &str,
    count: i32,
    down: Option<i32>,
    files: Files<'_>,
) {
    let Files {
        audit,
        controller_log,
        metrics_dump,
    } = files;
    let process = rig.process();
    let client = rig.client();
    let watched = Watched::start(&client).await;
    rig.nodepool(kind == "dense").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (idle_rss, _) = process.rss_mb();
    let calls_before = rig.cloud_calls();
    let requests_before = Requests::read(audit, rig.agent());

    let machine_before = machine::CpuSnapshot::take();
    let started = Instant::now();
    deployment(&client, count, &pod_spec(kind)).await;
    let (mut first_claim, mut all_claims, mut all_bound, mut all_running) =
        (None, None, None, None);
    let mut last_claims = 0;
    // A sample reads the watches' stores: no request, but 10 000 pods take the harness a few
    // milliseconds of the CPU the rigs share.
    let sample_period = Duration::from_millis(if count > 2000 { 500 } else { 250 });
    while all_running.is_none() {
        assert!(
            started.elapsed() < LIMIT,
            "{scenario}: not all pods Running after {LIMIT:?}"
        );
        tokio::time::sleep(sample_period).await;
        let s = watched.sample();
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
    eprintln!(
        "{scenario} launch: {}",
        machine_before.report_until(&machine::CpuSnapshot::take(), 8)
    );
    let nodes = watched.sample().live_claims;
    let (rss, peak) = process.rss_mb();
    eprintln!(
        "{scenario} launch: controller RSS after it: {}",
        process.rss_split()
    );
    let metrics = reqwest::get(rig.metrics_url())
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    // Kept for reading which families weigh most.
    let _ = std::fs::write(metrics_dump, &metrics);
    // What a Prometheus scrape (Accept-Encoding: gzip) transfers.
    let gzipped = reqwest::Client::new()
        .get(rig.metrics_url())
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("metrics")
        .bytes()
        .await
        .map_or(0, |b| b.len());
    let requests = Requests::read(audit, rig.agent()).since(&requests_before);
    let cloud = match (&calls_before, rig.cloud_calls()) {
        (Some(before), Some(after)) => {
            eprintln!(
                "{scenario} launch: Exoscale calls by operation: {}",
                by_operation(&after[before.len()..])
            );
            per_node(after.len() - before.len(), nodes)
        }
        _ => "–".into(),
    };
    println!(
        "| {scenario} | {} | {} | {} | {} | {nodes} | {cloud} | {} ({}/node) | {idle_rss:.0} / {rss:.0} / {peak:.0} MB | {:.1} s | {} / {} KB |",
        secs(first_claim),
        secs(all_claims),
        secs(all_bound),
        secs(all_running),
        requests.total(),
        per_node(requests.total() as usize, nodes),
        process.cpu_seconds(),
        metrics.len() / 1024,
        gzipped / 1024,
    );
    eprintln!(
        "{scenario} launch: apiserver requests by verb and resource: {}",
        requests.top(16)
    );
    if let Some(t) = audit::launch_timeline(audit) {
        let opt = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1} s"));
        eprintln!(
            "{scenario} launch: all pods created at {:.1} s; the last of the {} pods kube-scheduler marked unschedulable at {} ({} pods unbound then, {} of them never marked); the last NodeClaim created at {} ({} after all pods existed, {} after the last mark), from the audit log",
            t.last_pod_created,
            t.pods_marked,
            opt(t.last_pod_marked),
            t.unbound_at_last_mark,
            t.never_marked_at_last_mark,
            opt(t.last_claim_created),
            opt(t.last_claim_created.map(|c| c - t.last_pod_created)),
            opt(t
                .last_claim_created
                .zip(t.last_pod_marked)
                .map(|(c, m)| c - m)),
        );
    }
    let registrations = audit::registration_delays(audit, rig.agent());
    eprintln!(
        "{scenario} launch: Node created → the controller's first accepted write to it (registration), p50 / p99 / max: {} over {} Nodes",
        audit::spread(&registrations),
        registrations.len()
    );
    if let Some((watch, controller)) = audit::registration_split(audit, controller_log, rig.agent())
    {
        eprintln!(
            "{scenario} launch: registration split where the controller's Node watch delivered the Node: created → delivered {}; delivered → first write {} (p50 / p99 / max over {} Nodes)",
            audit::spread(&watch),
            audit::spread(&controller),
            watch.len()
        );
    }

    let Some(down) = down else { return };
    let calls_before = rig.cloud_calls();
    let requests_before = Requests::read(audit, rig.agent());
    let cpu_before = process.cpu_seconds();
    let (before, claims_before): (HashSet<String>, HashSet<String>) = {
        let n = watched.names();
        (n.pods.into_iter().collect(), n.claims.into_iter().collect())
    };
    if kind == "dense" {
        keep_pods_of_nodes(&client, down / DENSE_PODS_PER_NODE as i32).await;
    }
    let mut new_claims = HashSet::new();
    let mut moved = HashSet::new();
    // Where kube-scheduler put the recreated pods, as first seen bound: which nodes are then
    // inside consolidateAfter (and so neither candidates nor destinations) paces consolidation.
    let mut placed: HashMap<String, (u64, String)> = HashMap::new();
    process.reset_peak();
    let machine_before = machine::CpuSnapshot::take();
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
        let s = watched.sample();
        let n = watched.names();
        // A pod the ReplicaSet created after the scale-down replaces an evicted one. An evicted
        // pod the ReplicaSet was removing anyway is not replaced: evictions are counted from
        // the audit log's eviction requests.
        moved.extend(n.pods.iter().filter(|p| !before.contains(*p)).cloned());
        for (pod, node) in &n.nodes {
            if !before.contains(pod) && !placed.contains_key(pod) {
                placed.insert(pod.clone(), (scaled.elapsed().as_secs(), node.clone()));
            }
        }
        // A NodeClaim created after the scale-down is a replacement.
        new_claims.extend(
            n.claims
                .iter()
                .filter(|c| !claims_before.contains(*c))
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
    eprintln!(
        "{scenario} scale-down (with the 3 settled minutes): {}",
        machine_before.report_until(&machine::CpuSnapshot::take(), 8)
    );
    eprintln!(
        "{scenario} scale-down: recreated pods by when first seen bound (s after the scale-down) and node: {}",
        placements(&placed)
    );
    let (rss, peak) = process.rss_mb();
    eprintln!(
        "{scenario} scale-down: controller RSS after it: {}",
        process.rss_split()
    );
    let requests = Requests::read(audit, rig.agent()).since(&requests_before);
    let cloud = match (&calls_before, rig.cloud_calls()) {
        (Some(before), Some(after)) => {
            let calls = &after[before.len()..];
            eprintln!(
                "{scenario} scale-down: Exoscale calls by operation: {}",
                by_operation(calls)
            );
            format!(
                "{} deletes, {} calls",
                calls.iter().filter(|c| *c == "delete-instance").count(),
                calls.len()
            )
        }
        _ => "–".into(),
    };
    println!(
        "| {scenario} scale-down to {down} pods | {nodes} → {} nodes in {:.0} s | {} replacement(s), {} eviction requests, {} pods recreated | {cloud} | {} apiserver requests | {rss:.0} / {peak:.0} MB | {:.1} s CPU |",
        last.0,
        took.as_secs_f64(),
        new_claims.len(),
        requests.0.get("create pods/eviction").copied().unwrap_or(0),
        moved.len(),
        requests.total(),
        process.cpu_seconds() - cpu_before,
    );
    eprintln!(
        "{scenario} scale-down: apiserver requests by verb and resource: {}",
        requests.top(16)
    );
}
