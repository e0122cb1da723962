//! [`Metered`] times every cloud provider call into `karpenter_cloudprovider_duration_seconds`
//! and counts failures in `karpenter_cloudprovider_errors_total`, as upstream's metrics
//! decorator does. Instance-type lookups are timed by the state→scheduler adapter
//! (`provisioning::input::pools_with_types`), the one place that asks for them.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;

use crate::apis::{NodeClaim, NodeClassReference, NodePool};
use crate::operator::metrics::Metrics;
use crate::scheduling::InstanceType;

use super::{
    CloudProvider, DriftReason, NodeClassKind, NodeClassState, Ownership, RepairPolicy, Result,
};

pub struct Metered {
    inner: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
}

impl Metered {
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }

    async fn timed<T>(
        &self,
        method: &str,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = call.await;
        let error = result.as_ref().err().map(|e| e.kind());
        self.metrics
            .observe_cloud_call(method, started.elapsed(), error);
        result
    }
}

impl CloudProvider for Metered {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn create<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(self.timed("Create", self.inner.create(nodeclaim)))
    }
    fn delete<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.timed("Delete", self.inner.delete(nodeclaim)))
    }
    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(self.timed("Get", self.inner.get(provider_id)))
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<NodeClaim>>> {
        Box::pin(self.timed("List", self.inner.list()))
    }
    fn instance_types<'a>(
        &'a self,
        nodepool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        self.inner.instance_types(nodepool)
    }
    fn is_drifted<'a>(
        &'a self,
        nodeclaim: &'a NodeClaim,
    ) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(self.timed("IsDrifted", self.inner.is_drifted(nodeclaim)))
    }
    fn repair_policies(&self) -> Vec<RepairPolicy> {
        self.inner.repair_policies()
    }
    fn supported_node_classes(&self) -> Vec<NodeClassKind> {
        self.inner.supported_node_classes()
    }
    fn nodeclass(&self, reference: &NodeClassReference) -> Option<NodeClassState> {
        self.inner.nodeclass(reference)
    }
    fn nodeclasses_synced(&self) -> bool {
        self.inner.nodeclasses_synced()
    }
    fn nodeclaim_created(&self, uid: &str) {
        self.inner.nodeclaim_created(uid)
    }
    fn serves(&self, reference: &NodeClassReference) -> bool {
        self.inner.serves(reference)
    }
    fn ownership(&self, instance: &NodeClaim) -> Ownership {
        self.inner.ownership(instance)
    }
    fn adopt<'a>(&'a self, instance: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.timed("Adopt", self.inner.adopt(instance)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudprovider::fake::FakeCloudProvider;

    #[test]
    fn every_call_is_timed_and_failures_are_counted_by_kind() {
        let metrics = Arc::new(Metrics::new());
        let metered = Metered::new(Arc::new(FakeCloudProvider::new()), metrics.clone());
        futures::executor::block_on(async {
            metered.list().await.unwrap();
            // The fake knows no such instance: a NodeClaimNotFound error.
            assert!(metered.get("fake://missing").await.is_err());
        });
        let text = metrics.render();
        for line in [
            "karpenter_cloudprovider_duration_seconds_count{method=\"List\",provider=\"exoscale\"} 1",
            "karpenter_cloudprovider_duration_seconds_count{method=\"Get\",provider=\"exoscale\"} 1",
            "karpenter_cloudprovider_errors_total{method=\"Get\",provider=\"exoscale\",error=\"nodeclaim_not_found\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
