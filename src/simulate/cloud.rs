//! The cloud `simulate` runs against: instance types of the embedded catalogue at list prices,
//! built per ExoscaleNodeClass of the manifests, behind the same `CloudProvider` contract (and
//! the same `WithOverlays` decorator) the controller uses. It launches nothing.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::apis::labels::EXOSCALE_GROUP;
use crate::apis::{ExoscaleNodeClass, NodeClaim, NodeClassReference, NodePool};
use crate::cloudprovider::exoscale::NODECLASS_KIND;
use crate::cloudprovider::{
    CloudProvider, CloudProviderError, DriftReason, NodeClassKind, NodeClassState, RepairPolicy,
    Result,
};
use crate::scheduling::InstanceType;

/// Instance types per ExoscaleNodeClass name, and the manifests' ExoscaleNodeClasses.
pub struct CatalogueCloud {
    pub types_by_class: HashMap<String, Vec<Arc<InstanceType>>>,
    pub node_classes: HashMap<String, ExoscaleNodeClass>,
}

fn launches_nothing<T>() -> Result<T> {
    Err(CloudProviderError::Other(
        "simulate launches and reads no instances".into(),
    ))
}

impl CloudProvider for CatalogueCloud {
    fn name(&self) -> &'static str {
        "exoscale-catalogue"
    }
    fn create<'a>(&'a self, _: &'a NodeClaim) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(async { launches_nothing() })
    }
    fn delete<'a>(&'a self, _: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { launches_nothing() })
    }
    fn get<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<NodeClaim>> {
        Box::pin(async { launches_nothing() })
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<NodeClaim>>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn instance_types<'a>(
        &'a self,
        nodepool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        let class = &nodepool.spec.template.spec.node_class_ref.name;
        let types = self.types_by_class.get(class).cloned();
        Box::pin(async move {
            types.ok_or_else(|| CloudProviderError::Other(format!("no ExoscaleNodeClass {class}")))
        })
    }
    fn is_drifted<'a>(&'a self, _: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(async { Ok(None) })
    }
    fn repair_policies(&self) -> Vec<RepairPolicy> {
        Vec::new()
    }
    fn supported_node_classes(&self) -> Vec<NodeClassKind> {
        vec![NodeClassKind {
            group: EXOSCALE_GROUP.into(),
            kind: NODECLASS_KIND.into(),
        }]
    }
    /// The manifest's NodeClass as if it were Ready (simulate does not resolve templates).
    fn nodeclass(&self, reference: &NodeClassReference) -> Option<NodeClassState> {
        if !self.serves(reference) {
            return None;
        }
        let class = self.node_classes.get(&reference.name)?;
        Some(NodeClassState {
            generation: class.metadata.generation,
            terminating: false,
            ready: None,
            node_labels: class.spec.node_labels.clone(),
            node_taints: class.spec.node_taints.clone(),
        })
    }
}
