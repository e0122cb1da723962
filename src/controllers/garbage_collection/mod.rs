//! Instance garbage collection (leader only; exoscale-provider §3.3 and karpenter-core §4.5,
//! with defects 6, 7 and 8 fixed).
//!
//! An instance is deleted only when all of these hold: the provider proves it is this
//! cluster's ([`Ownership::Proven`]: it carries the cluster's identity, which no setting can
//! get wrong); no NodeClaim owns it — a NodeClaim with a provider ID owns exactly that ID, and
//! only a NodeClaim still waiting for its provider ID owns an instance by name (so the twin of
//! a lost create response is collected, not kept alive by its sibling's name); and it has been
//! orphaned for the grace period. Unproven instances are adopted when a NodeClaim owns them by
//! provider ID and otherwise only reported; another cluster's are never touched. NodeClaims
//! whose instance is gone and whose Node is not Ready are deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};

use crate::apis::NodeClaim;
use crate::apis::labels::{INSTANCE_NODECLAIM_LABEL, conditions};
use crate::cloudprovider::Ownership;
use crate::state::{ClusterIndex, Kind, nodeclaim_provider_id};

use super::{Context, Result, ignore_not_found};
use crate::state::node_ready;

/// An instance listed under this cluster's ID that is not proven to be ours and that no
/// NodeClaim owns by provider ID: reported, never deleted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unowned {
    pub provider_id: String,
    /// The NodeClaim name the instance was launched for, if labelled.
    pub nodeclaim: Option<String>,
    pub ownership: OwnershipLabel,
}

/// The `reason` label of `karpenter_exoscale_unowned_instances`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OwnershipLabel {
    /// No cluster identity on the instance.
    Unproven,
    /// Another cluster's identity: probably a wrong `EXOSCALE_SKS_CLUSTER_ID` here or there.
    ForeignCluster,
}

impl OwnershipLabel {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnershipLabel::Unproven => "unproven",
            OwnershipLabel::ForeignCluster => "foreign_cluster",
        }
    }
}

/// What one collection pass does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Cloud instances (as NodeClaims from `list`) to delete.
    pub delete_instances: Vec<NodeClaim>,
    /// Unproven instances a NodeClaim owns by provider ID: to be labelled as ours.
    pub adopt: Vec<NodeClaim>,
    /// Instances we may not touch, to report.
    pub unowned: Vec<Unowned>,
    /// NodeClaims (names) whose instance is gone.
    pub delete_nodeclaims: Vec<String>,
}

/// The NodeClaim name an instance was launched for (label on the instance).
fn owner_name(instance: &NodeClaim) -> Option<String> {
    instance
        .labels()
        .get(INSTANCE_NODECLAIM_LABEL)
        .cloned()
        .or_else(|| instance.metadata.name.clone())
}

/// When a pass runs, by both of this replica's clocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassTime {
    /// Compared with instances' creation times (Exoscale's clock).
    pub wall: Timestamp,
    /// Measures how long this replica has seen an orphan: setting the wall clock forward
    /// does not shorten that.
    pub monotonic: Duration,
}

