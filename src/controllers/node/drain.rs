//! Which pods a terminating node must get rid of, in what order, and how (karpenter-core §4.2).
//! Pure: the caller passes the pods bound to the node, the clock and the termination deadline.

use crate::state::pods::{is_daemonset_pod, is_mirror, is_terminal};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::apis::labels::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};
use crate::state::HeldPod as Pod;

/// Pods deleted more than this long ago that still exist are "stuck" and no longer waited for.
const STUCK_TERMINATING_AFTER: Duration = Duration::from_secs(60);
/// Default pod grace period when the spec does not say.
const DEFAULT_POD_GRACE_SECONDS: i64 = 30;

/// Eviction tiers, evicted one at a time in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    NonCriticalWorkload,
    NonCriticalDaemon,
    CriticalWorkload,
    CriticalDaemon,
}

/// What to do with one pod now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodAction {
    /// Delete now with this grace period: the termination deadline forces it; bypasses PDBs
    /// and `karpenter.sh/do-not-disrupt`. `already_deleting`: the pod was evicted or deleted
    /// before, with a grace period running past the deadline; this shortens it, and the pod
    /// was counted as drained back then.
    ForceDelete {
        grace_period_seconds: i64,
        already_deleting: bool,
    },
    /// POST an eviction (respects PDBs).
    Evict,
    /// Still there, nothing to send: terminating, protected by do-not-disrupt, or in a later tier.
    Wait(WaitReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    Terminating,
    DoNotDisrupt,
    LaterTier,
}

/// One pod the termination deadline forces out (see [`PodAction::ForceDelete`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForceDeletion<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
    pub grace_period_seconds: i64,
    pub already_deleting: bool,
}

/// The drain decision for a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// `(namespace, name, uid, action)` for every pod that still blocks the drain.
    pub pods: Vec<(String, String, Option<String>, PodAction)>,
}

impl DrainPlan {
    /// Nothing blocks the drain any more.
    pub fn is_drained(&self) -> bool {
        self.pods.is_empty()
    }

    /// `(namespace, name, uid, grace period, already deleting)` of each forced deletion.
    pub fn force_deletions(&self) -> impl Iterator<Item = ForceDeletion<'_>> {
        self.pods
            .iter()
            .filter_map(|(ns, name, uid, action)| match action {
                PodAction::ForceDelete {
                    grace_period_seconds,
                    already_deleting,
                } => Some(ForceDeletion {
                    namespace: ns,
                    name,
                    uid: uid.as_deref(),
                    grace_period_seconds: *grace_period_seconds,
                    already_deleting: *already_deleting,
                }),
                _ => None,
            })
    }
}

fn is_critical(pod: &Pod) -> bool {
    matches!(
        pod.spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref()),
        Some("system-cluster-critical") | Some("system-node-critical")
    )
}

/// Pods tolerating `karpenter.sh/disrupted:NoSchedule` would come straight back; not drained.
fn tolerates_disrupted_taint(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .into_iter()
        .flatten()
        .any(|t| {
            let effect_ok = t
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "NoSchedule");
            let op = t.operator.as_deref().unwrap_or("Equal");
            let key_ok = match t.key.as_deref() {
                None | Some("") => op == "Exists",
                Some(key) => key == DISRUPTED_TAINT_KEY,
            };
            effect_ok && key_ok
        })
}

/// `karpenter.sh/do-not-disrupt` protects the pod from eviction now, by the rule disruption's
/// decisions use ([`crate::disruption::model::do_not_disrupt_protects`]).
pub fn do_not_disrupt_active(pod: &Pod, now: Timestamp) -> bool {
    let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DO_NOT_DISRUPT_ANNOTATION))
    else {
        return false;
    };
    use crate::controllers::disruption::view::to_chrono;
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(to_chrono);
    let now = to_chrono(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    crate::disruption::model::do_not_disrupt_protects(value, started, now)
}

fn deletion(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.deletion_timestamp.as_ref().map(|t| t.0)
}

fn grace_seconds(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_POD_GRACE_SECONDS)
}

