//! The Exoscale cloud provider: glues NodeClass lookup, instance types and prices, template
//! resolution, bootstrap tokens, user data and instances into the [`CloudProvider`] contract.
//!
//! Kubernetes access is behind two small traits ([`NodeClassSource`], [`NodeBootstrap`], in
//! `cluster`) so the provider runs against the simulated cloud and in-memory doubles in tests.
//! `settings` holds the configuration, `mapping` the instance ↔ NodeClaim translation.

mod cluster;
#[cfg(any(test, feature = "test-doubles"))]
mod doubles;
mod listed;
mod mapping;
mod settings;

pub use cluster::{
    KubeNodeBootstrap, NodeBootstrap, NodeClassSource, TokenCreateFailure, WatchedNodeClasses,
    recorded_tokens,
};
#[cfg(any(test, feature = "test-doubles"))]
pub use doubles::{InMemoryNodeBootstrap, StaticNodeClasses};
use listed::Lookup;
use mapping::launch_error;
pub use mapping::nodeclaim_from_instance;
pub use settings::{ExoscaleSettings, NODECLASS_KIND};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::apis::labels::{
    EXOSCALE_GROUP, INSTANCE_CLUSTER_UID_LABEL, INSTANCE_NODECLAIM_LABEL,
    NODECLAIM_TOKENS_ANNOTATION, NODECLASS_HASH_ANNOTATION, NODEPOOL_LABEL, conditions,
};
use crate::apis::{
    ConditionStatus, ConditionsExt, ExoscaleNodeClass, NodeClaim, NodeClassReference, NodePool,
};
use crate::clock::Clock;
use crate::exoscale;
use crate::exoscale::models::{Instance, Labels};
use crate::providers::bootstrap_token::{self, TokenOwner};
use crate::providers::drift::{self, DesiredState};
use crate::providers::instance::{
    self, ClusterIdentity, DeleteOutcome, InstanceProvider, LaunchSpec, Ownership, is_live,
    parse_provider_id,
};
use crate::providers::instance_types::{
    self, DiscoveredType, InstanceTypeCatalog, InstanceTypeProvider, to_resource_list,
};
use crate::providers::nodeclass::NodeClassResolver;
use crate::providers::pricing::PriceBook;
use crate::providers::template::{KubernetesVersionSource, TemplateResolver};
use crate::providers::userdata::{self, UserDataInput};
use crate::scheduling::InstanceType;

use super::NodeClassState;
use super::destroyed::DestroyedInstances;
use super::error::reasons;
use super::first_launch::FirstLaunches;
use super::{
    CloudProvider, CloudProviderError, DriftReason, NodeClassKind, RepairPolicy, Result,
    cheapest_offering, default_repair_policies, requests_of, requirements_from_api,
};

/// The Exoscale implementation of the contract.
pub struct ExoscaleCloudProvider {
    settings: ExoscaleSettings,
    nodeclasses: Arc<dyn NodeClassSource>,
    bootstrap: Arc<dyn NodeBootstrap>,
    instances: InstanceProvider,
    instance_types: Arc<InstanceTypeProvider>,
    templates: Arc<TemplateResolver>,
    resolver: Arc<NodeClassResolver>,
    /// Token Secrets this process issued per NodeClaim and not yet recorded on it or deleted.
    issued: std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// NodeClaims the provisioner of this process created: their first launch needs no lookup.
    first_launches: FirstLaunches,
    /// Instances seen destroyed to the end: a teardown's second check needs no read.
    destroyed: DestroyedInstances,
    /// The last list of the cluster's instances, for drift checks.
    listed: tokio::sync::Mutex<listed::ListedInstances>,
    clock: Arc<dyn Clock>,
}

/// Everything [`ExoscaleCloudProvider::new`] needs besides the settings.
pub struct Dependencies {
    pub client: exoscale::Client,
    pub nodeclasses: Arc<dyn NodeClassSource>,
    pub bootstrap: Arc<dyn NodeBootstrap>,
    pub versions: Arc<dyn KubernetesVersionSource>,
    pub clock: Arc<dyn Clock>,
    pub prices: PriceBook,
}

