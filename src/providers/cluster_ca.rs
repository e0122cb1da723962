//! The cluster CA bundle new nodes trust: `kube-public/cluster-info` (key `kubeconfig`,
//! first cluster's `certificate-authority-data`), else `kube-system/kube-root-ca.crt`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CaError {
    #[error("cluster-info kubeconfig: {0}")]
    ClusterInfo(String),
    #[error(
        "failed to get cluster CA: cluster-info ({cluster_info}); kube-root-ca.crt ({root_ca})"
    )]
    NotFound {
        cluster_info: String,
        root_ca: String,
    },
}

/// The CA from the `kubeconfig` value of `kube-public/cluster-info`.
pub fn ca_from_cluster_info(kubeconfig: &str) -> Result<Vec<u8>, CaError> {
    let doc: serde_json::Value = serde_yaml_ng::from_str(kubeconfig)
        .map_err(|e| CaError::ClusterInfo(format!("not YAML: {e}")))?;
    let data = doc
        .get("clusters")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("cluster"))
        .and_then(|c| c.get("certificate-authority-data"))
        .and_then(|d| d.as_str())
        .ok_or_else(|| {
            CaError::ClusterInfo("no clusters[0].cluster.certificate-authority-data".into())
        })?;
    let pem = BASE64
        .decode(data.trim())
        .map_err(|e| CaError::ClusterInfo(format!("certificate-authority-data: {e}")))?;
    if pem.is_empty() {
        return Err(CaError::ClusterInfo(
            "certificate-authority-data is empty".into(),
        ));
    }
    Ok(pem)
}

async fn configmap_value(
    client: &Client,
    ns: &str,
    name: &str,
    key: &str,
) -> Result<String, String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    cm.data
        .and_then(|d| d.get(key).cloned())
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| format!("{ns}/{name} has no key {key}"))
}

/// Reads the CA from the cluster, with the Go provider's fallback.
pub async fn fetch(client: &Client) -> Result<Vec<u8>, CaError> {
    let cluster_info =
        match configmap_value(client, "kube-public", "cluster-info", "kubeconfig").await {
            Ok(kubeconfig) => match ca_from_cluster_info(&kubeconfig) {
                Ok(pem) => return Ok(pem),
                Err(e) => e.to_string(),
            },
            Err(e) => e,
        };
    match configmap_value(client, "kube-system", "kube-root-ca.crt", "ca.crt").await {
        Ok(pem) => Ok(pem.into_bytes()),
        Err(root_ca) => Err(CaError::NotFound {
            cluster_info,
            root_ca,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_is_read_from_the_first_cluster() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: ''\n  cluster:\n    certificate-authority-data: {}\n    server: https://x:6443\n",
            BASE64.encode(pem)
        );
        assert_eq!(ca_from_cluster_info(&kubeconfig).unwrap(), pem.as_bytes());
    }

    #[test]
    fn broken_cluster_info_is_named() {
        for (doc, needle) in [
            ("clusters: []\n", "certificate-authority-data"),
            (
                "clusters:\n- cluster:\n    certificate-authority-data: '!!'\n",
                "certificate-authority-data",
            ),
            (": : :", "not YAML"),
        ] {
            let e = ca_from_cluster_info(doc).unwrap_err().to_string();
            assert!(e.contains(needle), "{doc:?}: {e}");
        }
    }
}
