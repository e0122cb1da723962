//! Well-known label, annotation, taint and finalizer keys shared with upstream Karpenter and the
//! Go Exoscale provider. Changing any value here breaks wire compatibility.

/// API group of the Karpenter core CRDs.
pub const KARPENTER_GROUP: &str = "karpenter.sh";
/// API group of the Exoscale NodeClass.
pub const EXOSCALE_GROUP: &str = "karpenter.exoscale.com";

// --- labels written by the core -------------------------------------------------------------
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
pub const CAPACITY_TYPE_LABEL: &str = "karpenter.sh/capacity-type";
pub const NODE_REGISTERED_LABEL: &str = "karpenter.sh/registered";
pub const NODE_INITIALIZED_LABEL: &str = "karpenter.sh/initialized";
pub const DO_NOT_SYNC_TAINTS_LABEL: &str = "karpenter.sh/do-not-sync-taints";
pub const NODE_EXCLUDE_FROM_LB_LABEL: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// Label linking a NodeClaim/Node to its ExoscaleNodeClass: `<group>/<lowercase kind>`.
pub const NODECLASS_LABEL: &str = "karpenter.exoscale.com/exoscalenodeclass";

// --- Kubernetes well-known labels -----------------------------------------------------------
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const WINDOWS_BUILD_LABEL: &str = "node.kubernetes.io/windows-build";

// --- Exoscale instance-type labels ----------------------------------------------------------
pub const INSTANCE_FAMILY_LABEL: &str = "karpenter.exoscale.com/instance-family";
pub const INSTANCE_SIZE_LABEL: &str = "karpenter.exoscale.com/instance-size";
pub const INSTANCE_CPU_LABEL: &str = "karpenter.exoscale.com/instance-cpu";
pub const INSTANCE_MEMORY_LABEL: &str = "karpenter.exoscale.com/instance-memory";
pub const INSTANCE_GPU_COUNT_LABEL: &str = "karpenter.exoscale.com/instance-gpu-count";
pub const INSTANCE_GPU_MODEL_LABEL: &str = "karpenter.exoscale.com/instance-gpu-model";
/// Aliases used by the Go provider; kept so existing NodePools keep selecting the same types.
pub const LEGACY_INSTANCE_FAMILY_LABEL: &str = "exoscale.com/instance-family";
pub const LEGACY_INSTANCE_SIZE_LABEL: &str = "exoscale.com/instance-size";
pub const LEGACY_GPU_COUNT_LABEL: &str = "karpenter.sh/instance-gpu-count";
pub const LEGACY_ACCELERATOR_LABEL: &str = "karpenter.sh/instance-accelerator";

// --- labels written on Exoscale instances ---------------------------------------------------
pub const INSTANCE_MANAGED_BY_LABEL: &str = "exoscale.com/managed-by";
pub const INSTANCE_MANAGED_BY_VALUE: &str = "karpenter";
pub const INSTANCE_CLUSTER_ID_LABEL: &str = "exoscale.com/cluster-id";
pub const INSTANCE_NODECLAIM_LABEL: &str = "exoscale.com/node-claim";
pub const INSTANCE_NODEPOOL_LABEL: &str = "exoscale.com/nodepool-name";
/// The UID of the cluster's `kube-system` Namespace: proof that an instance is this cluster's
/// that no setting can get wrong (the cluster-id label comes from configuration).
pub const INSTANCE_CLUSTER_UID_LABEL: &str = "exoscale.com/cluster-uid";

// --- bootstrap-token Secret bookkeeping (Go provider compatible) ---------------------------
pub const BOOTSTRAP_TOKEN_ANNOTATION: &str = "exoscale.com/bootstrap-token";
/// On a NodeClaim: the bootstrap-token Secrets issued for it, comma-separated. Tokens are found
/// by these names only (the controller may not list Secrets).
pub const NODECLAIM_TOKENS_ANNOTATION: &str = "karpenter.exoscale.com/bootstrap-token-secrets";
pub const TOKEN_CREATED_ANNOTATION: &str = "exoscale.com/token-created";
pub const TOKEN_PROVIDER_LABEL: &str = "exoscale.com/token-provider";
pub const TOKEN_PROVIDER_VALUE: &str = "karpenter-exoscale";
pub const TOKEN_NODE_REGISTERED_ANNOTATION: &str = "exoscale.com/node-registered";

// --- annotations -----------------------------------------------------------------------------
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
pub const NODEPOOL_HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";
pub const NODEPOOL_HASH_VERSION_ANNOTATION: &str = "karpenter.sh/nodepool-hash-version";
/// Bumped whenever the drift hash changes in a way that would drift every node.
pub const NODEPOOL_HASH_VERSION: &str = "v3";
pub const NODECLASS_HASH_ANNOTATION: &str = "karpenter.exoscale.com/nodeclass-hash";
pub const NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION: &str =
    "karpenter.sh/nodeclaim-termination-timestamp";
pub const NODECLAIM_MIN_VALUES_RELAXED_ANNOTATION: &str =
    "karpenter.sh/nodeclaim-min-values-relaxed";
