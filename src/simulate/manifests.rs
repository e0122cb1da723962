//! Loading the manifests `simulate` reads: files or directories of multi-document YAML holding
//! NodePools, ExoscaleNodeClasses, NodeOverlays, workloads (expanded to pods), DaemonSets and
//! Nodes. Invalid objects fail with the file, the document index and the field.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use crate::apis::validation::{self, deserialize_with_path};
use crate::apis::{ExoscaleNodeClass, NodeOverlay, NodePool};

#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: document {index}: {message}")]
    Invalid {
        path: String,
        index: usize,
        message: String,
    },
    #[error("no manifests found in {0}")]
    Empty(String),
}

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
}

/// Reads every path (a file, or a directory searched recursively for `.yaml`/`.yml`/`.json`).
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        collect_files(path, &mut files)?;
    }
    let mut manifests = Manifests::default();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|source| ManifestError::Read {
            path: file.display().to_string(),
            source,
        })?;
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

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let read_error = |source| ManifestError::Read {
        path: path.display().to_string(),
        source,
    };
    let metadata = std::fs::metadata(path).map_err(read_error)?;
    if !metadata.is_dir() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(read_error)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        let is_manifest = entry
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if entry.is_dir() {
            collect_files(&entry, out)?;
        } else if is_manifest {
            out.push(entry);
        }
    }
    Ok(())
}

/// Parses one file's documents into `manifests`.
pub fn load_text(path: &str, text: &str, manifests: &mut Manifests) -> Result<(), ManifestError> {
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
            push_pod(with_default_namespace(pod), m);
        }
        ("v1", "Node") => m.nodes.push(typed(&value)?),
        ("apps/v1", "DaemonSet") => m.daemon_sets.push(typed(&value)?),
        ("apps/v1", "Deployment") => {
            let d: Deployment = typed(&value)?;
            let spec = d.spec.ok_or("spec: required field is missing")?;
            expand(&d.metadata, &spec.template, spec.replicas.unwrap_or(1), m);
        }
        ("apps/v1", "ReplicaSet") => {
            let r: ReplicaSet = typed(&value)?;
            let spec = r.spec.ok_or("spec: required field is missing")?;
            let template = spec
                .template
                .ok_or("spec.template: required field is missing")?;
            expand(&r.metadata, &template, spec.replicas.unwrap_or(1), m);
        }
        ("apps/v1", "StatefulSet") => {
            let s: StatefulSet = typed(&value)?;
            let spec = s.spec.ok_or("spec: required field is missing")?;
            expand(&s.metadata, &spec.template, spec.replicas.unwrap_or(1), m);
        }
        ("batch/v1", "Job") => {
            let j: Job = typed(&value)?;
            let spec = j.spec.ok_or("spec: required field is missing")?;
            expand(
                &j.metadata,
                &spec.template,
                spec.parallelism.unwrap_or(1),
                m,
            );
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

fn push_pod(pod: Pod, m: &mut Manifests) {
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
}

/// A workload becomes `count` pods named `<name>-<i>` from its template.
fn expand(owner: &ObjectMeta, template: &PodTemplateSpec, count: i32, m: &mut Manifests) {
    let name = owner.name.clone().unwrap_or_default();
    for i in 0..count.max(0) {
        let mut metadata = template.metadata.clone().unwrap_or_default();
        metadata.name = Some(format!("{name}-{i}"));
        metadata.namespace = owner.namespace.clone();
        let pod = Pod {
            metadata,
            spec: template.spec.clone(),
            status: None,
        };
        push_pod(with_default_namespace(pod), m);
    }
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
}
