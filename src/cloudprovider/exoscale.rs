//! The Exoscale cloud provider: glues NodeClass lookup, instance types and prices, template
//! resolution, bootstrap tokens, user data and instances into the [`CloudProvider`] contract.
//!
//! Kubernetes access is behind two small traits ([`NodeClassSource`], [`NodeBootstrap`]) so the
//! provider runs against the simulated cloud in tests and in `simulate` without a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::apis::labels::{
    EXOSCALE_GROUP, INSTANCE_CLUSTER_UID_LABEL, INSTANCE_NODECLAIM_LABEL, INSTANCE_NODEPOOL_LABEL,
    NODECLAIM_TOKENS_ANNOTATION, NODECLASS_HASH_ANNOTATION, NODEPOOL_LABEL, conditions,
};
use crate::apis::{
    ConditionStatus, ConditionsExt, ExoscaleNodeClass, NodeClaim, NodeClaimSpec,
    NodeClassReference, NodePool, NodeSelectorRequirementWithMinValues, Operator,
};
use crate::clock::Clock;
use crate::exoscale;
use crate::exoscale::models::{Instance, Labels};
use crate::providers::bootstrap_token::{self, BootstrapToken};
use crate::providers::drift::{self, DesiredState};
use crate::providers::instance::{
    self, ClusterIdentity, DeleteOutcome, InstanceProvider, LaunchError, LaunchSpec, Ownership,
    is_live, parse_provider_id,
};
use crate::providers::instance_types::{
    self, DiscoveredType, InstanceTypeCatalog, InstanceTypeProvider, to_resource_list,
};
use crate::providers::pricing::PriceBook;
use crate::providers::template::{KubernetesVersionSource, TemplateResolver};
use crate::providers::userdata::{self, UserDataInput};
use crate::providers::{cluster_ca, nodeclass::NodeClassResolver};
use crate::scheduling::InstanceType;
use crate::scheduling::labels::{CAPACITY_TYPE, INSTANCE_TYPE, ZONE};

use super::NodeClassState;
use super::error::reasons;
use super::{
    CloudProvider, CloudProviderError, DriftReason, NodeClassKind, RepairPolicy, Result,
    cheapest_offering, default_repair_policies, requests_of, requirements_from_api,
};

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
    /// How long a bootstrap token stays valid: `NODECLAIM_REGISTRATION_TTL` plus a margin, so a
    /// node that may still register can still authenticate.
    pub bootstrap_token_ttl: std::time::Duration,
}

/// Where NodeClasses are read from (a reflector store in production).
pub trait NodeClassSource: Send + Sync {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass>;
    /// Whether the first complete list arrived.
    fn synced(&self) -> bool {
        true
    }
}

impl NodeClassSource for Store<ExoscaleNodeClass> {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass> {
        Store::get(self, &ObjectRef::new(name)).map(|nc| (*nc).clone())
    }
    fn synced(&self) -> bool {
        use futures::FutureExt;
        self.wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
    }
}

/// NodeClasses held in memory (tests, `simulate`).
#[derive(Default)]
pub struct StaticNodeClasses(RwLock<BTreeMap<String, ExoscaleNodeClass>>);

impl StaticNodeClasses {
    pub fn insert(&self, nodeclass: ExoscaleNodeClass) {
        let name = nodeclass.metadata.name.clone().unwrap_or_default();
        self.0.write().expect("lock").insert(name, nodeclass);
    }

    pub fn remove(&self, name: &str) {
        self.0.write().expect("lock").remove(name);
    }
}

impl NodeClassSource for StaticNodeClasses {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass> {
        self.0.read().expect("lock").get(name).cloned()
    }
}

/// Cluster-side needs of a launch: bootstrap tokens and the CA bundle.
pub trait NodeBootstrap: Send + Sync {
    fn create_token<'a>(
        &'a self,
        nodeclaim: &'a str,
    ) -> BoxFuture<'a, std::result::Result<BootstrapToken, String>>;
    /// Deletes the token Secrets of these names (never listed: found by recorded name).
    fn delete_tokens<'a>(
        &'a self,
        secret_names: &'a [String],
    ) -> BoxFuture<'a, std::result::Result<(), String>>;
    fn cluster_ca(&self) -> BoxFuture<'_, std::result::Result<Vec<u8>, String>>;
}

/// Tokens as `kube-system` Secrets and the CA from the cluster (read once, then cached).
pub struct KubeNodeBootstrap {
    client: kube::Client,
    ca: tokio::sync::OnceCell<Vec<u8>>,
    ttl: std::time::Duration,
}

