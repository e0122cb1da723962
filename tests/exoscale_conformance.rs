//! Exoscale API conformance: every operation of the client, and the simulated API's answers,
//! checked against the official OpenAPI document (`tests/support/openapi.rs`). The same check
//! runs over the traffic of `tests/cloudprovider_exoscale.rs` (each test) and of the e2e suites
//! (each `World::finish`), so the controller's real conversations are covered too. Here: the
//! checker itself catches what it must, and a run through every client operation is clean.

#[path = "support/openapi.rs"]
mod openapi;

use std::collections::BTreeSet;

use karpenter_exoscale::exoscale::models::*;
use karpenter_exoscale::exoscale::{Client, InstanceFilter};
use karpenter_exoscale::sim::{Exchange, ExoscaleSim};
use serde_json::json;

use openapi::{all_problems, problems};

fn exchange(
    method: &str,
    path: &str,
    query: Option<&str>,
    body: &str,
    status: u16,
    answer: serde_json::Value,
) -> Exchange {
    Exchange {
        method: method.into(),
        path: path.into(),
        query: query.map(str::to_string),
        request_body: body.into(),
        status,
        response_body: Some(answer),
        injected: false,
        lost: false,
    }
}

const ID: &str = "8a3c2e1f-4b5d-4c6e-9f70-1a2b3c4d5e6f";

#[test]
fn the_checker_catches_what_the_api_would_refuse_or_never_send() {
    let operation = json!({"id": ID, "state": "pending", "reference": {"id": ID}});
    let ok = exchange(
        "GET",
        &format!("/v2/operation/{ID}"),
        None,
        "",
        200,
        operation.clone(),
    );
    assert_eq!(problems(&ok), Vec::<String>::new());

    let find = |ex: &Exchange, text: &str| {
        let found = problems(ex);
        assert!(
            found.iter().any(|p| p.contains(text)),
            "expected a problem containing {text:?}, got {found:?}"
        );
    };
    find(
        &exchange("GET", "/v2/no-such-thing", None, "", 200, json!({})),
        "no such operation",
    );
    find(
        &exchange(
            "PATCH",
            &format!("/v2/instance/{ID}"),
            None,
            "",
            200,
            json!({}),
        ),
        "no such operation",
    );
    // Path parameters are typed: an operation id is a UUID.
    find(
        &exchange(
            "GET",
            "/v2/operation/not-a-uuid",
            None,
            "",
            200,
            operation.clone(),
        ),
        "is not a UUID",
    );
    // Query parameters must be declared.
    find(
        &exchange(
            "GET",
            "/v2/instance",
            Some("colour=blue"),
            "",
            200,
            json!({"instances": []}),
        ),
        "query colour",
    );
    // Request bodies: unknown fields, read-only fields, wrong types, missing required ones.
    let create = |body: serde_json::Value| {
        exchange(
            "POST",
            "/v2/instance",
            None,
            &body.to_string(),
            200,
            operation.clone(),
        )
    };
    let good = json!({"instance-type": {"id": ID}, "template": {"id": ID}, "disk-size": 50});
    assert_eq!(problems(&create(good.clone())), Vec::<String>::new());
    let mut unknown = good.clone();
    unknown["colour"] = json!("blue");
    find(&create(unknown), "request.colour: not in the API's schema");
    let mut wrong = good.clone();
    wrong["disk-size"] = json!("fifty");
    find(&create(wrong), "request.disk-size: expected an integer");
    find(
        &create(json!({"template": {"id": ID}, "disk-size": 50})),
        "request.instance-type: required, missing",
    );
    find(
        &exchange(
            "GET",
            "/v2/instance",
            None,
            "{\"x\":1}",
            200,
            json!({"instances": []}),
        ),
        "takes none",
    );
    // Answers: an undeclared 2xx, a field the API never sends, a value out of its schema.
    find(
        &exchange(
            "GET",
            &format!("/v2/operation/{ID}"),
            None,
            "",
            201,
            operation.clone(),
        ),
        "status 201",
    );
    let mut invented = operation.clone();
    invented["colour"] = json!("blue");
    find(
        &exchange(
            "GET",
            &format!("/v2/operation/{ID}"),
            None,
            "",
            200,
            invented,
        ),
        "response.colour",
    );
    find(
        &exchange(
            "GET",
            &format!("/v2/operation/{ID}"),
            None,
            "",
            200,
            json!({"id": ID, "state": "sleeping"}),
        ),
        "is not one of",
    );
    // Error answers of the simulated API must have a documented shape; injected ones are free.
    find(
        &exchange(
            "GET",
            &format!("/v2/instance/{ID}"),
            None,
            "",
            404,
            json!({"oops": 1}),
        ),
        "documented shapes",
    );
    assert_eq!(
        problems(&exchange(
            "GET",
            &format!("/v2/instance/{ID}"),
            None,
            "",
            404,
            json!({"message": "Instance not found"})
        )),
        Vec::<String>::new()
    );
    let mut injected = exchange(
        "GET",
        &format!("/v2/instance/{ID}"),
        None,
        "",
        500,
        json!("garbage"),
    );
    injected.injected = true;
    assert_eq!(problems(&injected), Vec::<String>::new());
}

