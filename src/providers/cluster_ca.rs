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

/// How long a CA bundle read from the cluster is used before it is read again: a rotated CA
/// reaches new nodes within this, without a restart.
pub const CA_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);
/// After a failed re-read, how long the bundle held is used before the next try: during an
/// API outage, one launch in this interval waits for a read, not every launch.
pub const CA_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// The CA bundle, read again once older than its maximum age. A failed read keeps the bundle
/// already held (a brief API hiccup must not fail launches); with none held, it fails.
pub struct CaCache {
    clock: std::sync::Arc<dyn crate::clock::Clock>,
    max_age: std::time::Duration,
    /// The bundle and when (monotonic) it is to be read again.
    held: tokio::sync::Mutex<Option<(std::time::Duration, Vec<u8>)>>,
}

impl CaCache {
    pub fn new(
        clock: std::sync::Arc<dyn crate::clock::Clock>,
        max_age: std::time::Duration,
    ) -> Self {
        CaCache {
            clock,
            max_age,
            held: tokio::sync::Mutex::new(None),
        }
    }

    /// The bundle, read with `fetch` when none is held or it is due. Concurrent callers wait
    /// for one read.
    pub async fn get<F, Fut>(&self, fetch: F) -> Result<Vec<u8>, String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<u8>, CaError>>,
    {
        let mut held = self.held.lock().await;
        let now = self.clock.monotonic();
        if let Some((due, pem)) = held.as_ref()
            && now < *due
        {
            return Ok(pem.clone());
        }
        match fetch().await {
            Ok(pem) => {
                *held = Some((now + self.max_age, pem.clone()));
                Ok(pem)
            }
            Err(e) => match held.as_mut() {
                Some((due, pem)) => {
                    tracing::warn!(error = %e, "could not read the cluster CA again; using the one read before");
                    *due = now + CA_RETRY_AFTER;
                    Ok(pem.clone())
                }
                None => Err(e.to_string()),
            },
        }
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

    #[tokio::test]
    async fn a_rotated_ca_is_read_again_and_a_failed_read_keeps_the_last() {
        use crate::clock::FixedClock;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        use std::time::Duration;
        let clock = FixedClock::default();
        let cache = CaCache::new(Arc::new(clock.clone()), CA_MAX_AGE);
        let reads = AtomicU32::new(0);
        let read = |pem: &'static str| {
            reads.fetch_add(1, SeqCst);
            async move { Ok(pem.as_bytes().to_vec()) }
        };
        let failing = || {
            reads.fetch_add(1, SeqCst);
            async {
                Err(CaError::NotFound {
                    cluster_info: "connection refused".into(),
                    root_ca: "connection refused".into(),
                })
            }
        };
        assert!(
            cache
                .get(failing)
                .await
                .unwrap_err()
                .contains("connection refused")
        );
        assert_eq!(cache.get(|| read("old")).await.unwrap(), b"old");
        clock.advance(CA_MAX_AGE - Duration::from_secs(1));
        assert_eq!(
            cache.get(|| read("new")).await.unwrap(),
            b"old",
            "held while fresh"
        );
        assert_eq!(reads.load(SeqCst), 2);
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            cache.get(failing).await.unwrap(),
            b"old",
            "a failed read keeps it"
        );
        assert_eq!(reads.load(SeqCst), 3);
        // Not read again at once after a failure: every launch would wait for it.
        assert_eq!(cache.get(|| read("new")).await.unwrap(), b"old");
        assert_eq!(reads.load(SeqCst), 3);
        clock.advance(CA_RETRY_AFTER);
        assert_eq!(cache.get(|| read("new")).await.unwrap(), b"new", "rotated");
        assert_eq!(reads.load(SeqCst), 4);
    }
}
