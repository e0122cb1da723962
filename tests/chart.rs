//! The Helm chart: it renders to valid YAML, the Deployment is hardened and passes every
//! setting the binary reads, and its RBAC is exactly what the code needs — checked both against
//! the declared table (`operator::rbac`) and against a scan of the API calls in `src/`.
//!
//! Rendering uses the Helm binary from `hack/helm.sh` (built from its Go module once, cached).

#[path = "chart/scan.rs"]
mod scan;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use karpenter_exoscale::operator::rbac::{self, ResourceName, Scope, Target};
use serde::Deserialize;
use serde_json::Value;

const RELEASE_NAMESPACE: &str = "karpenter";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn helm() -> &'static str {
    static HELM: OnceLock<String> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("hack/helm.sh"))
            .output()
            .expect("bash runs hack/helm.sh");
        assert!(
            out.status.success(),
            "hack/helm.sh failed (it needs Go to build Helm once): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

const REQUIRED: &[&str] = &[
    "settings.zone=ch-gva-2",
    "settings.sksClusterId=00000000-0000-4000-8000-000000000000",
    "settings.clusterEndpoint=https://api.example.com:6443",
    "credentials.existingSecret=exoscale",
];

/// `helm template` with `sets`; Err carries Helm's message.
fn try_render(sets: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "karpenter"])
        .arg(repo().join("charts/karpenter-exoscale"))
        .args(["--namespace", RELEASE_NAMESPACE]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("helm runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = Value::deserialize(doc).map_err(|e| format!("rendered YAML: {e}"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

fn render(extra: &[&str]) -> Vec<Value> {
    let sets: Vec<&str> = REQUIRED.iter().chain(extra).copied().collect();
    try_render(&sets).unwrap_or_else(|e| panic!("helm template failed: {e}"))
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn deployment(docs: &[Value]) -> &Value {
    let found = find(docs, "Deployment");
    assert_eq!(found.len(), 1, "one Deployment");
    found[0]
}

fn strs(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn chart_renders_every_object_as_valid_yaml() {
    let docs = render(&[]);
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(kind), "{kind} missing from {kinds:?}");
    }
    assert!(
        !kinds.contains("ServiceMonitor"),
        "ServiceMonitor is opt-in"
    );
    assert!(!kinds.contains("Secret"), "existingSecret means no Secret");
    for doc in &docs {
        assert!(doc["metadata"]["name"].is_string(), "unnamed object {doc}");
    }
    let monitored = render(&["metrics.serviceMonitor.enabled=true"]);
    let monitor = find(&monitored, "ServiceMonitor");
    assert_eq!(monitor.len(), 1);
    assert_eq!(monitor[0]["spec"]["endpoints"][0]["port"], "http-metrics");
}

#[test]
fn missing_required_values_fail_with_their_names() {
    for (missing, name) in [
        (0, "settings.zone"),
        (1, "settings.sksClusterId"),
        (2, "settings.clusterEndpoint"),
    ] {
        let sets: Vec<&str> = REQUIRED
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != missing)
            .map(|(_, s)| *s)
            .collect();
        let err = try_render(&sets).unwrap_err();
        assert!(err.contains(&format!("{name} is required")), "{err}");
    }
    let err = try_render(&REQUIRED[..3]).unwrap_err();
    assert!(err.contains("credentials.existingSecret"), "{err}");
}

/// Several replicas without leader election would all act: refused at render time.
#[test]
fn leader_election_is_off_only_with_one_replica() {
    let err =
        try_render(&[REQUIRED, &["settings.disableLeaderElection=true"]].concat()).unwrap_err();
    assert!(err.contains("needs replicas=1"), "{err}");
    render(&["settings.disableLeaderElection=true", "replicas=1"]);
}

#[test]
fn credentials_from_values_become_a_secret_the_deployment_reads() {
    let docs = try_render(&[
        REQUIRED[0],
        REQUIRED[1],
        REQUIRED[2],
        "credentials.apiKey=EXOkey",
        "credentials.apiSecret=s3cret",
    ])
    .unwrap();
    let secrets = find(&docs, "Secret");
    assert_eq!(secrets.len(), 1);
    let name = secrets[0]["metadata"]["name"].as_str().unwrap();
    assert_eq!(secrets[0]["stringData"]["api-key"], "EXOkey");
    let env = &deployment(&docs)["spec"]["template"]["spec"]["containers"][0]["env"];
    let key_ref = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "EXOSCALE_API_SECRET")
        .unwrap();
    assert_eq!(key_ref["valueFrom"]["secretKeyRef"]["name"], name);
    assert_eq!(key_ref["valueFrom"]["secretKeyRef"]["key"], "api-secret");
}

