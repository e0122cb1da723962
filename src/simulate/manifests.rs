//! Loading the manifests `simulate` reads: files or directories of multi-document YAML holding
//! NodePools, ExoscaleNodeClasses, NodeOverlays, workloads (expanded to pods), DaemonSets and
//! Nodes. Invalid objects fail with the file, the document index and the field.

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use super::input::{self, InputError};
use crate::apis::validation::{self, deserialize_with_path};
use crate::apis::{ExoscaleNodeClass, NodeOverlay, NodePool};

#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("{path}: document {index}: {message}")]
    Invalid {
        path: String,
        index: usize,
        message: String,
    },
    #[error("no manifests found in {0}")]
    Empty(String),
    #[error(transparent)]
    Input(#[from] InputError),
}

/// Pods `simulate` expands from all workloads together (`replicas`, `parallelism`): enough for
/// any cluster Karpenter manages, small enough that a typo (`replicas: 2147483647`) is an
/// error rather than gigabytes of pods.
pub const MAX_PODS: usize = 100_000;

/// Everything the simulation needs, as typed objects.
#[derive(Debug, Default)]
pub struct Manifests {
    pub node_pools: Vec<NodePool>,
    pub node_classes: Vec<ExoscaleNodeClass>,
    pub overlays: Vec<NodeOverlay>,
    /// Pending pods (no `spec.nodeName`), workloads already expanded.
    pub pending_pods: Vec<Pod>,
    /// Pods bound to a Node of the manifests by `spec.nodeName`.
    pub bound_pods: Vec<Pod>,
    pub daemon_sets: Vec<DaemonSet>,
    pub nodes: Vec<Node>,
    /// Kinds that were skipped, and other things worth telling the user.
    pub warnings: Vec<String>,
    /// Where each named object came from (`kind namespace/name` → `file: document N`), so a
    /// second object of the same name is refused as the API server would refuse it.
    seen: std::collections::BTreeMap<String, String>,
}

/// Reads every path (a file, or a directory searched recursively for `.yaml`/`.yml`/`.json`).
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        files.extend(input::manifest_files(path)?);
    }
    let mut manifests = Manifests::default();
    for file in &files {
        let text = input::read_manifest(file)?;
        load_text(&file.display().to_string(), &text, &mut manifests)?;
    }
    if manifests.node_pools.is_empty()
        && manifests.pending_pods.is_empty()
        && manifests.nodes.is_empty()
    {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(ManifestError::Empty(shown.join(", ")));
    }
    Ok(manifests)
}

/// Parses one file's documents into `manifests`.
pub fn load_text(path: &str, text: &str, manifests: &mut Manifests) -> Result<(), ManifestError> {
    input::check_nesting(path, text)?;
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let invalid = |message: String| ManifestError::Invalid {
            path: path.to_string(),
            index,
            message,
        };
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| invalid(format!("not valid YAML: {e}")))?;
        if value.is_null() {
            continue;
        }
        record_name(&value, &format!("{path}: document {index}"), manifests).map_err(invalid)?;
        add_document(value, manifests).map_err(invalid)?;
    }
    Ok(())
}

fn typed<K: DeserializeOwned>(value: &Value) -> Result<K, String> {
    deserialize_with_path(value).map_err(|e| e.to_string())
}

fn ours<K: DeserializeOwned>(value: &Value) -> Result<K, String> {
    validation::parse(value).map_err(|e| e.to_string())
}

fn add_document(value: Value, m: &mut Manifests) -> Result<(), String> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match (api_version.as_str(), kind.as_str()) {
        ("karpenter.sh/v1", "NodePool") => m.node_pools.push(ours(&value)?),
        ("karpenter.exoscale.com/v1", "ExoscaleNodeClass") => m.node_classes.push(ours(&value)?),
        ("karpenter.sh/v1alpha1", "NodeOverlay") => m.overlays.push(ours(&value)?),
        ("v1", "Pod") => {
            let pod: Pod = typed(&value)?;
            push_pod(with_default_namespace(pod), m)?;
        }
        ("v1", "Node") => m.nodes.push(typed(&value)?),
        ("apps/v1", "DaemonSet") => m.daemon_sets.push(typed(&value)?),
        ("apps/v1", "Deployment") => {
            let d: Deployment = typed(&value)?;
            let spec = d.spec.ok_or("spec: required field is missing")?;
            expand(
                &d.metadata,
                &spec.template,
                "spec.replicas",
                spec.replicas,
                m,
            )?;
        }
        ("apps/v1", "ReplicaSet") => {
            let r: ReplicaSet = typed(&value)?;
            let spec = r.spec.ok_or("spec: required field is missing")?;
            let template = spec
                .template
                .ok_or("spec.template: required field is missing")?;
            expand(&r.metadata, &template, "spec.replicas", spec.replicas, m)?;
        }
        ("apps/v1", "StatefulSet") => {
            let s: StatefulSet = typed(&value)?;
            let spec = s.spec.ok_or("spec: required field is missing")?;
            expand(
                &s.metadata,
                &spec.template,
                "spec.replicas",
                spec.replicas,
                m,
            )?;
        }
        ("batch/v1", "Job") => {
            let j: Job = typed(&value)?;
            let spec = j.spec.ok_or("spec: required field is missing")?;
            expand(
                &j.metadata,
                &spec.template,
                "spec.parallelism",
                spec.parallelism,
                m,
            )?;
        }
        ("", _) | (_, "") => return Err("apiVersion and kind are required".into()),
        _ => {
            let name = value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?");
            m.warnings.push(format!(
                "skipped {api_version}/{kind} {name}: not a kind simulate reads"
            ));
        }
    }
    Ok(())
}

