//! The real client against the simulated cloud over loopback: every typed operation
//! round-trips with real signatures.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use karpenter_exoscale::catalogue::Catalogue;
use karpenter_exoscale::exoscale::models::*;
use karpenter_exoscale::exoscale::{
    Client, Credentials, Error, FixedClock, InstanceFilter, RateLimit,
};
use karpenter_exoscale::sim::{AuthOutcome, ExoscaleSim, InstanceEvent};

async fn setup() -> (ExoscaleSim, Client) {
    let sim = ExoscaleSim::start().await.expect("sim starts");
    let client = Client::new(sim.client_config()).expect("client builds");
    (sim, client)
}

async fn type_id(client: &Client, name: &str) -> String {
    client
        .list_instance_types()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap()
        .id
}

async fn create_request(sim: &ExoscaleSim, client: &Client, name: &str) -> CreateInstanceRequest {
    let template = client
        .get_sks_template(sim.kubernetes_version(), SksTemplateVariant::Standard)
        .await
        .unwrap();
    let mut req =
        CreateInstanceRequest::new(&type_id(client, "standard.medium").await, &template, 50);
    req.name = Some(name.to_string());
    req.labels
        .insert("exoscale.com/managed-by".into(), "karpenter".into());
    req.labels
        .insert("exoscale.com/node-claim".into(), name.to_string());
    req
}

fn gzip_base64(text: &str) -> String {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
}

async fn next_event(rx: &mut tokio::sync::broadcast::Receiver<InstanceEvent>) -> InstanceEvent {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("an instance event arrives")
        .expect("channel open")
}

