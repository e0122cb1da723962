//! `karpenter-exoscale doctor`: checks configuration, credentials, zone, instance types, the
//! SKS cluster, its node templates and NodeClass references against the configured endpoint.
//! Each check prints one line with ✓/✗ and, on failure, a fix hint.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::exoscale::models::SksTemplateVariant;
use crate::exoscale::{ApiSecret, Client, ClientConfig, Credentials, Endpoint, Error, RetryPolicy};

pub const ENV_API_KEY: &str = "EXOSCALE_API_KEY";
pub const ENV_API_SECRET: &str = "EXOSCALE_API_SECRET";
pub const ENV_ZONE: &str = "EXOSCALE_ZONE";
pub const ENV_SKS_CLUSTER_ID: &str = "EXOSCALE_SKS_CLUSTER_ID";
pub const ENV_API_ENDPOINT: &str = "EXOSCALE_API_ENDPOINT";
pub const ENV_API_ENVIRONMENT: &str = "EXOSCALE_API_ENVIRONMENT";
pub const ENV_KUBECONFIG: &str = "KUBECONFIG";
pub const ENV_CLUSTER_ENDPOINT: &str = "CLUSTER_ENDPOINT";

/// Required variables that are unset or empty, all of them at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing required environment variables: {}", .missing.join(", "))]
pub struct MissingEnv {
    pub missing: Vec<&'static str>,
}

/// What a NodeClass refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    SecurityGroup,
    PrivateNetwork,
    AntiAffinityGroup,
}

impl RefKind {
    fn label(self) -> &'static str {
        match self {
            RefKind::SecurityGroup => "security group",
            RefKind::PrivateNetwork => "private network",
            RefKind::AntiAffinityGroup => "anti-affinity group",
        }
    }
}

/// One selector term of an ExoscaleNodeClass to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeClassRef {
    pub nodeclass: String,
    pub kind: RefKind,
    pub id_or_name: String,
}

/// The configuration `doctor` checks; plain data so callers and tests can build it directly.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    pub api_key: String,
    pub api_secret: ApiSecret,
    pub zone: String,
    pub sks_cluster_id: String,
    pub api_endpoint: Option<String>,
    pub api_environment: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// `CLUSTER_ENDPOINT`: compared with the SKS cluster's endpoint (a different one suggests
    /// `EXOSCALE_SKS_CLUSTER_ID` names another cluster).
    pub cluster_endpoint: Option<String>,
    /// `None` when the NodeClasses could not be read (no reachable cluster): the check is
    /// skipped with a note. `Some` (even empty) when they were read.
    pub nodeclass_refs: Option<Vec<NodeClassRef>>,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

