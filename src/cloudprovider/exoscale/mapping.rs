//! Translations between Exoscale's answers and the Karpenter contract: an instance as a
//! NodeClaim, a launch failure as a cloud-provider error.

use std::collections::BTreeMap;

use crate::apis::labels::{
    EXOSCALE_GROUP, INSTANCE_CLUSTER_UID_LABEL, INSTANCE_NODECLAIM_LABEL, INSTANCE_NODEPOOL_LABEL,
    NODEPOOL_LABEL,
};
use crate::apis::{
    NodeClaim, NodeClaimSpec, NodeClassReference, NodeSelectorRequirementWithMinValues, Operator,
};
use crate::cloudprovider::CloudProviderError;
use crate::cloudprovider::error::reasons;
use crate::exoscale::models::Instance;
use crate::providers::instance::{self, LaunchError};
use crate::providers::instance_types::{self, DiscoveredType, to_resource_list};
use crate::scheduling::labels::{CAPACITY_TYPE, INSTANCE_TYPE, ZONE};

use super::settings::NODECLASS_KIND;

pub(super) fn launch_error(e: LaunchError, instance_type: &str, zone: &str) -> CloudProviderError {
    match e {
        LaunchError::Capacity(err) => CloudProviderError::InsufficientCapacity {
            message: format!("{instance_type} in {zone}: {err}"),
            offerings: vec![(instance_type.to_string(), zone.to_string())],
        },
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
        // Exoscale disks are at most a few TiB; a size past i64 is no size at all.
        let disk = instance
            .disk_size
            .and_then(|gib| i64::try_from(gib).ok())
            .unwrap_or(0);
        status.capacity = to_resource_list(&instance_types::capacity(
            t,
            disk,
            crate::apis::nodeclass::DEFAULT_MAX_PODS,
        ));
    }
    claim
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
