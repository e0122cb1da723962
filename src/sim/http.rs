//! The HTTP face of the sim: signature checks, routing on the raw path, fault injection and
//! call recording. One fallback handler sees every request exactly as sent.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;

use super::faults::{self, FaultAction};
use super::world::{self, Reply};
use super::{AuthOutcome, CallRecord, Shared};
use crate::exoscale::signer;

/// A parsed route: the API operation id and its path parameters.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Route {
    pub operation: &'static str,
    pub params: Vec<String>,
}

/// Maps method + raw path (with `/v2`) to an operation. `:attach` is part of the last segment.
pub(crate) fn route(method: &Method, path: &str) -> Option<Route> {
    let rest = path.strip_prefix("/v2/")?;
    let segments: Vec<&str> = rest.split('/').collect();
    let r = |operation, params: &[&str]| {
        Some(Route {
            operation,
            params: params.iter().map(|s| s.to_string()).collect(),
        })
    };
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["zone"]) => r("list-zones", &[]),
        ("GET", ["instance-type"]) => r("list-instance-types", &[]),
        ("GET", ["instance-type", id]) => r("get-instance-type", &[id]),
        ("GET", ["instance"]) => r("list-instances", &[]),
        ("POST", ["instance"]) => r("create-instance", &[]),
        ("GET", ["instance", id]) => r("get-instance", &[id]),
        ("PUT", ["instance", id]) => r("update-instance", &[id]),
        ("DELETE", ["instance", id]) => r("delete-instance", &[id]),
        ("GET", ["template"]) => r("list-templates", &[]),
        ("GET", ["template", id]) => r("get-template", &[id]),
        ("GET", ["sks-template", version, variant]) => {
            r("get-active-nodepool-template", &[version, variant])
        }
        ("GET", ["sks-cluster"]) => r("list-sks-clusters", &[]),
        ("GET", ["sks-cluster", id]) => r("get-sks-cluster", &[id]),
        ("GET", ["sks-cluster-version"]) => r("list-sks-cluster-versions", &[]),
        ("GET", ["security-group"]) => r("list-security-groups", &[]),
        ("PUT", ["security-group", action]) if action.ends_with(":attach") => r(
            "attach-instance-to-security-group",
            &[action.trim_end_matches(":attach")],
        ),
        ("GET", ["security-group", id]) => r("get-security-group", &[id]),
        ("GET", ["private-network"]) => r("list-private-networks", &[]),
        ("PUT", ["private-network", action]) if action.ends_with(":attach") => r(
            "attach-instance-to-private-network",
            &[action.trim_end_matches(":attach")],
        ),
        ("GET", ["private-network", id]) => r("get-private-network", &[id]),
        ("GET", ["anti-affinity-group"]) => r("list-anti-affinity-groups", &[]),
        ("GET", ["anti-affinity-group", id]) => r("get-anti-affinity-group", &[id]),
        ("GET", ["operation", id]) => r("get-operation", &[id]),
        _ => None,
    }
}

fn json_response(reply: &Reply, retry_after: Option<u64>) -> Response {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(secs) = retry_after {
        builder = builder.header(header::RETRY_AFTER, secs.to_string());
    }
    builder
        .body(Body::from(reply.body.to_string()))
        .expect("static response parts are valid")
}

fn raw_response(status: u16, body: String) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("static response parts are valid")
}

/// Headers go out as 200, then the body stream fails: the client never learns the outcome.
fn lost_response() -> Response {
    let stream = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "simulated lost response",
        ))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("static response parts are valid")
}