pub const PRICE_OVERLAY_APPLIED_ANNOTATION: &str = "karpenter.sh/price-overlay-applied";
pub const CAPACITY_OVERLAY_APPLIED_ANNOTATION: &str = "karpenter.sh/capacity-overlay-applied";
pub const PROVIDER_COMPATIBILITY_ANNOTATION: &str = "compatibility.karpenter.sh/provider";

// --- finalizers ------------------------------------------------------------------------------
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";
pub const NODECLASS_FINALIZER: &str = "exoscale.com/nodeclass-finalizer";

// --- taints ----------------------------------------------------------------------------------
pub const UNREGISTERED_TAINT_KEY: &str = "karpenter.sh/unregistered";
pub const DISRUPTED_TAINT_KEY: &str = "karpenter.sh/disrupted";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

// --- capacity types and architectures --------------------------------------------------------
pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";
pub const CAPACITY_TYPE_SPOT: &str = "spot";
pub const CAPACITY_TYPE_RESERVED: &str = "reserved";
pub const ARCH_AMD64: &str = "amd64";
pub const ARCH_ARM64: &str = "arm64";

/// Labels that may appear in requirements without any NodePool defining them.
pub const WELL_KNOWN_LABELS: &[&str] = &[
    NODEPOOL_LABEL,
    ZONE_LABEL,
    REGION_LABEL,
    INSTANCE_TYPE_LABEL,
    ARCH_LABEL,
    OS_LABEL,
    CAPACITY_TYPE_LABEL,
    WINDOWS_BUILD_LABEL,
    INSTANCE_FAMILY_LABEL,
    INSTANCE_SIZE_LABEL,
    INSTANCE_CPU_LABEL,
    INSTANCE_MEMORY_LABEL,
    INSTANCE_GPU_COUNT_LABEL,
    INSTANCE_GPU_MODEL_LABEL,
    LEGACY_INSTANCE_FAMILY_LABEL,
    LEGACY_INSTANCE_SIZE_LABEL,
    LEGACY_GPU_COUNT_LABEL,
    LEGACY_ACCELERATOR_LABEL,
];

/// Deprecated label keys and the keys they are rewritten to before use.
pub const NORMALIZED_LABELS: &[(&str, &str)] = &[
    ("failure-domain.beta.kubernetes.io/zone", ZONE_LABEL),
    ("failure-domain.beta.kubernetes.io/region", REGION_LABEL),
    ("beta.kubernetes.io/arch", ARCH_LABEL),
    ("beta.kubernetes.io/os", OS_LABEL),
    ("beta.kubernetes.io/instance-type", INSTANCE_TYPE_LABEL),
    // The Exoscale block-storage CSI driver's topology key: its volumes are zonal.
    ("topology.csi.exoscale.com/zone", ZONE_LABEL),
];

/// Returns the canonical key for a possibly deprecated label key.
pub fn normalize_label(key: &str) -> &str {
    NORMALIZED_LABELS
        .iter()
        .find(|(old, _)| *old == key)
        .map(|(_, new)| *new)
        .unwrap_or(key)
}

/// A label Karpenter owns: users may not set it in templates or requirements.
pub fn is_restricted_label(key: &str) -> bool {
    if key == HOSTNAME_LABEL {
        return true;
    }
    let domain = key.split_once('/').map(|(d, _)| d).unwrap_or("");
    let karpenter_domain = domain == "karpenter.sh" || domain.ends_with(".karpenter.sh");
    karpenter_domain && !WELL_KNOWN_LABELS.contains(&key)
}

/// Longest label value and qualified-name name part (Kubernetes `validation.LabelValueMaxLength`).
const LABEL_NAME_MAX: usize = 63;
/// Longest DNS-1123 subdomain, the optional prefix of a qualified name.
const DNS_SUBDOMAIN_MAX: usize = 253;

