//! Object builders for unit tests of the state index and the controllers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint as CoreTaint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::apis::labels::{NODEPOOL_LABEL, conditions};
use crate::apis::nodeclaim::ResourceRequirements;
use crate::apis::{
    ConditionStatus, ConditionsExt, NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassReference,
    ResourceList,
};

use super::held_pod::{HeldPod as Pod, PodSpec};

/// Marks every kind listed once, as the watches' first lists do: the index is then synced
/// unless a NodeClaim waits for its provider ID (or a kind is required or stale).
pub fn list_every_kind(index: &mut crate::state::ClusterIndex) {
    for kind in crate::state::Kind::ALL {
        index.begin_list(kind);
        index.finish_list(kind);
    }
}

pub fn ts(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + seconds).unwrap())
}

pub fn pod(namespace: &str, name: &str, node: Option<&str>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata = ObjectMeta {
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{namespace}-{name}")),
        ..Default::default()
    };
    pod.spec = Some(PodSpec {
        node_name: node.map(Into::into),
        ..Default::default()
    });
    pod
}

/// `pod`, owned (as its controller) by the DaemonSet `ds`, and pinned to its node as the
/// DaemonSet controller pins it (`matchFields: metadata.name In [<node>]`).
pub fn owned_by_daemonset(mut pod: Pod) -> Pod {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if let (Some(node), Some(spec)) = (node, pod.spec.as_mut()) {
        spec.affinity = Some(
            serde_json::from_value(serde_json::json!({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]}
            }}))
            .expect("a node affinity"),
        );
    }
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ds".into(),
            uid: "ds".into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    pod
}

pub fn node(name: &str, provider_id: Option<&str>, taints: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: provider_id.map(Into::into),
            taints: (!taints.is_empty()).then(|| {
                taints
                    .iter()
                    .map(|(key, effect)| CoreTaint {
                        key: key.to_string(),
                        effect: effect.to_string(),
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        }),
        status: Some(NodeStatus::default()),
    }
}

pub fn resources(pairs: &[(&str, &str)]) -> ResourceList {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

pub fn with_node_capacity(mut node: Node, pairs: &[(&str, &str)]) -> Node {
    let status = node.status.get_or_insert_with(Default::default);
    status.capacity = Some(resources(pairs));
    status.allocatable = Some(resources(pairs));
    node
}

pub fn nodeclaim(name: &str, nodepool: &str, provider_id: Option<&str>) -> NodeClaim {
    let mut claim = NodeClaim::new(
        name,
        NodeClaimSpec {
            taints: vec![],
            startup_taints: vec![],
            requirements: vec![],
            resources: ResourceRequirements::default(),
            node_class_ref: NodeClassReference {
                group: crate::cloudprovider::fake::NODECLASS_GROUP.into(),
                kind: crate::cloudprovider::fake::NODECLASS_KIND.into(),
                name: "default".into(),
            },
            termination_grace_period: None,
            expire_after: "720h".into(),
        },
    );
    claim.metadata.labels = Some(BTreeMap::from([(
        NODEPOOL_LABEL.to_string(),
        nodepool.to_string(),
    )]));
    claim.metadata.uid = Some(format!("uid-{name}"));
    claim.metadata.creation_timestamp = Some(ts(0));
    claim.status = Some(NodeClaimStatus {
        provider_id: provider_id.map(Into::into),
        ..Default::default()
    });
    claim
}

/// The test provider's NodeClass kind, the one [`managed_index`] serves.
pub fn served_kinds() -> Vec<(String, String)> {
    vec![(
        crate::cloudprovider::fake::NODECLASS_GROUP.into(),
        crate::cloudprovider::fake::NODECLASS_KIND.into(),
    )]
}

/// An index that serves only the test provider's NodeClass kind.
pub fn managed_index() -> crate::state::ClusterIndex {
    let mut index = crate::state::ClusterIndex::default();
    index.set_managed_kinds(served_kinds());
    index
}

/// A NodeClaim of another Karpenter in the same cluster (upstream's KWOK provider).
pub fn foreign(mut claim: NodeClaim) -> NodeClaim {
    claim.spec.node_class_ref = NodeClassReference {
        group: "karpenter.kwok.sh".into(),
        kind: "KWOKNodeClass".into(),
        name: "default".into(),
    };
    claim
}

pub fn with_capacity(mut claim: NodeClaim, pairs: &[(&str, &str)]) -> NodeClaim {
    let status = claim.status.get_or_insert_with(Default::default);
    status.capacity = resources(pairs);
    status.allocatable = resources(pairs);
    claim
}

pub fn set_condition(
    mut claim: NodeClaim,
    type_: &str,
    status: ConditionStatus,
    at: i64,
) -> NodeClaim {
    claim
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .set_condition(type_, status, type_, "", None, ts(at).0);
    claim
}

pub fn registered(claim: NodeClaim) -> NodeClaim {
    let claim = set_condition(claim, conditions::LAUNCHED, ConditionStatus::True, 0);
    set_condition(claim, conditions::REGISTERED, ConditionStatus::True, 0)
}

pub fn pdb(namespace: &str, name: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A VolumeAttachment of a PersistentVolume (`None`: an inline volume) to a node.
pub fn volume_attachment(
    name: &str,
    node: &str,
    pv: Option<&str>,
) -> k8s_openapi::api::storage::v1::VolumeAttachment {
    use k8s_openapi::api::storage::v1::{
        VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
    };
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: "csi.example.com".into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: pv.map(Into::into),
                ..Default::default()
            },
        },
        status: None,
    }
}
