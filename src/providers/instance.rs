//! Exoscale instances owned by this cluster: provider IDs, names and ownership labels, an
//! idempotent launch (adopts an instance created by an earlier attempt), private-network
//! attachment with rollback, O(1)-call listing and idempotent deletion.

use thiserror::Error;

use crate::apis::labels::{
    INSTANCE_CLUSTER_ID_LABEL, INSTANCE_CLUSTER_UID_LABEL, INSTANCE_MANAGED_BY_LABEL,
    INSTANCE_MANAGED_BY_VALUE, INSTANCE_NODECLAIM_LABEL, INSTANCE_NODEPOOL_LABEL,
};
pub use crate::cloudprovider::Ownership;
use crate::exoscale::models::{CreateInstanceRequest, IdRef, Instance, InstanceState, Labels};
use crate::exoscale::{self, InstanceFilter};

pub const PROVIDER_ID_PREFIX: &str = "exoscale://";

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProviderIdError {
    #[error("provider ID {0:?} must start with exoscale://")]
    Prefix(String),
    #[error("provider ID {0:?} is missing the instance ID")]
    Missing(String),
    #[error("provider ID {0:?}: instance ID must be a lowercase UUID")]
    NotUuid(String),
}

pub fn provider_id(instance_id: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{instance_id}")
}

/// `exoscale://<lowercase uuid>` → the instance ID.
pub fn parse_provider_id(value: &str) -> Result<&str, ProviderIdError> {
    let id = value
        .strip_prefix(PROVIDER_ID_PREFIX)
        .ok_or_else(|| ProviderIdError::Prefix(value.to_string()))?;
    if id.is_empty() {
        return Err(ProviderIdError::Missing(value.to_string()));
    }
    if !crate::exoscale::models::is_canonical_uuid(id) {
        return Err(ProviderIdError::NotUuid(value.to_string()));
    }
    Ok(id)
}

/// Instance (and Node) name: the prefix then the NodeClaim name, no separator (Go provider).
pub fn instance_name(prefix: &str, nodeclaim: &str) -> String {
    format!("{prefix}{nodeclaim}")
}

/// Who this cluster is: the configured SKS cluster ID (`EXOSCALE_SKS_CLUSTER_ID`, shared by
/// every instance Karpenter launched for that ID — and so by another cluster if the setting is
/// wrong) and the `kube-system` Namespace UID (this cluster's alone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterIdentity {
    pub cluster_id: String,
    pub uid: String,
}

impl ClusterIdentity {
    pub fn new(cluster_id: impl Into<String>, uid: impl Into<String>) -> Self {
        ClusterIdentity {
            cluster_id: cluster_id.into(),
            uid: uid.into(),
        }
    }

    /// The labels every instance we launch carries.
    pub fn labels(&self, nodeclaim: &str, nodepool: Option<&str>) -> Labels {
        let mut labels = Labels::from([
            (
                INSTANCE_MANAGED_BY_LABEL.to_string(),
                INSTANCE_MANAGED_BY_VALUE.to_string(),
            ),
            (
                INSTANCE_CLUSTER_ID_LABEL.to_string(),
                self.cluster_id.clone(),
            ),
            (INSTANCE_CLUSTER_UID_LABEL.to_string(), self.uid.clone()),
            (INSTANCE_NODECLAIM_LABEL.to_string(), nodeclaim.to_string()),
        ]);
        if let Some(pool) = nodepool.filter(|p| !p.is_empty()) {
            labels.insert(INSTANCE_NODEPOOL_LABEL.to_string(), pool.to_string());
        }
        labels
    }

    /// Instances Karpenter manages under our cluster ID (ours, unproven, or another cluster's
    /// sharing the ID: [`ClusterIdentity::ownership`] tells them apart).
    ///
    /// The ID is written in its canonical spelling; the Go provider writes it as configured,
    /// so an instance it launched under `EXOSCALE_SKS_CLUSTER_ID` typed in upper case, braced
    /// or without hyphens is ours too.
    pub fn cluster_filter(&self) -> InstanceFilter {
        let managed =
            InstanceFilter::labels([(INSTANCE_MANAGED_BY_LABEL, INSTANCE_MANAGED_BY_VALUE)]);
        match uuid::Uuid::try_parse(&self.cluster_id) {
            Ok(id) => managed.with_uuid_label(INSTANCE_CLUSTER_ID_LABEL, id),
            Err(_) => {
                let mut f = managed;
                f.labels.insert(
                    INSTANCE_CLUSTER_ID_LABEL.to_string(),
                    self.cluster_id.clone(),
                );
                f
            }
        }
    }