impl ExoscaleCloudProvider {
    /// Builds the provider; call [`ExoscaleCloudProvider::refresh_instance_types`] (and spawn
    /// the periodic refresh on the catalog) before serving.
    pub fn new(settings: ExoscaleSettings, deps: Dependencies) -> Self {
        let catalog = Arc::new(InstanceTypeCatalog::new(
            deps.client.clone(),
            &settings.zone,
        ));
        ExoscaleCloudProvider {
            instances: InstanceProvider::new(
                deps.client.clone(),
                ClusterIdentity::new(&settings.cluster_id, &settings.cluster_uid),
            ),
            instance_types: Arc::new(InstanceTypeProvider::new(
                catalog,
                deps.prices,
                deps.clock.clone(),
            )),
            templates: Arc::new(TemplateResolver::new(
                deps.client.clone(),
                deps.versions,
                deps.clock.clone(),
                crate::providers::template::DEFAULT_TTL,
            )),
            resolver: Arc::new(NodeClassResolver::new(
                deps.client,
                deps.clock.clone(),
                crate::providers::nodeclass::NAME_CACHE_TTL,
            )),
            listed: Default::default(),
            clock: deps.clock,
            settings,
            nodeclasses: deps.nodeclasses,
            bootstrap: deps.bootstrap,
            issued: Default::default(),
            first_launches: FirstLaunches::default(),
            destroyed: DestroyedInstances::default(),
        }
    }

    pub fn settings(&self) -> &ExoscaleSettings {
        &self.settings
    }

    /// Instance operations (garbage collection lists and deletes through these).
    pub fn instances(&self) -> &InstanceProvider {
        &self.instances
    }

    /// Instance types, prices and the unavailable-offering cache.
    pub fn instance_type_provider(&self) -> &Arc<InstanceTypeProvider> {
        &self.instance_types
    }

    /// Template resolution (the NodeClass controller's `TemplateResolved`).
    pub fn templates(&self) -> &Arc<TemplateResolver> {
        &self.templates
    }

    /// Security group / anti-affinity group / private network resolution for NodeClass status.
    pub fn nodeclass_resolver(&self) -> &Arc<NodeClassResolver> {
        &self.resolver
    }

    pub async fn refresh_instance_types(&self) -> Result<usize> {
        self.instance_types
            .catalog()
            .refresh()
            .await
            .map_err(|e| CloudProviderError::Other(e.to_string()))
    }

    /// Starts the periodic instance-type refresh; abort the handle to stop it.
    pub fn spawn_instance_type_refresh(
        &self,
        interval: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        self.instance_types
            .catalog()
            .clone()
            .spawn_refresh(interval)
    }

    fn nodeclass_of(&self, reference: &NodeClassReference) -> Result<ExoscaleNodeClass> {
        if reference.group != EXOSCALE_GROUP || reference.kind != NODECLASS_KIND {
            return Err(CloudProviderError::create(
                reasons::NODECLASS_RESOLUTION_FAILED,
                format!(
                    "nodeClassRef {}/{} is not served by the exoscale provider",
                    reference.group, reference.kind
                ),
            ));
        }
        if !self.nodeclasses.synced() {
            return Err(CloudProviderError::create(
                reasons::NODECLASS_RESOLUTION_FAILED,
                "ExoscaleNodeClasses are not current (not listed yet, or their watch failed and \
                 no new list completed): nothing is launched or judged drifted from them",
            ));
        }
        self.nodeclasses.get(&reference.name).ok_or_else(|| {
            CloudProviderError::create(
                reasons::NODECLASS_RESOLUTION_FAILED,
                format!("ExoscaleNodeClass {:?} not found", reference.name),
            )
        })
    }

