//! Volume checks for pending pods (karpenter-core §3.2 step 3 and §3.3 step 3): a pod whose
//! claims cannot be satisfied by any new node is not provisioned for (a `FailedScheduling` event
//! names the claim), and a claim's topology (a bound volume's node affinity, or the StorageClass's
//! allowed topologies while binding waits for the first consumer) narrows the node it gets.
//! Pure over a [`VolumeLookup`] so it is tested without a cluster.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use crate::apis::labels::HOSTNAME_LABEL;
use crate::scheduling::convert::node_selector_term;
use crate::scheduling::{Operator, Requirement, Requirements};
use crate::state::HeldPod as Pod;
use crate::state::pods::{PodClaim, claims};

/// The API server sets this once a claim's binding is complete.
const BIND_COMPLETED_ANNOTATION: &str = "pv.kubernetes.io/bind-completed";

/// Where the checks read claims, volumes and classes (the cluster index in production).
pub trait VolumeLookup {
    fn pvc(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>>;
    /// The class marked `storageclass.kubernetes.io/is-default-class: "true"`.
    fn default_storage_class(&self) -> Option<Arc<StorageClass>>;
}

/// Marks the class admission gives claims that name none.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// The default class among `classes` (the newest wins when several claim it, as admission does).
pub fn default_class<'a>(
    classes: impl IntoIterator<Item = &'a Arc<StorageClass>>,
) -> Option<Arc<StorageClass>> {
    classes
        .into_iter()
        .filter(|c| {
            c.annotations()
                .get(DEFAULT_CLASS_ANNOTATION)
                .map(String::as_str)
                == Some("true")
        })
        .max_by_key(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .cloned()
}

impl VolumeLookup for crate::state::ClusterIndex {
    fn pvc(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        crate::state::ClusterIndex::pvc(self, namespace, name)
    }
    fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        crate::state::ClusterIndex::pv(self, name)
    }
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        crate::state::ClusterIndex::storage_class(self, name)
    }
    fn default_storage_class(&self) -> Option<Arc<StorageClass>> {
        default_class(&self.storage_classes())
    }
}

/// Why a pod's volumes keep it from being provisioned for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VolumeError {
    #[error("persistentvolumeclaim {0:?} not found")]
    ClaimNotFound(String),
    #[error("persistentvolumeclaim {0:?} is being deleted")]
    ClaimDeleting(String),
    #[error("persistentvolumeclaim {0:?} has lost its volume")]
    ClaimLost(String),
    #[error(
        "persistentvolumeclaim {claim:?} is bound to persistentvolume {volume:?}, which is not found"
    )]
    VolumeNotFound { claim: String, volume: String },
    #[error(
        "persistentvolumeclaim {claim:?} is bound to persistentvolume {volume:?}, which is being deleted"
    )]
    VolumeDeleting { claim: String, volume: String },
    #[error("persistentvolumeclaim {0:?} is still binding")]
    BindingIncomplete(String),
    #[error("persistentvolumeclaim {0:?} is unbound and names no storage class")]
    NoStorageClass(String),
    #[error("persistentvolumeclaim {claim:?} uses storage class {class:?}, which is not found")]
    StorageClassNotFound { claim: String, class: String },
    #[error(
        "persistentvolumeclaim {claim:?} is unbound and storage class {class:?} binds Immediately; it will be bound to a volume before the pod can be placed"
    )]
    ImmediateBinding { claim: String, class: String },
    #[error("volume topology of {claim:?} is invalid: {message}")]
    InvalidTopology { claim: String, message: String },
    #[error("the topologies of the pod's volumes exclude each other")]
    IncompatibleTopologies,
}

/// Node constraints of one volume: alternatives (any one suffices); empty = unconstrained.
type Alternatives = Vec<Requirements>;

fn volume_topology(claim: &str, pv: &PersistentVolume) -> Result<Alternatives, VolumeError> {
    let terms = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    // A local volume pins the pod to one node's name; a new node has another name, so only
    // the rest of the term (its zone…) can guide provisioning.
    let local = pv
        .spec
        .as_ref()
        .is_some_and(|s| s.local.is_some() || s.host_path.is_some());
    terms
        .iter()
        .map(|term| {
            let mut reqs =
                node_selector_term(claim, term).map_err(|e| VolumeError::InvalidTopology {
                    claim: claim.to_string(),
                    message: e.to_string(),
                })?;
            if local {
                reqs.remove(HOSTNAME_LABEL);
            }
            Ok(reqs)
        })
        .collect()
}

