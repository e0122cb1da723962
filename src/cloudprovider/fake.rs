//! An in-memory cloud provider with configurable instance types, prices and zones, for
//! scheduler, controller and benchmark tests. Its default catalogue is upstream's synthetic
//! benchmark shape ([`crate::scheduling::fixtures::instance_types`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;

use crate::apis::{NodeClaim, NodeClassReference, NodePool};
use crate::cloudprovider::NodeClassState;
use crate::providers::instance_types::to_resource_list;
use crate::scheduling::labels::{CAPACITY_TYPE, ZONE};
use crate::scheduling::{InstanceType, fixtures};

use super::{
    CloudProvider, CloudProviderError, DriftReason, NodeClassKind, RepairPolicy, Result,
    cheapest_offering, default_repair_policies, requests_of, requirements_from_api,
};

pub const PROVIDER_ID_PREFIX: &str = "fake://";

/// The NodeClass kind the fake serves (core tests use it; the core never names a real one).
pub const NODECLASS_GROUP: &str = "karpenter.test.sh";
pub const NODECLASS_KIND: &str = "TestNodeClass";

/// The state of the fake cloud; every knob is safe to turn while it is in use.
#[derive(Default)]
pub struct FakeCloudProvider {
    instance_types: RwLock<Vec<Arc<InstanceType>>>,
    instances: Mutex<BTreeMap<String, NodeClaim>>,
    next_id: AtomicU64,
    create_errors: Mutex<Vec<CloudProviderError>>,
    drifted: Mutex<HashMap<String, DriftReason>>,
    create_calls: AtomicU64,
    delete_calls: AtomicU64,
}

impl FakeCloudProvider {
    /// A provider with upstream's 400-type benchmark catalogue.
    pub fn new() -> Self {
        Self::with_instance_types(fixtures::instance_types(400))
    }

    pub fn with_instance_types(types: Vec<Arc<InstanceType>>) -> Self {
        let p = FakeCloudProvider::default();
        *p.instance_types.write().expect("lock") = types;
        p
    }

    pub fn set_instance_types(&self, types: Vec<Arc<InstanceType>>) {
        *self.instance_types.write().expect("lock") = types;
    }

    fn update_offerings(&self, name: &str, f: impl Fn(&mut crate::scheduling::Offering)) -> bool {
        let mut types = self.instance_types.write().expect("lock");
        let Some(slot) = types.iter_mut().find(|t| t.name == name) else {
            return false;
        };
        let mut it = (**slot).clone();
        it.offerings.iter_mut().for_each(f);
        *slot = Arc::new(it);
        true
    }

    /// Sets the price of every offering of `name`; false when the type is unknown.
    pub fn set_price(&self, name: &str, price: f64) -> bool {
        self.update_offerings(name, |o| o.price = price)
    }

    /// Marks the offerings of `name` in `zone` (un)available.
    pub fn set_available(&self, name: &str, zone: &str, available: bool) -> bool {
        self.update_offerings(name, |o| {
            if o.zone == zone {
                o.available = available;
            }
        })
    }

    /// The next `create` calls fail with these errors, in order.
    pub fn fail_next_create(&self, err: CloudProviderError) {
        self.create_errors.lock().expect("lock").push(err);
    }

    pub fn set_drifted(&self, provider_id: &str, reason: &str) {
        self.drifted.lock().expect("lock").insert(
            provider_id.into(),
            DriftReason::new(reason, format!("{reason} drifted")),
        );
    }

    pub fn created(&self) -> Vec<NodeClaim> {
        self.instances
            .lock()
            .expect("lock")
            .values()
            .cloned()
            .collect()
    }

    pub fn create_calls(&self) -> u64 {
        self.create_calls.load(Ordering::Relaxed)
    }

    pub fn delete_calls(&self) -> u64 {
        self.delete_calls.load(Ordering::Relaxed)
    }

