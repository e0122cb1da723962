//! NodeClass resolution (what the NodeClass controller writes to the status) against the
//! simulated cloud: IDs and names, order, errors that name what failed, and the list cache.

use std::sync::Arc;

use karpenter_exoscale::apis::ExoscaleNodeClassSpec;
use karpenter_exoscale::apis::nodeclass::SelectorTerm;
use karpenter_exoscale::exoscale::{self, FixedClock};
use karpenter_exoscale::providers::nodeclass::{NAME_CACHE_TTL, NodeClassResolver};
use karpenter_exoscale::sim::{ExoscaleSim, Fault};

fn base() -> ExoscaleNodeClassSpec {
    serde_yaml_ng::from_str("templateID: 188e6dc9-7b29-4db4-a8af-fc6368660738\n").unwrap()
}

fn by_id(id: &str) -> SelectorTerm {
    SelectorTerm {
        id: Some(id.into()),
        name: None,
    }
}

fn by_name(name: &str) -> SelectorTerm {
    SelectorTerm {
        id: None,
        name: Some(name.into()),
    }
}

async fn setup() -> (ExoscaleSim, NodeClassResolver, FixedClock) {
    let sim = ExoscaleSim::start().await.unwrap();
    let client = exoscale::Client::new(sim.client_config()).unwrap();
    let clock = FixedClock::at(1_800_000_000);
    let resolver = NodeClassResolver::new(client, Arc::new(clock.clone()), NAME_CACHE_TTL);
    (sim, resolver, clock)
}

#[tokio::test]
async fn security_groups_resolve_in_order_by_id_and_name() {
    let (sim, r, _) = setup().await;
    let web = sim.add_security_group("web");
    let db = sim.add_security_group("db");
    let nodes = sim
        .security_groups()
        .into_iter()
        .find(|(_, n)| n == "karpenter-nodes")
        .unwrap()
        .0;
    let mut spec = base();
    spec.security_groups = vec![web.clone()];
    spec.security_group_selector_terms =
        vec![by_id(&db), by_name("karpenter-nodes"), by_name("web")];
    assert_eq!(
        r.resolve_security_groups(&spec).await.unwrap(),
        vec![web, db, nodes]
    );
    assert_eq!(
        sim.call_count("get-security-group"),
        0,
        "names and listed ids need no GET"
    );
}

#[tokio::test]
async fn missing_groups_are_named_in_the_error() {
    let (_sim, r, _) = setup().await;
    let mut spec = base();
    spec.security_group_selector_terms = vec![by_name("non-existent-sg")];
    let e = r
        .resolve_security_groups(&spec)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "security group with name non-existent-sg not found");

    let mut spec = base();
    spec.anti_affinity_groups = vec!["5a1e4c55-0000-4000-8000-000000000000".into()];
    let e = r
        .resolve_anti_affinity_groups(&spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("failed to get anti-affinity group 5a1e4c55-"),
        "{e}"
    );

    let mut spec = base();
    spec.private_network_selector_terms = vec![by_name("non-existent-pn")];
    let e = r
        .resolve_private_networks(&spec)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "private network with name non-existent-pn not found");
}

#[tokio::test]
async fn anti_affinity_groups_and_private_networks_resolve() {
    let (sim, r, _) = setup().await;
    let aag = sim.anti_affinity_groups()[0].clone();
    let pn = sim.private_networks()[0].clone();
    let mut spec = base();
    spec.anti_affinity_group_selector_terms = vec![by_name(&aag.1), by_id(&aag.0)];
    spec.private_networks = vec![pn.0.clone()];
    assert_eq!(
        r.resolve_anti_affinity_groups(&spec).await.unwrap(),
        vec![aag.0],
        "duplicates dropped"
    );
    assert_eq!(r.resolve_private_networks(&spec).await.unwrap(), vec![pn.0]);
    assert!(r.resolve_security_groups(&base()).await.unwrap().is_empty());
}

#[tokio::test]
async fn list_failures_are_reported_and_do_not_poison_the_cache() {
    let (sim, r, _) = setup().await;
    sim.inject(Fault::status(
        "list-security-groups",
        403,
        "forbidden by IAM policy",
    ));
    let mut spec = base();
    spec.security_group_selector_terms = vec![by_name("karpenter-nodes")];
    let e = r
        .resolve_security_groups(&spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("failed to get security group by name:"),
        "{e}"
    );
    assert_eq!(r.resolve_security_groups(&spec).await.unwrap().len(), 1);
}

#[tokio::test]
async fn the_list_cache_serves_lookups_and_refreshes_on_a_miss_or_after_the_ttl() {
    let (sim, r, clock) = setup().await;
    let mut spec = base();
    spec.security_group_selector_terms = vec![by_name("karpenter-nodes")];
    r.resolve_security_groups(&spec).await.unwrap();
    r.resolve_security_groups(&spec).await.unwrap();
    assert_eq!(sim.call_count("list-security-groups"), 1);
    // A group created after the list was cached is found at once (one refresh).
    let fresh = sim.add_security_group("created-later");
    spec.security_group_selector_terms
        .push(by_name("created-later"));
    assert!(
        r.resolve_security_groups(&spec)
            .await
            .unwrap()
            .contains(&fresh)
    );
    assert_eq!(sim.call_count("list-security-groups"), 2);
    clock.set(1_800_000_000 + NAME_CACHE_TTL.as_secs() as i64 + 1);
    r.resolve_security_groups(&spec).await.unwrap();
    assert_eq!(sim.call_count("list-security-groups"), 3);
}