fn class_topology(claim: &str, class: &StorageClass) -> Result<Alternatives, VolumeError> {
    class
        .allowed_topologies
        .iter()
        .flatten()
        .map(|term| {
            let mut reqs = Requirements::new();
            for e in term.match_label_expressions.iter().flatten() {
                let r = Requirement::new(&e.key, Operator::In, e.values.clone()).map_err(|e| {
                    VolumeError::InvalidTopology {
                        claim: claim.to_string(),
                        message: e.to_string(),
                    }
                })?;
                reqs.add(r);
            }
            Ok(reqs)
        })
        .collect()
}

fn unbound_class_topology(
    claim: &str,
    class_name: Option<&str>,
    volumes: &impl VolumeLookup,
) -> Result<Alternatives, VolumeError> {
    let class_name = class_name
        .filter(|c| !c.is_empty())
        .ok_or_else(|| VolumeError::NoStorageClass(claim.to_string()))?;
    claim_class_topology(claim, class_name, volumes)
}

fn claim_class_topology(
    claim: &str,
    class_name: &str,
    volumes: &impl VolumeLookup,
) -> Result<Alternatives, VolumeError> {
    let class =
        volumes
            .storage_class(class_name)
            .ok_or_else(|| VolumeError::StorageClassNotFound {
                claim: claim.to_string(),
                class: class_name.to_string(),
            })?;
    if class.volume_binding_mode.as_deref().unwrap_or("Immediate") == "Immediate" {
        return Err(VolumeError::ImmediateBinding {
            claim: claim.to_string(),
            class: class_name.to_string(),
        });
    }
    class_topology(claim, &class)
}

fn claim_topology(
    namespace: &str,
    claim: &PodClaim<'_>,
    volumes: &impl VolumeLookup,
) -> Result<Alternatives, VolumeError> {
    let name = &claim.name;
    let Some(pvc) = volumes.pvc(namespace, name) else {
        // An ephemeral claim is created by its controller once the pod exists; until then its
        // template's class decides.
        let Some(template) = &claim.ephemeral else {
            return Err(VolumeError::ClaimNotFound(name.clone()));
        };
        let class = template
            .and_then(|t| t.spec.storage_class_name.as_deref())
            .filter(|c| !c.is_empty());
        return match class {
            Some(class) => unbound_class_topology(name, Some(class), volumes),
            // No class in the template: admission will give the claim the default class.
            None => match volumes.default_storage_class() {
                Some(class) => claim_class_topology(name, &class.name_any(), volumes),
                None => Err(VolumeError::NoStorageClass(name.clone())),
            },
        };
    };
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(VolumeError::ClaimDeleting(name.clone()));
    }
    if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
        return Err(VolumeError::ClaimLost(name.clone()));
    }
    let spec = pvc.spec.as_ref();
    match spec
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
    {
        Some(volume) => {
            let pv = volumes
                .pv(volume)
                .ok_or_else(|| VolumeError::VolumeNotFound {
                    claim: name.clone(),
                    volume: volume.to_string(),
                })?;
            if pv.metadata.deletion_timestamp.is_some() {
                return Err(VolumeError::VolumeDeleting {
                    claim: name.clone(),
                    volume: volume.to_string(),
                });
            }
            if !pvc.annotations().contains_key(BIND_COMPLETED_ANNOTATION) {
                return Err(VolumeError::BindingIncomplete(name.clone()));
            }
            volume_topology(name, &pv)
        }
        None => unbound_class_topology(
            name,
            spec.and_then(|s| s.storage_class_name.as_deref()),
            volumes,
        ),
    }
}