fn authenticate(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    route: Option<&Route>,
) -> AuthOutcome {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        // python-exoscale lists zones unsigned on purpose; the real API allows it.
        let unsigned_ok = route.is_some_and(|r| r.operation == "list-zones");
        return if unsigned_ok {
            AuthOutcome::Unsigned
        } else {
            AuthOutcome::Rejected("missing Authorization header".into())
        };
    };
    let Ok(value) = value.to_str() else {
        return AuthOutcome::Rejected("non-ASCII Authorization header".into());
    };
    let parsed = match signer::parse_authorization(value) {
        Ok(p) => p,
        Err(e) => return AuthOutcome::Rejected(e.to_string()),
    };
    let secret = shared
        .credentials
        .lock()
        .expect("lock")
        .get(&parsed.credential)
        .cloned();
    let Some(secret) = secret else {
        return AuthOutcome::Rejected(format!("unknown API key {}", parsed.credential));
    };
    let pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    match signer::verify(
        &parsed,
        &secret,
        method.as_str(),
        uri.path(),
        &pairs,
        body,
        shared.clock.now_unix(),
    ) {
        Ok(()) => AuthOutcome::Valid {
            key: parsed.credential,
            signature: parsed.signature,
        },
        Err(e) => AuthOutcome::Rejected(e.to_string()),
    }
}

pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = route(&method, uri.path());
    let auth = authenticate(&shared, &method, &uri, &headers, &body, route.as_ref());
    let operation = route
        .as_ref()
        .map_or("unknown", |r| r.operation)
        .to_string();
    let mut record = CallRecord {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        operation: operation.clone(),
        status: 0,
        auth: auth.clone(),
        response_lost: false,
    };
    let mut sent = Sent::default();
    let response = respond(&shared, route, &auth, &body, &uri, &mut record, &mut sent).await;
    super::record_exchange(
        &shared,
        super::Exchange {
            method: record.method.clone(),
            path: record.path.clone(),
            query: record.query.clone(),
            request_body: String::from_utf8_lossy(&body).into_owned(),
            status: record.status,
            response_body: sent.body,
            injected: sent.injected,
            lost: record.response_lost,
        },
    );
    super::record_call(&shared, record);
    response
}

/// What the sim answered, for the exchange log.
#[derive(Default)]
struct Sent {
    body: Option<serde_json::Value>,
    /// A fault decided the answer, not the simulated API.
    injected: bool,
}

async fn respond(
    shared: &Arc<Shared>,
    route: Option<Route>,
    auth: &AuthOutcome,
    body: &[u8],
    uri: &Uri,
    record: &mut CallRecord,
    sent: &mut Sent,
) -> Response {
    if let AuthOutcome::Rejected(_) = auth {
        record.status = 403;
        let reply = world::error(403, "Invalid request signature");
        sent.body = Some(reply.body.clone());
        return json_response(&reply, None);
    }
    let Some(route) = route else {
        record.status = 404;
        let reply = world::error(404, "Not found");
        sent.body = Some(reply.body.clone());
        return json_response(&reply, None);
    };
    let action = faults::next_action(&mut shared.faults.lock().expect("lock"), route.operation);
    sent.injected = matches!(
        action,
        Some(
            FaultAction::Status { .. }
                | FaultAction::CommitThenStatus { .. }
                | FaultAction::RateLimited { .. }
                | FaultAction::QuotaExceeded
                | FaultAction::FailOperation { .. }
        )
    );
    let mut lose = false;
    let mut failure = None;
    let mut hold_after = None;
    let mut answer_instead = None;
    match action {
        Some(FaultAction::Status { status, body }) => {
            record.status = status;
            return raw_response(status, body);
        }
        Some(FaultAction::RateLimited { retry_after_secs }) => {
            record.status = 429;
            let reply = Reply {
                status: 429,
                body: serde_json::json!({"error": "Too Many Requests", "retry_after": retry_after_secs}),
                deferred: None,
            };
            return json_response(&reply, Some(retry_after_secs));
        }
        Some(FaultAction::QuotaExceeded) => {
            record.status = 403;
            return json_response(
                &world::quota_exceeded(shared.world.lock().expect("lock").instances.len()),
                None,
            );
        }
        Some(FaultAction::Latency(wait)) => tokio::time::sleep(wait).await,
        Some(FaultAction::LoseResponse) => lose = true,
        Some(FaultAction::LoseResponseCommitLater(delay)) => {
            record.response_lost = true;
            let (shared, body, uri) = (shared.clone(), body.to_vec(), uri.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let reply = execute(&shared, &route, &body, &uri);
                if let Some(deferred) = reply.deferred {
                    super::schedule_completion(shared, deferred);
                }
            });
            return lost_response();
        }
        Some(FaultAction::FailOperation { reason, message }) => failure = Some((reason, message)),
        Some(FaultAction::CommitThenStatus { status, body }) => {
            answer_instead = Some((status, body))
        }
        Some(FaultAction::Hold {
            after_commit: false,
            only_status: None,
            gate,
        }) => gate.park().await,
        Some(FaultAction::Hold {
            only_status, gate, ..
        }) => hold_after = Some((only_status, gate)),
        None => {}
    }
    let reply = execute(shared, &route, body, uri);
    record.status = reply.status;
    if let Some(mut deferred) = reply.deferred.clone() {
        if let Some((reason, message)) = &failure {
            deferred = deferred.failing(reason, message);
        }
        super::schedule_completion(shared.clone(), deferred);
    }
    if let Some((only_status, gate)) = hold_after
        && only_status.is_none_or(|s| s == reply.status)
    {
        gate.park().await;
    }
    if lose {
        record.response_lost = true;
        return lost_response();
    }
    if let Some((status, body)) = answer_instead {
        record.status = status;
        return raw_response(status, body);
    }
    sent.body = Some(reply.body.clone());
    json_response(&reply, None)
}

