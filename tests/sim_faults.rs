//! Each fault mode of the sim ends in the right typed error or a correct retry.

use std::time::Duration;

use karpenter_exoscale::exoscale::models::*;
use karpenter_exoscale::exoscale::{Client, Error, InstanceFilter, PollPolicy, RetryPolicy};
use karpenter_exoscale::sim::{ExoscaleSim, Fault, FaultAction};

async fn setup() -> (ExoscaleSim, Client) {
    let sim = ExoscaleSim::start().await.expect("sim starts");
    let client = Client::new(sim.client_config()).expect("client builds");
    (sim, client)
}

async fn create_request(sim: &ExoscaleSim, client: &Client, claim: &str) -> CreateInstanceRequest {
    let itype = client
        .list_instance_types()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name() == "standard.small")
        .unwrap();
    let template = client
        .get_sks_template(sim.kubernetes_version(), SksTemplateVariant::Standard)
        .await
        .unwrap();
    let mut req = CreateInstanceRequest::new(&itype.id, &template, 20);
    req.name = Some(claim.to_string());
    req.labels
        .insert("exoscale.com/node-claim".into(), claim.to_string());
    req
}

fn identity(claim: &str) -> InstanceFilter {
    InstanceFilter::labels([("exoscale.com/node-claim", claim)]).with_name(claim)
}

#[tokio::test]
async fn transient_5xx_on_a_read_is_retried_until_success() {
    let (sim, client) = setup().await;
    sim.inject(
        Fault::status(
            "list-instance-types",
            503,
            "Endpoint template temporarily unavailable",
        )
        .times(2),
    );
    let types = client.list_instance_types().await.unwrap();
    assert!(!types.is_empty());
    assert_eq!(sim.call_count("list-instance-types"), 3);
}

#[tokio::test]
async fn persistent_5xx_gives_a_server_error_after_the_bounded_attempts() {
    let (sim, client) = setup().await;
    sim.inject(Fault::status("list-zones", 500, "internal").always());
    let err = client.list_zones().await.unwrap_err();
    assert_eq!(
        err,
        Error::Server {
            status: 500,
            message: "internal".into()
        }
    );
    assert_eq!(
        sim.call_count("list-zones"),
        4,
        "max_attempts of the sim client config"
    );
}

#[tokio::test]
async fn not_implemented_is_not_retried() {
    let (sim, client) = setup().await;
    sim.inject(Fault::status("list-zones", 501, "nope").always());
    assert!(matches!(
        client.list_zones().await,
        Err(Error::Server { status: 501, .. })
    ));
    assert_eq!(sim.call_count("list-zones"), 1);
}

#[tokio::test]
async fn rate_limit_with_retry_after_is_waited_out() {
    let (sim, client) = setup().await;
    sim.inject(Fault::on(
        "list-zones",
        FaultAction::RateLimited {
            retry_after_secs: 1,
        },
    ));
    assert_eq!(client.list_zones().await.unwrap().len(), 8);
    let calls = sim.calls();
    assert_eq!(
        calls.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![429, 200]
    );
}

#[tokio::test]
async fn persistent_rate_limit_surfaces_retry_after() {
    let (sim, _) = setup().await;
    let mut config = sim.client_config();
    config.retry = RetryPolicy::none();
    let client = Client::new(config).unwrap();
    sim.inject(
        Fault::any(FaultAction::RateLimited {
            retry_after_secs: 7,
        })
        .always(),
    );
    match client.list_zones().await {
        Err(Error::RateLimited {
            retry_after,
            message,
        }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)));
            assert_eq!(message, "Too Many Requests");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_retry_after_beyond_the_bound_is_not_waited_for() {
    let (sim, client) = setup().await;
    sim.inject(Fault::on(
        "list-zones",
        FaultAction::RateLimited {
            retry_after_secs: 3600,
        },
    ));
    assert!(matches!(
        client.list_zones().await,
        Err(Error::RateLimited { .. })
    ));
    assert_eq!(sim.call_count("list-zones"), 1);
}

