//! The CloudProvider contract of upstream Karpenter (karpenter-core.md §2), its error kinds,
//! the pure offering selection every provider shares, the Exoscale implementation and an
//! in-memory fake for scheduler tests and benchmarks.

pub mod destroyed;
pub mod error;
pub mod exoscale;
#[cfg(test)]
pub mod fake;
pub mod first_launch;
pub mod metered;
pub mod overlay;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::apis::{
    NodeClaim, NodeClassReference, NodePool, NodeSelectorRequirementWithMinValues,
    Operator as ApiOperator,
};
use crate::scheduling::{
    InstanceType, Offering, Operator, Quantity, Requirement, RequirementError, Requirements,
    Resources,
};

pub use error::CloudProviderError;

pub type Result<T, E = CloudProviderError> = std::result::Result<T, E>;

/// A provider's drift verdict (upstream's `""` for "not drifted" is `None` here): the reason
/// the `Drifted` condition carries, and a message naming what differs (the `DriftDetected`
/// event the Go provider publishes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftReason {
    pub reason: String,
    pub message: String,
}

impl DriftReason {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        DriftReason {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// A node condition that means "unhealthy" once it has lasted `toleration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairPolicy {
    pub condition_type: String,
    /// `True` or `False`.
    pub condition_status: String,
    pub toleration: Duration,
}

impl RepairPolicy {
    pub fn new(condition_type: &str, condition_status: &str, toleration: Duration) -> Self {
        RepairPolicy {
            condition_type: condition_type.into(),
            condition_status: condition_status.into(),
            toleration,
        }
    }
}

/// A NodeClass kind a provider serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeClassKind {
    pub group: String,
    pub kind: String,
}

/// What the core reads from a NodeClass, whatever its kind: upstream reads the same from the
/// provider's NodeClass object (generation, deletion, the `Ready` condition).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeClassState {
    pub generation: Option<i64>,
    pub terminating: bool,
    /// The NodeClass's `Ready` condition; `None` until it reports one.
    pub ready: Option<crate::apis::Condition>,
    /// Labels and taints every node of the class gets on top of its NodePool's template (the
    /// scheduler must know them before launch, like the template's own).
    pub node_labels: std::collections::BTreeMap<String, String>,
    pub node_taints: Vec<crate::apis::Taint>,
}

/// What the core asks of a cloud. Every method may be called concurrently.
pub trait CloudProvider: Send + Sync {
    /// The `provider` metric label.
    fn name(&self) -> &'static str;

    /// Launches one instance for the NodeClaim (or adopts the one an earlier attempt made) and
    /// returns the NodeClaim with labels, `providerID`, `imageID`, capacity and allocatable.
    /// Returns as soon as the instance ID exists.
    fn create<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<NodeClaim>>;

    /// Requests termination. `Ok(())` while it is in progress; keep calling until it returns
    /// [`CloudProviderError::NodeClaimNotFound`], meaning the instance is gone.
    fn delete<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, Result<()>>;

    /// The NodeClaim view of an instance; `NodeClaimNotFound` once it is gone.
    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<NodeClaim>>;

    /// Every instance this cluster owns.
    fn list(&self) -> BoxFuture<'_, Result<Vec<NodeClaim>>>;

    /// Every instance type the NodePool's NodeClass can use, including ones with no available
    /// offering right now.
    fn instance_types<'a>(
        &'a self,
        nodepool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>>;