    /// The instance of one NodeClaim of *this* cluster (UID included: a create never adopts
    /// another cluster's instance of the same name).
    pub fn nodeclaim_filter(&self, nodeclaim: &str) -> InstanceFilter {
        let mut f = self.cluster_filter();
        f.labels
            .insert(INSTANCE_CLUSTER_UID_LABEL.to_string(), self.uid.clone());
        f.labels
            .insert(INSTANCE_NODECLAIM_LABEL.to_string(), nodeclaim.to_string());
        f
    }

    /// Judges an instance by its UID label.
    pub fn ownership(&self, labels: &Labels) -> Ownership {
        match labels.get(INSTANCE_CLUSTER_UID_LABEL) {
            Some(uid) if *uid == self.uid => Ownership::Proven,
            Some(_) => Ownership::Foreign,
            None => Ownership::Unproven,
        }
    }
}

/// Whether `instance` was launched for the NodeClaim `nodeclaim`: its NodeClaim label names
/// it (every instance this provider or the Go provider launched carries one) or, without that
/// label, its name does (`<prefix><nodeclaim>`, or the NodeClaim a listed instance stands in
/// for is named after it). A provider ID alone is not proof: a create answer naming another
/// instance, or an ID edited by hand, would make another VM "this NodeClaim's instance".
pub fn launched_for(instance: &Instance, nodeclaim: &str, prefix: &str) -> bool {
    // A stand-in named after the instance (a Node's teardown without its NodeClaim, GC) is
    // the instance's by name whatever its label says.
    instance.name == nodeclaim
        || match instance.labels.get(INSTANCE_NODECLAIM_LABEL) {
            Some(label) => label == nodeclaim,
            None => instance.name == instance_name(prefix, nodeclaim),
        }
}

/// Not being torn down.
pub fn is_live(instance: &Instance) -> bool {
    !matches!(
        instance.state,
        InstanceState::Destroying | InstanceState::Destroyed | InstanceState::Expunging
    )
}

/// Failures that mean "this offering cannot be had now": quota, capacity, a full anti-affinity
/// group, or a type not authorized / not offered in the zone. The core then tries another type.
pub fn is_capacity_failure(err: &exoscale::Error) -> bool {
    if err.is_capacity_error() {
        return true;
    }
    match err {
        exoscale::Error::BadRequest { message, .. }
        | exoscale::Error::Unauthorized { message, .. }
        | exoscale::Error::OperationFailed { message, .. } => {
            let m = message.to_ascii_lowercase();
            (m.contains("instance type") || m.contains("instance-type"))
                && (m.contains("not authorized") || m.contains("not available"))
                || m.contains("anti-affinity group") && m.contains("full")
        }
        _ => false,
    }
}

/// Everything one launch needs, already resolved. Debug leaves out the user data (it carries
/// the bootstrap token).
#[derive(Clone)]
pub struct LaunchSpec {
    pub nodeclaim: String,
    pub nodepool: Option<String>,
    pub name: String,
    pub instance_type_id: String,
    pub template_id: String,
    pub disk_size: u64,
    pub user_data: String,
    pub security_groups: Vec<String>,
    pub anti_affinity_groups: Vec<String>,
    pub private_networks: Vec<String>,
}

impl std::fmt::Debug for LaunchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchSpec")
            .field("nodeclaim", &self.nodeclaim)
            .field("nodepool", &self.nodepool)
            .field("name", &self.name)
            .field("instance_type_id", &self.instance_type_id)
            .field("template_id", &self.template_id)
            .field("disk_size", &self.disk_size)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .field("security_groups", &self.security_groups)
            .field("anti_affinity_groups", &self.anti_affinity_groups)
            .field("private_networks", &self.private_networks)
            .finish()
    }
}

