//! Installs CRD manifests and waits until the apiserver serves them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;

const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// The project's generated CRDs (`crds/`).
pub fn project_crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crds")
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("reading CRD dir {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Every CustomResourceDefinition in the `*.yaml` files of `dir` (multi-document files too).
pub fn load_dir(dir: &Path) -> Result<Vec<CustomResourceDefinition>, String> {
    let mut crds = Vec::new();
    for file in yaml_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = serde_yaml_ng::Value::deserialize(document)
                .map_err(|e| format!("parsing {}: {e}", file.display()))?;
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_yaml_ng::from_value(value)
                .map_err(|e| format!("{} is not a CRD: {e}", file.display()))?;
            crds.push(crd);
        }
    }
    if crds.is_empty() {
        return Err(format!("no CRDs found in {}", dir.display()));
    }
    Ok(crds)
}

/// Applies every CRD of `dir` and waits until each is Established.
pub async fn install_dir(client: &kube::Client, dir: &Path) -> Result<Vec<String>, String> {
    let crds = load_dir(dir)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("karpenter-exoscale-tests").force();
    let mut names = Vec::new();
    for crd in &crds {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or_else(|| "a CRD without metadata.name".to_string())?;
        let mut applied = crd.clone();
        applied.metadata.managed_fields = None;
        api.patch(&name, &params, &Patch::Apply(&applied))
            .await
            .map_err(|e| format!("installing CRD {name}: {e}"))?;
        names.push(name);
    }
    for name in &names {
        wait_established(&api, name).await?;
    }
    Ok(names)
}

async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let established = api.get(name).await.ok().is_some_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            return Ok(());
        }
        if started.elapsed() > ESTABLISHED_TIMEOUT {
            return Err(format!(
                "CRD {name} not Established after {ESTABLISHED_TIMEOUT:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