const NAME_CHARSET: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`: the name part of a key, or a non-empty value.
fn is_label_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Lowercase RFC 1123 subdomain: dot-separated `[a-z0-9]([-a-z0-9]*[a-z0-9])?` parts.
fn is_dns_subdomain(text: &str) -> bool {
    text.split('.').all(|part| {
        let bytes = part.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
            }
            _ => false,
        }
    })
}

/// Checks a label key is a qualified name (Kubernetes `IsQualifiedName`): an optional DNS
/// subdomain prefix and '/', then a name. `Err` says every way it is not.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((_, name)) if name.contains('/') => {
            return Err(format!(
                "a qualified name is an optional DNS subdomain prefix and '/', then a name that {NAME_CHARSET}"
            ));
        }
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let mut problems = Vec::new();
    match prefix {
        Some("") => problems.push("prefix part must be non-empty".to_string()),
        Some(prefix) if prefix.len() > DNS_SUBDOMAIN_MAX => problems.push(format!(
            "prefix part must be no more than {DNS_SUBDOMAIN_MAX} characters"
        )),
        Some(prefix) if !is_dns_subdomain(prefix) => problems.push(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".to_string(),
        ),
        _ => {}
    }
    if name.is_empty() {
        problems.push("name part must be non-empty".to_string());
    } else {
        if name.len() > LABEL_NAME_MAX {
            problems.push(format!(
                "name part must be no more than {LABEL_NAME_MAX} characters"
            ));
        }
        if !is_label_name(name) {
            problems.push(format!("name part {NAME_CHARSET}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join(", "))
    }
}

/// Checks a label value (Kubernetes `IsValidLabelValue`): empty, or a name of at most 63
/// characters.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    if value.len() > LABEL_NAME_MAX {
        problems.push(format!("must be no more than {LABEL_NAME_MAX} characters"));
    }
    if !value.is_empty() && !is_label_name(value) {
        problems.push(format!(
            "a valid label must be an empty string or {NAME_CHARSET}"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join(", "))
    }
}

/// Condition types shared by the CRDs.
pub mod conditions {
    pub const READY: &str = "Ready";
    // NodeClaim
    pub const LAUNCHED: &str = "Launched";
    pub const REGISTERED: &str = "Registered";
    pub const INITIALIZED: &str = "Initialized";
    pub const CONSOLIDATABLE: &str = "Consolidatable";
    pub const DRIFTED: &str = "Drifted";
    pub const DRAINED: &str = "Drained";
    pub const VOLUMES_DETACHED: &str = "VolumesDetached";
    pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
    pub const CONSISTENT_STATE_FOUND: &str = "ConsistentStateFound";
    pub const DISRUPTION_REASON: &str = "DisruptionReason";
    // NodeClaim condition reasons
    pub const DRAINING_REASON: &str = "Draining";
    pub const AWAITING_VOLUME_DETACHMENT_REASON: &str = "AwaitingVolumeDetachment";
    pub const TERMINATION_GRACE_PERIOD_ELAPSED_REASON: &str = "TerminationGracePeriodElapsed";
    // NodePool
    pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
    pub const NODECLASS_READY: &str = "NodeClassReady";
    pub const NODE_REGISTRATION_HEALTHY: &str = "NodeRegistrationHealthy";
    // ExoscaleNodeClass
    pub const TEMPLATE_RESOLVED: &str = "TemplateResolved";
    pub const SECURITY_GROUPS_RESOLVED: &str = "SecurityGroupsResolved";
    pub const ANTI_AFFINITY_GROUPS_RESOLVED: &str = "AntiAffinityGroupsResolved";
    pub const PRIVATE_NETWORKS_RESOLVED: &str = "PrivateNetworksResolved";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricted_labels_follow_upstream_rules() {
        assert!(is_restricted_label("kubernetes.io/hostname"));
        assert!(is_restricted_label("karpenter.sh/foo"));
        assert!(is_restricted_label("sub.karpenter.sh/foo"));
        assert!(!is_restricted_label("karpenter.sh/capacity-type"));
        assert!(!is_restricted_label("team.example.com/owner"));
        assert!(!is_restricted_label("notkarpenter.shx/a"));
    }

    #[test]
    fn label_keys_must_be_qualified_names() {
        let name63 = "a".repeat(63);
        let prefix253 = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        for ok in [
            "app",
            "App_Name.v-1",
            "team.example.com/owner",
            "kubernetes.io/arch",
            "x/Y",
            name63.as_str(),
            &format!("{prefix253}/{name63}"),
        ] {
            assert_eq!(validate_label_key(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "name part must be non-empty"),
            ("team/", "name part must be non-empty"),
            ("/owner", "prefix part must be non-empty"),
            ("a/b/c", "a qualified name"),
            ("-app", "name part must consist"),
            ("app_", "name part must consist"),
            ("app name", "name part must consist"),
            ("Team.example.com/owner", "lowercase RFC 1123"),
            ("team..example.com/owner", "lowercase RFC 1123"),
            ("team_x.com/owner", "lowercase RFC 1123"),
            ("é", "name part must consist"),
        ] {
            let err = validate_label_key(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let long_name = "a".repeat(64);
        assert!(
            validate_label_key(&long_name)
                .unwrap_err()
                .contains("no more than 63")
        );
        let long_prefix = format!("{}/a", "a".repeat(254));
        assert!(
            validate_label_key(&long_prefix)
                .unwrap_err()
                .contains("no more than 253")
        );
    }

    #[test]
    fn label_values_are_empty_or_short_names() {
        for ok in ["", "a", "on-demand", "v1.2_3", &"z".repeat(63)] {
            assert_eq!(validate_label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-a", "a.", "a b", "a/b", "é"] {
            assert!(validate_label_value(bad).is_err(), "{bad}");
        }
        assert!(
            validate_label_value(&"z".repeat(64))
                .unwrap_err()
                .contains("no more than 63")
        );
    }

    #[test]
    fn deprecated_labels_are_normalized() {
        assert_eq!(normalize_label("beta.kubernetes.io/arch"), ARCH_LABEL);
        assert_eq!(
            normalize_label("failure-domain.beta.kubernetes.io/zone"),
            ZONE_LABEL
        );
        assert_eq!(normalize_label("custom/key"), "custom/key");
    }
}