impl DoctorConfig {
    pub fn from_env() -> Result<DoctorConfig, MissingEnv> {
        DoctorConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup`; empty values count as unset.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<DoctorConfig, MissingEnv> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut missing = Vec::new();
        let mut required = |name: &'static str| {
            let value = get(name);
            if value.is_none() {
                missing.push(name);
            }
            value.unwrap_or_default()
        };
        let api_key = required(ENV_API_KEY);
        let api_secret = required(ENV_API_SECRET);
        let zone = required(ENV_ZONE);
        let sks_cluster_id = required(ENV_SKS_CLUSTER_ID);
        if !missing.is_empty() {
            return Err(MissingEnv { missing });
        }
        Ok(DoctorConfig {
            api_key,
            api_secret: ApiSecret::new(api_secret),
            zone,
            sks_cluster_id,
            api_endpoint: get(ENV_API_ENDPOINT),
            api_environment: get(ENV_API_ENVIRONMENT),
            kubeconfig: get(ENV_KUBECONFIG).map(PathBuf::from),
            cluster_endpoint: get(ENV_CLUSTER_ENDPOINT),
            nodeclass_refs: None,
            request_timeout: Duration::from_secs(15),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckStatus {
    Pass,
    Fail,
    /// Not run: a prerequisite failed or the input is unavailable.
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    pub hint: Option<String>,
}

impl CheckResult {
    fn pass(name: impl Into<String>, detail: impl Into<String>) -> Self {
        CheckResult {
            name: name.into(),
            status: CheckStatus::Pass,
            detail: detail.into(),
            hint: None,
        }
    }

    fn fail(name: impl Into<String>, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        CheckResult {
            name: name.into(),
            status: CheckStatus::Fail,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }

    fn skip(name: impl Into<String>, detail: impl Into<String>) -> Self {
        CheckResult {
            name: name.into(),
            status: CheckStatus::Skip,
            detail: detail.into(),
            hint: None,
        }
    }

    /// One line: `✓ name: detail`, `✗ name: detail — fix: hint`, `- name: skipped: detail`.
    pub fn line(&self) -> String {
        match self.status {
            CheckStatus::Pass => format!("✓ {}: {}", self.name, self.detail),
            CheckStatus::Fail => match &self.hint {
                Some(hint) => format!("✗ {}: {} — fix: {}", self.name, self.detail, hint),
                None => format!("✗ {}: {}", self.name, self.detail),
            },
            CheckStatus::Skip => format!("- {}: skipped: {}", self.name, self.detail),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoctorReport {
    pub checks: Vec<CheckResult>,
}

impl DoctorReport {
    /// True when no check failed (skips with a note do not fail the run).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != CheckStatus::Fail)
    }

    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    fn push(&mut self, result: CheckResult) -> bool {
        let passed = result.status == CheckStatus::Pass;
        self.checks.push(result);
        passed
    }
}

fn credentials_hint(err: &Error) -> String {
    match err {
        Error::Unauthorized { .. } => format!(
            "check {ENV_API_KEY} and {ENV_API_SECRET} (a key of this organisation with compute and SKS access; the secret is shown once at key creation)"
        ),
        Error::Transport { .. } | Error::Timeout { .. } => format!(
            "check network access to the endpoint, or {ENV_API_ENDPOINT} / {ENV_API_ENVIRONMENT}"
        ),
        _ => "retry later; if it persists, check the Exoscale status page".to_string(),
    }
}

/// Runs every check and collects the results.
pub async fn check(cfg: &DoctorConfig) -> DoctorReport {
    let mut report = DoctorReport::default();
    let endpoint = match Endpoint::resolve(
        &cfg.zone,
        cfg.api_endpoint.as_deref(),
        cfg.api_environment.as_deref(),
    ) {
        Ok(e) => e,
        Err(e) => {
            report.push(CheckResult::fail(
                "endpoint",
                e.to_string(),
                format!("fix {ENV_ZONE}, {ENV_API_ENDPOINT} or {ENV_API_ENVIRONMENT}"),
            ));
            return report;
        }
    };
    report.push(CheckResult::pass("endpoint", endpoint.to_string()));

    let mut config = ClientConfig::new(
        endpoint.clone(),
        Credentials {
            key: cfg.api_key.clone(),
            secret: cfg.api_secret.clone(),
        },
    );
    config.request_timeout = cfg.request_timeout;
    config.retry = RetryPolicy {
        max_attempts: 2,
        base_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(1),
        max_retry_after: Duration::from_secs(5),
    };
    let client = match Client::new(config) {
        Ok(c) => c,
        Err(e) => {
            report.push(CheckResult::fail(
                "credentials",
                e.to_string(),
                "report this as a bug",
            ));
            return report;
        }
    };

    // Credentials: a signed GET /zone.
    let zones = match client.list_zones().await {
        Ok(zones) => {
            report.push(CheckResult::pass(
                "credentials",
                format!("signed GET /zone accepted (key {})", cfg.api_key),
            ));
            Some(zones)
        }
        Err(e) => {
            let hint = credentials_hint(&e);
            report.push(CheckResult::fail("credentials", e.to_string(), hint));
            None
        }
    };
    let Some(zones) = zones else {
        for name in dependent_checks() {
            report.push(CheckResult::skip(name, "needs valid credentials"));
        }
        return report;
    };

    let zone_ok = match zones.iter().find(|z| z.name == cfg.zone) {
        Some(_) => report.push(CheckResult::pass("zone", format!("{} exists", cfg.zone))),
        None => report.push(CheckResult::fail(
            "zone",
            format!(
                "zone {:?} is not listed by GET /zone (known: {})",
                cfg.zone,
                zones
                    .iter()
                    .map(|z| z.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!("set {ENV_ZONE} to the zone of the SKS cluster"),
        )),
    };

    if zone_ok {
        report.push(match client.list_instance_types().await {
            Ok(types) => {
                let usable: Vec<String> = types
                    .iter()
                    .filter(|t| t.authorized && t.zones.iter().any(|z| z == &cfg.zone))
                    .map(|t| t.name())
                    .collect();
                if usable.is_empty() {
                    CheckResult::fail(
                        "instance-types",
                        format!(
                            "no authorized instance type in {} ({} listed)",
                            cfg.zone,
                            types.len()
                        ),
                        "ask Exoscale support to authorize instance types for this organisation",
                    )
                } else {
                    CheckResult::pass(
                        "instance-types",
                        format!("{} authorized types in {}", usable.len(), cfg.zone),
                    )
                }
            }
            Err(e) => CheckResult::fail(
                "instance-types",
                e.to_string(),
                "the API key needs read access to compute instance types",
            ),
        });
    } else {
        report.push(CheckResult::skip("instance-types", "needs a valid zone"));
    }

    let version = match client.get_sks_cluster(&cfg.sks_cluster_id).await {
        Ok(cluster) => {
            report.push(endpoint_check(
                cfg.cluster_endpoint.as_deref(),
                cluster.endpoint.as_deref(),
            ));
            report.push(CheckResult::pass(
                "sks-cluster",
                format!(
                    "{} ({}) Kubernetes {}{}",
                    cluster.name,
                    cluster.id,
                    cluster.version,
                    cluster.state.map(|s| format!(", {s}")).unwrap_or_default()
                ),
            ));
            Some(patch_version(&cluster.version))
        }
        Err(e) => {
            let hint = if e.is_not_found() || matches!(e, Error::InvalidRequest(_)) {
                format!(
                    "set {ENV_SKS_CLUSTER_ID} to the id of an SKS cluster in {} (`exo compute sks list`)",
                    cfg.zone
                )
            } else {
                credentials_hint(&e)
            };
            report.push(CheckResult::fail("sks-cluster", e.to_string(), hint));
            None
        }
    };

    for variant in [SksTemplateVariant::Standard, SksTemplateVariant::Nvidia] {
        let name = format!("sks-template {}", variant.as_str());
        let Some(version) = &version else {
            report.push(CheckResult::skip(name, "needs the SKS cluster's version"));
            continue;
        };
        let result = match client.get_sks_template(version, variant).await {
            Ok(id) => match client.get_template(&id).await {
                Ok(t) => CheckResult::pass(
                    name,
                    format!("Kubernetes {version} → {} ({})", t.name, t.id),
                ),
                Err(e) => CheckResult::fail(
                    name,
                    format!("active template {id} for {version} cannot be read: {e}"),
                    "set templateID in the ExoscaleNodeClass, or retry later",
                ),
            },
            Err(e) => CheckResult::fail(
                name,
                format!(
                    "no active {} template for Kubernetes {version}: {e}",
                    variant.as_str()
                ),
                "upgrade the SKS cluster to a supported version, or set imageTemplateSelector.version / templateID",
            ),
        };
        report.push(result);
    }

    check_nodeclass_refs(&client, cfg, &mut report).await;
    report
}

/// `CLUSTER_ENDPOINT` against the SKS cluster's endpoint (the run command logs the same).
fn endpoint_check(configured: Option<&str>, actual: Option<&str>) -> CheckResult {
    const NAME: &str = "cluster-endpoint";
    match (configured, actual) {
        (None, _) => CheckResult::skip(NAME, format!("{ENV_CLUSTER_ENDPOINT} is not set")),
        (Some(_), None) => CheckResult::skip(NAME, "the SKS cluster reports no endpoint"),
        (Some(c), Some(a)) if crate::operator::run::same_endpoint(c, a) => {
            CheckResult::pass(NAME, format!("{c} is the SKS cluster's endpoint"))
        }
        (Some(c), Some(a)) => CheckResult::fail(
            NAME,
            format!("{ENV_CLUSTER_ENDPOINT} is {c} but the SKS cluster's endpoint is {a}"),
            format!(
                "check that {ENV_SKS_CLUSTER_ID} names this cluster; nodes join {ENV_CLUSTER_ENDPOINT}"
            ),
        ),
    }
}

fn dependent_checks() -> [&'static str; 7] {
    [
        "zone",
        "instance-types",
        "sks-cluster",
        "cluster-endpoint",
        "sks-template standard",
        "sks-template nvidia",
        "nodeclasses",
    ]
}

async fn check_nodeclass_refs(client: &Client, cfg: &DoctorConfig, report: &mut DoctorReport) {
    let Some(refs) = &cfg.nodeclass_refs else {
        let why = match &cfg.kubeconfig {
            Some(path) => format!("the cluster at {} was not reachable", path.display()),
            None => format!("no cluster reachable ({ENV_KUBECONFIG} unset)"),
        };
        report.push(CheckResult::skip(
            "nodeclasses",
            format!("{why}; NodeClass references not checked"),
        ));
        return;
    };
    if refs.is_empty() {
        report.push(CheckResult::pass(
            "nodeclasses",
            "no NodeClass references to resolve",
        ));
        return;
    }
    for r in refs {
        let name = format!(
            "nodeclass {} {} {}",
            r.nodeclass,
            r.kind.label(),
            r.id_or_name
        );
        let resolved = match r.kind {
            RefKind::SecurityGroup => client
                .resolve_security_group(&r.id_or_name)
                .await
                .map(|g| format!("{} ({})", g.name, g.id)),
            RefKind::PrivateNetwork => client
                .resolve_private_network(&r.id_or_name)
                .await
                .map(|g| format!("{} ({})", g.name, g.id)),
            RefKind::AntiAffinityGroup => client
                .resolve_anti_affinity_group(&r.id_or_name)
                .await
                .map(|g| format!("{} ({}), {}/8 members", g.name, g.id, g.member_count())),
        };
        report.push(match resolved {
            Ok(detail) => CheckResult::pass(name, detail),
            Err(e) => CheckResult::fail(
                name,
                e.to_string(),
                format!(
                    "create the {} in {} or fix the ExoscaleNodeClass {}",
                    r.kind.label(),
                    cfg.zone,
                    r.nodeclass
                ),
            ),
        });
    }
}

/// `v1.34.1+build` or `1.34.1-exo.1` → `1.34.1`.
fn patch_version(version: &str) -> String {
    let v = version.trim().trim_start_matches('v');
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    v[..end].trim_end_matches('.').to_string()
}

/// Runs the checks, writes one line per check to `out`, and returns true when none failed.
pub async fn run(cfg: &DoctorConfig, out: &mut impl Write) -> bool {
    let report = check(cfg).await;
    for c in &report.checks {
        let _ = writeln!(out, "{}", c.line());
    }
    let passed = report.passed();
    let failed = report
        .checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .count();
    let _ = if passed {
        writeln!(out, "all checks passed")
    } else {
        writeln!(out, "{failed} check(s) failed")
    };
    passed
}

/// The security groups, private networks and anti-affinity groups the NodeClasses name, by ID
/// (deprecated lists and `id` terms) or by name.
pub fn refs_from_nodeclasses(classes: &[crate::apis::ExoscaleNodeClass]) -> Vec<NodeClassRef> {
    use crate::apis::nodeclass::SelectorTerm;
    let mut refs = Vec::new();
    for class in classes {
        let nodeclass = class.metadata.name.clone().unwrap_or_default();
        let spec = &class.spec;
        let groups: [(RefKind, &[String], &[SelectorTerm]); 3] = [
            (
                RefKind::SecurityGroup,
                &spec.security_groups,
                &spec.security_group_selector_terms,
            ),
            (
                RefKind::PrivateNetwork,
                &spec.private_networks,
                &spec.private_network_selector_terms,
            ),
            (
                RefKind::AntiAffinityGroup,
                &spec.anti_affinity_groups,
                &spec.anti_affinity_group_selector_terms,
            ),
        ];
        for (kind, ids, terms) in groups {
            let terms = terms
                .iter()
                .filter_map(|t| t.id.clone().or_else(|| t.name.clone()));
            for id_or_name in ids.iter().cloned().chain(terms) {
                refs.push(NodeClassRef {
                    nodeclass: nodeclass.clone(),
                    kind,
                    id_or_name,
                });
            }
        }
    }
    refs
}

/// Reads the ExoscaleNodeClasses from the cluster in KUBECONFIG (or in-cluster), bounded in time.
pub async fn read_nodeclass_refs(timeout: Duration) -> Result<Vec<NodeClassRef>, String> {
    let list = async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| e.to_string())?;
        let api: kube::Api<crate::apis::ExoscaleNodeClass> = kube::Api::all(client);
        api.list(&Default::default())
            .await
            .map_err(|e| e.to_string())
    };
    let classes = tokio::time::timeout(timeout, list)
        .await
        .map_err(|_| format!("no answer from the cluster within {}s", timeout.as_secs()))??;
    Ok(refs_from_nodeclasses(&classes.items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn all_missing_variables_are_reported_at_once() {
        let env: HashMap<&str, &str> =
            HashMap::from([(ENV_ZONE, "ch-gva-2"), (ENV_API_SECRET, "  ")]);
        let err = DoctorConfig::from_lookup(|n| env.get(n).map(|v| v.to_string())).unwrap_err();
        assert_eq!(
            err.missing,
            vec![ENV_API_KEY, ENV_API_SECRET, ENV_SKS_CLUSTER_ID]
        );
        assert_eq!(
            err.to_string(),
            "missing required environment variables: EXOSCALE_API_KEY, EXOSCALE_API_SECRET, EXOSCALE_SKS_CLUSTER_ID"
        );
    }

    #[test]
    fn optional_variables_are_read_and_the_secret_is_hidden() {
        let env: HashMap<&str, &str> = HashMap::from([
            (ENV_API_KEY, "EXOabc"),
            (ENV_API_SECRET, "shh-secret"),
            (ENV_ZONE, "de-fra-1"),
            (ENV_SKS_CLUSTER_ID, "c1"),
            (ENV_API_ENVIRONMENT, "ppapi"),
            (ENV_KUBECONFIG, "/tmp/kc"),
        ]);
        let cfg = DoctorConfig::from_lookup(|n| env.get(n).map(|v| v.to_string())).unwrap();
        assert_eq!(cfg.api_environment.as_deref(), Some("ppapi"));
        assert_eq!(cfg.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(cfg.api_endpoint, None);
        assert!(!format!("{cfg:?}").contains("shh-secret"));
    }

    #[test]
    fn versions_are_cut_to_patch() {
        assert_eq!(patch_version("v1.34.1+exo"), "1.34.1");
        assert_eq!(patch_version("1.33.5-rc.1"), "1.33.5");
        assert_eq!(patch_version("1.34.1"), "1.34.1");
    }

    #[test]
    fn lines_carry_marks_and_hints() {
        assert_eq!(CheckResult::pass("zone", "ok").line(), "✓ zone: ok");
        assert_eq!(
            CheckResult::fail("zone", "bad", "set it").line(),
            "✗ zone: bad — fix: set it"
        );
        assert_eq!(CheckResult::skip("x", "why").line(), "- x: skipped: why");
    }
}