    fn launch(&self, nodeclaim: &NodeClaim) -> Result<NodeClaim> {
        self.create_calls.fetch_add(1, Ordering::Relaxed);
        {
            let mut errors = self.create_errors.lock().expect("lock");
            if !errors.is_empty() {
                return Err(errors.remove(0));
            }
        }
        let reqs = requirements_from_api(&nodeclaim.spec.requirements)
            .map_err(|e| CloudProviderError::create("InvalidRequirements", e.to_string()))?;
        let requests = requests_of(nodeclaim)?;
        let types = self.instance_types.read().expect("lock").clone();
        let (it, offering) = cheapest_offering(&types, &reqs, &requests).ok_or_else(|| {
            CloudProviderError::insufficient_capacity(
                "no available offering matches the NodeClaim's requirements and requests",
            )
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let provider_id = format!("{PROVIDER_ID_PREFIX}{id}");
        let mut out = nodeclaim.clone();
        let labels = out.metadata.labels.get_or_insert_with(BTreeMap::new);
        for r in it.requirements.iter() {
            if let Some(v) = r.single_value() {
                labels.insert(r.key().to_string(), v.to_string());
            }
        }
        labels.insert(ZONE.into(), offering.zone.clone());
        labels.insert(CAPACITY_TYPE.into(), offering.capacity_type.clone());
        let status = out.status.get_or_insert_with(Default::default);
        status.provider_id = Some(provider_id.clone());
        status.image_id = Some("fake-image".into());
        status.capacity = to_resource_list(&it.capacity);
        status.allocatable = to_resource_list(&it.allocatable());
        self.instances
            .lock()
            .expect("lock")
            .insert(provider_id, out.clone());
        Ok(out)
    }
}

fn provider_id_of(nodeclaim: &NodeClaim) -> Option<&str> {
    nodeclaim.status.as_ref()?.provider_id.as_deref()
}

impl CloudProvider for FakeCloudProvider {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn create<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(async move { self.launch(nodeclaim) })
    }

    fn delete<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.delete_calls.fetch_add(1, Ordering::Relaxed);
            let id = provider_id_of(nodeclaim).unwrap_or_default().to_string();
            match self.instances.lock().expect("lock").remove(&id) {
                Some(_) => Ok(()),
                None => Err(CloudProviderError::NodeClaimNotFound(id)),
            }
        })
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(async move {
            self.instances
                .lock()
                .expect("lock")
                .get(provider_id)
                .cloned()
                .ok_or_else(|| CloudProviderError::NodeClaimNotFound(provider_id.into()))
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<NodeClaim>>> {
        Box::pin(async move { Ok(self.created()) })
    }

    fn instance_types<'a>(
        &'a self,
        _nodepool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        Box::pin(async move { Ok(self.instance_types.read().expect("lock").clone()) })
    }

    fn is_drifted<'a>(
        &'a self,
        nodeclaim: &'a NodeClaim,
    ) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(async move {
            let Some(id) = provider_id_of(nodeclaim) else {
                return Ok(None);
            };
            Ok(self.drifted.lock().expect("lock").get(id).cloned())
        })
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    fn supported_node_classes(&self) -> Vec<NodeClassKind> {
        vec![NodeClassKind {
            group: NODECLASS_GROUP.into(),
            kind: NODECLASS_KIND.into(),
        }]
    }

    /// Every NodeClass of a served kind exists and is ready.
    fn nodeclass(&self, reference: &NodeClassReference) -> Option<NodeClassState> {
        self.serves(reference).then(|| NodeClassState {
            generation: Some(1),
            terminating: false,
            ready: Some(crate::apis::Condition {
                type_: "Ready".into(),
                status: crate::apis::ConditionStatus::True,
                reason: "Ready".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(1),
            }),
            node_labels: Default::default(),
            node_taints: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::{
        NodeClaimSpec, NodeClassReference, NodeSelectorRequirementWithMinValues, Operator,
    };

    fn claim(types: &[&str]) -> NodeClaim {
        NodeClaim::new(
            "nc-1",
            NodeClaimSpec {
                taints: vec![],
                startup_taints: vec![],
                requirements: vec![NodeSelectorRequirementWithMinValues {
                    key: "node.kubernetes.io/instance-type".into(),
                    operator: Operator::In,
                    values: types.iter().map(|t| t.to_string()).collect(),
                    min_values: None,
                }],
                resources: Default::default(),
                node_class_ref: NodeClassReference {
                    group: NODECLASS_GROUP.into(),
                    kind: NODECLASS_KIND.into(),
                    name: "default".into(),
                },
                termination_grace_period: None,
                expire_after: "720h".into(),
            },
        )
    }

    #[tokio::test]
    async fn create_get_list_delete_round_trip() {
        let p = FakeCloudProvider::new();
        assert_eq!(p.instance_types(&test_pool()).await.unwrap().len(), 400);
        p.set_price("fake-it-9", 0.0001);
        let nc = p.create(&claim(&["fake-it-3", "fake-it-9"])).await.unwrap();
        let labels = nc.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["node.kubernetes.io/instance-type"], "fake-it-9");
        let pid = nc.status.as_ref().unwrap().provider_id.clone().unwrap();
        assert_eq!(p.get(&pid).await.unwrap(), nc);
        assert_eq!(p.list().await.unwrap().len(), 1);
        p.set_drifted(&pid, "ImageID");
        assert_eq!(
            p.is_drifted(&nc)
                .await
                .unwrap()
                .map(|d| d.reason)
                .as_deref(),
            Some("ImageID")
        );
        p.delete(&nc).await.unwrap();
        assert!(p.delete(&nc).await.unwrap_err().is_not_found());
        assert!(p.get(&pid).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn unavailable_offerings_and_injected_errors_surface() {
        let p = FakeCloudProvider::new();
        for zone in fixtures::FAKE_ZONES {
            p.set_available("fake-it-0", zone, false);
        }
        assert!(
            p.create(&claim(&["fake-it-0"]))
                .await
                .unwrap_err()
                .is_insufficient_capacity()
        );
        p.fail_next_create(CloudProviderError::NodeClassNotReady("x".into()));
        assert!(
            p.create(&claim(&["fake-it-1"]))
                .await
                .unwrap_err()
                .is_nodeclass_not_ready()
        );
        assert!(p.create(&claim(&["fake-it-1"])).await.is_ok());
        assert_eq!(p.create_calls(), 3);
    }

    fn test_pool() -> NodePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {"template": {"spec": {
                "requirements": [],
                "nodeClassRef": {"group": NODECLASS_GROUP, "kind": NODECLASS_KIND, "name": "default"}
            }}}
        }))
        .unwrap()
    }
}