fn execute(shared: &Shared, route: &Route, body: &[u8], uri: &Uri) -> Reply {
    let mut w = shared.world.lock().expect("lock");
    let p = |i: usize| route.params[i].as_str();
    match route.operation {
        "list-zones" => w.list_zones(),
        "list-instance-types" => w.list_instance_types(),
        "get-instance-type" => w.get_instance_type(p(0)),
        "list-instances" => w.list_instances(),
        "create-instance" => w.create_instance(body),
        "get-instance" => w.get_instance(p(0)),
        "update-instance" => w.update_instance(p(0), body),
        "delete-instance" => w.delete_instance(p(0)),
        "list-templates" => {
            let query: Vec<(String, String)> =
                url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                    .into_owned()
                    .collect();
            let get = |name: &str| {
                query
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            w.list_templates(get("visibility"), get("family"))
        }
        "get-template" => w.get_template(p(0)),
        "get-active-nodepool-template" => w.get_sks_template(p(0), p(1)),
        "list-sks-clusters" => w.list_sks_clusters(),
        "get-sks-cluster" => w.get_sks_cluster(p(0)),
        "list-sks-cluster-versions" => w.list_sks_versions(),
        "list-security-groups" => w.list_security_groups(),
        "get-security-group" => w.get_security_group(p(0)),
        "attach-instance-to-security-group" => w.attach_security_group(p(0), body),
        "list-private-networks" => w.list_private_networks(),
        "get-private-network" => w.get_private_network(p(0)),
        "attach-instance-to-private-network" => w.attach_private_network(p(0), body),
        "list-anti-affinity-groups" => w.list_anti_affinity_groups(),
        "get-anti-affinity-group" => w.get_anti_affinity_group(p(0)),
        "get-operation" => w.get_operation(p(0)),
        other => world::error(404, format!("operation {other} is not simulated")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_on_the_raw_path() {
        let r = route(&Method::PUT, "/v2/private-network/abc:attach").unwrap();
        assert_eq!(r.operation, "attach-instance-to-private-network");
        assert_eq!(r.params, vec!["abc"]);
        let r = route(&Method::GET, "/v2/sks-template/1.34.1/nvidia").unwrap();
        assert_eq!(r.params, vec!["1.34.1", "nvidia"]);
        assert_eq!(
            route(&Method::GET, "/v2/instance/x").unwrap().operation,
            "get-instance"
        );
        assert!(route(&Method::POST, "/v2/zone").is_none());
        assert!(route(&Method::GET, "/zone").is_none());
    }
}