#[test]
fn deployment_is_hardened_and_highly_available() {
    let docs = render(&[]);
    let deploy = deployment(&docs);
    let pod = &deploy["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(strs(&security["capabilities"]["drop"]), ["ALL"]);
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert!(spread["labelSelector"]["matchLabels"].is_object());
    let tolerated: Vec<&str> = pod["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["key"].as_str())
        .collect();
    assert!(tolerated.contains(&"CriticalAddonsOnly"), "{tolerated:?}");
    // Never on a node it manages: it could remove its own node.
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchExpressions"][0];
    assert_eq!(term["key"], "karpenter.sh/nodepool");
    assert_eq!(term["operator"], "DoesNotExist");
    assert_eq!(strs(&container["args"]), ["run"]);

    let pdb = find(&docs, "PodDisruptionBudget");
    assert_eq!(
        pdb[0]["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
}

/// Environment variable names `src/operator/config.rs` reads (outside its tests).
fn config_env_names() -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo().join("src/operator/config.rs")).unwrap();
    let shipped = source.split("#[cfg(test)]").next().unwrap();
    let mut names = BTreeSet::new();
    for quoted in shipped.split('"').skip(1).step_by(2) {
        let looks_like_env = quoted.len() > 3
            && quoted
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            && quoted
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_uppercase());
        if looks_like_env {
            names.insert(quoted.to_string());
        }
    }
    names
}

#[test]
fn deployment_passes_exactly_the_settings_the_binary_reads() {
    let read = config_env_names();
    assert!(
        read.contains("EXOSCALE_ZONE") && read.contains("FEATURE_GATES"),
        "{read:?}"
    );
    let docs = render(&[]);
    let env = &deployment(&docs)["spec"]["template"]["spec"]["containers"][0]["env"];
    let mut set = BTreeSet::new();
    for var in env.as_array().unwrap() {
        let name = var["name"].as_str().unwrap().to_string();
        assert!(
            var.get("value").is_some() || var.get("valueFrom").is_some(),
            "{name} has no value"
        );
        assert!(set.insert(name.clone()), "{name} is set twice");
    }
    // HOSTNAME is the fallback identity; Kubernetes sets it in every container.
    let missing: Vec<_> = read
        .iter()
        .filter(|n| *n != "HOSTNAME" && !set.contains(*n))
        .collect();
    assert!(missing.is_empty(), "the chart does not set {missing:?}");
    let unread: Vec<_> = set.iter().filter(|n| !read.contains(*n)).collect();
    assert!(
        unread.is_empty(),
        "the chart sets {unread:?}, which nothing reads"
    );
}

#[test]
fn every_setting_is_a_chart_value() {
    let template =
        std::fs::read_to_string(repo().join("charts/karpenter-exoscale/templates/deployment.yaml"))
            .unwrap();
    let values: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo().join("charts/karpenter-exoscale/values.yaml")).unwrap(),
    )
    .unwrap();
    let mut referenced = 0;
    for line in template.lines() {
        let Some(at) = line.find(".Values.") else {
            continue;
        };
        let path: String = line[at + 8..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
            .collect();
        let mut node = &values;
        for part in path.split('.') {
            node = node.get(part).unwrap_or_else(|| {
                panic!("deployment.yaml uses .Values.{path}, not in values.yaml")
            });
        }
        referenced += 1;
    }
    assert!(referenced > 20, "only {referenced} value references found");
}

// ---- RBAC ----