    fn ready_nodeclass(&self, reference: &NodeClassReference) -> Result<ExoscaleNodeClass> {
        let nodeclass = self.nodeclass_of(reference)?;
        let ready = nodeclass
            .status
            .as_ref()
            .and_then(|s| s.conditions.get_condition(conditions::READY));
        // Ready for an older spec is not ready: after an edit (other security groups, another
        // template) a launch would use what the status resolved for the old one.
        let resolved_for = ready.and_then(|c| c.observed_generation);
        if let (Some(resolved), Some(current)) = (resolved_for, nodeclass.metadata.generation)
            && resolved != current
        {
            return Err(CloudProviderError::NodeClassNotReady(format!(
                "ExoscaleNodeClass {:?} changed (generation {current}); its status is for generation {resolved}, waiting for it to be resolved again",
                reference.name
            )));
        }
        match ready.map(|c| c.status) {
            Some(ConditionStatus::True) => Ok(nodeclass),
            Some(ConditionStatus::False) => Err(CloudProviderError::NodeClassNotReady(format!(
                "ExoscaleNodeClass {:?}: {}",
                reference.name,
                ready.map(|c| c.message.as_str()).unwrap_or_default()
            ))),
            _ => Err(CloudProviderError::create(
                "NodeClassNotReady",
                format!(
                    "ExoscaleNodeClass {:?} has not been resolved yet",
                    reference.name
                ),
            )),
        }
    }

    fn discovered(&self, instance: &Instance) -> Option<DiscoveredType> {
        self.instance_types
            .catalog()
            .by_id(&instance.instance_type.id)
    }

    /// The NodeClaim view of an instance (Get/List): labels, providerID, imageID, capacity.
    pub fn nodeclaim_from_instance(&self, instance: &Instance) -> NodeClaim {
        nodeclaim_from_instance(
            instance,
            self.discovered(instance).as_ref(),
            &self.settings.zone,
        )
    }