/// Decides a pass. `ownership` is the provider's judgement of each instance; `first_seen`
/// remembers when (monotonic) each orphan was first noticed, so instances without a creation
/// time also get the full grace period.
pub fn plan(
    instances: &[NodeClaim],
    ownership: impl Fn(&NodeClaim) -> Ownership,
    index: &ClusterIndex,
    now: PassTime,
    grace: Duration,
    first_seen: &mut BTreeMap<String, Duration>,
) -> Plan {
    let claims = index.nodeclaims();
    let known_ids: BTreeSet<&str> = claims
        .iter()
        .filter_map(|c| nodeclaim_provider_id(c))
        .collect();
    // Only a launch still waiting for its provider ID can own an instance by name.
    let launching_names: BTreeSet<String> = claims
        .iter()
        .filter(|c| nodeclaim_provider_id(c).is_none())
        .map(|c| c.name_any())
        .collect();
    let mut plan = Plan::default();
    let mut still_orphaned = BTreeSet::new();
    for instance in instances {
        let Some(id) = nodeclaim_provider_id(instance) else {
            continue;
        };
        let owned_by_id = known_ids.contains(id);
        let owned_by_name = owner_name(instance).is_some_and(|n| launching_names.contains(&n));
        let unowned = |ownership| Unowned {
            provider_id: id.to_string(),
            nodeclaim: owner_name(instance),
            ownership,
        };
        match ownership(instance) {
            Ownership::Foreign => {
                plan.unowned.push(unowned(OwnershipLabel::ForeignCluster));
                continue;
            }
            Ownership::Unproven if owned_by_id => {
                plan.adopt.push(instance.clone());
                continue;
            }
            Ownership::Unproven => {
                plan.unowned.push(unowned(OwnershipLabel::Unproven));
                continue;
            }
            Ownership::Proven => {}
        }
        if owned_by_id || owned_by_name {
            continue;
        }
        still_orphaned.insert(id.to_string());
        let seen = *first_seen.entry(id.to_string()).or_insert(now.monotonic);
        // Orphaned for the grace period by both clocks: since its creation (Exoscale's clock)
        // and since this replica first saw it orphaned (its own, monotonic). The creation time
        // alone would let a local clock running ahead shorten the grace, and a wall-clock first
        // sighting would let the clock being set forward do so; after a restart, an orphan waits
        // one grace period again.
        let seen_long_enough = now.monotonic.saturating_sub(seen) >= grace;
        // Full precision (a `500ms` grace is not 0), and a grace beyond `SignedDuration`'s
        // range never elapses rather than wrapping negative.
        let old_enough = SignedDuration::try_from(grace).is_ok_and(|grace| {
            instance
                .metadata
                .creation_timestamp
                .as_ref()
                .is_none_or(|created| now.wall.duration_since(created.0) >= grace)
        });
        if seen_long_enough && old_enough {
            plan.delete_instances.push(instance.clone());
        }
    }
    first_seen.retain(|id, _| still_orphaned.contains(id));

    let live_ids: BTreeSet<&str> = instances.iter().filter_map(nodeclaim_provider_id).collect();
    for claim in &claims {
        // Another provider's claim is never in our instance list: its instances are its own.
        if claim.metadata.deletion_timestamp.is_some() || !index.manages_claim(claim) {
            continue;
        }
        let Some(id) = nodeclaim_provider_id(claim) else {
            continue;
        };
        let registered = claim.condition_is_true(conditions::REGISTERED);
        if !registered || live_ids.contains(id) {
            continue;
        }
        let ready = index.nodes_by_provider_id(id).iter().any(|n| node_ready(n));
        if !ready {
            plan.delete_nodeclaims.push(claim.name_any());
        }
    }
    plan
}

/// What a pass reads from cluster state: which NodeClaims own instances, and which Nodes are
/// Ready.
pub fn may_collect(index: &ClusterIndex) -> bool {
    index.current_all(&[Kind::NodeClaim, Kind::Node])
}

/// Garbage collector with its memory of first sightings and of what it already reported.
#[derive(Default)]
pub struct Collector {
    first_seen: Mutex<BTreeMap<String, Duration>>,
    reported: Mutex<BTreeSet<Unowned>>,
}