/// One granted (group or URL, resource, verb, scope, names) as rendered by the chart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    target: Target,
    verb: String,
    scope: Scope,
    names: Vec<String>,
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The rules the chart grants to its ServiceAccount, by scope.
fn chart_grants(docs: &[Value]) -> BTreeSet<Grant> {
    let account = find(docs, "ServiceAccount")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let bound_to_us = |binding: &Value, role_kind: &str| -> Option<String> {
        let ours = binding["subjects"].as_array()?.iter().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == account.as_str()
                && s["namespace"] == RELEASE_NAMESPACE
        });
        (ours && binding["roleRef"]["kind"] == role_kind)
            .then(|| binding["roleRef"]["name"].as_str().unwrap().to_string())
    };
    let mut grants = BTreeSet::new();
    let mut add_rules = |role: &Value, scope: Scope| {
        for rule in role["rules"].as_array().unwrap() {
            let names = strs(&rule["resourceNames"]);
            let mut targets = Vec::new();
            for url in strs(&rule["nonResourceURLs"]) {
                targets.push(Target::NonResourceUrl(leak(&url)));
            }
            for group in strs(&rule["apiGroups"]) {
                for resource in strs(&rule["resources"]) {
                    targets.push(Target::Resource {
                        group: leak(&group),
                        resource: leak(&resource),
                    });
                }
            }
            for target in targets {
                for verb in strs(&rule["verbs"]) {
                    assert_ne!(verb, "*", "wildcard verb in {rule}");
                    grants.insert(Grant {
                        target,
                        verb,
                        scope,
                        names: names.clone(),
                    });
                }
            }
        }
    };
    let cluster_bound: BTreeSet<String> = find(docs, "ClusterRoleBinding")
        .into_iter()
        .filter_map(|b| bound_to_us(b, "ClusterRole"))
        .collect();
    for role in find(docs, "ClusterRole") {
        let name = role["metadata"]["name"].as_str().unwrap();
        assert!(
            cluster_bound.contains(name),
            "ClusterRole {name} is not bound"
        );
        add_rules(role, Scope::Cluster);
    }
    let role_bound: BTreeSet<(String, String)> = find(docs, "RoleBinding")
        .into_iter()
        .filter_map(|b| {
            let ns = b["metadata"]["namespace"].as_str()?.to_string();
            Some((ns, bound_to_us(b, "Role")?))
        })
        .collect();
    for role in find(docs, "Role") {
        let name = role["metadata"]["name"].as_str().unwrap().to_string();
        let ns = role["metadata"]["namespace"].as_str().unwrap().to_string();
        assert!(
            role_bound.contains(&(ns.clone(), name.clone())),
            "Role {ns}/{name} is not bound"
        );
        let scope = if ns == RELEASE_NAMESPACE {
            Scope::ReleaseNamespace
        } else {
            Scope::Namespace(leak(&ns))
        };
        add_rules(role, scope);
    }
    grants
}

fn declared_grants(lease_name: &str) -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for p in rbac::PERMISSIONS {
        let names: Vec<String> = p
            .resource_names
            .iter()
            .map(|n| match n {
                ResourceName::Fixed(name) => name.to_string(),
                ResourceName::LeaderElectionLease => lease_name.to_string(),
            })
            .collect();
        for verb in p.verbs {
            grants.insert(Grant {
                target: p.target,
                verb: verb.to_string(),
                scope: p.scope,
                names: names.clone(),
            });
        }
    }
    grants
}

fn assert_same(chart: &BTreeSet<Grant>, declared: &BTreeSet<Grant>) {
    let extra: Vec<_> = chart.difference(declared).collect();
    let missing: Vec<_> = declared.difference(chart).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "chart RBAC differs from src/operator/rbac.rs\n  granted but not declared: {extra:#?}\n  \
         declared but not granted: {missing:#?}"
    );
}

#[test]
fn chart_grants_exactly_the_declared_permissions() {
    let docs = render(&[]);
    assert_same(
        &chart_grants(&docs),
        &declared_grants("karpenter-leader-election"),
    );
    let renamed = render(&["settings.leaderElectionName=my-lease"]);
    assert_same(&chart_grants(&renamed), &declared_grants("my-lease"));
}

#[test]
fn secrets_are_reachable_only_in_kube_system() {
    let docs = render(&[]);
    for grant in chart_grants(&docs) {
        if let Target::Resource { resource, .. } = grant.target
            && resource.starts_with("secrets")
        {
            assert_eq!(grant.scope, Scope::Namespace("kube-system"), "{grant:?}");
            // Token Secrets are found by the name recorded on their NodeClaim: reading any
            // Secret of kube-system (service-account keys, other tokens) is never granted.
            assert!(
                matches!(grant.verb.as_str(), "create" | "delete"),
                "secrets may only be created and deleted: {grant:?}"
            );
        }
    }
}

