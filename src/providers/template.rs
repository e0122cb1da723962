//! Template resolution: `templateID` as is, or `imageTemplateSelector` through
//! `GET /sks-template/{version}/{variant}`, with the control plane's version when none is given.
//! Results are cached with a TTL so a launch does not cost extra API calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use thiserror::Error;

use crate::apis::ExoscaleNodeClass;
use crate::apis::nodeclass::TemplateVariant;
use crate::clock::Clock;
use crate::exoscale;
use crate::exoscale::models::SksTemplateVariant;

pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Error, Clone, PartialEq)]
pub enum TemplateError {
    #[error("neither templateID nor imageTemplateSelector is specified in ExoscaleNodeClass {0}")]
    NotSpecified(String),
    #[error("cannot detect the Kubernetes version of the control plane: {0}")]
    VersionDetection(String),
    #[error("{0:?} is not a Kubernetes version (expected [v]MAJOR.MINOR.PATCH)")]
    BadVersion(String),
    #[error(
        "failed to resolve template for version={version}, variant={variant}: no active SKS node template: {source}"
    )]
    Lookup {
        version: String,
        variant: &'static str,
        source: Box<exoscale::Error>,
    },
    #[error("template {id} not found or not accessible: {source}")]
    Inaccessible {
        id: String,
        source: Box<exoscale::Error>,
    },
}

/// The template a NodeClass wants now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedTemplate {
    pub id: String,
    /// The Kubernetes version it was selected for (`None` for a plain `templateID`).
    pub kubernetes_version: Option<String>,
}

/// Where the control plane's version comes from (the apiserver's `/version` in production).
pub trait KubernetesVersionSource: Send + Sync {
    /// The raw `gitVersion`, e.g. `v1.34.1+k3s1`.
    fn git_version(&self) -> BoxFuture<'_, Result<String, String>>;
}

/// A fixed version (tests, `simulate`).
pub struct FixedVersion(pub String);

impl KubernetesVersionSource for FixedVersion {
    fn git_version(&self) -> BoxFuture<'_, Result<String, String>> {
        let v = self.0.clone();
        Box::pin(async move { Ok(v) })
    }
}

/// The apiserver's `GET /version`.
pub struct ApiServerVersion(pub kube::Client);

impl KubernetesVersionSource for ApiServerVersion {
    fn git_version(&self) -> BoxFuture<'_, Result<String, String>> {
        Box::pin(async move {
            self.0
                .apiserver_version()
                .await
                .map(|info| info.git_version)
                .map_err(|e| e.to_string())
        })
    }
}

/// `v1.26.5+k3s1` → `1.26.5`: optional `v`, then the first `major.minor.patch`.
pub fn parse_kubernetes_version(git_version: &str) -> Result<String, TemplateError> {
    let bad = || TemplateError::BadVersion(git_version.to_string());
    let rest = git_version
        .trim()
        .strip_prefix('v')
        .unwrap_or(git_version.trim());
    let mut parts = Vec::with_capacity(3);
    let mut chars = rest.chars().peekable();
    for i in 0..3 {
        let mut n = String::new();
        while let Some(c) = chars.peek().filter(|c| c.is_ascii_digit()) {
            n.push(*c);
            chars.next();
        }
        if n.is_empty() {
            return Err(bad());
        }
        parts.push(n);
        if i < 2 && chars.next() != Some('.') {
            return Err(bad());
        }
    }
    Ok(parts.join("."))
}

fn sks_variant(v: TemplateVariant) -> SksTemplateVariant {
    match v {
        TemplateVariant::Standard => SksTemplateVariant::Standard,
        TemplateVariant::Nvidia => SksTemplateVariant::Nvidia,
    }
}

#[derive(Clone)]
struct Cached<T> {
    value: T,
    fetched_at: i64,
}

/// Resolves NodeClass templates with a TTL cache (keyed by version and variant).
pub struct TemplateResolver {
    client: exoscale::Client,
    versions: Arc<dyn KubernetesVersionSource>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    templates: Mutex<HashMap<(String, SksTemplateVariant), Cached<String>>>,
    control_plane_version: Mutex<Option<Cached<String>>>,
}