/// The eviction tier of a pod.
pub fn tier(pod: &Pod) -> Tier {
    match (is_critical(pod), is_daemonset_pod(pod)) {
        (false, false) => Tier::NonCriticalWorkload,
        (false, true) => Tier::NonCriticalDaemon,
        (true, false) => Tier::CriticalWorkload,
        (true, true) => Tier::CriticalDaemon,
    }
}

/// Pods the drain never removes, whatever their phase: mirror pods (the kubelet owns them),
/// pods tolerating the disrupted taint (they would come straight back) and pods stuck
/// terminating. Their volumes are not waited for either.
pub fn never_drained(pod: &Pod, now: Timestamp) -> bool {
    let stuck = deletion(pod).is_some_and(|d| {
        now.duration_since(d).as_secs() > STUCK_TERMINATING_AFTER.as_secs() as i64
    });
    is_mirror(pod) || tolerates_disrupted_taint(pod) || stuck
}

/// Pods the drain must wait for.
pub fn drainable(pod: &Pod, now: Timestamp) -> bool {
    !is_terminal(pod) && !never_drained(pod, now)
}

fn seconds_until(deadline: Timestamp, now: Timestamp) -> i64 {
    deadline.duration_since(now).as_secs()
}

/// The grace period of a forced deletion: what is left until the deadline, at least 1 s.
fn forced_grace(deadline: Timestamp, now: Timestamp) -> i64 {
    seconds_until(deadline, now).max(1)
}

/// The deletion timestamp a forced deletion sent now would give the pod.
fn forced_deletion_time(deadline: Timestamp, now: Timestamp) -> Timestamp {
    deadline.max(now + Duration::from_secs(1))
}