/// Combines per-volume alternatives: the cross product, keeping only compatible branches.
fn combine(all: Vec<Alternatives>) -> Result<Alternatives, VolumeError> {
    let mut branches: Alternatives = vec![Requirements::new()];
    for alternatives in all.into_iter().filter(|a| !a.is_empty()) {
        let mut next = Vec::new();
        for branch in &branches {
            for alternative in &alternatives {
                if branch.intersects(alternative).is_ok() {
                    next.push(branch.intersection(alternative));
                }
            }
        }
        if next.is_empty() {
            return Err(VolumeError::IncompatibleTopologies);
        }
        branches = next;
    }
    Ok(branches)
}

/// One requirement set for the node. The scheduler takes a single set: alternatives that differ
/// only in the values of one `In` key (zones, usually) merge exactly; otherwise the first branch
/// is used, which is narrower than necessary but never places a pod where a volume cannot go.
fn merge(branches: Alternatives) -> Option<Requirements> {
    let first = branches.first()?.clone();
    if branches.len() == 1 {
        return Some(first);
    }
    let single_in_key = |r: &Requirements| -> Option<(String, Vec<String>)> {
        let mut items = r.iter();
        let only = items.next()?;
        (items.next().is_none() && only.operator() == Operator::In)
            .then(|| (only.key().to_string(), only.values().to_vec()))
    };
    let mut key = None;
    let mut values: Vec<String> = Vec::new();
    for branch in &branches {
        let Some((k, v)) = single_in_key(branch) else {
            return Some(first);
        };
        if key.get_or_insert_with(|| k.clone()) != &k {
            return Some(first);
        }
        for value in v {
            if !values.contains(&value) {
                values.push(value);
            }
        }
    }
    Some(Requirements::from_requirements([Requirement::in_values(
        &key?, values,
    )]))
}