impl TemplateResolver {
    pub fn new(
        client: exoscale::Client,
        versions: Arc<dyn KubernetesVersionSource>,
        clock: Arc<dyn Clock>,
        ttl: Duration,
    ) -> Self {
        TemplateResolver {
            client,
            versions,
            clock,
            ttl,
            templates: Mutex::new(HashMap::new()),
            control_plane_version: Mutex::new(None),
        }
    }

    fn fresh<T: Clone>(&self, cached: Option<&Cached<T>>) -> Option<T> {
        let now = self.clock.now_unix();
        cached
            .filter(|c| now.saturating_sub(c.fetched_at) < self.ttl.as_secs() as i64)
            .map(|c| c.value.clone())
    }

    /// The control plane's version, cached.
    pub async fn control_plane_version(&self) -> Result<String, TemplateError> {
        if let Some(v) = self.fresh(self.control_plane_version.lock().expect("lock").as_ref()) {
            return Ok(v);
        }
        let raw = self
            .versions
            .git_version()
            .await
            .map_err(TemplateError::VersionDetection)?;
        let version = parse_kubernetes_version(&raw)?;
        *self.control_plane_version.lock().expect("lock") = Some(Cached {
            value: version.clone(),
            fetched_at: self.clock.now_unix(),
        });
        Ok(version)
    }

    /// The template the NodeClass wants now.
    pub async fn resolve(
        &self,
        nodeclass: &ExoscaleNodeClass,
    ) -> Result<ResolvedTemplate, TemplateError> {
        if let Some(id) = nodeclass
            .spec
            .template_id
            .as_deref()
            .filter(|s| !s.is_empty())
        {
            return Ok(ResolvedTemplate {
                id: id.to_string(),
                kubernetes_version: None,
            });
        }
        let Some(selector) = &nodeclass.spec.image_template_selector else {
            return Err(TemplateError::NotSpecified(
                nodeclass.metadata.name.clone().unwrap_or_default(),
            ));
        };
        let version = match selector.version.as_deref().filter(|v| !v.is_empty()) {
            Some(v) => parse_kubernetes_version(v)?,
            None => self.control_plane_version().await?,
        };
        let variant = sks_variant(selector.variant);
        let key = (version.clone(), variant);
        if let Some(id) = self.fresh(self.templates.lock().expect("lock").get(&key)) {
            return Ok(ResolvedTemplate {
                id,
                kubernetes_version: Some(version),
            });
        }
        let id = self
            .client
            .get_sks_template(&version, variant)
            .await
            .map_err(|source| TemplateError::Lookup {
                version: version.clone(),
                variant: variant.as_str(),
                source: Box::new(source),
            })?;
        self.templates.lock().expect("lock").insert(
            key,
            Cached {
                value: id.clone(),
                fetched_at: self.clock.now_unix(),
            },
        );
        Ok(ResolvedTemplate {
            id,
            kubernetes_version: Some(version),
        })
    }

    /// Resolves and checks that the template exists and is usable (`GET /template/{id}`):
    /// what the NodeClass controller's `TemplateResolved` condition reports.
    pub async fn resolve_and_verify(
        &self,
        nodeclass: &ExoscaleNodeClass,
    ) -> Result<ResolvedTemplate, TemplateError> {
        let resolved = self.resolve(nodeclass).await?;
        self.client
            .get_template(&resolved.id)
            .await
            .map_err(|source| TemplateError::Inaccessible {
                id: resolved.id.clone(),
                source: Box::new(source),
            })?;
        Ok(resolved)
    }

    /// Forgets cached results (e.g. after the NodeClass changed).
    pub fn invalidate(&self) {
        self.templates.lock().expect("lock").clear();
        *self.control_plane_version.lock().expect("lock") = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_extracted_like_the_go_provider() {
        assert_eq!(parse_kubernetes_version("v1.27.3").unwrap(), "1.27.3");
        assert_eq!(parse_kubernetes_version("1.28.0").unwrap(), "1.28.0");
        assert_eq!(parse_kubernetes_version("v1.26.5+k3s1").unwrap(), "1.26.5");
        assert_eq!(
            parse_kubernetes_version("v1.34.1-eks-1234").unwrap(),
            "1.34.1"
        );
        for bad in ["invalid", "", "v1.33", "1", "v.1.2"] {
            let e = parse_kubernetes_version(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
