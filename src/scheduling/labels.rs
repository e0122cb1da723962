//! Well-known label keys and the aliases Kubernetes still accepts for them.

use std::collections::HashSet;

pub const NODE_POOL: &str = "karpenter.sh/nodepool";
pub const CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const REGION: &str = "topology.kubernetes.io/region";
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
pub const ARCH: &str = "kubernetes.io/arch";
pub const OS: &str = "kubernetes.io/os";
pub const WINDOWS_BUILD: &str = "node.kubernetes.io/windows-build";
pub const HOSTNAME: &str = "kubernetes.io/hostname";

pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";
pub const CAPACITY_TYPE_SPOT: &str = "spot";
pub const CAPACITY_TYPE_RESERVED: &str = "reserved";

/// Upstream's `WellKnownLabels`: keys a pod may require even when no NodePool defines them.
pub const CORE_WELL_KNOWN: [&str; 8] = [
    NODE_POOL,
    ZONE,
    REGION,
    INSTANCE_TYPE,
    ARCH,
    OS,
    CAPACITY_TYPE,
    WINDOWS_BUILD,
];

/// Rewrites deprecated aliases to the stable key (`failure-domain.beta.kubernetes.io/zone` → zone…);
/// the table lives with the other label keys in `apis::labels`.
pub fn normalize_key(key: &str) -> &str {
    crate::apis::labels::normalize_label(key)
}

/// The set of well-known label keys: the core ones plus any a cloud provider adds.
#[derive(Debug, Clone)]
pub struct WellKnownLabels {
    keys: HashSet<String>,
}

impl Default for WellKnownLabels {
    fn default() -> Self {
        Self::with_provider_labels(std::iter::empty::<String>())
    }
}

impl WellKnownLabels {
    pub fn with_provider_labels(extra: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let mut keys: HashSet<String> = CORE_WELL_KNOWN.iter().map(|k| k.to_string()).collect();
        keys.extend(extra.into_iter().map(Into::into));
        Self { keys }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }
}
