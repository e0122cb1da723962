//! What one cluster's Exoscale provider is configured with (the Go provider's environment
//! variables, read by `operator::config`).

/// The NodeClass kind this provider serves.
pub const NODECLASS_KIND: &str = "ExoscaleNodeClass";

/// Settings of one cluster, from the Go provider's environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExoscaleSettings {
    /// `EXOSCALE_ZONE`.
    pub zone: String,
    /// `EXOSCALE_SKS_CLUSTER_ID`.
    pub cluster_id: String,
    /// The UID of the cluster's `kube-system` Namespace (see [`ClusterIdentity`]).
    pub cluster_uid: String,
    /// `EXOSCALE_COMPUTE_INSTANCE_PREFIX` (default empty).
    pub instance_prefix: String,
    /// `CLUSTER_ENDPOINT`: the apiserver URL new nodes use.
    pub cluster_endpoint: String,
    /// `CLUSTER_DOMAIN` (default `cluster.local`).
    pub cluster_domain: String,
    /// How long a bootstrap token stays valid ([`crate::providers::bootstrap_token::token_ttl`]:
    /// launch timeout + registration TTL + a margin), so a node that may still register can
    /// still authenticate.
    pub bootstrap_token_ttl: std::time::Duration,
}