impl KubeNodeBootstrap {
    /// Tokens valid for `ttl` (the registration TTL plus a margin, see
    /// [`bootstrap_token::TOKEN_TTL_MARGIN`]).
    pub fn new(client: kube::Client, ttl: std::time::Duration) -> Self {
        KubeNodeBootstrap {
            client,
            ca: tokio::sync::OnceCell::new(),
            ttl,
        }
    }
}

impl NodeBootstrap for KubeNodeBootstrap {
    fn create_token<'a>(
        &'a self,
        nodeclaim: &'a str,
    ) -> BoxFuture<'a, std::result::Result<BootstrapToken, String>> {
        Box::pin(async move {
            bootstrap_token::create_for_nodeclaim(
                &self.client,
                nodeclaim,
                chrono::Utc::now(),
                self.ttl,
            )
            .await
            .map_err(|e| e.to_string())
        })
    }

    fn delete_tokens<'a>(
        &'a self,
        secret_names: &'a [String],
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        Box::pin(async move {
            for name in secret_names {
                bootstrap_token::delete_token(&self.client, name)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    fn cluster_ca(&self) -> BoxFuture<'_, std::result::Result<Vec<u8>, String>> {
        Box::pin(async move {
            self.ca
                .get_or_try_init(|| cluster_ca::fetch(&self.client))
                .await
                .cloned()
                .map_err(|e| e.to_string())
        })
    }
}

/// The token Secrets recorded on a NodeClaim.
pub fn recorded_tokens(claim: &NodeClaim) -> BTreeSet<String> {
    bootstrap_token::recorded(
        claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODECLAIM_TOKENS_ANNOTATION))
            .map(String::as_str),
    )
}

/// Tokens kept in memory with a fixed CA (tests, `simulate`).
pub struct InMemoryNodeBootstrap {
    ca: Vec<u8>,
    tokens: Mutex<BTreeMap<String, BootstrapToken>>,
    fail_creates: Mutex<u32>,
}

impl InMemoryNodeBootstrap {
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        InMemoryNodeBootstrap {
            ca: ca_pem.into(),
            tokens: Mutex::new(BTreeMap::new()),
            fail_creates: Mutex::new(0),
        }
    }

    /// Live tokens by NodeClaim.
    pub fn tokens(&self) -> BTreeMap<String, BootstrapToken> {
        self.tokens.lock().expect("lock").clone()
    }

    /// The next `n` token creations fail.
    pub fn fail_next_creates(&self, n: u32) {
        *self.fail_creates.lock().expect("lock") = n;
    }
}

