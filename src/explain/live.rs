//! Reads the live cluster, read-only, into the same `ClusterIndex` the controller's watches
//! fill: every kind the provisioning and disruption adapters look at.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::apis::{ExoscaleNodeClass, NodeClaim, NodeOverlay, NodePool};
use crate::state::ClusterIndex;

use super::ExplainError;

/// One page of a LIST; the apiserver hands a continue token for the rest.
const PAGE: u32 = 500;
/// A cluster larger than this per kind is refused rather than read without end.
const MAX_OBJECTS: usize = 200_000;

/// The cluster as the controller would see it, plus the objects the index does not keep.
pub struct Live {
    pub index: ClusterIndex,
    pub node_classes: Vec<ExoscaleNodeClass>,
    pub overlays: Vec<NodeOverlay>,
    /// The latest `DriftDetected` note per NodeClaim (the field that differs, both sides).
    pub drift_notes: std::collections::BTreeMap<String, String>,
    /// What could not be read without failing the command (events), for the warnings.
    pub unread: Vec<String>,
}

/// The `DriftDetected` events (the Go provider's, naming what differs), newest per NodeClaim.
async fn drift_notes(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, String>, kube::Error> {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::all(client.clone());
    let list = events
        .list(
            &ListParams::default()
                .fields("reason=DriftDetected")
                .limit(PAGE),
        )
        .await?;
    let mut items = list.items;
    items.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let mut out = std::collections::BTreeMap::new();
    for e in items {
        if let (Some(name), Some(note)) = (e.regarding.and_then(|r| r.name), e.note) {
            out.insert(name, note);
        }
    }
    Ok(out)
}

async fn list_all<K>(client: &Client, optional: bool) -> Result<Vec<K>, ExplainError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&()).to_string();
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = match api.list(&params).await {
            Ok(page) => page,
            // A CRD that is not installed (NodeOverlay on an older cluster) holds nothing.
            Err(kube::Error::Api(e)) if optional && e.code == 404 => return Ok(Vec::new()),
            Err(source) => return Err(ExplainError::Read { kind, source }),
        };
        out.extend(page.items);
        if out.len() > MAX_OBJECTS {
            return Err(ExplainError::TooLarge {
                kind,
                limit: MAX_OBJECTS,
            });
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Lists every kind once. Needs only `list` on them (see the README's read-only RBAC).
pub async fn read(client: &Client) -> Result<Live, ExplainError> {
    let mut index = ClusterIndex::default();
    for node in list_all::<Node>(client, false).await? {
        index.apply_node(node);
    }
    for claim in list_all::<NodeClaim>(client, false).await? {
        index.apply_nodeclaim(claim);
    }
    for pool in list_all::<NodePool>(client, false).await? {
        index.apply_nodepool(pool);
    }
    for pod in list_all::<Pod>(client, false).await? {
        index.apply_pod(pod);
    }
    for ds in list_all::<DaemonSet>(client, false).await? {
        index.apply_daemonset(ds);
    }
    for pdb in list_all::<PodDisruptionBudget>(client, false).await? {
        index.apply_pdb(pdb);
    }
    for pvc in list_all::<PersistentVolumeClaim>(client, false).await? {
        index.apply_pvc(pvc);
    }
    for pv in list_all::<PersistentVolume>(client, false).await? {
        index.apply_pv(pv);
    }
    for class in list_all::<StorageClass>(client, false).await? {
        index.apply_storage_class(class);
    }
    let overlays = list_all::<NodeOverlay>(client, true).await?;
    for overlay in &overlays {
        index.apply_overlay(overlay.clone());
    }
    let node_classes = list_all::<ExoscaleNodeClass>(client, false).await?;
    let mut unread = Vec::new();
    let drift_notes = drift_notes(client).await.unwrap_or_else(|e| {
        unread.push(format!(
            "DriftDetected events not read ({e}): drift is shown by reason only"
        ));
        Default::default()
    });
    Ok(Live {
        index,
        node_classes,
        overlays,
        drift_notes,
        unread,
    })
}