/// The RBAC target of a Rust kind name, from the type's own `Resource` metadata.
fn kind_target(kind: &str, subresource: Option<&str>) -> Option<Target> {
    use k8s_openapi::api::{apps, coordination, core, policy, storage};
    use karpenter_exoscale::apis::{ExoscaleNodeClass, NodeClaim, NodeOverlay, NodePool};
    fn of<K: kube::Resource<DynamicType = ()>>(sub: Option<&str>) -> Target {
        let plural = K::plural(&());
        Target::Resource {
            group: leak(&K::group(&())),
            resource: leak(&match sub {
                Some(s) => format!("{plural}/{s}"),
                None => plural.into_owned(),
            }),
        }
    }
    Some(match kind {
        "Node" => of::<core::v1::Node>(subresource),
        "Pod" => of::<core::v1::Pod>(subresource),
        // The cluster state watches pods as this compact type: the same resource.
        "HeldPod" => of::<karpenter_exoscale::state::HeldPod>(subresource),
        "Secret" => of::<core::v1::Secret>(subresource),
        "ConfigMap" => of::<core::v1::ConfigMap>(subresource),
        "Namespace" => of::<core::v1::Namespace>(subresource),
        "Service" => of::<core::v1::Service>(subresource),
        "PersistentVolume" => of::<core::v1::PersistentVolume>(subresource),
        "PersistentVolumeClaim" => of::<core::v1::PersistentVolumeClaim>(subresource),
        "DaemonSet" => of::<apps::v1::DaemonSet>(subresource),
        "PodDisruptionBudget" => of::<policy::v1::PodDisruptionBudget>(subresource),
        "VolumeAttachment" => of::<storage::v1::VolumeAttachment>(subresource),
        "StorageClass" => of::<storage::v1::StorageClass>(subresource),
        "Event" => of::<k8s_openapi::api::events::v1::Event>(subresource),
        "Lease" => of::<coordination::v1::Lease>(subresource),
        "NodeClaim" => of::<NodeClaim>(subresource),
        "NodePool" => of::<NodePool>(subresource),
        "NodeOverlay" => of::<NodeOverlay>(subresource),
        "ExoscaleNodeClass" => of::<ExoscaleNodeClass>(subresource),
        _ => return None,
    })
}

/// Files whose API calls are not the controller's: the simulated kubelet (node and pods) is a
/// test tool that runs with the test cluster's admin credentials; `explain/live.rs` is the
/// read-only `explain`/`plan` commands' one LIST per kind (generic over the kind), whose
/// permissions the README lists for a read-only user and which the controller's watches of the
/// same kinds already hold.
const NOT_THE_CONTROLLER: &[&str] = &["sim/kubelet.rs", "sim/pods.rs", "explain/live.rs"];

fn source_uses() -> Vec<scan::ApiUse> {
    let files = scan::sources(&repo().join("src"), NOT_THE_CONTROLLER);
    scan::scan(&files).unwrap_or_else(|errors| {
        panic!(
            "the RBAC scan cannot follow these API uses; make them plain `Api` calls or teach \
             tests/chart/scan.rs:\n  {}",
            errors.join("\n  ")
        )
    })
}

/// Whether a permission in `granted` scope allows a call through an Api built in `used`.
fn scope_allows(granted: Scope, used: &scan::ApiScope) -> bool {
    match (granted, used) {
        (Scope::Cluster, _) => true,
        (Scope::Namespace(ns), scan::ApiScope::Namespaced(Some(used))) => ns == used,
        // A namespace from a variable: the declared namespace is trusted (e.g. kube-public, or
        // the Lease namespace, which defaults to the release namespace).
        (Scope::Namespace(_) | Scope::ReleaseNamespace, scan::ApiScope::Namespaced(None)) => true,
        (Scope::ReleaseNamespace, scan::ApiScope::OwnNamespace) => true,
        _ => false,
    }
}

fn use_target(u: &scan::ApiUse) -> Target {
    match &u.touched {
        scan::Touched::Kind { kind, subresource } => kind_target(kind, subresource.as_deref())
            .unwrap_or_else(|| {
                panic!(
                    "{}: kind {kind} is not in kind_target of tests/chart.rs",
                    u.at
                )
            }),
        scan::Touched::Resource { group, resource } => Target::Resource {
            group: leak(group),
            resource: leak(resource),
        },
        scan::Touched::NonResourceUrl(url) => Target::NonResourceUrl(leak(url)),
    }
}

