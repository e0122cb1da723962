//! Which VolumeAttachments a terminating node must wait for before its instance is deleted
//! (karpenter-core §4.2 step 6). Deleting the instance while a CSI driver still has a volume
//! attached can leave the volume stuck "in use" for its next consumer.
//!
//! Pure: the caller passes the attachments (from cluster state), the node's pods, and resolves
//! PersistentVolumeClaims.

use std::collections::BTreeSet;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;

use crate::state::HeldPod as Pod;

use super::drain::never_drained;

/// A PersistentVolumeClaim by namespace and name.
pub type ClaimRef = (String, String);

/// The PersistentVolumeClaims used by pods the drain leaves in place (mirror pods, pods
/// tolerating the disrupted taint, pods stuck terminating): their volumes stay attached until
/// the instance goes, so waiting for them would only stall termination.
pub fn claims_of_undrained_pods(
    pods: &[impl std::borrow::Borrow<Pod>],
    now: Timestamp,
) -> BTreeSet<ClaimRef> {
    let mut claims = BTreeSet::new();
    for pod in pods.iter().map(std::borrow::Borrow::borrow) {
        if !never_drained(pod, now) {
            continue;
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        for claim in crate::state::pods::claims(pod) {
            claims.insert((namespace.clone(), claim.name));
        }
    }
    claims
}

/// The attachments on `node` to wait for: those of a PersistentVolume not in `spared`.
/// Inline (non-PV) attachments are not waited for, as upstream does.
pub fn blocking_attachments<'a>(
    attachments: &'a [impl std::borrow::Borrow<VolumeAttachment>],
    node: &str,
    spared: &BTreeSet<String>,
) -> Vec<&'a VolumeAttachment> {
    attachments
        .iter()
        .map(std::borrow::Borrow::borrow)
        .filter(|va| va.spec.node_name == node)
        .filter(|va| {
            va.spec
                .source
                .persistent_volume_name
                .as_ref()
                .is_some_and(|pv| !spared.contains(pv))
        })
        .collect()
}

/// What step 6 concludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detachment {
    /// Nothing left attached (that we wait for).
    Detached,
    /// Still attached: wait. Holds the attachment names.
    Awaiting(Vec<String>),
    /// Still attached but the termination deadline passed: go on without them.
    DeadlinePassed(Vec<String>),
}

/// Decides step 6 from the blocking attachments, the clock and the termination deadline.
pub fn detachment(
    blocking: &[&VolumeAttachment],
    now: Timestamp,
    deadline: Option<Timestamp>,
) -> Detachment {
    if blocking.is_empty() {
        return Detachment::Detached;
    }
    let mut names: Vec<String> = blocking
        .iter()
        .map(|va| va.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    if deadline.is_some_and(|d| now >= d) {
        Detachment::DeadlinePassed(names)
    } else {
        Detachment::Awaiting(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::DISRUPTED_TAINT_KEY;
    use crate::state::held_pod::Volume;
    use crate::state::testing::{pod, ts, volume_attachment as attachment};
    use k8s_openapi::api::core::v1::{
        EphemeralVolumeSource, PersistentVolumeClaimVolumeSource, Toleration,
    };

    fn with_claim(mut p: Pod, volume: &str, claim: &str) -> Pod {
        p.spec
            .as_mut()
            .unwrap()
            .volumes
            .get_or_insert_with(Vec::new)
            .push(Volume {
                name: volume.into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Default::default()
            });
        p
    }

    fn tolerating(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().tolerations = Some(
            vec![Toleration {
                key: Some(DISRUPTED_TAINT_KEY.into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }]
            .into(),
        );
        p
    }

    fn mirror(mut p: Pod) -> Pod {
        p.metadata.annotations = Some(
            [("kubernetes.io/config.mirror".to_string(), "x".to_string())]
                .into_iter()
                .collect(),
        );
        p
    }

    #[test]
    fn only_claims_of_pods_the_drain_leaves_are_spared() {
        let now = ts(1000).0;
        let drained = with_claim(pod("ns", "app", Some("n1")), "data", "app-data");
        let daemon = with_claim(
            tolerating(pod("ns", "agent", Some("n1"))),
            "d",
            "agent-data",
        );
        let static_pod = with_claim(mirror(pod("kube-system", "etcd", Some("n1"))), "d", "etcd");
        let mut stuck = with_claim(pod("ns", "stuck", Some("n1")), "d", "stuck-data");
        stuck.metadata.deletion_timestamp = Some(ts(100));
        let mut scratch = tolerating(pod("ns", "scratch", Some("n1")));
        scratch.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "tmp".into(),
            ephemeral: Some(EphemeralVolumeSource::default()),
            ..Default::default()
        }]);
        let claims = claims_of_undrained_pods(&[drained, daemon, static_pod, stuck, scratch], now);
        let expected: BTreeSet<ClaimRef> = [
            ("ns", "agent-data"),
            ("kube-system", "etcd"),
            ("ns", "stuck-data"),
            ("ns", "scratch-tmp"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(claims, expected);
    }

    #[test]
    fn attachments_of_this_node_block_unless_spared_or_inline() {
        let all = vec![
            attachment("va-app", "n1", Some("pv-app")),
            attachment("va-agent", "n1", Some("pv-agent")),
            attachment("va-inline", "n1", None),
            attachment("va-other-node", "n2", Some("pv-x")),
        ];
        let spared: BTreeSet<String> = ["pv-agent".to_string()].into();
        let blocking = blocking_attachments(&all, "n1", &spared);
        let names: Vec<_> = blocking
            .iter()
            .map(|va| va.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(names, vec!["va-app"]);
    }

    #[test]
    fn waits_until_detached_or_the_deadline_passes() {
        let va = attachment("va-app", "n1", Some("pv-app"));
        let blocking = vec![&va];
        assert_eq!(
            detachment(&[], ts(0).0, Some(ts(10).0)),
            Detachment::Detached
        );
        assert_eq!(
            detachment(&blocking, ts(0).0, None),
            Detachment::Awaiting(vec!["va-app".into()])
        );
        assert_eq!(
            detachment(&blocking, ts(9).0, Some(ts(10).0)),
            Detachment::Awaiting(vec!["va-app".into()])
        );
        assert_eq!(
            detachment(&blocking, ts(10).0, Some(ts(10).0)),
            Detachment::DeadlinePassed(vec!["va-app".into()])
        );
    }
}