#[tokio::test]
async fn rate_limited_create_is_retried_because_nothing_happened() {
    let (sim, client) = setup().await;
    let req = create_request(&sim, &client, "rl").await;
    sim.inject(Fault::on(
        "create-instance",
        FaultAction::RateLimited {
            retry_after_secs: 1,
        },
    ));
    let op = client.create_instance(&req).await.unwrap();
    assert!(op.reference_id().is_some());
    assert_eq!(sim.call_count("create-instance"), 2);
    assert_eq!(sim.instances().len(), 1);
}

#[tokio::test]
async fn a_5xx_on_create_is_never_blindly_retried() {
    let (sim, client) = setup().await;
    let req = create_request(&sim, &client, "plain").await;
    sim.inject(Fault::status("create-instance", 503, "busy"));
    assert!(matches!(
        client.create_instance(&req).await,
        Err(Error::Server { status: 503, .. })
    ));
    assert_eq!(sim.call_count("create-instance"), 1);
    assert!(sim.instances().is_empty());
}

#[tokio::test]
async fn a_lost_create_response_does_not_produce_a_second_instance() {
    let (sim, client) = setup().await;
    let req = create_request(&sim, &client, "lost").await;
    sim.inject(Fault::on("create-instance", FaultAction::LoseResponse));
    let created = client
        .create_instance_once(&req, &identity("lost"))
        .await
        .unwrap();
    assert!(
        created.adopted,
        "the instance created by the lost call is adopted"
    );
    assert_eq!(sim.call_count("create-instance"), 1);
    let instances = sim.instances();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].instance.id, created.instance.id);
    assert!(sim.calls().iter().any(|c| c.response_lost));
}

#[tokio::test]
async fn a_lost_create_response_is_a_transport_error_for_the_raw_call() {
    let (sim, client) = setup().await;
    let req = create_request(&sim, &client, "raw").await;
    sim.inject(Fault::on("create-instance", FaultAction::LoseResponse));
    let err = client.create_instance(&req).await.unwrap_err();
    assert!(
        matches!(err, Error::Transport { connect: false, .. }),
        "{err:?}"
    );
    assert_eq!(sim.call_count("create-instance"), 1);
    assert_eq!(sim.instances().len(), 1);
}

/// A client whose lookups after an outcome-unknown create give up after `wait`.
async fn setup_with_lookup_wait(wait: Duration) -> (ExoscaleSim, Client) {
    let sim = ExoscaleSim::start().await.expect("sim starts");
    let mut config = sim.client_config();
    config.create_lookup_wait = wait;
    let client = Client::new(config).expect("client builds");
    (sim, client)
}

/// A 502 may come from a gateway after the backend committed: the create is not sent again
/// in the same attempt; lookups end with a distinct error when nothing appears.
#[tokio::test]
async fn a_5xx_create_is_looked_up_never_sent_again_in_the_same_attempt() {
    let (sim, client) = setup_with_lookup_wait(Duration::from_millis(1500)).await;
    let req = create_request(&sim, &client, "retry").await;
    sim.inject(Fault::status("create-instance", 502, "bad gateway"));
    let err = client
        .create_instance_once(&req, &identity("retry"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CreateOutcomeUnknown { .. }), "{err:?}");
    assert!(err.to_string().contains("bad gateway"), "{err}");
    assert_eq!(sim.call_count("create-instance"), 1);
    // One lookup before the POST, then several while the outcome was unknown.
    assert!(sim.call_count("list-instances") >= 3);
    assert!(sim.instances().is_empty());
    // The next attempt looks up first, finds nothing, and creates.
    let created = client
        .create_instance_once(&req, &identity("retry"))
        .await
        .unwrap();
    assert!(!created.adopted);
    assert_eq!(sim.call_count("create-instance"), 2);
    assert_eq!(sim.instances().len(), 1);
}