    /// Provider-side drift (`None` = not drifted).
    fn is_drifted<'a>(
        &'a self,
        nodeclaim: &'a NodeClaim,
    ) -> BoxFuture<'a, Result<Option<DriftReason>>>;

    /// Node conditions that make a node unhealthy (empty disables repair).
    fn repair_policies(&self) -> Vec<RepairPolicy>;

    /// NodeClass kinds served; the first is the default.
    fn supported_node_classes(&self) -> Vec<NodeClassKind>;

    /// The referenced NodeClass as the provider holds it (its watch, not an API call);
    /// `None` when it does not exist or is of a kind this provider does not serve.
    fn nodeclass(&self, reference: &NodeClassReference) -> Option<NodeClassState>;

    /// Whether [`CloudProvider::nodeclass`] answers from a complete list (a `None` before that
    /// means "not seen yet", not "absent").
    fn nodeclasses_synced(&self) -> bool {
        true
    }

    /// The provisioner of this process has just created the NodeClaim with this UID: its first
    /// [`CloudProvider::create`] cannot follow an earlier attempt, so the provider may skip
    /// looking for that attempt's instance (see [`first_launch`]).
    fn nodeclaim_created(&self, _uid: &str) {}

    /// Whether this provider serves `reference`'s kind (a NodeClaim of another kind is left
    /// to the provider that does).
    fn serves(&self, reference: &NodeClassReference) -> bool {
        self.supported_node_classes()
            .iter()
            .any(|k| k.group == reference.group && k.kind == reference.kind)
    }

    /// Whether an instance from [`CloudProvider::list`] is proven to be this cluster's. Only
    /// proven instances may ever be deleted by garbage collection.
    fn ownership(&self, _instance: &NodeClaim) -> Ownership {
        Ownership::Proven
    }

    /// Records this cluster's identity on an [`Ownership::Unproven`] instance that a NodeClaim
    /// of this cluster owns by provider ID.
    fn adopt<'a>(&'a self, _instance: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// How well an instance listed by the provider is proven to be this cluster's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Carries this cluster's identity.
    Proven,
    /// Listed under this cluster's configured ID but carries no identity (launched by an
    /// older version or another provider): adopted when a NodeClaim owns it by provider ID,
    /// otherwise only reported, never deleted.
    Unproven,
    /// Carries another cluster's identity (a wrongly shared cluster ID): never touched.
    Foreign,
}

/// The repair policies of the Go Exoscale provider.
pub fn default_repair_policies() -> Vec<RepairPolicy> {
    let min = |m: u64| Duration::from_secs(m * 60);
    vec![
        RepairPolicy::new("Ready", "False", min(15)),
        RepairPolicy::new("DiskPressure", "True", min(10)),
        RepairPolicy::new("MemoryPressure", "True", min(10)),
        RepairPolicy::new("PIDPressure", "True", min(10)),
        RepairPolicy::new("NetworkUnavailable", "True", min(5)),
    ]
}

fn operator(op: ApiOperator) -> Operator {
    match op {
        ApiOperator::In => Operator::In,
        ApiOperator::NotIn => Operator::NotIn,
        ApiOperator::Exists => Operator::Exists,
        ApiOperator::DoesNotExist => Operator::DoesNotExist,
        ApiOperator::Gt => Operator::Gt,
        ApiOperator::Lt => Operator::Lt,
        ApiOperator::Gte => Operator::Gte,
        ApiOperator::Lte => Operator::Lte,
    }
}

/// CRD requirements as scheduler requirements (the same key may appear twice: intersected).
pub fn requirements_from_api(
    reqs: &[NodeSelectorRequirementWithMinValues],
) -> std::result::Result<Requirements, RequirementError> {
    let mut out = Requirements::new();
    for r in reqs {
        let req = Requirement::new(&r.key, operator(r.operator), r.values.iter().cloned())?
            .with_min_values(r.min_values.and_then(|m| usize::try_from(m).ok()));
        out.add(req);
    }
    Ok(out)
}

/// `spec.resources.requests` as scheduler resources.
pub fn requests_of(nodeclaim: &NodeClaim) -> Result<Resources> {
    let mut r = Resources::new();
    for (name, q) in &nodeclaim.spec.resources.requests {
        let q = Quantity::parse(&q.0).map_err(|e| {
            CloudProviderError::create(
                "InvalidNodeClaim",
                format!("spec.resources.requests[{name}]: {e}"),
            )
        })?;
        r.set(name, q);
    }
    Ok(r)
}