    async fn launch(&self, claim: &NodeClaim, nodeclass: &ExoscaleNodeClass) -> Result<NodeClaim> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let zone = self.settings.zone.clone();
        let nodepool = claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(NODEPOOL_LABEL))
            .cloned();
        let status = nodeclass.status.clone().unwrap_or_default();

        // Adopt an instance an earlier attempt created (its answer lost or our process died),
        // unless this process created the NodeClaim and this is its first attempt.
        let existing = if self.first_launches.take(claim.metadata.uid.as_deref()) {
            None
        } else {
            self.instances
                .find_for_nodeclaim(&name)
                .await
                .map_err(|e| {
                    CloudProviderError::create(reasons::INSTANCE_CREATION_FAILED, e.to_string())
                })?
        };
        if let Some(found) = existing {
            let found = self
                .instances
                .ensure_private_networks(found, &status.private_networks)
                .await
                .map_err(|e| launch_error(e, "", &zone))?;
            return self.launched(claim, nodeclass, &found);
        }

        let reqs = requirements_from_api(&claim.spec.requirements).map_err(|e| {
            CloudProviderError::create(reasons::INSTANCE_TYPE_SELECTION_FAILED, e.to_string())
        })?;
        let requests = requests_of(claim)?;
        // In a block: the whole priced list (~17 KB) is not held across the awaits below, by
        // every launch waiting on the API's rate limit at once.
        let chosen = {
            let types: Vec<Arc<InstanceType>> = self
                .instance_types
                .list(nodeclass)
                .map_err(|e| {
                    CloudProviderError::create(
                        reasons::INSTANCE_TYPE_SELECTION_FAILED,
                        e.to_string(),
                    )
                })?
                .into_iter()
                .map(Arc::new)
                .collect();
            let (chosen, _) = cheapest_offering(&types, &reqs, &requests).ok_or_else(|| {
                CloudProviderError::insufficient_capacity(format!(
                    "no available instance type in {zone} satisfies the NodeClaim's requirements ({reqs}) and requests"
                ))
            })?;
            chosen.name.clone()
        };
        let discovered = self
            .instance_types
            .catalog()
            .by_name(&chosen)
            .ok_or_else(|| {
                CloudProviderError::create(
                    reasons::INSTANCE_TYPE_SELECTION_FAILED,
                    format!("instance type {chosen} disappeared from the catalog"),
                )
            })?;
        let template = self.templates.resolve(nodeclass).await.map_err(|e| {
            CloudProviderError::create(reasons::TEMPLATE_RESOLUTION_FAILED, e.to_string())
        })?;

        let mut node_labels = claim.metadata.labels.clone().unwrap_or_default();
        node_labels.extend(instance_types::labels(&discovered, &zone));
        let ca = self
            .bootstrap
            .cluster_ca()
            .await
            .map_err(|e| CloudProviderError::create(reasons::USER_DATA_GENERATION_FAILED, e))?;
        let owner = TokenOwner {
            name: &name,
            uid: claim.metadata.uid.as_deref(),
        };
        let token = match self.bootstrap.create_token(owner).await {
            Ok(token) => token,
            Err(failure) => {
                if let Some(secret) = &failure.maybe_stored {
                    self.drop_unanswered_token(&name, secret).await;
                }
                return Err(CloudProviderError::create(
                    reasons::BOOTSTRAP_TOKEN_CREATION_FAILED,
                    format!("failed to create bootstrap token: {failure}"),
                ));
            }
        };
        let token_name = token.secret_name();
        self.issued_tokens()
            .entry(name.clone())
            .or_default()
            .insert(token_name.clone());
        let input = UserDataInput {
            api_server: self.settings.cluster_endpoint.clone(),
            bootstrap_token: token,
            cluster_ca_pem: ca,
            cluster_domain: self.settings.cluster_domain.clone(),
            kubelet: nodeclass.kubelet(),
            labels: node_labels,
            taints: claim
                .spec
                .taints
                .iter()
                .chain(&claim.spec.startup_taints)
                .cloned()
                .collect(),
        };
        let user_data = match userdata::render(&input) {
            Ok(u) => u,
            Err(e) => {
                self.forget_issued(&name, &token_name).await;
                return Err(CloudProviderError::create(
                    reasons::USER_DATA_GENERATION_FAILED,
                    e.to_string(),
                ));
            }
        };
        let spec = LaunchSpec {
            nodeclaim: name.clone(),
            nodepool,
            name: instance::instance_name(&self.settings.instance_prefix, &name),
            instance_type_id: discovered.id.clone(),
            template_id: template.id,
            disk_size: nodeclass.spec.disk_size.max(0) as u64,
            user_data,
            security_groups: status.security_groups.clone(),
            anti_affinity_groups: status.anti_affinity_groups.clone(),
            private_networks: status.private_networks.clone(),
        };
        match self.instances.launch(&spec).await {
            Ok(launched) => self.launched(claim, nodeclass, &launched.instance),
            Err(e) => {
                if e.gives_up_token() {
                    self.forget_issued(&name, &token_name).await;
                } else {
                    tracing::warn!(nodeclaim = %name, error = %e, "launch failed with an instance possibly created; keeping its bootstrap token for adoption");
                }
                if e.is_capacity() {
                    self.instance_types
                        .mark_unavailable(&discovered.name(), &zone);
                }
                Err(launch_error(e, &discovered.name(), &zone))
            }
        }
    }

    fn issued_tokens(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeSet<String>>> {
        self.issued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes the one token a failed launch issued (it provably left no instance).
    async fn forget_issued(&self, nodeclaim: &str, secret_name: &str) {
        if let Some(names) = self.issued_tokens().get_mut(nodeclaim) {
            names.remove(secret_name);
        }
        if let Err(e) = self
            .bootstrap
            .delete_tokens(&[secret_name.to_string()])
            .await
        {
            tracing::warn!(nodeclaim, error = %e, "could not delete the bootstrap token of a failed launch; it expires on its own");
        }
    }

    /// A token whose create answer was lost may be stored and valid: it is deleted now. It is
    /// also kept as issued, whether that delete worked or not: the create may be stored only
    /// after the delete (answered 404), so the NodeClaim's next launch records it and its
    /// registration or teardown deletes it again, rather than leaving it valid to its expiry.
    async fn drop_unanswered_token(&self, nodeclaim: &str, secret_name: &str) {
        self.issued_tokens()
            .entry(nodeclaim.to_string())
            .or_default()
            .insert(secret_name.to_string());
        if let Err(e) = self
            .bootstrap
            .delete_tokens(&[secret_name.to_string()])
            .await
        {
            tracing::warn!(nodeclaim, secret = secret_name, error = %e, "could not delete a bootstrap token whose create was not answered; kept on record for the NodeClaim");
        }
    }

    /// Deletes every token of a NodeClaim whose instance is gone: those recorded on it and,
    /// unless its Node registered, those this process issued for it. A launch records every
    /// token issued for the NodeClaim, and a claim only registers once that launch is
    /// written; the bootstrap-token controller then deletes the recorded tokens and only then
    /// drops the record. So a registered claim's issued tokens are either still recorded or
    /// already deleted (deleting them again was one more call per removed node, answered 404).
    ///
    /// A stand-in built from the instance list (garbage collection's view of an orphan, which
    /// has no UID) shares only the name of the NodeClaim its instance was launched for: the
    /// twin of a lost create carries the live claim's name. Its deletion must not take the
    /// tokens that claim's own instance still needs to join.
    async fn forget_tokens(&self, claim: &NodeClaim) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut names = recorded_tokens(claim);
        if claim.metadata.uid.is_some() {
            let issued = self.issued_tokens().remove(&name).unwrap_or_default();
            let registered = claim.condition_is_true(conditions::REGISTERED);
            if !registered {
                names.extend(issued);
            }
        }
        if names.is_empty() {
            return;
        }
        let names: Vec<String> = names.into_iter().collect();
        if let Err(e) = self.bootstrap.delete_tokens(&names).await {
            tracing::warn!(nodeclaim = %name, error = %e, "could not delete the bootstrap tokens of a NodeClaim; they expire on their own");
        }
    }

    /// The NodeClaim `create` returns: the input plus the instance's labels and status.
    fn launched(
        &self,
        claim: &NodeClaim,
        nodeclass: &ExoscaleNodeClass,
        instance: &Instance,
    ) -> Result<NodeClaim> {
        // A provider ID is parsed back only in its one canonical spelling: another (uppercase,
        // braced, from a list answer) would leave a NodeClaim whose finalizer never goes.
        if !exoscale::models::is_canonical_uuid(&instance.id) {
            return Err(CloudProviderError::create(
                reasons::INSTANCE_CREATION_FAILED,
                format!(
                    "the API named the launched instance {:?}, not a lowercase hyphenated UUID",
                    exoscale::error::sanitize_api_text(&instance.id)
                ),
            ));
        }
        let discovered = self.discovered(instance).ok_or_else(|| {
            CloudProviderError::create(
                reasons::INSTANCE_CREATION_FAILED,
                format!(
                    "instance {} has instance type {} that is not usable in {}",
                    instance.id,
                    exoscale::error::sanitize_api_text(&instance.instance_type.id),
                    self.settings.zone
                ),
            )
        })?;
        let it = instance_types::build(
            &discovered,
            nodeclass,
            &self.settings.zone,
            self.instance_types.price(&discovered),
            true,
        )
        .map_err(|e| {
            CloudProviderError::create(reasons::INSTANCE_CREATION_FAILED, e.to_string())
        })?;
        let mut out = claim.clone();
        out.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(instance_types::labels(&discovered, &self.settings.zone));
        let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(
            NODECLASS_HASH_ANNOTATION.to_string(),
            drift::nodeclass_hash(&nodeclass.spec),
        );
        // The tokens issued for it, so they can be deleted by name once the node registered.
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut tokens = recorded_tokens(claim);
        tokens.extend(self.issued_tokens().get(&name).cloned().unwrap_or_default());
        if !tokens.is_empty() {
            annotations.insert(
                NODECLAIM_TOKENS_ANNOTATION.to_string(),
                bootstrap_token::record(&tokens),
            );
        }
        let status = out.status.get_or_insert_with(Default::default);
        status.provider_id = Some(instance::provider_id(&instance.id));
        status.image_id = Some(instance.template.id.clone());
        status.capacity = to_resource_list(&it.capacity);
        status.allocatable = to_resource_list(&it.allocatable());
        Ok(out)
    }

    async fn desired_state(&self, nodeclass: &ExoscaleNodeClass) -> Result<DesiredState> {
        let status = nodeclass.status.clone().unwrap_or_default();
        let template_id = match status.template_id.clone().filter(|t| !t.is_empty()) {
            Some(t) => t,
            None => {
                self.templates
                    .resolve(nodeclass)
                    .await
                    .map_err(|e| CloudProviderError::Other(e.to_string()))?
                    .id
            }
        };
        Ok(DesiredState {
            template_id,
            security_groups: status.security_groups,
            anti_affinity_groups: status.anti_affinity_groups,
            private_networks: status.private_networks,
            nodeclass_hash: drift::nodeclass_hash(&nodeclass.spec),
        })
    }

    /// The instance of `claim` for a drift check: from the last list of the cluster's
    /// instances when it is fresh, listing again when it is stale or old enough and lacks the
    /// instance ([`listed::ListedInstances::lookup`]), else read on its own (an instance newer
    /// than a young list, one no list shows, or a failed list).
    /// Puts back the identity labels `expected` that an instance lost. The copy that showed
    /// them missing may be a list up to 30 s old, and an update replaces the whole label map:
    /// the labels written are computed from a fresh read, so a label someone added meanwhile
    /// is kept (Exoscale has no conditional update; only the read-to-write instant is open).
    async fn heal_labels(&self, claim: &str, id: &str, expected: &Labels) {
        let current = match self.instances.get(id).await {
            Ok(current) => current,
            Err(e) => {
                tracing::warn!(instance = %id, error = %e, "could not read the instance to restore its labels");
                return;
            }
        };
        // Another cluster's identity on it is reported by garbage collection, never
        // overwritten: healing would claim an instance that may not be ours.
        if self.instances.identity().ownership(&current.labels) == Ownership::Foreign {
            tracing::warn!(nodeclaim = %claim, instance = %id, "the instance carries another cluster's identity; its labels are left as they are");
            return;
        }
        let Some(labels) = drift::labels_to_heal(&current.labels, expected) else {
            return;
        };
        match self.instances.set_labels(id, &labels).await {
            // The list no longer says what the instance carries.
            Ok(()) => self.listed.lock().await.forget(),
            Err(e) => {
                tracing::warn!(instance = %id, error = %e, "could not restore instance labels")
            }
        }
    }

    async fn instance_for_drift(&self, claim: &NodeClaim) -> Result<Option<Instance>> {
        let id = claim
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|pid| parse_provider_id(pid).ok())
            .map(str::to_string);
        if let Some(id) = id {
            let clock = self.clock.as_ref();
            // Held across the list, so the checks waiting behind it use its answer.
            let mut cache = self.listed.lock().await;
            let mut lookup = cache.lookup(&id, clock);
            if lookup == Lookup::List {
                lookup = match self.instances.list().await {
                    Ok(instances) => {
                        cache.store(instances, clock);
                        cache.lookup(&id, clock)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "listing instances for drift failed; reading one by one");
                        Lookup::Read
                    }
                };
            }
            drop(cache);
            if let Lookup::Found(instance) = lookup {
                return Ok(Some(*instance));
            }
        }
        self.instance_of(claim).await
    }

    async fn instance_of(&self, claim: &NodeClaim) -> Result<Option<Instance>> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        match claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(pid) if !pid.is_empty() => {
                let id =
                    parse_provider_id(pid).map_err(|e| CloudProviderError::Other(e.to_string()))?;
                match self.instances.get(id).await {
                    Ok(i) => Ok(Some(i)),
                    Err(e) if e.is_not_found() => Ok(None),
                    Err(e) => Err(CloudProviderError::Other(e.to_string())),
                }
            }
            // Launched but the providerID was never recorded: find it by its label.
            _ => self
                .instances
                .find_for_nodeclaim(&name)
                .await
                .map_err(|e| CloudProviderError::Other(e.to_string())),
        }
    }
}