#[derive(Debug, Error)]
pub enum LaunchError {
    /// The create failed for capacity (quota, capacity, full anti-affinity group, type): the
    /// API refused it, its operation failed, or a 5xx named capacity and a lookup found
    /// nothing. Only the last two may have left an instance, and nothing adopts it: the
    /// NodeClaim is deleted at once (its teardown or GC deletes such an instance).
    #[error("no capacity: {0}")]
    Capacity(exoscale::Error),
    /// The create was refused outright (validation, permissions, rate limit, fenced): no
    /// instance exists.
    #[error("instance creation refused: {0}")]
    Refused(exoscale::Error),
    /// Anything else, including an outcome-unknown create: an instance may exist.
    #[error("cannot create instance: {0}")]
    Api(exoscale::Error),
    #[error(
        "failed to attach private network {network} to instance {instance}: {source}{}",
        rollback_note(.rollback)
    )]
    PrivateNetwork {
        instance: String,
        network: String,
        source: exoscale::Error,
        /// The error of deleting the half-built instance, if that failed too.
        rollback: Option<exoscale::Error>,
    },
}

impl LaunchError {
    /// Whether the launch's bootstrap token may go now. Only a launch whose instance the
    /// NodeClaim's next launch may adopt keeps it, for that instance to join: an
    /// outcome-unknown create, or a half-built instance whose rollback failed. A capacity
    /// failure gives it up: nothing adopts what it may have left, which then cannot join.
    pub fn gives_up_token(&self) -> bool {
        match self {
            LaunchError::Capacity(_) | LaunchError::Refused(_) => true,
            LaunchError::PrivateNetwork { rollback, .. } => rollback.is_none(),
            LaunchError::Api(_) => false,
        }
    }

    pub fn is_capacity(&self) -> bool {
        matches!(self, LaunchError::Capacity(_))
    }
}

/// Errors of a create request that prove nothing was created: the API refused it, or it was
/// never sent.
fn create_refused(err: &exoscale::Error) -> bool {
    use exoscale::Error as E;
    match err {
        E::BadRequest { .. }
        | E::Unauthorized { .. }
        | E::NotFound { .. }
        | E::QuotaExceeded { .. }
        | E::RateLimited { .. }
        | E::UnknownZone { .. }
        | E::InvalidRequest(_)
        | E::Fenced(_) => true,
        // A server error is no proof the server did nothing.
        E::InsufficientCapacity { status, .. } => *status < 500,
        E::Transport { connect, .. } => *connect,
        _ => false,
    }
}

/// A failed create request: capacity (refused, or a 5xx naming it), other refusals (no
/// instance), or anything else (an instance may exist).
fn classify_create(err: exoscale::Error) -> LaunchError {
    if is_capacity_failure(&err) {
        LaunchError::Capacity(err)
    } else if create_refused(&err) {
        LaunchError::Refused(err)
    } else {
        LaunchError::Api(err)
    }
}

fn rollback_note(rollback: &Option<exoscale::Error>) -> String {
    match rollback {
        Some(e) => {
            format!(" (and deleting the instance failed: {e}; garbage collection will retry)")
        }
        None => " (instance deleted)".to_string(),
    }
}

/// The result of a launch.
#[derive(Clone, Debug)]
pub struct Launched {
    pub instance: Instance,
    /// True when an instance of an earlier attempt was found and reused.
    pub adopted: bool,
}

/// Outcome of a delete request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Termination requested or in progress.
    Deleting,
    /// The instance no longer exists.
    Gone,
}

/// Instance operations scoped to one cluster.
#[derive(Clone, Debug)]
pub struct InstanceProvider {
    client: exoscale::Client,
    identity: ClusterIdentity,
}

impl InstanceProvider {
    pub fn new(client: exoscale::Client, identity: ClusterIdentity) -> Self {
        InstanceProvider { client, identity }
    }

    pub fn client(&self) -> &exoscale::Client {
        &self.client
    }

    pub fn identity(&self) -> &ClusterIdentity {
        &self.identity
    }

    /// The live instance of `nodeclaim`, if one exists (one list call).
    pub async fn find_for_nodeclaim(
        &self,
        nodeclaim: &str,
    ) -> Result<Option<Instance>, exoscale::Error> {
        self.client
            .find_instance(&self.identity.nodeclaim_filter(nodeclaim))
            .await
    }