/// The cheapest available offering among `types` that the requirements admit and whose
/// allocatable holds `requests`; ties keep the earlier type (callers pass a stable order).
pub fn cheapest_offering<'a>(
    types: &'a [Arc<InstanceType>],
    requirements: &Requirements,
    requests: &Resources,
) -> Option<(&'a Arc<InstanceType>, &'a Offering)> {
    let mut best: Option<(&Arc<InstanceType>, &Offering)> = None;
    for it in types {
        if it.requirements.intersects(requirements).is_err() || !requests.fits_in(&it.allocatable())
        {
            continue;
        }
        for o in it
            .offerings
            .iter()
            .filter(|o| o.available && o.compatible(requirements))
        {
            if best.is_none_or(|(_, b)| o.price < b.price) {
                best = Some((it, o));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;

    fn req(key: &str, op: ApiOperator, values: &[&str]) -> NodeSelectorRequirementWithMinValues {
        NodeSelectorRequirementWithMinValues {
            key: key.into(),
            operator: op,
            values: values.iter().map(|v| v.to_string()).collect(),
            min_values: None,
        }
    }

    #[test]
    fn repair_policies_match_the_go_provider() {
        let p = default_repair_policies();
        assert_eq!(p.len(), 5);
        assert_eq!(
            p[0],
            RepairPolicy::new("Ready", "False", Duration::from_secs(900))
        );
        assert_eq!(p[4].toleration, Duration::from_secs(300));
    }

    #[test]
    fn cheapest_compatible_offering_wins() {
        let types = fixtures::instance_types(10);
        let reqs = requirements_from_api(&[
            req(
                "node.kubernetes.io/instance-type",
                ApiOperator::In,
                &["fake-it-3", "fake-it-1", "fake-it-5"],
            ),
            req(
                "karpenter.sh/capacity-type",
                ApiOperator::In,
                &["on-demand"],
            ),
            req(
                "topology.kubernetes.io/zone",
                ApiOperator::In,
                &["test-zone-3"],
            ),
        ])
        .unwrap();
        let (it, o) = cheapest_offering(&types, &reqs, &Resources::new()).unwrap();
        assert_eq!(it.name, "fake-it-1");
        assert_eq!(
            (o.zone.as_str(), o.capacity_type.as_str()),
            ("test-zone-3", "on-demand")
        );
        // Requests that only bigger types hold skip the small ones.
        let big = Resources::from_literals(&[("cpu", "4")]);
        let (it, _) = cheapest_offering(&types, &reqs, &big).unwrap();
        assert_eq!(it.name, "fake-it-5");
        let huge = Resources::from_literals(&[("cpu", "64")]);
        assert!(cheapest_offering(&types, &reqs, &huge).is_none());
    }

    #[test]
    fn a_single_candidate_is_used_and_ties_keep_the_earlier_type() {
        let types = fixtures::instance_types(3);
        let only = requirements_from_api(&[req(
            "node.kubernetes.io/instance-type",
            ApiOperator::In,
            &["fake-it-2"],
        )])
        .unwrap();
        let (it, _) = cheapest_offering(&types, &only, &Resources::new()).unwrap();
        assert_eq!(it.name, "fake-it-2");
        let same_price: Vec<Arc<InstanceType>> = types
            .iter()
            .map(|t| {
                let mut t = (**t).clone();
                t.offerings.iter_mut().for_each(|o| o.price = 1.0);
                Arc::new(t)
            })
            .collect();
        let (it, _) =
            cheapest_offering(&same_price, &Requirements::new(), &Resources::new()).unwrap();
        assert_eq!(it.name, "fake-it-0");
    }

    #[test]
    fn bad_requirements_are_reported() {
        let e = requirements_from_api(&[req("x", ApiOperator::Gt, &["a"])]).unwrap_err();
        assert!(e.to_string().contains('x'), "{e}");
    }
}