/// Checks the pod's claims and returns the node constraints their volumes impose (`None` when
/// they impose none).
pub fn volume_requirements(
    pod: &Pod,
    volumes: &impl VolumeLookup,
) -> Result<Option<Requirements>, VolumeError> {
    let claims = claims(pod);
    if claims.is_empty() {
        return Ok(None);
    }
    let namespace = pod.namespace().unwrap_or_default();
    let per_volume = claims
        .iter()
        .map(|c| claim_topology(&namespace, c, volumes))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = merge(combine(per_volume)?);
    Ok(merged.filter(|r| !r.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Volumes {
        pvcs: BTreeMap<String, Arc<PersistentVolumeClaim>>,
        pvs: BTreeMap<String, Arc<PersistentVolume>>,
        classes: BTreeMap<String, Arc<StorageClass>>,
    }

    impl VolumeLookup for Volumes {
        fn pvc(&self, _: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            self.pvcs.get(name).cloned()
        }
        fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
            self.pvs.get(name).cloned()
        }
        fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
            self.classes.get(name).cloned()
        }
        fn default_storage_class(&self) -> Option<Arc<StorageClass>> {
            default_class(self.classes.values())
        }
    }

    impl Volumes {
        fn claim(mut self, value: serde_json::Value) -> Self {
            let pvc: PersistentVolumeClaim = serde_json::from_value(value).unwrap();
            self.pvcs.insert(pvc.name_any(), Arc::new(pvc));
            self
        }
        fn volume(mut self, value: serde_json::Value) -> Self {
            let pv: PersistentVolume = serde_json::from_value(value).unwrap();
            self.pvs.insert(pv.name_any(), Arc::new(pv));
            self
        }
        fn class(mut self, name: &str, mode: &str, zones: &[&str]) -> Self {
            let mut value = json!({"metadata": {"name": name}, "provisioner": "csi.exoscale.com",
                "volumeBindingMode": mode});
            if !zones.is_empty() {
                value["allowedTopologies"] = json!([{"matchLabelExpressions": [
                    {"key": "topology.csi.exoscale.com/zone", "values": zones}]}]);
            }
            let class: StorageClass = serde_json::from_value(value).unwrap();
            self.classes.insert(name.into(), Arc::new(class));
            self
        }
    }

    fn pod_with(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "db-0", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}}))
        .unwrap()
    }

    fn claim_volume(claim: &str) -> serde_json::Value {
        json!({"name": claim, "persistentVolumeClaim": {"claimName": claim}})
    }

    fn bound_claim(name: &str, volume: &str) -> serde_json::Value {
        json!({"metadata": {"name": name, "namespace": "default",
                "annotations": {BIND_COMPLETED_ANNOTATION: "yes"}},
            "spec": {"volumeName": volume}, "status": {"phase": "Bound"}})
    }

    fn zonal_volume(name: &str, zones: &[&str]) -> serde_json::Value {
        json!({"metadata": {"name": name}, "spec": {"nodeAffinity": {"required": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.csi.exoscale.com/zone", "operator": "In", "values": zones}]}]}}}})
    }

    fn zones_of(reqs: &Requirements) -> Vec<String> {
        reqs.get("topology.kubernetes.io/zone")
            .map(|r| r.values().to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn pods_without_claims_are_unconstrained() {
        let pod = pod_with(json!([{"name": "scratch", "emptyDir": {}}]));
        assert_eq!(volume_requirements(&pod, &Volumes::default()), Ok(None));
    }

    #[test]
    fn a_bound_volume_pins_the_node_to_its_zone_under_the_standard_key() {
        let volumes = Volumes::default()
            .claim(bound_claim("data", "pv-1"))
            .volume(zonal_volume("pv-1", &["ch-gva-2"]));
        let reqs = volume_requirements(&pod_with(json!([claim_volume("data")])), &volumes)
            .unwrap()
            .unwrap();
        assert_eq!(zones_of(&reqs), ["ch-gva-2"]);
    }

    #[test]
    fn missing_deleting_lost_or_half_bound_claims_are_named() {
        let pod = pod_with(json!([claim_volume("data")]));
        assert_eq!(
            volume_requirements(&pod, &Volumes::default()),
            Err(VolumeError::ClaimNotFound("data".into()))
        );
        let lost = Volumes::default().claim(json!({"metadata": {"name": "data"},
            "spec": {}, "status": {"phase": "Lost"}}));
        assert_eq!(
            volume_requirements(&pod, &lost),
            Err(VolumeError::ClaimLost("data".into()))
        );
        let deleting = Volumes::default().claim(json!({"metadata": {"name": "data",
            "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["kubernetes.io/pvc-protection"]},
            "spec": {}}));
        assert_eq!(
            volume_requirements(&pod, &deleting),
            Err(VolumeError::ClaimDeleting("data".into()))
        );
        let no_volume = Volumes::default().claim(bound_claim("data", "pv-gone"));
        assert!(matches!(
            volume_requirements(&pod, &no_volume),
            Err(VolumeError::VolumeNotFound { .. })
        ));
        let binding = Volumes::default()
            .claim(json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv-1"}}))
            .volume(zonal_volume("pv-1", &["ch-gva-2"]));
        assert_eq!(
            volume_requirements(&pod, &binding),
            Err(VolumeError::BindingIncomplete("data".into()))
        );
    }

    #[test]
    fn unbound_claims_need_an_existing_wait_for_first_consumer_class() {
        let pod = pod_with(json!([claim_volume("data")]));
        let unbound = |class: Option<&str>| {
            json!({"metadata": {"name": "data"}, "spec": {"storageClassName": class},
                "status": {"phase": "Pending"}})
        };
        let no_class = Volumes::default().claim(unbound(None));
        assert_eq!(
            volume_requirements(&pod, &no_class),
            Err(VolumeError::NoStorageClass("data".into()))
        );
        let missing = Volumes::default().claim(unbound(Some("fast")));
        assert!(matches!(
            volume_requirements(&pod, &missing),
            Err(VolumeError::StorageClassNotFound { .. })
        ));
        let immediate =
            Volumes::default()
                .claim(unbound(Some("fast")))
                .class("fast", "Immediate", &[]);
        let error = volume_requirements(&pod, &immediate).unwrap_err();
        assert!(error.to_string().contains("Immediate"), "{error}");
        let waiting = Volumes::default().claim(unbound(Some("fast"))).class(
            "fast",
            "WaitForFirstConsumer",
            &["ch-gva-2", "de-fra-1"],
        );
        let reqs = volume_requirements(&pod, &waiting).unwrap().unwrap();
        assert_eq!(zones_of(&reqs), ["ch-gva-2", "de-fra-1"]);
        let anywhere = Volumes::default().claim(unbound(Some("fast"))).class(
            "fast",
            "WaitForFirstConsumer",
            &[],
        );
        assert_eq!(volume_requirements(&pod, &anywhere), Ok(None));
    }

    #[test]
    fn ephemeral_claims_follow_their_template_class_until_created() {
        let pod = pod_with(
            json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}}]),
        );
        let volumes = Volumes::default().class("fast", "WaitForFirstConsumer", &["ch-gva-2"]);
        let reqs = volume_requirements(&pod, &volumes).unwrap().unwrap();
        assert_eq!(zones_of(&reqs), ["ch-gva-2"]);
        // Once created, the claim `<pod>-<volume>` is checked like any other.
        let created = volumes
            .claim(bound_claim("db-0-scratch", "pv-9"))
            .volume(zonal_volume("pv-9", &["ch-gva-2"]));
        assert!(volume_requirements(&pod, &created).unwrap().is_some());
    }

    #[test]
    fn an_ephemeral_claim_without_a_class_uses_the_default_class() {
        let pod = pod_with(
            json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}}]),
        );
        assert_eq!(
            volume_requirements(&pod, &Volumes::default()),
            Err(VolumeError::NoStorageClass("db-0-scratch".into()))
        );
        let mut volumes =
            Volumes::default().class("standard", "WaitForFirstConsumer", &["ch-gva-2"]);
        let mut class = (*volumes.classes["standard"]).clone();
        class
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(DEFAULT_CLASS_ANNOTATION.into(), "true".into());
        volumes.classes.insert("standard".into(), Arc::new(class));
        let reqs = volume_requirements(&pod, &volumes).unwrap().unwrap();
        assert_eq!(zones_of(&reqs), ["ch-gva-2"]);
    }

    #[test]
    fn volumes_in_different_zones_exclude_each_other() {
        let volumes = Volumes::default()
            .claim(bound_claim("a", "pv-a"))
            .claim(bound_claim("b", "pv-b"))
            .volume(zonal_volume("pv-a", &["ch-gva-2"]))
            .volume(zonal_volume("pv-b", &["de-fra-1"]));
        let pod = pod_with(json!([claim_volume("a"), claim_volume("b")]));
        assert_eq!(
            volume_requirements(&pod, &volumes),
            Err(VolumeError::IncompatibleTopologies)
        );
        let overlapping = Volumes::default()
            .claim(bound_claim("a", "pv-a"))
            .claim(bound_claim("b", "pv-b"))
            .volume(zonal_volume("pv-a", &["ch-gva-2", "de-fra-1"]))
            .volume(zonal_volume("pv-b", &["de-fra-1"]));
        let reqs = volume_requirements(&pod, &overlapping).unwrap().unwrap();
        assert_eq!(zones_of(&reqs), ["de-fra-1"]);
    }

    #[test]
    fn a_local_volume_keeps_its_zone_but_not_its_old_hostname() {
        let volumes = Volumes::default().claim(bound_claim("data", "local-1")).volume(json!({
            "metadata": {"name": "local-1"}, "spec": {"local": {"path": "/mnt/disk"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["old-node"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["ch-gva-2"]}]}]}}}}));
        let reqs = volume_requirements(&pod_with(json!([claim_volume("data")])), &volumes)
            .unwrap()
            .unwrap();
        assert!(!reqs.has(HOSTNAME_LABEL));
        assert_eq!(zones_of(&reqs), ["ch-gva-2"]);
    }

    #[test]
    fn alternatives_over_one_key_merge_and_others_keep_the_first_branch() {
        let zone = |z: &str| {
            Requirements::from_requirements([Requirement::in_values(
                "topology.kubernetes.io/zone",
                [z],
            )])
        };
        let merged = merge(vec![zone("a"), zone("b")]).unwrap();
        assert_eq!(zones_of(&merged), ["a", "b"]);
        let mut mixed = zone("a");
        mixed.add(Requirement::in_values("kubernetes.io/arch", ["amd64"]));
        let first = merge(vec![mixed.clone(), zone("b")]).unwrap();
        assert_eq!(first, mixed);
    }
}