/// Plans the drain of a node given its pods, the time and the termination deadline.
pub fn plan(
    pods: &[impl std::borrow::Borrow<Pod>],
    now: Timestamp,
    deadline: Option<Timestamp>,
) -> DrainPlan {
    let candidates: Vec<&Pod> = pods
        .iter()
        .map(std::borrow::Borrow::borrow)
        .filter(|p| drainable(p, now))
        .collect();
    let mut forced = Vec::new();
    let mut rest = Vec::new();
    for pod in candidates {
        let must_force = deadline.is_some_and(|deadline| match deletion(pod) {
            // Already deleting: only a deletion that would outlive what a forced deletion now
            // sets (the deadline, or 1 s once it is past) needs a new, shorter one.
            Some(deleting_until) => deleting_until > forced_deletion_time(deadline, now),
            None => seconds_until(deadline, now) <= grace_seconds(pod),
        });
        if must_force {
            forced.push(pod);
        } else {
            rest.push(pod);
        }
    }
    let current_tier = rest.iter().map(|p| tier(p)).min();
    let mut plan = DrainPlan::default();
    let id = |pod: &Pod| {
        (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
            pod.metadata.uid.clone(),
        )
    };
    for pod in forced {
        let (ns, name, uid) = id(pod);
        let grace = deadline.map(|d| forced_grace(d, now)).unwrap_or(1);
        plan.pods.push((
            ns,
            name,
            uid,
            PodAction::ForceDelete {
                grace_period_seconds: grace,
                already_deleting: deletion(pod).is_some(),
            },
        ));
    }
    for pod in rest {
        let (ns, name, uid) = id(pod);
        let action = if deletion(pod).is_some() {
            PodAction::Wait(WaitReason::Terminating)
        } else if Some(tier(pod)) != current_tier {
            PodAction::Wait(WaitReason::LaterTier)
        } else if do_not_disrupt_active(pod, now) {
            PodAction::Wait(WaitReason::DoNotDisrupt)
        } else {
            PodAction::Evict
        };
        plan.pods.push((ns, name, uid, action));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::held_pod::PodStatus;
    use crate::state::testing::{pod, ts};
    use k8s_openapi::api::core::v1::Toleration;

    fn daemon(p: Pod) -> Pod {
        crate::state::testing::owned_by_daemonset(p)
    }

    fn critical(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        p
    }

    fn annotated(mut p: Pod, key: &str, value: &str) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        p
    }

    fn actions(plan: &DrainPlan) -> Vec<(String, PodAction)> {
        plan.pods
            .iter()
            .map(|(_, name, _, a)| (name.clone(), a.clone()))
            .collect()
    }

    fn evicted(plan: &DrainPlan) -> Vec<&str> {
        plan.pods
            .iter()
            .filter(|p| p.3 == PodAction::Evict)
            .map(|p| p.1.as_str())
            .collect()
    }

    #[test]
    fn evicts_one_tier_at_a_time_in_upstream_order() {
        let now = ts(0).0;
        let pods = vec![
            critical(daemon(pod("ns", "crit-ds", Some("n")))),
            critical(pod("ns", "crit", Some("n"))),
            daemon(pod("ns", "ds", Some("n"))),
            pod("ns", "app", Some("n")),
        ];
        let first = plan(&pods, now, None);
        assert_eq!(evicted(&first), vec!["app"]);
        let second = plan(&pods[..3], now, None);
        assert_eq!(evicted(&second), vec!["ds"]);
        let third = plan(&pods[..2], now, None);
        assert_eq!(evicted(&third), vec!["crit"]);
        let last = plan(&pods[..1], now, None);
        assert_eq!(evicted(&last), vec!["crit-ds"]);
        assert!(plan(&Vec::<Pod>::new(), now, None).is_drained());
    }

    #[test]
    fn ignores_mirror_terminal_tolerating_and_stuck_pods() {
        let now = ts(1000).0;
        let mirror = annotated(
            pod("ns", "mirror", Some("n")),
            "kubernetes.io/config.mirror",
            "x",
        );
        let mut done = pod("ns", "done", Some("n"));
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let mut tolerating = pod("ns", "tolerating", Some("n"));
        tolerating.spec.as_mut().unwrap().tolerations = Some(
            vec![Toleration {
                key: Some(DISRUPTED_TAINT_KEY.into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }]
            .into(),
        );
        let mut stuck = pod("ns", "stuck", Some("n"));
        stuck.metadata.deletion_timestamp = Some(ts(900));
        let mut terminating = pod("ns", "terminating", Some("n"));
        terminating.metadata.deletion_timestamp = Some(ts(990));
        let p = plan(&[mirror, done, tolerating, stuck, terminating], now, None);
        assert_eq!(
            actions(&p),
            vec![(
                "terminating".into(),
                PodAction::Wait(WaitReason::Terminating)
            )]
        );
    }

    #[test]
    fn do_not_disrupt_waits_until_the_deadline_forces_deletion() {
        // terminationGracePeriod 1h; pod grace 600 s: forced at deadline - 10 min.
        let deadline = ts(3600).0;
        let mut p = annotated(
            pod("ns", "precious", Some("n")),
            DO_NOT_DISRUPT_ANNOTATION,
            "true",
        );
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(600);
        let early = plan(std::slice::from_ref(&p), ts(2999).0, Some(deadline));
        assert_eq!(
            actions(&early),
            vec![("precious".into(), PodAction::Wait(WaitReason::DoNotDisrupt))]
        );
        let at = plan(std::slice::from_ref(&p), ts(3000).0, Some(deadline));
        assert_eq!(
            actions(&at),
            vec![(
                "precious".into(),
                PodAction::ForceDelete {
                    grace_period_seconds: 600,
                    already_deleting: false,
                }
            )]
        );
        let late = plan(std::slice::from_ref(&p), ts(4000).0, Some(deadline));
        assert_eq!(
            late.force_deletions()
                .map(|f| f.grace_period_seconds)
                .collect::<Vec<_>>(),
            vec![1],
            "past the deadline the grace period is clamped to 1 s"
        );
    }

    #[test]
    fn a_do_not_disrupt_duration_protects_the_pod_until_it_has_run_that_long() {
        let mut p = annotated(
            pod("ns", "warming", Some("n")),
            DO_NOT_DISRUPT_ANNOTATION,
            "1h",
        );
        p.status.get_or_insert_with(Default::default).start_time = Some(ts(0));
        let waits = vec![("warming".into(), PodAction::Wait(WaitReason::DoNotDisrupt))];
        assert_eq!(
            actions(&plan(std::slice::from_ref(&p), ts(600).0, None)),
            waits
        );
        assert_eq!(
            actions(&plan(std::slice::from_ref(&p), ts(3600).0, None)),
            vec![("warming".into(), PodAction::Evict)]
        );
        // Not started yet: protected. A value that is neither: not.
        p.status.as_mut().unwrap().start_time = None;
        assert_eq!(
            actions(&plan(std::slice::from_ref(&p), ts(7200).0, None)),
            waits
        );
        let junk = annotated(
            pod("ns", "warming", Some("n")),
            DO_NOT_DISRUPT_ANNOTATION,
            "yes",
        );
        assert_eq!(
            actions(&plan(std::slice::from_ref(&junk), ts(0).0, None)),
            vec![("warming".into(), PodAction::Evict)]
        );
    }

    #[test]
    fn forced_pods_do_not_hold_back_other_tiers() {
        let deadline = ts(100).0;
        let mut slow = pod("ns", "slow", Some("n"));
        slow.spec.as_mut().unwrap().termination_grace_period_seconds = Some(200);
        let ds = daemon(pod("ns", "ds", Some("n")));
        let p = plan(&[slow, ds], ts(0).0, Some(deadline));
        assert_eq!(
            actions(&p),
            vec![
                (
                    "slow".into(),
                    PodAction::ForceDelete {
                        grace_period_seconds: 100,
                        already_deleting: false,
                    }
                ),
                ("ds".into(), PodAction::Evict),
            ]
        );
    }

    #[test]
    fn a_pod_deleting_past_the_deadline_is_forced() {
        let deadline = ts(100).0;
        let mut p = pod("ns", "late", Some("n"));
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(10);
        p.metadata.deletion_timestamp = Some(ts(150));
        let out = plan(&[p], ts(50).0, Some(deadline));
        assert_eq!(
            out.force_deletions().collect::<Vec<_>>(),
            vec![ForceDeletion {
                namespace: "ns",
                name: "late",
                uid: Some("uid-ns-late"),
                grace_period_seconds: 50,
                already_deleting: true,
            }]
        );
    }

    #[test]
    fn a_pod_deleting_by_the_deadline_is_waited_for_not_deleted_again() {
        // Forced at t=50 with 50 s left: the pod now deletes at the deadline.
        let deadline = ts(100).0;
        let mut p = pod("ns", "forced", Some("n"));
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(300);
        let first = plan(std::slice::from_ref(&p), ts(50).0, Some(deadline));
        assert_eq!(
            actions(&first),
            vec![(
                "forced".into(),
                PodAction::ForceDelete {
                    grace_period_seconds: 50,
                    already_deleting: false,
                }
            )]
        );
        p.metadata.deletion_timestamp = Some(ts(100));
        for now in [51, 99, 100] {
            let later = plan(std::slice::from_ref(&p), ts(now).0, Some(deadline));
            assert_eq!(
                actions(&later),
                vec![("forced".into(), PodAction::Wait(WaitReason::Terminating))],
                "at t={now}"
            );
        }
    }

    #[test]
    fn past_the_deadline_a_pod_forced_with_one_second_is_not_forced_again() {
        let deadline = ts(100).0;
        let mut p = pod("ns", "late", Some("n"));
        let first = plan(std::slice::from_ref(&p), ts(120).0, Some(deadline));
        assert_eq!(first.force_deletions().count(), 1);
        p.metadata.deletion_timestamp = Some(ts(121));
        for now in [120, 121, 130] {
            let later = plan(std::slice::from_ref(&p), ts(now).0, Some(deadline));
            assert_eq!(later.force_deletions().count(), 0, "at t={now}");
            assert!(!later.is_drained(), "still waited for at t={now}");
        }
    }
}