impl CloudProvider for ExoscaleCloudProvider {
    fn name(&self) -> &'static str {
        "exoscale"
    }

    fn create<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(async move {
            let nodeclass = self.ready_nodeclass(&nodeclaim.spec.node_class_ref)?;
            self.launch(nodeclaim, &nodeclass).await
        })
    }

    fn delete<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let name = nodeclaim.metadata.name.clone().unwrap_or_default();
            let gone = || CloudProviderError::NodeClaimNotFound(name.clone());
            let recorded_id = nodeclaim
                .status
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(|pid| parse_provider_id(pid).ok());
            // The Node's teardown saw it destroyed to the end: no read needed.
            if recorded_id.is_some_and(|id| self.destroyed.take_gone(id)) {
                self.forget_tokens(nodeclaim).await;
                return Err(gone());
            }
            let Some(instance) = self.instance_of(nodeclaim).await? else {
                if let Some(id) = recorded_id {
                    self.destroyed.not_found(id);
                }
                self.forget_tokens(nodeclaim).await;
                return Err(gone());
            };
            // A recorded provider ID is not proof the instance is ours: NodeClaims restored
            // from another cluster's backup, or an ID edited by hand, can name an instance
            // that carries another cluster's identity. Never deleted; the NodeClaim keeps its
            // finalizer until someone decides (an instance without identity, launched before
            // identities or by the Go provider, is owned by the NodeClaim that records it).
            if self.instances.identity().ownership(&instance.labels) == Ownership::Foreign {
                return Err(CloudProviderError::Other(format!(
                    "instance {} carries another cluster's identity (label {INSTANCE_CLUSTER_UID_LABEL}); not deleting it: if this NodeClaim is not this cluster's, remove its finalizer by hand",
                    instance.id
                )));
            }
            if !instance::launched_for(&instance, &name, &self.settings.instance_prefix) {
                return Err(CloudProviderError::Other(format!(
                    "instance {} was not launched for NodeClaim {name} (label {INSTANCE_NODECLAIM_LABEL}={:?}, name {:?}); not deleting it: if the provider ID is wrong, correct it or remove the finalizer by hand",
                    instance.id,
                    exoscale::error::sanitize_api_text(
                        instance
                            .labels
                            .get(INSTANCE_NODECLAIM_LABEL)
                            .map_or("", String::as_str)
                    ),
                    exoscale::error::sanitize_api_text(&instance.name),
                )));
            }
            // `instance_of` has just read it: no second GET.
            match self.instances.delete_read(&instance).await.map_err(|e| {
                CloudProviderError::Other(format!("failed to delete instance {}: {e}", instance.id))
            })? {
                DeleteOutcome::Deleting => {
                    self.destroyed.destroying(&instance.id);
                    Ok(())
                }
                DeleteOutcome::Gone => {
                    self.destroyed.not_found(&instance.id);
                    self.forget_tokens(nodeclaim).await;
                    Err(gone())
                }
            }
        })
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(async move {
            let id = parse_provider_id(provider_id)
                .map_err(|e| CloudProviderError::Other(e.to_string()))?;
            match self.instances.get(id).await {
                Ok(i) if i.state == exoscale::models::InstanceState::Destroyed => {
                    Err(CloudProviderError::NodeClaimNotFound(provider_id.into()))
                }
                Ok(i) => Ok(self.nodeclaim_from_instance(&i)),
                Err(e) if e.is_not_found() => {
                    Err(CloudProviderError::NodeClaimNotFound(provider_id.into()))
                }
                Err(e) => Err(CloudProviderError::Other(e.to_string())),
            }
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<NodeClaim>>> {
        Box::pin(async move {
            let instances =
                self.instances.list().await.map_err(|e| {
                    CloudProviderError::Other(format!("failed to list instances: {e}"))
                })?;
            Ok(instances
                .iter()
                .filter(|i| is_live(i) || i.state == exoscale::models::InstanceState::Destroying)
                .map(|i| self.nodeclaim_from_instance(i))
                .collect())
        })
    }

    fn ownership(&self, instance: &NodeClaim) -> Ownership {
        let uid = instance
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INSTANCE_CLUSTER_UID_LABEL));
        let labels = uid
            .map(|u| Labels::from([(INSTANCE_CLUSTER_UID_LABEL.to_string(), u.clone())]))
            .unwrap_or_default();
        self.instances.identity().ownership(&labels)
    }

    fn adopt<'a>(&'a self, instance: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let pid = instance
                .status
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .unwrap_or_default();
            let id =
                parse_provider_id(pid).map_err(|e| CloudProviderError::Other(e.to_string()))?;
            let current = self
                .instances
                .get(id)
                .await
                .map_err(|e| CloudProviderError::Other(e.to_string()))?;
            let identity = self.instances.identity();
            // Re-checked on the fresh read: never relabel another cluster's instance.
            if identity.ownership(&current.labels) != Ownership::Unproven {
                return Ok(());
            }
            let mut labels = current.labels.clone();
            labels.insert(INSTANCE_CLUSTER_UID_LABEL.to_string(), identity.uid.clone());
            self.instances.set_labels(id, &labels).await.map_err(|e| {
                CloudProviderError::Other(format!("failed to label instance {id}: {e}"))
            })
        })
    }

    fn instance_types<'a>(
        &'a self,
        nodepool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        Box::pin(async move {
            let nodeclass = self
                .nodeclass_of(&nodepool.spec.template.spec.node_class_ref)
                .map_err(|e| CloudProviderError::Other(e.to_string()))?;
            self.instance_types
                .list(&nodeclass)
                .map(|v| v.into_iter().map(Arc::new).collect())
                .map_err(|e| CloudProviderError::Other(e.to_string()))
        })
    }

    fn is_drifted<'a>(
        &'a self,
        nodeclaim: &'a NodeClaim,
    ) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(async move {
            let name = nodeclaim.metadata.name.clone().unwrap_or_default();
            let nodeclass = self
                .nodeclass_of(&nodeclaim.spec.node_class_ref)
                .map_err(|e| CloudProviderError::Other(e.to_string()))?;
            let ready = nodeclass
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.is_true(conditions::READY));
            if !ready {
                // Never judge drift against a status that is not (yet) resolved.
                return Ok(None);
            }
            let desired = self.desired_state(&nodeclass).await?;
            let launched_hash = nodeclaim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODECLASS_HASH_ANNOTATION))
                .map(String::as_str);
            // A list answer has no anti-affinity groups. It decides only when the instance
            // provably has none: we launched it from this very NodeClass spec (same hash), and
            // that spec names no group. Otherwise the instance is read on its own.
            let spec = &nodeclass.spec;
            let without_groups = desired.anti_affinity_groups.is_empty()
                && spec.anti_affinity_groups.is_empty()
                && spec.anti_affinity_group_selector_terms.is_empty()
                && launched_hash == Some(desired.nodeclass_hash.as_str());
            let instance = if without_groups {
                self.instance_for_drift(nodeclaim).await?
            } else {
                self.instance_of(nodeclaim).await?
            };
            let Some(instance) = instance else {
                return Err(CloudProviderError::NodeClaimNotFound(name));
            };
            let expected = self.instances.identity().labels(
                &name,
                nodeclaim
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(NODEPOOL_LABEL))
                    .map(String::as_str),
            );
            if drift::labels_to_heal(&instance.labels, &expected).is_some() {
                self.heal_labels(&name, &instance.id, &expected).await;
            }
            Ok(drift::detect(&instance, &desired, launched_hash).map(|d| {
                tracing::info!(nodeclaim = %name, reason = d.reason, message = %d.message, "drift detected");
                DriftReason::new(d.reason, d.message)
            }))
        })
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    fn supported_node_classes(&self) -> Vec<NodeClassKind> {
        vec![NodeClassKind {
            group: EXOSCALE_GROUP.into(),
            kind: NODECLASS_KIND.into(),
        }]
    }

    fn nodeclasses_synced(&self) -> bool {
        self.nodeclasses.synced()
    }

    fn nodeclaim_created(&self, uid: &str) {
        self.first_launches.created(uid);
    }

    fn nodeclass(&self, reference: &NodeClassReference) -> Option<NodeClassState> {
        let nodeclass = self.nodeclass_of(reference).ok()?;
        Some(NodeClassState {
            generation: nodeclass.metadata.generation,
            terminating: nodeclass.metadata.deletion_timestamp.is_some(),
            ready: nodeclass
                .status
                .as_ref()
                .and_then(|s| {
                    s.conditions
                        .get_condition(crate::apis::labels::conditions::READY)
                })
                .cloned(),
            node_labels: nodeclass.spec.node_labels.clone(),
            node_taints: nodeclass.spec.node_taints.clone(),
        })
    }
}