#[test]
fn every_api_call_in_the_code_is_declared() {
    let uses = source_uses();
    assert!(uses.len() > 20, "the scan found only {} uses", uses.len());
    let grants = rbac::grants();
    let mut uncovered = Vec::new();
    for u in &uses {
        let target = use_target(u);
        let covered = grants.iter().any(|(t, verb, scope)| {
            *t == target && *verb == u.verb && scope_allows(*scope, &u.scope)
        });
        if !covered {
            uncovered.push(format!(
                "{}: {} {:?} via {:?}",
                u.at, u.verb, target, u.scope
            ));
        }
    }
    assert!(
        uncovered.is_empty(),
        "API calls without a permission in src/operator/rbac.rs:\n  {}",
        uncovered.join("\n  ")
    );
}

#[test]
fn every_declared_permission_is_used_by_the_code() {
    let uses = source_uses();
    let mut by_grant: BTreeMap<(Target, &str), Vec<&scan::ApiUse>> = BTreeMap::new();
    for u in &uses {
        by_grant
            .entry((use_target(u), u.verb.as_str()))
            .or_default()
            .push(u);
    }
    let mut unused = Vec::new();
    for (target, verb, scope) in rbac::grants() {
        let used = by_grant
            .get(&(target, verb))
            .is_some_and(|uses| uses.iter().any(|u| scope_allows(scope, &u.scope)));
        if !used {
            unused.push(format!("{verb} {target:?} in {scope:?}"));
        }
    }
    assert!(
        unused.is_empty(),
        "declared permissions no code uses (remove them from src/operator/rbac.rs and the chart):\n  {}",
        unused.join("\n  ")
    );
}

#[test]
fn scan_follows_variables_helpers_and_returned_apis() {
    let code = r#"
        const NS: &str = "kube-system";
        fn secrets(client: &Client) -> Api<Secret> { Api::namespaced(client.clone(), NS) }
        async fn helper<K>(api: &Api<K>, name: &str) { api.patch_status(name, &p, &x).await; }
        async fn work(client: Client) {
            let api: Api<Node> = Api::all(client.clone());
            api.delete("n", &d).await; // api.create( in a comment is ignored
            helper(&api, "n").await;
            secrets(&client).list(&lp).await;
            let s = secrets(&client);
            s.create(&pp, &x).await;
            Controller::new(Api::<Pod>::all(client.clone()), cfg);
            let text = "Api::<Service>::all(client).delete()";
        }
        #[cfg(test)]
        mod tests { fn t() { let a: Api<Lease> = Api::all(c); a.delete("x", &d); } }
    "#;
    let uses = scan::scan(&[("src/x.rs".into(), code.into())]).unwrap();
    let got: BTreeSet<(String, String, Option<String>, scan::ApiScope)> = uses
        .into_iter()
        .map(|u| match u.touched {
            scan::Touched::Kind { kind, subresource } => (kind, u.verb, subresource, u.scope),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let kube_system = scan::ApiScope::Namespaced(Some("kube-system".into()));
    let expected: BTreeSet<_> = [
        ("Node", "delete", None, scan::ApiScope::All),
        ("Node", "patch", Some("status"), scan::ApiScope::All),
        ("Secret", "list", None, kube_system.clone()),
        ("Secret", "create", None, kube_system),
        ("Pod", "list", None, scan::ApiScope::All),
        ("Pod", "watch", None, scan::ApiScope::All),
    ]
    .into_iter()
    .map(|(k, v, s, scope)| (k.to_string(), v.to_string(), s.map(String::from), scope))
    .collect();
    assert_eq!(got, expected);
}

#[test]
fn scan_refuses_what_it_cannot_follow() {
    let code = r#"
        struct Holder { api: Api<Node> }
        fn f(client: Client) {
            let api: Api<Pod> = Api::all(client);
            mystery(api);
            let x = Api::all(client);
            Api::<Node>::all(client).entry("n");
        }
    "#;
    let errors = scan::scan(&[("src/y.rs".into(), code.into())]).unwrap_err();
    let text = errors.join("\n");
    assert!(text.contains("struct field"), "{text}");
    assert!(text.contains("`mystery`"), "{text}");
    assert!(text.contains("cannot tell the kind"), "{text}");
    assert!(text.contains("unknown Api method `entry`"), "{text}");
    assert_eq!(errors.len(), 4, "{text}");
}

// ---- Metrics: dashboard and README name only metrics the binary registers ----

/// `karpenter_*` metric names registered in `src/` (string literals outside tests).
fn registered_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, source) in scan::sources(&repo().join("src"), &[]) {
        let shipped = source.split("#[cfg(test)]").next().unwrap();
        for quoted in shipped.split('"').skip(1).step_by(2) {
            if quoted.starts_with("karpenter_")
                && quoted.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            {
                names.insert(quoted.to_string());
            }
        }
    }
    names
}

fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("karpenter_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[test]
fn dashboard_queries_only_registered_metrics() {
    let registered = registered_metrics();
    assert!(
        registered.contains("karpenter_nodeclaims_created"),
        "{registered:?}"
    );
    let text = std::fs::read_to_string(repo().join("dashboards/karpenter-exoscale.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() > 10));
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push_str(target["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    let unknown: Vec<String> = metric_names_in(&exprs)
        .into_iter()
        .filter(|name| {
            let base = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            !registered.contains(name.as_str()) && !registered.contains(base)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries unregistered metrics {unknown:?}"
    );
}

#[test]
fn readme_lists_every_registered_metric() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let listed = metric_names_in(&readme);
    // The README names counters without the `_total` they carry on the wire; a gauge whose
    // upstream name ends in `_total` (`karpenter_nodepools_cost_total`) is listed whole.
    let missing: Vec<_> = registered_metrics()
        .into_iter()
        .filter(|m| {
            let bare = m.strip_suffix("_total").unwrap_or(m);
            !listed.contains(m) && !listed.contains(bare)
        })
        .collect();
    assert!(missing.is_empty(), "README.md does not list {missing:?}");
}

// ---- Container image (no Docker engine here: check the Dockerfile's inputs and runtime) ----

/// Top-level paths the build stage copies, and those `.dockerignore` lets into the context.
fn docker_inputs() -> (BTreeSet<String>, BTreeSet<String>) {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let mut copied = BTreeSet::new();
    for line in dockerfile.lines() {
        if let Some(args) = line.strip_prefix("COPY ")
            && !args.starts_with("--from")
        {
            let parts: Vec<&str> = args.split_whitespace().collect();
            for src in &parts[..parts.len() - 1] {
                copied.insert(src.trim_end_matches('/').to_string());
            }
        }
    }
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let allowed = ignore
        .lines()
        .filter_map(|l| l.strip_prefix('!'))
        .map(|p| p.trim_end_matches('/').to_string())
        .collect();
    (copied, allowed)
}

#[test]
fn image_build_gets_every_file_the_binary_embeds() {
    let (copied, allowed) = docker_inputs();
    for needed in ["Cargo.toml", "Cargo.lock", "src"] {
        assert!(
            copied.contains(needed) && allowed.contains(needed),
            "{needed}"
        );
    }
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    for line in manifest.lines() {
        if let Some(path) = line.strip_prefix("path = \"") {
            let path = path.trim_end_matches('"');
            // The file itself or a directory above it must be copied and let into the context.
            let covered = |set: &BTreeSet<String>| {
                set.iter()
                    .any(|p| path == p || path.starts_with(&format!("{p}/")))
            };
            assert!(
                covered(&copied) && covered(&allowed),
                "Cargo.toml target {path}"
            );
        }
        if line.trim() == "[[bench]]" {
            assert!(copied.contains("benches") && allowed.contains("benches"));
        }
    }
    for (file, source) in scan::sources(&repo().join("src"), &[]) {
        let shipped = source.split("#[cfg(test)]").next().unwrap();
        for macro_name in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in shipped.match_indices(macro_name) {
                let rel = shipped[at + macro_name.len()..].split('"').next().unwrap();
                let dir = PathBuf::from(&file).parent().unwrap().join(rel);
                let mut normal = PathBuf::new();
                for part in dir.components() {
                    match part {
                        std::path::Component::ParentDir => {
                            normal.pop();
                        }
                        other => normal.push(other),
                    }
                }
                let top = normal.components().next().unwrap();
                let top = top.as_os_str().to_string_lossy().into_owned();
                assert!(
                    copied.contains(&top) && allowed.contains(&top),
                    "{file} embeds {}, but the image build does not copy {top}/",
                    normal.display()
                );
            }
        }
    }
}

#[test]
fn image_runs_the_static_binary_as_non_root() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile.split("\nFROM ").skip(1).collect();
    assert!(stages.len() >= 2, "multi-stage build");
    let runtime = stages.last().unwrap();
    assert!(runtime.starts_with("gcr.io/distroless/static"), "{runtime}");
    assert!(runtime.contains("USER 65532:65532"));
    assert!(runtime.contains("ENTRYPOINT [\"/karpenter-exoscale\"]"));
    assert!(
        dockerfile.contains("unknown-linux-musl"),
        "a static (musl) binary"
    );
    let copies: Vec<&str> = runtime.lines().filter(|l| l.starts_with("COPY")).collect();
    assert_eq!(
        copies.len(),
        1,
        "the runtime image holds the binary only: {copies:?}"
    );
    // The chart runs the same user and binary.
    let docs = render(&[]);
    let pod = &deployment(&docs)["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
}

/// The image and `hack/scale.sh` build the same profile (`dist`), the whole-program-optimized
/// one the measurements name; comments do not count.
#[test]
fn the_image_and_the_scale_harness_build_the_same_optimized_profile() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let scale = std::fs::read_to_string(repo().join("hack/scale.sh")).unwrap();
    for (what, text) in [("Dockerfile", &dockerfile), ("hack/scale.sh", &scale)] {
        let text: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains("cargo build --profile dist")
                && text.contains("/dist/karpenter-exoscale"),
            "{what} builds and runs the dist profile"
        );
    }
    let manifest: toml::Table = std::fs::read_to_string(repo().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let dist = &manifest["profile"]["dist"];
    assert_eq!(dist["inherits"].as_str(), Some("release"));
    assert_eq!(dist["lto"].as_str(), Some("fat"));
    assert_eq!(dist["codegen-units"].as_integer(), Some(1));
}

#[test]
fn every_base_image_is_pinned_by_digest() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert!(froms.len() >= 2);
    for from in froms {
        let image = from.split_whitespace().next().unwrap();
        let (tagged, digest) = image
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("{image} is not pinned by digest"));
        assert!(
            tagged.contains(':'),
            "{image}: keep the tag beside the digest"
        );
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{image}: malformed digest"
        );
    }
}