fn with_default_namespace(mut pod: Pod) -> Pod {
    if pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        pod.metadata.namespace = Some("default".into());
    }
    pod
}

fn push_pod(pod: Pod, m: &mut Manifests) -> Result<(), String> {
    if m.pending_pods.len() + m.bound_pods.len() >= MAX_PODS {
        return Err(format!(
            "more than {MAX_PODS} pods in the manifests, the most simulate expands"
        ));
    }
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    if bound {
        m.bound_pods.push(pod)
    } else {
        m.pending_pods.push(pod)
    }
    Ok(())
}

/// A workload becomes `count` pods named `<name>-<i>` from its template (`count` is the
/// workload's `field`, 1 when unset, refused when negative or above [`MAX_PODS`]).
fn expand(
    owner: &ObjectMeta,
    template: &PodTemplateSpec,
    field: &str,
    count: Option<i32>,
    m: &mut Manifests,
) -> Result<(), String> {
    let count = count.unwrap_or(1);
    if count < 0 {
        return Err(format!(
            "{field}: {count}: must be greater than or equal to 0"
        ));
    }
    let room = MAX_PODS.saturating_sub(m.pending_pods.len() + m.bound_pods.len());
    if count as usize > room {
        return Err(format!(
            "{field}: {count} pods would exceed the {MAX_PODS} pods simulate expands (room left: {room})"
        ));
    }
    let name = owner.name.clone().unwrap_or_default();
    for i in 0..count {
        let mut metadata = template.metadata.clone().unwrap_or_default();
        metadata.name = Some(format!("{name}-{i}"));
        metadata.namespace = owner.namespace.clone();
        let pod = Pod {
            metadata,
            spec: template.spec.clone(),
            status: None,
        };
        let pod = with_default_namespace(pod);
        let key = format!(
            "Pod {}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        if let Some(first) = m.seen.get(&key) {
            return Err(format!(
                "{key} (replica {i} of {name}) has the name of an object in {first}"
            ));
        }
        m.seen.insert(key, format!("replica {i} of {name}"));
        push_pod(pod, m)?;
    }
    Ok(())
}

/// Refuses a second object of the same kind, namespace and name (the API server would
/// refuse to create it; here it would silently double a workload or shadow a NodePool).
fn record_name(value: &Value, origin: &str, m: &mut Manifests) -> Result<(), String> {
    let (Some(kind), Some(name)) = (
        value.get("kind").and_then(Value::as_str),
        value.pointer("/metadata/name").and_then(Value::as_str),
    ) else {
        return Ok(());
    };
    let cluster_scoped = matches!(
        kind,
        "NodePool" | "ExoscaleNodeClass" | "NodeOverlay" | "Node"
    );
    let namespace = if cluster_scoped {
        String::new()
    } else {
        value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_string()
            + "/"
    };
    let group = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.split_once('/').map(|(g, _)| g))
        .unwrap_or_default();
    // Core kinds keep their bare name so an explicit Pod and a workload's replica collide.
    let kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let key = format!("{kind} {namespace}{name}");
    if let Some(first) = m.seen.get(&key) {
        return Err(format!("metadata.name: {key} already defined in {first}"));
    }
    m.seen.insert(key, origin.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.exoscale.com, kind: ExoscaleNodeClass, name: default}
      requirements: []