    /// Creates the instance, then attaches the private networks it lacks. The caller has made
    /// sure no instance of the NodeClaim exists ([`Self::find_for_nodeclaim`], or it created the
    /// NodeClaim and never launched it): no lookup comes first, only after a create whose
    /// outcome is unknown (then the instance that create made is adopted). Returns once the
    /// instance ID exists, without reading the instance back; only when private networks are
    /// wanted does it wait for the create operation and read it (they need a created VM).
    pub async fn launch(&self, spec: &LaunchSpec) -> Result<Launched, LaunchError> {
        let mut req =
            CreateInstanceRequest::new(&spec.instance_type_id, &spec.template_id, spec.disk_size);
        req.name = Some(spec.name.clone());
        req.labels = self
            .identity
            .labels(&spec.nodeclaim, spec.nodepool.as_deref());
        req.user_data = Some(spec.user_data.clone().into());
        req.security_groups = spec.security_groups.iter().map(IdRef::new).collect();
        req.anti_affinity_groups = spec.anti_affinity_groups.iter().map(IdRef::new).collect();
        let identity = self.identity.nodeclaim_filter(&spec.nodeclaim);
        let created = self
            .client
            .create_instance_known_new(&req, &identity)
            .await
            .map_err(classify_create)?;
        // An answer whose operation already failed is a failure, whatever it names (a
        // capacity failure then marks the offering unavailable); no call is made for it.
        let failed = |op: &&exoscale::models::Operation| {
            matches!(
                op.state,
                exoscale::models::OperationState::Failure
                    | exoscale::models::OperationState::Timeout
            )
        };
        if let Some(op) = created.operation.as_ref().filter(failed) {
            self.client.wait_operation(op).await.map_err(classify)?;
        }
        if spec.private_networks.is_empty() {
            // The create's answer says all a launch needs (ID, type, template, labels): the
            // happy path is one call, and the instance's progress is the registration's job.
            return Ok(Launched {
                instance: created.instance,
                adopted: created.adopted,
            });
        }
        if let Some(op) = &created.operation {
            self.client.wait_operation(op).await.map_err(classify)?;
        }
        // Attaching networks needs the instance as it is now (which networks it already has).
        let instance = self
            .client
            .get_instance(&created.instance.id)
            .await
            .map_err(LaunchError::Api)?;
        // Read back, the instance must be the one this create made: a network attached to
        // (and on failure the rollback deleting) another would act on a VM not ours.
        if !identity.matches(&instance) {
            return Err(LaunchError::Api(exoscale::Error::Decode {
                what: "create-instance operation".into(),
                message: format!(
                    "the create answer named instance {}, which does not carry NodeClaim {}'s labels; nothing is done to it",
                    instance.id, spec.nodeclaim
                ),
            }));
        }
        let instance = self
            .ensure_private_networks(instance, &spec.private_networks)
            .await?;
        Ok(Launched {
            instance,
            adopted: created.adopted,
        })
    }

    /// Attaches the wanted networks the instance lacks; on failure deletes the instance so no
    /// half-configured node joins the cluster.
    pub async fn ensure_private_networks(
        &self,
        instance: Instance,
        wanted: &[String],
    ) -> Result<Instance, LaunchError> {
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|pn| !instance.private_networks.iter().any(|p| &p.id == *pn))
            .collect();
        if missing.is_empty() {
            return Ok(instance);
        }
        for network in missing {
            let attached = async {
                let op = self
                    .client
                    .attach_instance_to_private_network(network, &instance.id, None)
                    .await?;
                self.client.wait_operation(&op).await
            }
            .await;
            if let Err(source) = attached {
                let rollback = self.delete(&instance.id).await.err();
                return Err(LaunchError::PrivateNetwork {
                    instance: instance.id.clone(),
                    network: network.clone(),
                    source,
                    rollback,
                });
            }
        }
        self.client
            .get_instance(&instance.id)
            .await
            .map_err(LaunchError::Api)
    }

    pub async fn get(&self, id: &str) -> Result<Instance, exoscale::Error> {
        self.client.get_instance(id).await
    }

    /// Every instance under our cluster ID, live or terminating, in one API call (including
    /// ones whose [`ClusterIdentity::ownership`] is not proven).
    pub async fn list(&self) -> Result<Vec<Instance>, exoscale::Error> {
        self.client
            .list_instances(&self.identity.cluster_filter())
            .await
    }

    /// Requests termination without waiting for it; `Gone` once the instance no longer exists.
    pub async fn delete(&self, id: &str) -> Result<DeleteOutcome, exoscale::Error> {
        match self.client.get_instance(id).await {
            Err(e) if e.is_not_found() => Ok(DeleteOutcome::Gone),
            Err(e) => Err(e),
            Ok(instance) => self.delete_read(&instance).await,
        }
    }

    /// [`Self::delete`] of an instance the caller has just read: its state decides, so a
    /// termination being polled costs one GET a pass, not two.
    pub async fn delete_read(&self, instance: &Instance) -> Result<DeleteOutcome, exoscale::Error> {
        match instance.state {
            InstanceState::Destroyed | InstanceState::Expunging => {
                return Ok(DeleteOutcome::Gone);
            }
            InstanceState::Destroying => return Ok(DeleteOutcome::Deleting),
            _ => {}
        }
        let id = &instance.id;
        match self.client.delete_instance(id).await {
            Ok(_) => Ok(DeleteOutcome::Deleting),
            Err(e) if e.is_not_found() => Ok(DeleteOutcome::Gone),
            // Someone else started the deletion between our GET and DELETE.
            Err(exoscale::Error::BadRequest { status: 409, .. }) => Ok(DeleteOutcome::Deleting),
            Err(e) => Err(e),
        }
    }

    /// Writes `labels` as the instance's labels and waits for the update.
    pub async fn set_labels(&self, id: &str, labels: &Labels) -> Result<(), exoscale::Error> {
        let op = self.client.update_instance_labels(id, labels).await?;
        self.client.wait_operation(&op).await.map(|_| ())
    }
}