/// Fault: the create's response is lost and the backend commits it only later, so the first
/// lookup finds nothing. The create is not repeated; the instance is adopted once it appears.
#[tokio::test]
async fn a_create_committed_after_its_lost_response_is_adopted_not_duplicated() {
    let (sim, client) = setup().await;
    let req = create_request(&sim, &client, "late").await;
    sim.inject(Fault::on(
        "create-instance",
        FaultAction::LoseResponseCommitLater(Duration::from_millis(1500)),
    ));
    let created = client
        .create_instance_once(&req, &identity("late"))
        .await
        .unwrap();
    assert!(created.adopted);
    assert_eq!(sim.call_count("create-instance"), 1);
    let instances = sim.instances();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].instance.id, created.instance.id);
}

/// The same fault with a commit later than the lookup wait: the attempt fails without a
/// second POST, and the next attempt adopts the late instance.
#[tokio::test]
async fn a_create_committed_after_the_lookup_wait_is_adopted_by_the_next_attempt() {
    let (sim, client) = setup_with_lookup_wait(Duration::from_millis(500)).await;
    let req = create_request(&sim, &client, "later").await;
    sim.inject(Fault::on(
        "create-instance",
        FaultAction::LoseResponseCommitLater(Duration::from_secs(2)),
    ));
    let err = client
        .create_instance_once(&req, &identity("later"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CreateOutcomeUnknown { .. }), "{err:?}");
    assert_eq!(sim.call_count("create-instance"), 1);
    for _ in 0..100 {
        if !sim.instances().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sim.instances().len(), 1, "the backend committed late");
    let created = client
        .create_instance_once(&req, &identity("later"))
        .await
        .unwrap();
    assert!(created.adopted);
    assert_eq!(sim.call_count("create-instance"), 1);
    assert_eq!(sim.instances().len(), 1);
}

#[tokio::test]
async fn quota_exhaustion_is_a_capacity_error() {
    let (sim, client) = setup().await;
    sim.set_instance_quota(Some(1));
    client
        .create_instance(&create_request(&sim, &client, "q1").await)
        .await
        .unwrap();
    let err = client
        .create_instance(&create_request(&sim, &client, "q2").await)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::QuotaExceeded { status: 403, .. }),
        "{err:?}"
    );
    assert!(err.is_capacity_error());
    assert_eq!(sim.instances().len(), 1);

    sim.set_instance_quota(None);
    sim.inject(Fault::on("create-instance", FaultAction::QuotaExceeded));
    let err = client
        .create_instance_once(&create_request(&sim, &client, "q3").await, &identity("q3"))
        .await
        .unwrap_err();
    assert!(err.is_capacity_error(), "{err:?}");
    assert_eq!(sim.call_count("create-instance"), 3);
}