"#;

    fn load_str(text: &str) -> Result<Manifests, ManifestError> {
        let mut m = Manifests::default();
        load_text("test.yaml", text, &mut m).map(|_| m)
    }

    #[test]
    fn workloads_expand_to_named_pods() {
        let text = format!(
            "{POOL}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec:\n  replicas: 3\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec: {{containers: [{{name: c, image: i}}]}}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {{name: job, namespace: batch}}\nspec:\n  parallelism: 2\n  template:\n    spec: {{containers: [{{name: c, image: i}}], restartPolicy: Never}}\n"
        );
        let m = load_str(&text).unwrap();
        let names: Vec<String> = m
            .pending_pods
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap(),
                    p.metadata.name.as_deref().unwrap()
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "default/web-0",
                "default/web-1",
                "default/web-2",
                "batch/job-0",
                "batch/job-1"
            ]
        );
        assert_eq!(
            m.pending_pods[0].metadata.labels.as_ref().unwrap()["app"],
            "web"
        );
        assert_eq!(m.node_pools.len(), 1);
    }

    #[test]
    fn pods_with_a_node_name_are_bound() {
        let m = load_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {nodeName: node-a, containers: [{name: c}]}\n").unwrap();
        assert_eq!(m.bound_pods.len(), 1);
        assert!(m.pending_pods.is_empty());
    }

    #[test]
    fn other_kinds_are_skipped_with_a_warning() {
        let m = load_str("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n").unwrap();
        assert_eq!(m.warnings.len(), 1);
        assert!(
            m.warnings[0].contains("v1/ConfigMap cm"),
            "{:?}",
            m.warnings
        );
    }

    #[test]
    fn invalid_nodepool_names_file_document_and_field() {
        let text = format!(
            "{POOL}---\n{}",
            POOL.replace(
                "requirements: []",
                "requirements: []\n      expireAfter: 30d"
            )
            .replace("name: default}", "name: second}")
        );
        let err = load_str(&text).unwrap_err().to_string();
        assert!(err.starts_with("test.yaml: document 1:"), "{err}");
        assert!(err.contains("spec.template.spec.expireAfter"), "{err}");
    }

    #[test]
    fn invalid_pod_names_the_field() {
        let err = load_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {requests: 5}}]}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.containers[0].resources.requests"),
            "{err}"
        );
    }

    #[test]
    fn documents_without_kind_are_rejected() {
        let err = load_str("metadata: {name: x}\n").unwrap_err().to_string();
        assert!(err.contains("apiVersion and kind are required"), "{err}");
    }

    fn deployment(name: &str, replicas: &str) -> String {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    spec: {{containers: [{{name: c}}]}}\n"
        )
    }

    #[test]
    fn replica_counts_are_bounded_and_never_negative() {
        let started = std::time::Instant::now();
        let err = load_str(&deployment("web", "2147483647"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.replicas: 2147483647 pods would exceed the 100000 pods"),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let err = load_str(&deployment("web", "-3")).unwrap_err().to_string();
        assert!(
            err.contains("spec.replicas: -3: must be greater than or equal to 0"),
            "{err}"
        );
        let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  parallelism: 2147483647\n  template:\n    spec: {containers: [{name: c}], restartPolicy: Never}\n";
        let err = load_str(job).unwrap_err().to_string();
        assert!(err.contains("spec.parallelism: 2147483647 pods"), "{err}");
        // Several workloads together are bounded too.
        let text = format!(
            "{}---\n{}",
            deployment("a", "60000"),
            deployment("b", "60000")
        );
        let err = load_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("document 1: spec.replicas: 60000 pods"),
            "{err}"
        );
        assert!(err.contains("room left: 40000"), "{err}");
    }

    #[test]
    fn duplicate_names_are_refused_as_the_api_server_would() {
        let err = load_str(&format!("{POOL}---\n{POOL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("test.yaml: document 1: metadata.name: NodePool.karpenter.sh default already defined in test.yaml: document 0"), "{err}");
        // Same name, other namespace or kind: fine.
        let ok = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: other}\nspec: {containers: [{name: c}]}\n";
        assert_eq!(load_str(ok).unwrap().pending_pods.len(), 2);
        // A Pod named like a workload's replica would be reported twice under one name.
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-1}}\nspec: {{containers: [{{name: c}}]}}\n---\n{}",
            deployment("web", "2")
        );
        let err = load_str(&text).unwrap_err().to_string();
        assert!(err.contains("Pod default/web-1 (replica 1 of web) has the name of an object in test.yaml: document 0"), "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_with_the_file_and_line() {
        let text = format!("{POOL}---\nx: {}\n", "[".repeat(10_000));
        let err = load_str(&text).unwrap_err().to_string();
        assert!(err.contains("test.yaml: line"), "{err}");
        assert!(err.contains("nesting deeper than 256 levels"), "{err}");
    }
}