/// A failure after the create was accepted: the instance may exist.
fn classify(err: exoscale::Error) -> LaunchError {
    if is_capacity_failure(&err) {
        LaunchError::Capacity(err)
    } else {
        LaunchError::Api(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip_and_bad_ones_are_named() {
        let id = "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11";
        assert_eq!(parse_provider_id(&provider_id(id)).unwrap(), id);
        assert!(matches!(
            parse_provider_id("aws:///i-123"),
            Err(ProviderIdError::Prefix(_))
        ));
        assert!(matches!(
            parse_provider_id("exoscale://"),
            Err(ProviderIdError::Missing(_))
        ));
        assert!(matches!(
            parse_provider_id("exoscale://instance-123"),
            Err(ProviderIdError::NotUuid(_))
        ));
        assert!(matches!(
            parse_provider_id("exoscale://6A7A4F0E-3E0C-4C3B-9D58-3F1F1F0C2B11"),
            Err(ProviderIdError::NotUuid(_))
        ));
        assert!(parse_provider_id("").is_err());
    }

    fn identity() -> ClusterIdentity {
        ClusterIdentity::new("cluster-1", "uid-1")
    }

    #[test]
    fn labels_are_the_go_labels_plus_the_cluster_uid() {
        let l = identity().labels("default-abc", Some("default"));
        assert_eq!(
            l,
            Labels::from([
                (
                    "exoscale.com/managed-by".to_string(),
                    "karpenter".to_string()
                ),
                (
                    "exoscale.com/cluster-id".to_string(),
                    "cluster-1".to_string()
                ),
                ("exoscale.com/cluster-uid".to_string(), "uid-1".to_string()),
                (
                    "exoscale.com/node-claim".to_string(),
                    "default-abc".to_string()
                ),
                (
                    "exoscale.com/nodepool-name".to_string(),
                    "default".to_string()
                ),
            ])
        );
        assert_eq!(identity().labels("n", None).len(), 4);
        assert_eq!(instance_name("", "default-abc"), "default-abc");
        assert_eq!(instance_name("karpenter-", "x"), "karpenter-x");
    }

    fn instance_with(labels: Labels) -> Instance {
        serde_json::from_value(serde_json::json!({
            "id": "i", "name": "n", "state": "running",
            "instance-type": {"id": "t"}, "template": {"id": "tpl"},
            "labels": labels,
        }))
        .unwrap()
    }

    #[test]
    fn filters_never_match_another_cluster() {
        let mut i = instance_with(identity().labels("nc", None));
        assert!(identity().cluster_filter().matches(&i));
        assert!(identity().nodeclaim_filter("nc").matches(&i));
        let other_id = ClusterIdentity::new("c2", "uid-1");
        assert!(!other_id.cluster_filter().matches(&i));
        assert!(!identity().nodeclaim_filter("other").matches(&i));
        // Same (wrongly configured) cluster ID, another cluster's UID: listed under our ID,
        // but never the instance of one of our NodeClaims.
        let twin = ClusterIdentity::new("cluster-1", "uid-2");
        assert!(twin.cluster_filter().matches(&i));
        assert!(!twin.nodeclaim_filter("nc").matches(&i));
        assert!(is_live(&i));
        i.state = InstanceState::Destroying;
        assert!(!is_live(&i));
    }

    #[test]
    fn the_go_providers_spelling_of_the_cluster_id_is_ours_too() {
        let id = "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11";
        let us = ClusterIdentity::new(id, "uid-1");
        let written_by_go = |spelling: &str| {
            let mut labels = us.labels("nc", None);
            labels.insert(INSTANCE_CLUSTER_ID_LABEL.into(), spelling.into());
            labels.remove(INSTANCE_CLUSTER_UID_LABEL);
            instance_with(labels)
        };
        for spelling in [
            id.to_string(),
            id.to_uppercase(),
            format!("{{{id}}}"),
            id.replace('-', ""),
            format!("urn:uuid:{id}"),
        ] {
            assert!(
                us.cluster_filter().matches(&written_by_go(&spelling)),
                "{spelling}"
            );
        }
        for other in [
            "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b12",
            "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b1",
            "",
        ] {
            assert!(
                !us.cluster_filter().matches(&written_by_go(other)),
                "{other}"
            );
        }
        let mut unlabelled = us.labels("nc", None);
        unlabelled.remove(INSTANCE_CLUSTER_ID_LABEL);
        assert!(!us.cluster_filter().matches(&instance_with(unlabelled)));
    }

    #[test]
    fn ownership_is_proven_only_by_our_uid() {
        let ours = identity().labels("nc", None);
        assert_eq!(identity().ownership(&ours), Ownership::Proven);
        let theirs = ClusterIdentity::new("cluster-1", "uid-2").labels("nc", None);
        assert_eq!(identity().ownership(&theirs), Ownership::Foreign);
        let mut legacy = ours.clone();
        legacy.remove(INSTANCE_CLUSTER_UID_LABEL);
        assert_eq!(identity().ownership(&legacy), Ownership::Unproven);
        assert!(
            !identity()
                .nodeclaim_filter("nc")
                .matches(&instance_with(legacy)),
            "a create never adopts an instance without our UID"
        );
    }

    #[test]
    fn an_instance_is_a_nodeclaims_only_by_its_label_or_name() {
        let ours = instance_with(identity().labels("nc", None));
        assert!(launched_for(&ours, "nc", "karpenter-"));
        assert!(
            !launched_for(&ours, "other", "karpenter-"),
            "labelled for another"
        );
        let mut unlabelled = instance_with(Labels::new());
        unlabelled.name = "karpenter-nc".into();
        assert!(launched_for(&unlabelled, "nc", "karpenter-"));
        assert!(!launched_for(&unlabelled, "other", "karpenter-"));
        unlabelled.name = "database-1".into();
        assert!(!launched_for(&unlabelled, "nc", "karpenter-"), "a stranger");
        assert!(
            launched_for(&unlabelled, "database-1", "karpenter-"),
            "GC's stand-in"
        );
    }

    #[test]
    fn launch_spec_debug_hides_the_user_data() {
        let spec = LaunchSpec {
            nodeclaim: "nc".into(),
            nodepool: None,
            name: "nc".into(),
            instance_type_id: "t".into(),
            template_id: "tpl".into(),
            disk_size: 50,
            user_data: "H4sIAAAAsecretsecret".into(),
            security_groups: vec![],
            anti_affinity_groups: vec![],
            private_networks: vec![],
        };
        let debug = format!("{spec:?}");
        assert!(!debug.contains("secretsecret"), "{debug}");
        assert!(debug.contains("<20 bytes>"), "{debug}");
    }

    #[test]
    fn capacity_failures_are_recognised() {
        let bad = |m: &str| exoscale::Error::BadRequest {
            status: 400,
            message: m.into(),
        };
        assert!(is_capacity_failure(&bad(
            "Instance type gpua30.small is not authorized for this organization"
        )));
        assert!(is_capacity_failure(&bad(
            "Instance type gpu3.small is not available in zone ch-gva-2"
        )));
        assert!(is_capacity_failure(&bad(
            "Anti-affinity group spread is full (8 instances max)"
        )));
        assert!(is_capacity_failure(&exoscale::Error::QuotaExceeded {
            status: 403,
            message: "Quota exceeded".into()
        }));
        assert!(!is_capacity_failure(&bad("Invalid template")));
        assert!(!is_capacity_failure(&exoscale::Error::Server {
            status: 500,
            message: "boom".into()
        }));
    }
}