#[tokio::test]
async fn zones_round_trip_and_unknown_zone_is_named() {
    let (sim, client) = setup().await;
    let zones = client.list_zones().await.unwrap();
    assert_eq!(zones.len(), 8);
    let zone = client.check_zone("ch-gva-2").await.unwrap();
    assert_eq!(zone.api_endpoint.as_deref(), Some(sim.endpoint()));
    match client.check_zone("xx-nope-1").await {
        Err(Error::UnknownZone { zone, known }) => {
            assert_eq!(zone, "xx-nope-1");
            assert!(known.contains("de-fra-1"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn instance_types_match_the_catalogue() {
    let (_sim, client) = setup().await;
    let types = client.list_instance_types().await.unwrap();
    assert_eq!(types.len(), Catalogue::embedded().instance_types().len());
    let medium = types
        .iter()
        .find(|t| t.name() == "standard.medium")
        .unwrap();
    assert_eq!(
        (medium.cpus, medium.memory, medium.authorized),
        (2, 4 << 30, true)
    );
    let fetched = client.get_instance_type(&medium.id).await.unwrap();
    assert_eq!(&fetched, medium);
    let gpu = types.iter().find(|t| t.name() == "gpu3.small").unwrap();
    assert!(!gpu.authorized);
    assert_eq!(gpu.zones, vec!["de-fra-1"]);
    assert!(matches!(
        client
            .get_instance_type("00000000-0000-4000-8000-000000000000")
            .await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn templates_and_sks_lookups() {
    let (sim, client) = setup().await;
    let standard = client
        .get_sks_template("1.34.1", SksTemplateVariant::Standard)
        .await
        .unwrap();
    let nvidia = client
        .get_sks_template("1.34.1", SksTemplateVariant::Nvidia)
        .await
        .unwrap();
    assert_ne!(standard, nvidia);
    assert_eq!(
        Some(standard.clone()),
        sim.sks_template_id("1.34.1", SksTemplateVariant::Standard)
    );
    let template = client.get_template(&standard).await.unwrap();
    assert_eq!(template.version.as_deref(), Some("1.34.1"));
    let sks = client
        .list_templates(TemplateVisibility::Public, Some("sks"))
        .await
        .unwrap();
    assert!(sks.iter().any(|t| t.id == standard));
    assert!(sks.iter().all(|t| t.family.as_deref() == Some("sks")));
    let ubuntu = client
        .list_templates(TemplateVisibility::Public, Some("ubuntu"))
        .await
        .unwrap();
    assert_eq!(ubuntu.len(), 1);
    assert!(
        client
            .list_templates(TemplateVisibility::Private, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        client
            .get_sks_template("1.20.0", SksTemplateVariant::Standard)
            .await,
        Err(Error::NotFound { .. })
    ));
    sim.add_kubernetes_version("1.35.0");
    assert!(
        client
            .get_sks_template("1.35.0", SksTemplateVariant::Nvidia)
            .await
            .is_ok()
    );

    let cluster = client.get_sks_cluster(sim.cluster_id()).await.unwrap();
    assert_eq!(cluster.version, "1.34.1");
    assert!(cluster.endpoint.unwrap().contains(sim.cluster_id()));
    assert_eq!(client.list_sks_clusters().await.unwrap().len(), 1);
    assert!(
        client
            .list_sks_versions()
            .await
            .unwrap()
            .contains(&"1.35.0".to_string())
    );
    assert!(client.get_sks_cluster("../zone").await.is_err());
}

#[tokio::test]
async fn groups_and_networks_resolve_by_id_or_name() {
    let (sim, client) = setup().await;
    let sg_id = sim.add_security_group("web");
    assert_eq!(client.get_security_group(&sg_id).await.unwrap().name, "web");
    assert_eq!(
        client.resolve_security_group("web").await.unwrap().id,
        sg_id
    );
    assert!(client.list_security_groups().await.unwrap().len() >= 3);
    let pn_id = sim.add_private_network("backend");
    assert_eq!(
        client.resolve_private_network(&pn_id).await.unwrap().name,
        "backend"
    );
    assert_eq!(
        client.resolve_private_network("backend").await.unwrap().id,
        pn_id
    );
    assert!(client.list_private_networks().await.unwrap().len() >= 2);
    let aag_id = sim.add_anti_affinity_group("spread");
    let aag = client.resolve_anti_affinity_group("spread").await.unwrap();
    assert_eq!((aag.id.as_str(), aag.member_count()), (aag_id.as_str(), 0));
    assert!(client.list_anti_affinity_groups().await.unwrap().len() >= 2);
    assert!(matches!(
        client.resolve_security_group("nope").await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn instance_lifecycle_round_trip() {
    let (sim, client) = setup().await;
    let mut events = sim.subscribe_instance_events();
    let sg = sim.security_groups()[0].0.clone();
    let aag = sim.anti_affinity_groups()[0].0.clone();
    let pn = sim.private_networks()[0].0.clone();

    let mut req = create_request(&sim, &client, "karpenter-default-abc12").await;
    req.user_data =
        Some(gzip_base64("[settings.kubernetes]\ncloud-provider = \"external\"\n").into());
    req.security_groups = vec![IdRef::new(&sg)];
    req.anti_affinity_groups = vec![IdRef::new(&aag)];
    let op = client.create_instance(&req).await.unwrap();
    assert_eq!(op.state, OperationState::Pending);
    let id = op.reference_id().unwrap().to_string();
    let starting = client.get_instance(&id).await.unwrap();
    assert_eq!(starting.name, "karpenter-default-abc12");
    assert!(matches!(
        starting.state,
        InstanceState::Starting | InstanceState::Running
    ));

    let done = client.wait_operation(&op).await.unwrap();
    assert_eq!(done.state, OperationState::Success);
    let running = client.get_instance(&id).await.unwrap();
    assert_eq!(running.state, InstanceState::Running);
    assert_eq!(running.disk_size, Some(50));
    assert_eq!(running.anti_affinity_groups, vec![IdRef::new(&aag)]);
    match next_event(&mut events).await {
        InstanceEvent::Running(i) => assert_eq!(i.id, id),
        other => panic!("{other:?}"),
    }
    let stored = sim.instance(&id).unwrap();
    assert_eq!(
        stored.user_data.as_deref(),
        Some("[settings.kubernetes]\ncloud-provider = \"external\"\n")
    );
    assert_eq!(
        client
            .get_anti_affinity_group(&aag)
            .await
            .unwrap()
            .member_count(),
        1
    );

    // A second instance with other labels is filtered out client-side.
    let other = create_request(&sim, &client, "someone-else").await;
    let mut other = other;
    other.labels.clear();
    client.create_instance(&other).await.unwrap();
    let managed = client
        .list_instances(&InstanceFilter::labels([(
            "exoscale.com/managed-by",
            "karpenter",
        )]))
        .await
        .unwrap();
    assert_eq!(managed.len(), 1);
    assert_eq!(managed[0].id, id);
    assert!(
        managed[0].user_data.is_none(),
        "list items carry no user data"
    );
    assert_eq!(
        client
            .list_instances(&InstanceFilter::default())
            .await
            .unwrap()
            .len(),
        2
    );

    let mut labels = running.labels.clone();
    labels.insert("exoscale.com/nodepool-name".into(), "default".into());
    labels.remove("exoscale.com/node-claim");
    let op = client.update_instance_labels(&id, &labels).await.unwrap();
    client.wait_operation(&op).await.unwrap();
    assert_eq!(client.get_instance(&id).await.unwrap().labels, labels);

    let op = client
        .attach_instance_to_private_network(&pn, &id, Some("10.0.0.42"))
        .await
        .unwrap();
    client.wait_operation(&op).await.unwrap();
    let attached = client.get_instance(&id).await.unwrap();
    assert_eq!(attached.private_networks[0].id, pn);
    assert!(attached.private_networks[0].mac_address.is_some());
    let network = client.get_private_network(&pn).await.unwrap();
    assert_eq!(network.leases[0].ip.as_deref(), Some("10.0.0.42"));
    assert_eq!(network.leases[0].instance_id, id);
    assert!(matches!(
        client
            .attach_instance_to_private_network(&pn, &id, None)
            .await,
        Err(Error::BadRequest { status: 409, .. })
    ));

    let web = sim.add_security_group("web");
    let op = client
        .attach_instance_to_security_group(&web, &id)
        .await
        .unwrap();
    client.wait_operation(&op).await.unwrap();
    let in_groups = client.get_instance(&id).await.unwrap().security_groups;
    assert_eq!(in_groups, vec![IdRef::new(&sg), IdRef::new(&web)]);
    assert!(matches!(
        client.attach_instance_to_security_group(&web, &id).await,
        Err(Error::BadRequest { status: 409, .. })
    ));

    let op = client.delete_instance(&id).await.unwrap();
    assert_eq!(
        client.get_instance(&id).await.unwrap().state,
        InstanceState::Destroying
    );
    client.wait_operation(&op).await.unwrap();
    assert!(client.get_instance(&id).await.unwrap_err().is_not_found());
    assert!(
        client
            .delete_instance(&id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    loop {
        if let InstanceEvent::Deleted { id: gone, name } = next_event(&mut events).await {
            assert_eq!(
                (gone.as_str(), name.as_str()),
                (id.as_str(), "karpenter-default-abc12")
            );
            break;
        }
    }
}

#[tokio::test]
async fn create_once_adopts_an_existing_instance() {
    let (sim, client) = setup().await;
    let req = create_request(&sim, &client, "node-a").await;
    let identity = InstanceFilter::labels([("exoscale.com/node-claim", "node-a")]);
    let first = client.create_instance_once(&req, &identity).await.unwrap();
    assert!(!first.adopted);
    client
        .wait_operation(first.operation.as_ref().unwrap())
        .await
        .unwrap();
    let again = client.create_instance_once(&req, &identity).await.unwrap();
    assert!(again.adopted);
    assert_eq!(again.instance.id, first.instance.id);
    assert_eq!(sim.call_count("create-instance"), 1);
    assert_eq!(sim.instances().len(), 1);
    let mismatched = InstanceFilter::labels([("exoscale.com/node-claim", "other")]);
    assert!(matches!(
        client.create_instance_once(&req, &mismatched).await,
        Err(Error::InvalidRequest(_))
    ));
}

/// A create whose answer names no instance ID (missing, or not a UUID) did something unknown:
/// the instance is looked up by its labels, never taken from the answer, never created again.
#[tokio::test]
async fn a_create_answer_without_an_instance_id_is_looked_up() {
    use karpenter_exoscale::sim::{Fault, FaultAction};
    let sim = ExoscaleSim::start().await.expect("sim starts");
    let config = karpenter_exoscale::exoscale::ClientConfig {
        create_lookup_wait: Duration::from_secs(1),
        ..sim.client_config()
    };
    let client = Client::new(config).unwrap();
    let req = create_request(&sim, &client, "node-b").await;
    let identity = InstanceFilter::labels([("exoscale.com/node-claim", "node-b")]);
    let bogus = r#"{"id":"op-1","state":"success","reference":{"id":"../zone/x"}}"#;
    let answer_bogus = || {
        Fault::on(
            "create-instance",
            FaultAction::Status {
                status: 200,
                body: bogus.into(),
            },
        )
    };
    sim.inject(answer_bogus());
    assert!(
        matches!(
            client.create_instance_known_new(&req, &identity).await,
            Err(Error::CreateOutcomeUnknown { .. })
        ),
        "nothing was created, so nothing may be returned"
    );
    // Now an instance with those labels exists: the same answer adopts it.
    let real = client.create_instance_once(&req, &identity).await.unwrap();
    client
        .wait_operation(real.operation.as_ref().unwrap())
        .await
        .unwrap();
    sim.inject(answer_bogus());
    let adopted = client
        .create_instance_known_new(&req, &identity)
        .await
        .unwrap();
    assert!(adopted.adopted);
    assert_eq!(adopted.instance.id, real.instance.id);
    assert_eq!(sim.instances().len(), 1);
}

/// Fault: while an operation is polled, an answer about the same operation names another
/// resource. Polling stops with an error rather than report the other resource's success.
#[tokio::test]
async fn an_operation_that_changes_its_reference_is_not_trusted() {
    let (sim, client) = setup().await;
    let op = client
        .create_instance(&create_request(&sim, &client, "polled").await)
        .await
        .unwrap();
    let other = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d";
    sim.inject(karpenter_exoscale::sim::Fault::on(
        "get-operation",
        karpenter_exoscale::sim::FaultAction::Status {
            status: 200,
            body: serde_json::json!({
                "id": op.id,
                "state": "success",
                "reference": {"id": other, "link": format!("/v2/instance/{other}"), "command": "get-instance"}
            })
            .to_string(),
        },
    ));
    let err = client.wait_operation(&op).await.unwrap_err();
    assert!(err.to_string().contains(other), "{err}");
}

#[tokio::test]
async fn anti_affinity_group_limit_is_a_capacity_error() {
    let (sim, client) = setup().await;
    let aag = sim.add_anti_affinity_group("eight");
    for n in 0..8 {
        let mut req = create_request(&sim, &client, &format!("n{n}")).await;
        req.anti_affinity_groups = vec![IdRef::new(&aag)];
        client.create_instance(&req).await.unwrap();
    }
    let mut req = create_request(&sim, &client, "n9").await;
    req.anti_affinity_groups = vec![IdRef::new(&aag)];
    let err = client.create_instance(&req).await.unwrap_err();
    assert!(err.is_capacity_error(), "{err:?}");
    assert_eq!(
        client
            .get_anti_affinity_group(&aag)
            .await
            .unwrap()
            .member_count(),
        8
    );
}

#[tokio::test]
async fn unauthorized_type_and_bad_disk_are_rejected() {
    let (sim, client) = setup().await;
    let mut req = create_request(&sim, &client, "gpu").await;
    req.instance_type = IdRef::new(type_id(&client, "gpua30.small").await);
    let err = client.create_instance(&req).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest { status: 400, ref message } if message.contains("not authorized")),
        "{err:?}"
    );
    assert!(sim.set_authorized("gpua30.small", true));
    client.create_instance(&req).await.unwrap();
    let mut req = create_request(&sim, &client, "tiny-disk").await;
    req.disk_size = 1;
    assert!(matches!(
        client.create_instance(&req).await,
        Err(Error::BadRequest { .. })
    ));
}

#[tokio::test]
async fn every_call_is_signed_and_verified() {
    let (sim, client) = setup().await;
    client.list_zones().await.unwrap();
    client
        .list_instances(&InstanceFilter::default())
        .await
        .unwrap();
    client
        .list_templates(TemplateVisibility::Public, Some("sks"))
        .await
        .unwrap();
    let calls = sim.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(
        |c| matches!(&c.auth, AuthOutcome::Valid { key, .. } if key == &sim.credentials().key)
    ));
    assert_eq!(
        calls[2].query.as_deref(),
        Some("visibility=public&family=sks")
    );
    let sigs = sim.signatures_seen();
    assert_eq!(sigs.len(), 3);
    assert!(sigs.iter().all(|s| s.len() == 44 && s.ends_with('=')));
}

#[tokio::test]
async fn expired_signature_is_refused() {
    let sim = ExoscaleSim::start().await.unwrap();
    let mut config = sim.client_config();
    // Signatures expire 600 s after "now"; a clock from 2001 produces long-expired ones.
    config.clock = Arc::new(FixedClock::at(1_000_000_000));
    let client = Client::new(config).unwrap();
    let err = client
        .list_instances(&InstanceFilter::default())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        Error::Unauthorized {
            status: 403,
            message: "Invalid request signature".into()
        }
    );
    let call = sim.calls().pop().unwrap();
    assert_eq!(call.auth, AuthOutcome::Rejected("signature expired".into()));
    assert_eq!(call.status, 403);
}

#[tokio::test]
async fn wrong_secret_and_unknown_key_are_refused_without_leaking_the_secret() {
    let sim = ExoscaleSim::start().await.unwrap();
    let mut config = sim.client_config();
    config.credentials = Credentials::new(sim.credentials().key.clone(), "not-the-secret-xyz");
    let client = Client::new(config.clone()).unwrap();
    let err = client.list_zones().await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { status: 403, .. }));
    assert!(!format!("{err:?} {err} {client:?}").contains("not-the-secret-xyz"));
    assert_eq!(sim.call_count("list-zones"), 1, "403 is not retried");

    config.credentials = Credentials::new("EXOunknown", "whatever");
    let client = Client::new(config).unwrap();
    assert!(matches!(
        client.get_sks_cluster(sim.cluster_id()).await,
        Err(Error::Unauthorized { .. })
    ));
    sim.add_credentials("EXOunknown", "whatever");
    assert!(client.get_sks_cluster(sim.cluster_id()).await.is_ok());
}

#[tokio::test]
async fn unsigned_requests_only_list_zones() {
    let sim = ExoscaleSim::start().await.unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let zones = http
        .get(format!("{}/zone", sim.endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(zones.status(), 200);
    let instances = http
        .get(format!("{}/instance", sim.endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(instances.status(), 403);
    assert_eq!(
        instances.text().await.unwrap(),
        r#"{"message":"Invalid request signature"}"#
    );
}

#[tokio::test]
async fn a_burst_through_the_rate_limiter_all_succeeds() {
    let sim = ExoscaleSim::start().await.unwrap();
    let mut config = sim.client_config();
    config.rate_limit = Some(RateLimit {
        per_second: 200.0,
        burst: 5,
    });
    let client = Client::new(config).unwrap();
    let calls = (0..30).map(|_| {
        let client = client.clone();
        async move { client.list_zones().await }
    });
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(sim.call_count("list-zones"), 30);
}

#[tokio::test]
async fn update_instance_replaces_name_and_user_data() {
    let (sim, client) = setup().await;
    let op = client
        .create_instance(&create_request(&sim, &client, "before").await)
        .await
        .unwrap();
    let id = op.reference_id().unwrap().to_string();
    let update = UpdateInstanceRequest {
        name: Some("after".into()),
        labels: None,
        user_data: Some(
            base64::engine::general_purpose::STANDARD
                .encode("plain = true")
                .into(),
        ),
    };
    let op = client.update_instance(&id, &update).await.unwrap();
    assert_eq!(op.reference_id(), Some(id.as_str()));
    client.wait_operation(&op).await.unwrap();
    let updated = client.get_instance(&id).await.unwrap();
    assert_eq!(updated.name, "after");
    assert_eq!(
        updated
            .labels
            .get("exoscale.com/node-claim")
            .map(String::as_str),
        Some("before"),
        "labels untouched"
    );
    assert_eq!(
        sim.instance(&id).unwrap().user_data.as_deref(),
        Some("plain = true")
    );
    assert!(
        client
            .update_instance("6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11", &update)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

/// Operation, status, error kind.
type Report = (String, Option<u16>, Option<&'static str>);

/// Remembers what the client reports about each request it sent, and its rate-limiter waits.
#[derive(Default)]
struct Recorded(
    std::sync::Mutex<Vec<Report>>,
    std::sync::Mutex<Vec<Duration>>,
);

impl karpenter_exoscale::exoscale::RequestObserver for Recorded {
    fn observe(
        &self,
        operation: &str,
        status: Option<u16>,
        error: Option<&'static str>,
        _elapsed: Duration,
    ) {
        self.0
            .lock()
            .unwrap()
            .push((operation.to_string(), status, error));
    }

    fn waited(&self, wait: Duration) {
        self.1.lock().unwrap().push(wait);
    }
}

#[tokio::test]
async fn every_request_sent_is_reported_with_its_status_and_error_kind() {
    use karpenter_exoscale::sim::{Fault, FaultAction};
    let sim = ExoscaleSim::start().await.expect("sim starts");
    let recorded = Arc::new(Recorded::default());
    let config = karpenter_exoscale::exoscale::ClientConfig {
        observer: karpenter_exoscale::exoscale::Observer(Some(recorded.clone())),
        retry: karpenter_exoscale::exoscale::RetryPolicy::none(),
        ..sim.client_config()
    };
    let client = Client::new(config).unwrap();
    client
        .list_instances(&InstanceFilter::default())
        .await
        .unwrap();
    let missing = "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11";
    assert!(matches!(
        client.get_instance(missing).await,
        Err(Error::NotFound { .. })
    ));
    sim.inject(Fault::on(
        "list-instances",
        FaultAction::RateLimited {
            retry_after_secs: 1,
        },
    ));
    assert!(
        client
            .list_instances(&InstanceFilter::default())
            .await
            .is_err()
    );
    let seen = recorded.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("GET /instance".to_string(), Some(200), None),
            (
                "GET /instance/{id}".to_string(),
                Some(404),
                Some("not_found")
            ),
            ("GET /instance".to_string(), Some(429), Some("rate_limited")),
        ]
    );
}

#[tokio::test]
async fn rate_limiter_waits_are_reported() {
    let sim = ExoscaleSim::start().await.expect("sim starts");
    let recorded = Arc::new(Recorded::default());
    let config = karpenter_exoscale::exoscale::ClientConfig {
        observer: karpenter_exoscale::exoscale::Observer(Some(recorded.clone())),
        // One token, refilled every 2 s: the second request must wait for it.
        rate_limit: Some(RateLimit {
            per_second: 0.5,
            burst: 1,
        }),
        ..sim.client_config()
    };
    let client = Client::new(config).unwrap();
    client.list_zones().await.unwrap();
    assert!(
        recorded.1.lock().unwrap().is_empty(),
        "the first token is free"
    );
    client.list_zones().await.unwrap();
    let waits = recorded.1.lock().unwrap().clone();
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(waits[0] >= Duration::from_millis(500), "{waits:?}");
}