#[test]
fn the_secret_admission_policy_names_the_rendered_service_account() {
    let docs = render(&[]);
    let account = find(&docs, "ServiceAccount")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let policy = find(&docs, "ValidatingAdmissionPolicy");
    assert_eq!(policy.len(), 1);
    let condition = policy[0]["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert_eq!(
        condition,
        format!(
            "request.userInfo.username == \"system:serviceaccount:{RELEASE_NAMESPACE}:{account}\""
        )
    );
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(
        binding[0]["spec"]["policyName"],
        policy[0]["metadata"]["name"]
    );
    assert_eq!(
        binding[0]["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
    let off = render(&["secretAdmissionPolicy.enabled=false"]);
    assert!(find(&off, "ValidatingAdmissionPolicy").is_empty());
    assert!(find(&off, "ValidatingAdmissionPolicyBinding").is_empty());
}

#[test]
fn the_network_policy_is_optional_and_opens_only_the_served_ports() {
    assert!(find(&render(&[]), "NetworkPolicy").is_empty());
    let docs = render(&["networkPolicy.enabled=true", "metrics.port=9090"]);
    let policy = find(&docs, "NetworkPolicy")[0];
    let deployment = find(&docs, "Deployment")[0];
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let ingress: Vec<i64> = policy["spec"]["ingress"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(ingress, [9090, 8081]);
    let egress: Vec<i64> = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_array().unwrap().iter())
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(egress, [53, 53, 443, 6443]);
}

fn typed<K: serde::de::DeserializeOwned>(v: &Value) -> K {
    serde_json::from_value(v.clone()).unwrap()
}

/// The rendered policy, Role and RoleBinding on a real kube-apiserver: the controller's
/// ServiceAccount (impersonated) may create and delete its bootstrap tokens and nothing else
/// in kube-system, even though RBAC alone grants `create` on every Secret there.
#[tokio::test]
async fn the_secret_admission_policy_admits_only_our_bootstrap_tokens() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use karpenter_exoscale::providers::bootstrap_token::{
        BootstrapToken, TokenOwner, build_secret,
    };
    use kube::api::{Api, DeleteParams, PostParams};

    let Some(plane) = support::shared() else {
        return;
    };
    let admin = plane.client().await;
    // A release name of its own: the policy is cluster-wide and matches only its account.
    let docs = render(&["fullnameOverride=vap-test"]);
    let account = find(&docs, "ServiceAccount")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let pp = PostParams::default();
    let policy: ValidatingAdmissionPolicy = typed(find(&docs, "ValidatingAdmissionPolicy")[0]);
    let binding: ValidatingAdmissionPolicyBinding =
        typed(find(&docs, "ValidatingAdmissionPolicyBinding")[0]);
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&pp, &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await
        .unwrap();
    for doc in find(&docs, "Role") {
        if doc["metadata"]["namespace"] == "kube-system" {
            let role: Role = typed(doc);
            Api::<Role>::namespaced(admin.clone(), "kube-system")
                .create(&pp, &role)
                .await
                .unwrap();
        }
    }
    for doc in find(&docs, "RoleBinding") {
        if doc["metadata"]["namespace"] == "kube-system" {
            let rb: RoleBinding = typed(doc);
            Api::<RoleBinding>::namespaced(admin.clone(), "kube-system")
                .create(&pp, &rb)
                .await
                .unwrap();
        }
    }
    let mut config = plane.config().await;
    config.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    ));
    let controller = kube::Client::try_from(config).unwrap();
    let as_controller: Api<Secret> = Api::namespaced(controller, "kube-system");
    let as_admin: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");

    // What a compromised controller would try: a service-account token Secret.
    let forged: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vap-test-forged", "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token"
    }))
    .unwrap();
    // The policy is compiled asynchronously after creation: wait until it denies.
    let started = std::time::Instant::now();
    let mut rbac_refusal = None;
    let denial = loop {
        match as_controller.create(&pp, &forged).await {
            Err(kube::Error::Api(status)) if status.code == 422 || status.code == 403 => {
                if status.message.contains("ValidatingAdmissionPolicy") {
                    break status.message;
                }
                // The RoleBinding created above reaches the RBAC authorizer through its
                // informer: until it has, RBAC refuses the create (a CI run failed here).
                if status.code == 403 && status.message.contains("cannot create resource") {
                    rbac_refusal = Some(status.message);
                } else {
                    panic!("refused, but not by the policy: {status:?}");
                }
            }
            Err(other) => panic!("{other}"),
            Ok(_) => {
                // Created before the policy was active: remove it and try again.
                as_admin
                    .delete("vap-test-forged", &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the policy never took effect (last RBAC refusal: {rbac_refusal:?})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        denial.contains("type bootstrap.kubernetes.io/token"),
        "{denial}"
    );

    let now = chrono::Utc::now();
    let token = BootstrapToken::generate();
    // As the controller makes it: owned by its NodeClaim (the reference is not checked).
    let owner = TokenOwner {
        name: "claim",
        uid: Some("3d0a8b7e-1f42-4c6e-8f0e-6a9b2c1d4e5f"),
    };
    let ours = build_secret(&token, owner, now, std::time::Duration::from_secs(600));
    let denied = |secret: Secret, why: &'static str| {
        let api = as_controller.clone();
        async move {
            match api.create(&PostParams::default(), &secret).await {
                Err(kube::Error::Api(status)) => {
                    assert!(status.message.contains(why), "{status:?}")
                }
                other => panic!("expected a denial naming {why:?}, got {other:?}"),
            }
        }
    };
    let mut unlabelled = build_secret(
        &BootstrapToken::generate(),
        TokenOwner::named("claim"),
        now,
        std::time::Duration::from_secs(600),
    );
    unlabelled.metadata.labels = None;
    denied(
        unlabelled,
        "labelled exoscale.com/token-provider=karpenter-exoscale",
    )
    .await;
    let mut renamed = build_secret(
        &BootstrapToken::generate(),
        TokenOwner::named("claim"),
        now,
        std::time::Duration::from_secs(600),
    );
    renamed.metadata.name = Some("kube-proxy-token".into());
    denied(renamed, "named bootstrap-token-*").await;

    // Its own token: created, and deleted by name.
    as_controller.create(&pp, &ours).await.unwrap();
    as_controller
        .delete(&token.secret_name(), &DeleteParams::default())
        .await
        .unwrap();
    // Another Secret of kube-system cannot be deleted even though RBAC grants delete.
    let other: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vap-test-other"}, "type": "Opaque", "stringData": {"k": "v"}
    }))
    .unwrap();
    as_admin.create(&pp, &other).await.unwrap();
    match as_controller
        .delete("vap-test-other", &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains("type bootstrap.kubernetes.io/token"),
            "{status:?}"
        ),
        other => panic!("deleting another Secret was not refused: {other:?}"),
    }
    // Nor read: RBAC grants no get or list.
    match as_controller.get("vap-test-other").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("reading a Secret was not forbidden: {other:?}"),
    }
    as_admin
        .delete("vap-test-other", &DeleteParams::default())
        .await
        .unwrap();
}
