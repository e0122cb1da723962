//! The Kubernetes permissions the controller needs, one entry per API call site family.
//!
//! This table is the single statement of least privilege: `tests/chart.rs` checks that the Helm
//! chart grants exactly these rules, and that a scan of `src/` finds an API call for every rule
//! and a rule for every API call. Adding a call without a rule (or the reverse) fails that test.

/// Where a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every namespace and cluster-scoped objects (a ClusterRole).
    Cluster,
    /// One fixed namespace (a Role there).
    Namespace(&'static str),
    /// The namespace the controller is installed in (a Role there).
    ReleaseNamespace,
}

/// What a rule names: an API resource (with its group) or a non-resource URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// `group` is empty for the core API; `resource` is the plural, with `/subresource`.
    Resource {
        group: &'static str,
        resource: &'static str,
    },
    NonResourceUrl(&'static str),
}

/// A resourceName restriction that comes from configuration rather than a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResourceName {
    Fixed(&'static str),
    /// `LEADER_ELECTION_NAME` (the chart's `settings.leaderElectionName`).
    LeaderElectionLease,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    pub target: Target,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    /// Empty: any object.
    pub resource_names: &'static [ResourceName],
    /// Which code needs it.
    pub reason: &'static str,
}

const fn resource(group: &'static str, resource: &'static str) -> Target {
    Target::Resource { group, resource }
}

const KARPENTER: &str = "karpenter.sh";
const EXOSCALE: &str = "karpenter.exoscale.com";

/// Every permission the binary (the `run` controllers and `doctor`) uses.
pub const PERMISSIONS: &[Permission] = &[
    Permission {
        target: resource(KARPENTER, "nodepools"),
        verbs: &["list", "watch", "patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "cluster state and the NodePool controller watch NodePools; hash annotations",
    },
    Permission {
        target: resource(KARPENTER, "nodepools/status"),
        verbs: &["patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "NodePool readiness and resource counts",
    },
    Permission {
        target: resource(KARPENTER, "nodeclaims"),
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "provisioning creates, lifecycle/termination/GC/repair finalize and delete, disruption re-reads before acting",
    },
    Permission {
        target: resource(KARPENTER, "nodeclaims/status"),
        verbs: &["patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "NodeClaim launch/registration/initialization conditions",
    },
    Permission {
        target: resource(KARPENTER, "nodeoverlays"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "the cluster state watches NodeOverlays; the provider applies them to instance types",
    },
    Permission {
        target: resource(KARPENTER, "nodeoverlays/status"),
        verbs: &["patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "NodeOverlay ValidationSucceeded and Ready conditions",
    },
    Permission {
        target: resource(EXOSCALE, "exoscalenodeclasses"),
        verbs: &["list", "watch", "patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "the provider's NodeClass watch (launches, NodePool readiness), NodeClass controller (finalizer), doctor",
    },
    Permission {
        target: resource(EXOSCALE, "exoscalenodeclasses/status"),
        verbs: &["patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "resolved template, security groups, networks and conditions",
    },
    Permission {
        target: resource("", "nodes"),
        verbs: &["get", "list", "watch", "patch", "delete"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "registration sync, disruption taints (read fresh before patching), termination finalizer, deletion",
    },
    Permission {
        target: resource("", "pods"),
        verbs: &["list", "watch", "delete"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "scheduling input; draining deletes pods still running when the node's \
                 termination grace period is up",
    },
    Permission {
        target: resource("", "pods/eviction"),
        verbs: &["create"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "draining respects PodDisruptionBudgets through the Eviction API",
    },
    Permission {
        target: resource("storage.k8s.io", "volumeattachments"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "cluster state watches VolumeAttachments: termination waits for the node's volumes to be detached before deleting the instance",
    },
    Permission {
        target: resource("apps", "daemonsets"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "daemonset overhead of new nodes",
    },
    Permission {
        target: resource("policy", "poddisruptionbudgets"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "cluster state tracks PDBs for disruption decisions",
    },
    Permission {
        target: resource("", "persistentvolumeclaims"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "pending pods' claims are checked before a node is launched for them; termination does not wait for volumes of pods the drain leaves in place",
    },
    Permission {
        target: resource("", "persistentvolumes"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "a bound volume's node affinity narrows the node a pod gets",
    },
    Permission {
        target: resource("storage.k8s.io", "storageclasses"),
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "binding mode and allowed topologies of unbound claims",
    },
    Permission {
        target: resource("events.k8s.io", "events"),
        verbs: &["create", "patch"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "events on pods (any namespace) and cluster-scoped objects (in default)",
    },
    Permission {
        target: resource("", "secrets"),
        verbs: &["create", "delete"],
        scope: Scope::Namespace("kube-system"),
        resource_names: &[],
        reason: "bootstrap-token Secrets for joining nodes, deleted by the names recorded on NodeClaims (never listed or read: list would return every kube-system Secret)",
    },
    Permission {
        target: resource("", "configmaps"),
        verbs: &["get"],
        scope: Scope::Namespace("kube-public"),
        resource_names: &[ResourceName::Fixed("cluster-info")],
        reason: "the cluster CA written into node user data",
    },
    Permission {
        target: resource("", "configmaps"),
        verbs: &["get"],
        scope: Scope::Namespace("kube-system"),
        resource_names: &[ResourceName::Fixed("kube-root-ca.crt")],
        reason: "the cluster CA where a cluster publishes no cluster-info (the Go provider's fallback)",
    },
    Permission {
        target: resource("coordination.k8s.io", "leases"),
        verbs: &["create"],
        scope: Scope::ReleaseNamespace,
        resource_names: &[],
        reason: "leader election creates its Lease (create cannot be limited by name)",
    },
    Permission {
        target: resource("coordination.k8s.io", "leases"),
        verbs: &["get", "update"],
        scope: Scope::ReleaseNamespace,
        resource_names: &[ResourceName::LeaderElectionLease],
        reason: "leader election reads and renews its Lease (update with the read resourceVersion)",
    },
    Permission {
        target: resource("", "namespaces"),
        verbs: &["get"],
        scope: Scope::Cluster,
        resource_names: &[ResourceName::Fixed("kube-system")],
        reason: "the kube-system Namespace UID is the cluster identity every launched instance carries",
    },
    Permission {
        target: Target::NonResourceUrl("/version"),
        verbs: &["get"],
        scope: Scope::Cluster,
        resource_names: &[],
        reason: "the Kubernetes version picks the SKS node template",
    },
];

/// Every (target, verb, scope) the table grants, one per verb.
pub fn grants() -> Vec<(Target, &'static str, Scope)> {
    PERMISSIONS
        .iter()
        .flat_map(|p| p.verbs.iter().map(move |verb| (p.target, *verb, p.scope)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_only_restrict_verbs_that_take_a_name() {
        for p in PERMISSIONS.iter().filter(|p| !p.resource_names.is_empty()) {
            for verb in p.verbs {
                assert!(
                    !["create", "list", "watch", "deletecollection"].contains(verb),
                    "{:?}: Kubernetes cannot restrict {verb} by resourceName",
                    p.target
                );
            }
        }
    }

    #[test]
    fn each_grant_is_declared_once() {
        let mut seen = std::collections::BTreeSet::new();
        for grant in grants() {
            assert!(seen.insert(grant), "{grant:?} is declared twice");
        }
    }
}