impl NodeBootstrap for InMemoryNodeBootstrap {
    fn create_token<'a>(
        &'a self,
        nodeclaim: &'a str,
    ) -> BoxFuture<'a, std::result::Result<BootstrapToken, String>> {
        Box::pin(async move {
            {
                let mut fail = self.fail_creates.lock().expect("lock");
                if *fail > 0 {
                    *fail -= 1;
                    return Err("secrets is forbidden (injected)".to_string());
                }
            }
            let token = BootstrapToken::generate();
            self.tokens
                .lock()
                .expect("lock")
                .insert(nodeclaim.to_string(), token.clone());
            Ok(token)
        })
    }

    fn delete_tokens<'a>(
        &'a self,
        secret_names: &'a [String],
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        Box::pin(async move {
            self.tokens
                .lock()
                .expect("lock")
                .retain(|_, token| !secret_names.contains(&token.secret_name()));
            Ok(())
        })
    }

    fn cluster_ca(&self) -> BoxFuture<'_, std::result::Result<Vec<u8>, String>> {
        Box::pin(async move { Ok(self.ca.clone()) })
    }
}

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
                deps.clock,
                crate::providers::nodeclass::NAME_CACHE_TTL,
            )),
            settings,
            nodeclasses: deps.nodeclasses,
            bootstrap: deps.bootstrap,
            issued: Default::default(),
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

        // Adopt an instance an earlier attempt created (its answer lost or our process died).
        let existing = self
            .instances
            .find_for_nodeclaim(&name)
            .await
            .map_err(|e| {
                CloudProviderError::create(reasons::INSTANCE_CREATION_FAILED, e.to_string())
            })?;
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
        let types: Vec<Arc<InstanceType>> = self
            .instance_types
            .list(nodeclass)
            .map_err(|e| {
                CloudProviderError::create(reasons::INSTANCE_TYPE_SELECTION_FAILED, e.to_string())
            })?
            .into_iter()
            .map(Arc::new)
            .collect();
        let (chosen, _) = cheapest_offering(&types, &reqs, &requests).ok_or_else(|| {
            CloudProviderError::insufficient_capacity(format!(
                "no available instance type in {zone} satisfies the NodeClaim's requirements ({reqs}) and requests"
            ))
        })?;
        let discovered = self
            .instance_types
            .catalog()
            .by_name(&chosen.name)
            .ok_or_else(|| {
                CloudProviderError::create(
                    reasons::INSTANCE_TYPE_SELECTION_FAILED,
                    format!("instance type {} disappeared from the catalog", chosen.name),
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
        let token = self.bootstrap.create_token(&name).await.map_err(|e| {
            CloudProviderError::create(
                reasons::BOOTSTRAP_TOKEN_CREATION_FAILED,
                format!("failed to create bootstrap token: {e}"),
            )
        })?;
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
                // Only a launch that provably left no instance gives its token up: an instance
                // that may exist (an outcome-unknown create) needs it to join once adopted.
                if e.leaves_no_instance() {
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

    /// Deletes every token of a NodeClaim whose instance is gone: those recorded on it and
    /// those this process issued for it.
    async fn forget_tokens(&self, claim: &NodeClaim) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut names = recorded_tokens(claim);
        names.extend(self.issued_tokens().remove(&name).unwrap_or_default());
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
        let discovered = self.discovered(instance).ok_or_else(|| {
            CloudProviderError::create(
                reasons::INSTANCE_CREATION_FAILED,
                format!(
                    "instance {} has instance type {} that is not usable in {}",
                    instance.id, instance.instance_type.id, self.settings.zone
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

fn launch_error(e: LaunchError, instance_type: &str, zone: &str) -> CloudProviderError {
    match e {
        LaunchError::Capacity(err) | LaunchError::CapacityAfterAccept(err) => {
            CloudProviderError::InsufficientCapacity {
                message: format!("{instance_type} in {zone}: {err}"),
                offerings: vec![(instance_type.to_string(), zone.to_string())],
            }
        }
        e @ LaunchError::PrivateNetwork { .. } => {
            CloudProviderError::create(reasons::PRIVATE_NETWORK_ATTACH_FAILED, e.to_string())
        }
        LaunchError::Api(err) | LaunchError::Refused(err) => {
            CloudProviderError::create(reasons::INSTANCE_CREATION_FAILED, err.to_string())
        }
    }
}

fn requirement(key: &str, value: &str) -> NodeSelectorRequirementWithMinValues {
    NodeSelectorRequirementWithMinValues {
        key: key.into(),
        operator: Operator::In,
        values: vec![value.into()],
        min_values: None,
    }
}

/// The NodeClaim view of an instance. `discovered` is its type when known (an instance of a
/// type no longer offered still appears, with fewer labels and no capacity).
pub fn nodeclaim_from_instance(
    instance: &Instance,
    discovered: Option<&DiscoveredType>,
    zone: &str,
) -> NodeClaim {
    let name = instance
        .labels
        .get(INSTANCE_NODECLAIM_LABEL)
        .cloned()
        .unwrap_or_else(|| instance.name.clone());
    let mut labels = BTreeMap::from([
        (ZONE.to_string(), zone.to_string()),
        (CAPACITY_TYPE.to_string(), "on-demand".to_string()),
    ]);
    if let Some(t) = discovered {
        labels.extend(instance_types::labels(t, zone));
    }
    if let Some(pool) = instance.labels.get(INSTANCE_NODEPOOL_LABEL) {
        labels.insert(NODEPOOL_LABEL.to_string(), pool.clone());
    }
    let mut requirements = vec![requirement(ZONE, zone)];
    if let Some(t) = discovered {
        requirements.push(requirement(INSTANCE_TYPE, &t.name()));
    }
    let mut claim = NodeClaim::new(
        &name,
        NodeClaimSpec {
            taints: vec![],
            startup_taints: vec![],
            requirements,
            resources: Default::default(),
            node_class_ref: NodeClassReference {
                group: EXOSCALE_GROUP.into(),
                kind: NODECLASS_KIND.into(),
                name: String::new(),
            },
            termination_grace_period: None,
            expire_after: crate::apis::nodepool::default_expire_after(),
        },
    );
    claim.metadata.labels = Some(labels);
    // Kept on the view so ownership can be judged without another API call.
    if let Some(uid) = instance.labels.get(INSTANCE_CLUSTER_UID_LABEL) {
        claim.metadata.annotations = Some(BTreeMap::from([(
            INSTANCE_CLUSTER_UID_LABEL.to_string(),
            uid.clone(),
        )]));
    }
    claim.metadata.creation_timestamp = instance
        .created_at
        .as_deref()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
    let status = claim.status.get_or_insert_with(Default::default);
    status.provider_id = Some(instance::provider_id(&instance.id));
    status.image_id = Some(instance.template.id.clone());
    if let Some(t) = discovered {
        let disk = instance.disk_size.unwrap_or(0) as i64;
        status.capacity = to_resource_list(&instance_types::capacity(
            t,
            disk,
            crate::apis::nodeclass::DEFAULT_MAX_PODS,
        ));
    }
    claim
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
            let Some(instance) = self.instance_of(nodeclaim).await? else {
                self.forget_tokens(nodeclaim).await;
                return Err(gone());
            };
            match self.instances.delete(&instance.id).await.map_err(|e| {
                CloudProviderError::Other(format!("failed to delete instance {}: {e}", instance.id))
            })? {
                DeleteOutcome::Deleting => Ok(()),
                DeleteOutcome::Gone => {
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
            let Some(instance) = self.instance_of(nodeclaim).await? else {
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
            if let Some(labels) = drift::labels_to_heal(&instance.labels, &expected)
                && let Err(e) = self.instances.set_labels(&instance.id, &labels).await
            {
                tracing::warn!(instance = %instance.id, error = %e, "could not restore instance labels");
            }
            let desired = self.desired_state(&nodeclass).await?;
            let launched_hash = nodeclaim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODECLASS_HASH_ANNOTATION))
                .map(String::as_str);
            Ok(drift::detect(&instance, &desired, launched_hash).map(|d| {
                tracing::info!(nodeclaim = %name, reason = d.reason, message = %d.message, "drift detected");
                d.reason.to_string()
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(labels: &[(&str, &str)]) -> Instance {
        serde_json::from_value(serde_json::json!({
            "id": "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11",
            "name": "karpenter-default-x7k2p",
            "state": "running",
            "created-at": "2026-01-01T12:00:00Z",
            "disk-size": 50,
            "instance-type": {"id": "b6e9d1e8-89fc-4db3-aaa4-9b4c5b1d0844"},
            "template": {"id": "cbd89eb1-c66c-4637-9483-904d7e36c318"},
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        }))
        .unwrap()
    }

    fn medium() -> DiscoveredType {
        DiscoveredType {
            id: "b6e9d1e8-89fc-4db3-aaa4-9b4c5b1d0844".into(),
            family: "standard".into(),
            size: "medium".into(),
            cpus: 2,
            memory_bytes: 4 << 30,
            gpus: 0,
        }
    }

    #[test]
    fn instances_become_nodeclaims_with_name_labels_and_status() {
        let i = instance(&[
            (INSTANCE_NODECLAIM_LABEL, "default-x7k2p"),
            (INSTANCE_NODEPOOL_LABEL, "default"),
        ]);
        let nc = nodeclaim_from_instance(&i, Some(&medium()), "ch-gva-2");
        assert_eq!(nc.metadata.name.as_deref(), Some("default-x7k2p"));
        let l = nc.metadata.labels.as_ref().unwrap();
        assert_eq!(l[INSTANCE_TYPE], "standard.medium");
        assert_eq!(l[CAPACITY_TYPE], "on-demand");
        assert_eq!(l[ZONE], "ch-gva-2");
        assert_eq!(l[NODEPOOL_LABEL], "default");
        let s = nc.status.as_ref().unwrap();
        assert_eq!(
            s.provider_id.as_deref(),
            Some("exoscale://6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11")
        );
        assert_eq!(
            s.image_id.as_deref(),
            Some("cbd89eb1-c66c-4637-9483-904d7e36c318")
        );
        assert_eq!(s.capacity["ephemeral-storage"].0, "50Gi");
        assert_eq!(s.capacity["pods"].0, "110");
        assert_eq!(
            nc.metadata
                .creation_timestamp
                .as_ref()
                .unwrap()
                .0
                .as_second(),
            1_767_268_800
        );
    }

    #[test]
    fn an_instance_of_an_unknown_type_still_maps_without_guessing() {
        let nc = nodeclaim_from_instance(&instance(&[]), None, "ch-gva-2");
        assert_eq!(nc.metadata.name.as_deref(), Some("karpenter-default-x7k2p"));
        let l = nc.metadata.labels.as_ref().unwrap();
        assert!(
            !l.contains_key(INSTANCE_TYPE),
            "never the Go provider's `.`"
        );
        assert!(nc.status.as_ref().unwrap().capacity.is_empty());
    }
}