#[tokio::test]
async fn gpu_capacity_status_maps_to_insufficient_capacity() {
    let (sim, client) = setup().await;
    sim.inject(Fault::status(
        "create-instance",
        412,
        "Insufficient capacity for gpu3.small in de-fra-1",
    ));
    let err = client
        .create_instance(&create_request(&sim, &client, "gpu").await)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InsufficientCapacity { status: 412, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn error_on_the_nth_call_only() {
    let (sim, _) = setup().await;
    let mut config = sim.client_config();
    config.retry = RetryPolicy::none();
    let strict = Client::new(config).unwrap();
    sim.inject(Fault::status("get-sks-cluster", 404, "SKS cluster not found").nth(3));
    for _ in 0..2 {
        strict.get_sks_cluster(sim.cluster_id()).await.unwrap();
    }
    assert!(
        strict
            .get_sks_cluster(sim.cluster_id())
            .await
            .unwrap_err()
            .is_not_found()
    );
    strict.get_sks_cluster(sim.cluster_id()).await.unwrap();
}

#[tokio::test]
async fn problem_details_bodies_are_parsed() {
    let (sim, client) = setup().await;
    sim.inject(Fault::on(
        "update-instance",
        FaultAction::Status {
            status: 422,
            body: r#"{"type":"about:blank","title":"Invalid Request Body","status":422,"errors":[{"location":"$['labels']","detail":"too many"}]}"#.into(),
        },
    ));
    let err = client
        .update_instance_labels("6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11", &Labels::new())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        Error::BadRequest {
            status: 422,
            message: "Invalid Request Body: $['labels'] too many".into()
        }
    );
}

#[tokio::test]
async fn latency_beyond_the_request_timeout_is_a_timeout() {
    let (sim, _) = setup().await;
    let mut config = sim.client_config();
    config.request_timeout = Duration::from_millis(200);
    config.retry = RetryPolicy::none();
    let client = Client::new(config).unwrap();
    sim.inject(Fault::on(
        "list-zones",
        FaultAction::Latency(Duration::from_secs(10)),
    ));
    assert!(matches!(
        client.list_zones().await,
        Err(Error::Timeout { .. })
    ));
}

#[tokio::test]
async fn a_slow_read_is_retried_after_its_timeout() {
    let (sim, _) = setup().await;
    let mut config = sim.client_config();
    config.request_timeout = Duration::from_millis(300);
    let client = Client::new(config).unwrap();
    sim.inject(Fault::on(
        "list-zones",
        FaultAction::Latency(Duration::from_secs(10)),
    ));
    // The fault fires once, so success means the timed-out read was sent again.
    assert_eq!(client.list_zones().await.unwrap().len(), 8);
}

#[tokio::test]
async fn operation_polling_survives_transient_errors() {
    let (sim, client) = setup().await;
    let op = client
        .create_instance(&create_request(&sim, &client, "poll").await)
        .await
        .unwrap();
    sim.inject(Fault::status("get-operation", 500, "flaky").times(2));
    assert_eq!(
        client.wait_operation(&op).await.unwrap().state,
        OperationState::Success
    );
}

#[tokio::test]
async fn operation_polling_gives_up_after_consecutive_errors() {
    let (sim, _) = setup().await;
    let mut config = sim.client_config();
    config.retry = RetryPolicy::none();
    let client = Client::new(config).unwrap();
    sim.set_operation_delay(Duration::from_secs(3600));
    let op = client
        .create_instance(&create_request(&sim, &client, "poll").await)
        .await
        .unwrap();
    sim.inject(Fault::status("get-operation", 500, "down").always());
    assert!(matches!(
        client.wait_operation(&op).await,
        Err(Error::Server { status: 500, .. })
    ));
    assert_eq!(sim.call_count("get-operation"), 5);
}

#[tokio::test]
async fn operation_polling_is_bounded_by_its_timeout() {
    let (sim, _) = setup().await;
    let mut config = sim.client_config();
    config.poll = PollPolicy::fixed(Duration::from_millis(10), Duration::from_millis(150));
    let client = Client::new(config).unwrap();
    sim.set_operation_delay(Duration::from_secs(3600));
    let op = client
        .create_instance(&create_request(&sim, &client, "slow").await)
        .await
        .unwrap();
    match client.wait_operation(&op).await {
        Err(Error::Timeout { what }) => assert!(what.contains(&op.id)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_accepted_create_whose_operation_fails() {
    let (sim, client) = setup().await;
    sim.inject(Fault::on(
        "create-instance",
        FaultAction::FailOperation {
            reason: "unavailable".into(),
            message: "no host available for standard.small".into(),
        },
    ));
    let op = client
        .create_instance(&create_request(&sim, &client, "doomed").await)
        .await
        .unwrap();
    let err = client.wait_operation(&op).await.unwrap_err();
    match &err {
        Error::OperationFailed { state, reason, .. } => {
            assert_eq!(
                (state.as_str(), reason.as_str()),
                ("failure", "unavailable")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.is_capacity_error());
    let instance = client
        .get_instance(op.reference_id().unwrap())
        .await
        .unwrap();
    assert_eq!(instance.state, InstanceState::Error);
}