/// Every client operation once, against the simulated API, recorded and checked.
#[tokio::test]
async fn every_client_operation_and_its_answer_conform() {
    let sim = ExoscaleSim::start().await.expect("sim starts");
    sim.record_exchanges();
    let client = Client::new(sim.client_config()).expect("client builds");

    client.list_zones().await.unwrap();
    client.check_zone(sim.zone()).await.unwrap();
    let types = client.list_instance_types().await.unwrap();
    let medium = types
        .iter()
        .find(|t| t.name() == "standard.medium")
        .unwrap();
    client.get_instance_type(&medium.id).await.unwrap();
    let gpu = types.iter().find(|t| t.gpus > 0).expect("a GPU type");
    client.get_instance_type(&gpu.id).await.unwrap();
    let versions = client.list_sks_versions().await.unwrap();
    let template = client
        .get_sks_template(&versions[0], SksTemplateVariant::Standard)
        .await
        .unwrap();
    client.get_template(&template).await.unwrap();
    client
        .list_templates(TemplateVisibility::Public, Some("linux"))
        .await
        .unwrap();
    client.list_sks_clusters().await.unwrap();
    client.get_sks_cluster(sim.cluster_id()).await.unwrap();

    let groups = client.list_security_groups().await.unwrap();
    let sg = client
        .resolve_security_group(&groups[0].name)
        .await
        .unwrap();
    client.get_security_group(&sg.id).await.unwrap();
    let networks = client.list_private_networks().await.unwrap();
    let aags = client.list_anti_affinity_groups().await.unwrap();

    let mut req = CreateInstanceRequest::new(&medium.id, &template, 50);
    req.name = Some("karpenter-conformance".into());
    req.labels
        .insert("exoscale.com/managed-by".into(), "karpenter".into());
    req.user_data = Some(UserData("dXNlci1kYXRh".into()));
    req.security_groups = vec![IdRef::new(&sg.id)];
    if let Some(aag) = aags.first() {
        client.get_anti_affinity_group(&aag.id).await.unwrap();
        req.anti_affinity_groups = vec![IdRef::new(&aag.id)];
    }
    let op = client.create_instance(&req).await.unwrap();
    let done = client.wait_operation(&op).await.unwrap();
    client.get_operation(&done.id).await.unwrap();
    let id = done
        .reference
        .as_ref()
        .and_then(|r| r.id.clone())
        .expect("the operation names the instance");
    client.get_instance(&id).await.unwrap();
    client
        .list_instances(&InstanceFilter::labels([(
            "exoscale.com/managed-by",
            "karpenter",
        )]))
        .await
        .unwrap();
    client
        .find_instance(
            &InstanceFilter::labels([("exoscale.com/managed-by", "karpenter")])
                .with_name("karpenter-conformance"),
        )
        .await
        .unwrap();
    let mut labels = Labels::new();
    labels.insert("exoscale.com/managed-by".into(), "karpenter".into());
    labels.insert("exoscale.com/node-claim".into(), "conformance".into());
    let op = client.update_instance_labels(&id, &labels).await.unwrap();
    client.wait_operation(&op).await.unwrap();
    if let Some(other) = groups.get(1) {
        let op = client
            .attach_instance_to_security_group(&other.id, &id)
            .await
            .unwrap();
        client.wait_operation(&op).await.unwrap();
    }
    if let Some(pn) = networks.first() {
        client.get_private_network(&pn.id).await.unwrap();
        let op = client
            .attach_instance_to_private_network(&pn.id, &id, None)
            .await
            .unwrap();
        client.wait_operation(&op).await.unwrap();
    }
    let op = client.delete_instance(&id).await.unwrap();
    client.wait_operation(&op).await.unwrap();
    // A miss: the sim's 404 must have the API's error shape.
    assert!(client.get_instance(&id).await.is_err());

    let exchanges = sim.exchanges();
    let problems = all_problems(&exchanges);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let operations: BTreeSet<String> = exchanges
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e.method,
                e.path.split('/').nth(2).unwrap_or_default()
            )
        })
        .collect();
    assert!(
        operations.len() >= 12,
        "too few kinds of call covered: {operations:?}"
    );
}