impl Collector {
    /// One pass. Skipped unless this replica leads and its NodeClaims and Nodes are current
    /// (every instance would look orphaned to a stale or partial view). Launches in flight do
    /// not hold it back: their instances are spared by name, and a launch that keeps failing
    /// is exactly when twins and orphans appear.
    pub async fn collect(&self, ctx: &Context) -> Result<Plan> {
        if !ctx.leadership.is_leader() || !may_collect(&ctx.cluster.read()) {
            return Ok(Plan::default());
        }
        let instances = ctx.cloud.list().await?;
        let plan = {
            let index = ctx.cluster.read();
            let mut first_seen = self.first_seen.lock().unwrap_or_else(|p| p.into_inner());
            plan(
                &instances,
                |i| ctx.cloud.ownership(i),
                &index,
                PassTime {
                    wall: ctx.now(),
                    monotonic: ctx.clock.monotonic(),
                },
                ctx.timings.instance_gc_grace_period,
                &mut first_seen,
            )
        };
        self.report_unowned(ctx, &plan.unowned).await;
        for instance in &plan.adopt {
            let pid = nodeclaim_provider_id(instance).unwrap_or_default();
            tracing::info!(
                provider_id = pid,
                "labelling an instance of ours with the cluster identity"
            );
            if let Err(e) = ctx.cloud.adopt(instance).await {
                tracing::warn!(provider_id = pid, error = %e, "cannot label instance with the cluster identity");
            }
        }
        for instance in &plan.delete_instances {
            tracing::info!(provider_id = ?nodeclaim_provider_id(instance), nodeclaim = ?owner_name(instance), "deleting orphaned instance");
            match ctx.cloud.delete(instance).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(error = %e, "cannot delete orphaned instance"),
            }
        }
        let api: Api<NodeClaim> = Api::all(ctx.client.clone());
        for name in &plan.delete_nodeclaims {
            let claim = ctx.cluster.read().nodeclaim(name);
            // The list is filtered by our labels: an instance whose labels were edited (or a
            // changed cluster ID) drops out of it while it runs. Only the instance's own read
            // proves it gone.
            let provider_id = claim.as_deref().and_then(nodeclaim_provider_id);
            let Some(provider_id) = provider_id else {
                continue;
            };
            match ctx.cloud.get(provider_id).await {
                Err(e) if e.is_not_found() => {}
                Ok(_) => {
                    tracing::warn!(nodeclaim = %name, provider_id, "the instance is missing from the instance list but exists (its labels changed?); NodeClaim kept");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(nodeclaim = %name, provider_id, error = %e, "cannot confirm the instance is gone; NodeClaim kept");
                    continue;
                }
            }
            tracing::info!(nodeclaim = %name, "deleting NodeClaim whose instance is gone");
            // The very NodeClaim judged: not one recreated under its name since (a 409 then).
            let only_this = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: claim.as_ref().and_then(|c| c.metadata.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &only_this).await {
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                other => ignore_not_found(other)?,
            };
            if let Some(claim) = claim {
                ctx.metrics.nodeclaim_disrupted(
                    "garbage_collected",
                    claim
                        .labels()
                        .get(crate::apis::labels::NODEPOOL_LABEL)
                        .map(String::as_str)
                        .unwrap_or(""),
                    &ClusterIndex::capacity_type(&claim),
                );
            }
        }
        Ok(plan)
    }

    /// Sets the gauge every pass; logs and publishes an event once per instance.
    async fn report_unowned(&self, ctx: &Context, unowned: &[Unowned]) {
        for label in [OwnershipLabel::Unproven, OwnershipLabel::ForeignCluster] {
            let count = unowned.iter().filter(|u| u.ownership == label).count();
            ctx.metrics.set_unowned_instances(label.as_str(), count);
        }
        let fresh: Vec<Unowned> = {
            let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
            reported.retain(|r| unowned.contains(r));
            unowned
                .iter()
                .filter(|u| reported.insert((*u).clone()))
                .cloned()
                .collect()
        };
        for u in fresh {
            let why = match u.ownership {
                OwnershipLabel::Unproven => {
                    "carries this cluster's ID but not its identity label and no NodeClaim owns it by provider ID; delete it by hand if it is this cluster's"
                }
                OwnershipLabel::ForeignCluster => {
                    "carries this cluster's ID but another cluster's identity: EXOSCALE_SKS_CLUSTER_ID is probably wrong here or in that cluster"
                }
            };
            tracing::warn!(provider_id = %u.provider_id, nodeclaim = ?u.nodeclaim, reason = u.ownership.as_str(), "instance not garbage-collected: {why}");
            ctx.identity_event(
                "UnownedInstance",
                format!(
                    "Instance {} (NodeClaim {}) {why}",
                    u.provider_id,
                    u.nodeclaim.as_deref().unwrap_or("unknown")
                ),
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::*;

    fn plan_proven(
        instances: &[NodeClaim],
        index: &ClusterIndex,
        now: PassTime,
        grace: Duration,
        first_seen: &mut BTreeMap<String, Duration>,
    ) -> Plan {
        plan(
            instances,
            |_| Ownership::Proven,
            index,
            now,
            grace,
            first_seen,
        )
    }

    /// A pass at `secs` by both clocks, which have run together since the origin.
    fn at(secs: i64) -> PassTime {
        PassTime {
            wall: ts(secs).0,
            monotonic: Duration::from_secs(secs.unsigned_abs()),
        }
    }

    /// Ownership by the instance's NodeClaim label: names starting with "foreign-" are another
    /// cluster's, "legacy-" carry no identity.
    fn by_name(instance: &NodeClaim) -> Ownership {
        let owner = owner_name(instance).unwrap_or_default();
        if owner.starts_with("foreign-") {
            Ownership::Foreign
        } else if owner.starts_with("legacy-") {
            Ownership::Unproven
        } else {
            Ownership::Proven
        }
    }

    #[test]
    fn the_twin_of_a_lost_create_is_collected_although_its_sibling_has_the_name() {
        let mut index = ClusterIndex::default();
        // NodeClaim "nc" recorded instance b; instance a, same name label, is the twin.
        index.apply_nodeclaim(nodeclaim("nc", "p", Some("exoscale://b")));
        // Seen orphaned since long ago.
        let mut seen = BTreeMap::from([("exoscale://a".to_string(), Duration::ZERO)]);
        let p = plan_proven(
            &[instance("a", "nc", 0), instance("b", "nc", 0)],
            &index,
            at(10_000),
            Duration::from_secs(60),
            &mut seen,
        );
        let deleted: Vec<_> = p
            .delete_instances
            .iter()
            .filter_map(|i| nodeclaim_provider_id(i))
            .collect();
        assert_eq!(deleted, vec!["exoscale://a"]);
    }

    #[test]
    fn only_instances_proven_ours_are_ever_deleted() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(nodeclaim("legacy-owned", "p", Some("exoscale://l1")));
        let mut seen = BTreeMap::from([("exoscale://o1".to_string(), Duration::ZERO)]);
        let instances = [
            instance("f1", "foreign-a", 0),
            instance("f2", "foreign-b", 0),
            instance("l1", "legacy-owned", 0),
            instance("l2", "legacy-orphan", 0),
            instance("o1", "orphan", 0),
        ];
        let p = plan(
            &instances,
            by_name,
            &index,
            at(100_000),
            Duration::from_secs(60),
            &mut seen,
        );
        let ids = |v: &[NodeClaim]| -> Vec<String> {
            v.iter()
                .filter_map(|i| nodeclaim_provider_id(i).map(String::from))
                .collect()
        };
        assert_eq!(ids(&p.delete_instances), vec!["exoscale://o1"]);
        assert_eq!(ids(&p.adopt), vec!["exoscale://l1"]);
        let unowned: Vec<(&str, OwnershipLabel)> = p
            .unowned
            .iter()
            .map(|u| (u.provider_id.as_str(), u.ownership))
            .collect();
        assert_eq!(
            unowned,
            vec![
                ("exoscale://f1", OwnershipLabel::ForeignCluster),
                ("exoscale://f2", OwnershipLabel::ForeignCluster),
                ("exoscale://l2", OwnershipLabel::Unproven),
            ]
        );
        // An unproven instance a launching NodeClaim owns by name only is not adopted either.
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(nodeclaim("legacy-launching", "p", None));
        let p = plan(
            &[instance("l3", "legacy-launching", 0)],
            by_name,
            &index,
            at(100_000),
            Duration::from_secs(60),
            &mut seen,
        );
        assert!(p.adopt.is_empty() && p.delete_instances.is_empty());
        assert_eq!(p.unowned.len(), 1);
    }

    fn instance(id: &str, owner: &str, created: i64) -> NodeClaim {
        let mut i = nodeclaim(owner, "p", Some(&format!("exoscale://{id}")));
        i.metadata.labels =
            Some([(INSTANCE_NODECLAIM_LABEL.to_string(), owner.to_string())].into());
        i.metadata.creation_timestamp = Some(ts(created));
        i
    }

    /// The instances a pass at `now` (seconds) deletes from one orphan created at 0, with a
    /// 600-s grace.
    fn deleted_at(now: i64, seen: &mut BTreeMap<String, Duration>) -> Vec<NodeClaim> {
        let orphan = instance("a", "gone", 0);
        let grace = Duration::from_secs(600);
        plan_proven(&[orphan], &ClusterIndex::default(), at(now), grace, seen).delete_instances
    }

    #[test]
    fn orphans_are_deleted_only_after_the_grace_period() {
        let mut seen = BTreeMap::new();
        assert!(deleted_at(0, &mut seen).is_empty());
        assert!(deleted_at(599, &mut seen).is_empty());
        assert_eq!(deleted_at(600, &mut seen), vec![instance("a", "gone", 0)]);
    }

    /// A local clock an hour ahead of Exoscale's sees a new instance as an hour old; it is
    /// still kept for the grace period from its first sighting.
    #[test]
    fn a_local_clock_ahead_does_not_shorten_the_grace() {
        let mut seen = BTreeMap::new();
        assert!(
            deleted_at(3600, &mut seen).is_empty(),
            "deleted at first sight"
        );
        assert!(deleted_at(4199, &mut seen).is_empty());
        assert_eq!(deleted_at(4200, &mut seen).len(), 1);
    }

    /// The wall clock set forward by more than the grace period (NTP catching up, an operator)
    /// between two passes: the orphan first seen just before is kept until this replica has
    /// itself watched it for the grace period.
    #[test]
    fn setting_the_wall_clock_forward_does_not_shorten_the_grace() {
        let mut seen = BTreeMap::new();
        let orphan = instance("a", "gone", 1000);
        let grace = Duration::from_secs(600);
        let pass = |now: PassTime, seen: &mut BTreeMap<String, Duration>| {
            plan_proven(
                std::slice::from_ref(&orphan),
                &ClusterIndex::default(),
                now,
                grace,
                seen,
            )
            .delete_instances
        };
        assert!(pass(at(1000), &mut seen).is_empty());
        // One second later by the monotonic clock, an hour later by the wall clock.
        let jumped = |monotonic_secs: u64| PassTime {
            wall: ts(4601).0,
            monotonic: Duration::from_secs(monotonic_secs),
        };
        assert!(
            pass(jumped(1001), &mut seen).is_empty(),
            "deleted after 1 s"
        );
        assert!(pass(jumped(1599), &mut seen).is_empty());
        assert_eq!(pass(jumped(1600), &mut seen), vec![orphan.clone()]);
    }

    #[test]
    fn a_grace_too_long_to_represent_never_elapses_and_sub_second_graces_count() {
        let index = ClusterIndex::default();
        let mut seen = BTreeMap::new();
        let orphan = instance("a", "gone", 1000);
        // `u64::MAX as i64` is -1: every orphan would be deleted at once.
        let p = plan_proven(
            std::slice::from_ref(&orphan),
            &index,
            at(1000),
            Duration::from_secs(u64::MAX),
            &mut seen,
        );
        assert!(p.delete_instances.is_empty(), "{p:?}");
        // 1 500 ms is not truncated to 1 s.
        let grace = Duration::from_millis(1500);
        let at = |ms: i64| PassTime {
            wall: Timestamp::from_millisecond(ts(1000).0.as_millisecond() + ms)
                .expect("valid instant"),
            monotonic: Duration::from_millis(1_000_000 + ms.unsigned_abs()),
        };
        let p = plan_proven(
            std::slice::from_ref(&orphan),
            &index,
            at(1000),
            grace,
            &mut seen,
        );
        assert!(p.delete_instances.is_empty(), "{p:?}");
        let p = plan_proven(
            std::slice::from_ref(&orphan),
            &index,
            at(1500),
            grace,
            &mut seen,
        );
        assert_eq!(p.delete_instances, vec![orphan]);
    }

    #[test]
    fn instances_of_launching_claims_are_spared_even_without_provider_id() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(nodeclaim("launching", "p", None));
        index.apply_nodeclaim(nodeclaim("known", "p", Some("exoscale://b")));
        let mut seen = BTreeMap::new();
        let p = plan_proven(
            &[instance("a", "launching", 0), instance("b", "renamed", 0)],
            &index,
            at(100_000),
            Duration::from_secs(60),
            &mut seen,
        );
        assert!(p.delete_instances.is_empty(), "{p:?}");
    }

    #[test]
    fn instances_without_creation_time_wait_from_first_sighting() {
        let index = ClusterIndex::default();
        let mut seen = BTreeMap::new();
        let mut orphan = instance("a", "gone", 0);
        orphan.metadata.creation_timestamp = None;
        let grace = Duration::from_secs(60);
        assert!(
            plan_proven(
                std::slice::from_ref(&orphan),
                &index,
                at(1000),
                grace,
                &mut seen
            )
            .delete_instances
            .is_empty()
        );
        assert!(
            plan_proven(
                std::slice::from_ref(&orphan),
                &index,
                at(1059),
                grace,
                &mut seen
            )
            .delete_instances
            .is_empty()
        );
        assert_eq!(
            plan_proven(
                std::slice::from_ref(&orphan),
                &index,
                at(1060),
                grace,
                &mut seen
            )
            .delete_instances
            .len(),
            1
        );
        // Adopted again: forgotten.
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(nodeclaim("gone", "p", None));
        plan_proven(
            std::slice::from_ref(&orphan),
            &index,
            at(1061),
            grace,
            &mut seen,
        );
        assert!(seen.is_empty());
    }

    /// A NodeClaim that never gets its provider ID (creates keep failing) makes cluster state
    /// unsynced for as long as it lasts; collection runs all the same, and stops only when
    /// what it reads is not current.
    #[test]
    fn collection_waits_for_current_nodeclaims_and_nodes_not_for_launches() {
        let listed_with_a_launch = || {
            let mut index = ClusterIndex::default();
            crate::state::testing::list_every_kind(&mut index);
            index.apply_nodeclaim(nodeclaim("launching", "p", None));
            index
        };
        let index = listed_with_a_launch();
        assert!(!index.synced(), "a launch in flight leaves state unsynced");
        assert!(may_collect(&index));
        for kind in [Kind::NodeClaim, Kind::Node] {
            let mut stale = listed_with_a_launch();
            stale.mark_stale(kind);
            assert!(!may_collect(&stale), "{kind:?} stale");
        }
    }

    #[test]
    fn registered_claims_without_instance_and_ready_node_are_deleted() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(registered(nodeclaim("lost", "p", Some("exoscale://x"))));
        index.apply_nodeclaim(registered(nodeclaim("alive", "p", Some("exoscale://y"))));
        index.apply_nodeclaim(nodeclaim("young", "p", Some("exoscale://z")));
        let p = plan_proven(
            &[instance("y", "alive", 0)],
            &index,
            at(10),
            Duration::from_secs(60),
            &mut BTreeMap::new(),
        );
        assert_eq!(p.delete_nodeclaims, vec!["lost".to_string()]);
    }

    /// Another Karpenter's claims are never in our instance list: a NotReady Node of theirs
    /// does not make us delete them.
    #[test]
    fn another_providers_claims_are_left_alone() {
        let mut index = managed_index();
        index.apply_nodeclaim(registered(nodeclaim("ours", "p", Some("exoscale://x"))));
        index.apply_nodeclaim(registered(foreign(nodeclaim(
            "theirs",
            "kwok",
            Some("kwok://y"),
        ))));
        let p = plan_proven(
            &[],
            &index,
            at(10),
            Duration::from_secs(60),
            &mut BTreeMap::new(),
        );
        assert_eq!(p.delete_nodeclaims, vec!["ours".to_string()]);
    }
}
