//! The HTTP client: signing, rate limiting, retries, typed operations and operation polling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::credentials::Credentials;
use super::endpoint::{Endpoint, EndpointError};
use super::error::{self, Error};
use super::models::*;
use super::poll::PollPolicy;
use super::ratelimit::RateLimit;
use super::retry::{RetryPolicy, is_retryable};
use super::signer::{self, Clock, SIGNATURE_VALIDITY_SECS, SystemClock};
use crate::fence::Fence;
use crate::token_bucket::RateLimiter;

/// Told about every request that reached the wire, once its answer (or failure) is in: the
/// operator's metrics implement it. `operation` is bounded (ids and versions are elided).
pub trait RequestObserver: Send + Sync {
    fn observe(
        &self,
        operation: &str,
        status: Option<u16>,
        error: Option<&'static str>,
        elapsed: Duration,
    );

    /// A request waited this long for the client's rate limiter (only waits are reported).
    fn waited(&self, _wait: Duration) {}
}

/// An optional [`RequestObserver`] (a wrapper so [`ClientConfig`] stays `Debug`).
#[derive(Clone, Default)]
pub struct Observer(pub Option<Arc<dyn RequestObserver>>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Observer(set)"
        } else {
            "Observer(none)"
        })
    }
}

/// The metrics label of a request: method and path with ids and versions elided
/// (`GET /instance/{id}`, `PUT /security-group/{id}:attach`), so the label set stays bounded.
pub fn operation_name(method: &Method, path: &str) -> String {
    let segments: Vec<String> = path
        .split('/')
        .map(|segment| {
            let (name, action) = match segment.split_once(':') {
                Some((name, action)) => (name, Some(action)),
                None => (segment, None),
            };
            let looks_like_id =
                name.len() >= 16 && name.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            let elided = if looks_like_id {
                "{id}"
            } else if name.starts_with(|c: char| c.is_ascii_digit()) {
                "{version}"
            } else {
                name
            };
            match action {
                Some(action) => format!("{elided}:{action}"),
                None => elided.to_string(),
            }
        })
        .collect();
    format!("{method} {}", segments.join("/"))
}

/// Everything a client needs; build once from configuration, then share the `Client`.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub endpoint: Endpoint,
    pub credentials: Credentials,
    pub retry: RetryPolicy,
    /// `None` disables client-side rate limiting.
    pub rate_limit: Option<RateLimit>,
    pub poll: PollPolicy,
    /// Per-request timeout (connect + response).
    pub request_timeout: Duration,
    pub clock: Arc<dyn Clock>,
    pub user_agent: String,
    /// After a create whose outcome is unknown (the request may have been committed), how
    /// long to look the instance up before giving up the attempt. The create is never re-sent.
    pub create_lookup_wait: Duration,
    /// Told about every request (metrics); none by default.
    pub observer: Observer,
}

impl ClientConfig {
    pub fn new(endpoint: Endpoint, credentials: Credentials) -> Self {
        ClientConfig {
            endpoint,
            credentials,
            retry: RetryPolicy::default(),
            rate_limit: Some(RateLimit::default()),
            poll: PollPolicy::default(),
            request_timeout: Duration::from_secs(30),
            clock: Arc::new(SystemClock),
            user_agent: format!("karpenter-exoscale/{}", env!("CARGO_PKG_VERSION")),
            create_lookup_wait: Duration::from_secs(60),
            observer: Observer::default(),
        }
    }

    /// The configuration for `zone`, with the endpoint chosen as [`Endpoint::resolve`] does
    /// (EXOSCALE_API_ENDPOINT, else EXOSCALE_API_ENVIRONMENT and the zone).
    pub fn for_zone(
        zone: &str,
        api_endpoint: Option<&str>,
        api_environment: Option<&str>,
        credentials: Credentials,
    ) -> Result<Self, EndpointError> {
        Ok(ClientConfig::new(
            Endpoint::resolve(zone, api_endpoint, api_environment)?,
            credentials,
        ))
    }
}

/// Cheap to clone; clones share the connection pool and the rate limiter.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Checked by every write at send time; `None` for tools that never compete to lead.
    fence: Option<Fence>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    config: ClientConfig,
    limiter: Option<RateLimiter>,
}

/// Which instances a lookup wants: all of `labels` and, when set, this exact name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceFilter {
    pub labels: Labels,
    /// Labels whose value must name this UUID: hyphenated, braced, URN or simple, in any case
    /// (the Go provider writes `EXOSCALE_SKS_CLUSTER_ID` as it was typed).
    pub uuid_labels: BTreeMap<String, uuid::Uuid>,
    pub name: Option<String>,
}

impl InstanceFilter {
    pub fn labels<I, K, V>(labels: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        InstanceFilter {
            labels: labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            uuid_labels: BTreeMap::new(),
            name: None,
        }
    }

    /// Also requires `key`'s value to parse as `uuid` (hyphenated, braced, URN or bare hex, in
    /// either case).
    pub fn with_uuid_label(mut self, key: impl Into<String>, uuid: uuid::Uuid) -> Self {
        self.uuid_labels.insert(key.into(), uuid);
        self
    }

    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    pub fn matches(&self, instance: &Instance) -> bool {
        let names_uuid = |(key, uuid): (&String, &uuid::Uuid)| {
            let value = instance.labels.get(key).map(String::as_str);
            value.and_then(|v| uuid::Uuid::try_parse(v).ok()) == Some(*uuid)
        };
        instance.has_labels(&self.labels)
            && self.uuid_labels.iter().all(names_uuid)
            && self.name.as_ref().is_none_or(|n| &instance.name == n)
    }

    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.uuid_labels.is_empty() && self.name.is_none()
    }
}

/// The result of [`Client::create_instance_once`].
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedInstance {
    /// The instance as far as it is known without reading it again: the one found when it was
    /// adopted, else the create request's fields under the new ID (state `starting`; no
    /// private networks yet, no addresses). Enough to describe the launch, so the happy path
    /// is one API call.
    pub instance: Instance,
    /// The create operation; `None` when an existing instance was adopted.
    pub operation: Option<Operation>,
    /// True when the instance already existed (an earlier create whose answer was lost).
    pub adopted: bool,
}

/// An attempt's error, with the answer's status when one arrived.
struct Failed {
    status: Option<u16>,
    error: Error,
}

impl Failed {
    fn answered(status: u16, error: Error) -> Self {
        Failed {
            status: Some(status),
            error,
        }
    }
}

impl From<Error> for Failed {
    fn from(error: Error) -> Self {
        Failed {
            status: None,
            error,
        }
    }
}

struct Call {
    method: Method,
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
    idempotent: bool,
}

impl Call {
    fn get(path: String) -> Call {
        Call {
            method: Method::GET,
            path,
            query: Vec::new(),
            body: None,
            idempotent: true,
        }
    }
}

/// Rejects ids that would change the request path (ids come from user configuration).
fn segment(value: &str, what: &str) -> Result<String, Error> {
    let ok = !value.is_empty()
        && value != "."
        && value != ".."
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(Error::InvalidRequest(format!("invalid {what} {value:?}")))
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, Error> {
    // serde quotes the offending value whole: a 16 MiB string would be a 16 MiB error.
    serde_json::from_slice(bytes).map_err(|e| Error::Decode {
        what: what.to_string(),
        message: error::sanitize_api_text(&e.to_string()),
    })
}

/// An answer about another object than the one asked for (a broken or hostile API): acting on
/// it would read, or delete, what nobody asked for.
fn answer_about(what: &str, asked: &str, answered: &str) -> Result<(), Error> {
    if asked == answered {
        return Ok(());
    }
    Err(Error::Decode {
        what: what.to_string(),
        message: format!(
            "asked for {what} {asked}, the answer is about {:?}",
            error::sanitize_api_text(answered)
        ),
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value).map_err(|e| Error::InvalidRequest(e.to_string()))
}

/// The largest answer read: the biggest real ones (all templates, all instance types) are a
/// few hundred KiB; an endless or huge body ends in an error instead of exhausting memory.
pub const MAX_RESPONSE_BODY: usize = 16 * 1024 * 1024;

/// Reads a body up to `limit` bytes.
async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, Error> {
    let too_large = || Error::Decode {
        what: "response body".into(),
        message: format!("larger than the {limit}-byte limit; not read further"),
    };
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn transport_error(e: reqwest::Error) -> Error {
    if e.is_timeout() {
        Error::Timeout {
            what: "HTTP request".to_string(),
        }
    } else {
        Error::Transport {
            message: e.to_string(),
            connect: e.is_connect(),
        }
    }
}

/// After these errors a POST may or may not have taken effect.
fn outcome_unknown(e: &Error) -> bool {
    matches!(
        e,
        Error::Transport { connect: false, .. }
            | Error::Timeout { .. }
            | Error::Server { .. }
            | Error::Decode { .. }
    )
}

impl Client {
    pub fn new(config: ClientConfig) -> Result<Client, Error> {
        // ring is the only TLS backend; installing twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            // Never followed: a redirect could take the signed request and its body (user data
            // with a bootstrap token) to another host, and a foreign answer would be trusted.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(Duration::from_secs(10)))
            .user_agent(config.user_agent.clone())
            .build()
            .map_err(|e| Error::InvalidRequest(format!("cannot build HTTP client: {e}")))?;
        let limiter = config
            .rate_limit
            .map(|limit| RateLimiter::new(limit.per_second, limit.burst));
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                config,
                limiter,
            }),
            fence: None,
        })
    }

    /// This client with every write (any method but GET) checked against `fence` when sent,
    /// sharing the connection pool and rate limiter.
    pub fn fenced(&self, fence: Fence) -> Client {
        Client {
            inner: self.inner.clone(),
            fence: Some(fence),
        }
    }

    /// Builds the client and checks that `zone` is listed by the endpoint's `GET /zone`
    /// (which also proves the credentials).
    pub async fn connect(config: ClientConfig, zone: &str) -> Result<Client, Error> {
        let client = Client::new(config)?;
        client.check_zone(zone).await?;
        Ok(client)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.config.endpoint
    }

    async fn send(&self, call: &Call) -> Result<Vec<u8>, Error> {
        let mut attempt = 0;
        loop {
            let err = match self.send_once(call).await {
                Ok(body) => return Ok(body),
                Err(e) => e,
            };
            if !is_retryable(&err, call.idempotent) {
                return Err(err);
            }
            let Some(wait) = self
                .inner
                .config
                .retry
                .delay(attempt, &err, rand::random::<f64>())
            else {
                return Err(err);
            };
            tracing::debug!(method = %call.method, path = %call.path, attempt, ?wait, error = %err, "retrying Exoscale API call");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// One attempt: waits for the rate limiter, then sends and observes the exchange.
    async fn send_once(&self, call: &Call) -> Result<Vec<u8>, Error> {
        if let Some(limiter) = &self.inner.limiter {
            let asked = std::time::Instant::now();
            limiter.acquire().await;
            let wait = asked.elapsed();
            if let Some(observer) = &self.inner.config.observer.0
                && wait >= Duration::from_millis(1)
            {
                observer.waited(wait);
            }
        }
        let started = std::time::Instant::now();
        let result = self.exchange(call).await;
        let observed = match &result {
            Ok((status, _)) => Some((Some(*status), None)),
            // Refused before anything was sent: not a request.
            Err(Failed {
                error: Error::Fenced(_) | Error::InvalidRequest(_),
                ..
            }) => None,
            Err(Failed { status, error }) => Some((*status, Some(error.kind()))),
        };
        if let (Some(observer), Some((status, error))) = (&self.inner.config.observer.0, observed) {
            let operation = operation_name(&call.method, &call.path);
            observer.observe(&operation, status, error, started.elapsed());
        }
        result.map(|(_, body)| body).map_err(|f| f.error)
    }

    /// Signs and sends `call`; the answer's status comes back beside the body or the error.
    async fn exchange(&self, call: &Call) -> Result<(u16, Vec<u8>), Failed> {
        let config = &self.inner.config;
        let mut url = config.endpoint.join(&call.path);
        if !call.query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(call.query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let body = call.body.clone().unwrap_or_default();
        let now = config.clock.now_unix();
        // Re-signed on every attempt so the expiry stays fresh.
        let auth = signer::authorization(
            &config.credentials,
            call.method.as_str(),
            &url,
            &body,
            now + SIGNATURE_VALIDITY_SECS,
        )
        .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let mut request = self
            .inner
            .http
            .request(call.method.clone(), url)
            .header(AUTHORIZATION, auth);
        if call.body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json").body(body);
        }
        // At the last moment: a wait for the rate limiter may have outlasted leadership.
        if let Some(fence) = self.fence.as_ref().filter(|_| call.method != Method::GET) {
            fence
                .check(|| format!("{} {}", call.method, call.path))
                .map_err(Error::from)?;
            // Nor may the write itself outlast it: a slow connect or upload would deliver it
            // after another replica may have taken over. Given up at the deadline, its outcome
            // is unknown, as after any timeout.
            if let Some(left) = fence.time_left() {
                request = request.timeout(left.min(config.request_timeout));
            }
        }
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| error::parse_retry_after(v, now));
        if (300..400).contains(&status) {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| url::Url::parse(v).ok())
                .and_then(|u| u.host_str().map(str::to_string))
                .unwrap_or_else(|| "an unreadable location".into());
            return Err(Failed::answered(
                status,
                Error::Redirected {
                    status,
                    location: error::sanitize_api_text(&location),
                },
            ));
        }
        let bytes = read_bounded(response, MAX_RESPONSE_BODY)
            .await
            .map_err(|e| Failed::answered(status, e))?;
        if (200..300).contains(&status) {
            Ok((status, bytes))
        } else {
            Err(Failed::answered(
                status,
                error::from_response(status, &bytes, retry_after),
            ))
        }
    }

    async fn get_json<T: DeserializeOwned>(&self, path: String, what: &str) -> Result<T, Error> {
        let body = self.send(&Call::get(path)).await?;
        decode(&body, what)
    }

    async fn mutate<B: Serialize>(
        &self,
        method: Method,
        path: String,
        body: Option<&B>,
        idempotent: bool,
    ) -> Result<Operation, Error> {
        let call = Call {
            method,
            path,
            query: Vec::new(),
            body: body.map(encode).transpose()?,
            idempotent,
        };
        let bytes = self.send(&call).await?;
        decode(&bytes, "operation")
    }

    // ---- zones ----

    pub async fn list_zones(&self) -> Result<Vec<Zone>, Error> {
        let list: ZoneList = self.get_json("/zone".into(), "zone list").await?;
        Ok(list.zones)
    }

    /// Checks that `zone` is listed by `GET /zone`.
    pub async fn check_zone(&self, zone: &str) -> Result<Zone, Error> {
        let zones = self.list_zones().await?;
        zones
            .iter()
            .find(|z| z.name == zone)
            .cloned()
            .ok_or_else(|| Error::UnknownZone {
                zone: zone.to_string(),
                known: error::sanitize_api_text(
                    &zones
                        .iter()
                        .map(|z| z.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            })
    }

    // ---- instance types ----

    pub async fn list_instance_types(&self) -> Result<Vec<InstanceType>, Error> {
        let list: InstanceTypeList = self
            .get_json("/instance-type".into(), "instance type list")
            .await?;
        Ok(list.instance_types)
    }

    pub async fn get_instance_type(&self, id: &str) -> Result<InstanceType, Error> {
        let id = segment(id, "instance type id")?;
        self.get_json(format!("/instance-type/{id}"), "instance type")
            .await
    }

    // ---- instances ----

    /// `POST /instance`. Retried only when the request cannot have been processed (429,
    /// connection refused); see [`Client::create_instance_once`] for a safe create.
    pub async fn create_instance(&self, req: &CreateInstanceRequest) -> Result<Operation, Error> {
        self.mutate(Method::POST, "/instance".into(), Some(req), false)
            .await
    }

    /// Creates an instance unless one matching `identity` exists. When the outcome of a
    /// create is unknown (lost response, timeout, 5xx), it looks the instance up by
    /// `identity` before trying again, so a lost answer never produces a second instance.
    pub async fn create_instance_once(
        &self,
        req: &CreateInstanceRequest,
        identity: &InstanceFilter,
    ) -> Result<CreatedInstance, Error> {
        if identity.is_empty() {
            return Err(Error::InvalidRequest(
                "an idempotent create needs identifying labels or a name".into(),
            ));
        }
        if !identity.matches(&preview(req)) {
            return Err(Error::InvalidRequest(
                "the create request does not carry the identifying labels/name".into(),
            ));
        }
        if let Some(existing) = self.find_instance(identity).await? {
            return Ok(CreatedInstance {
                instance: existing,
                operation: None,
                adopted: true,
            });
        }
        self.create_instance_known_new(req, identity).await
    }

    /// [`Client::create_instance_once`] for a caller that knows no instance matching
    /// `identity` exists (it just looked, or it made the object the instance is for and never
    /// launched it): no lookup before the create, only after an outcome-unknown failure.
    pub async fn create_instance_known_new(
        &self,
        req: &CreateInstanceRequest,
        identity: &InstanceFilter,
    ) -> Result<CreatedInstance, Error> {
        if identity.is_empty() {
            return Err(Error::InvalidRequest(
                "an idempotent create needs identifying labels or a name".into(),
            ));
        }
        if !identity.matches(&preview(req)) {
            return Err(Error::InvalidRequest(
                "the create request does not carry the identifying labels/name".into(),
            ));
        }
        let adopted = |instance: Instance| CreatedInstance {
            instance,
            operation: None,
            adopted: true,
        };
        match self.create_instance(req).await {
            Ok(op) => {
                // Not plainly an instance ID: the create did something, what is unknown. Look
                // it up rather than trust (or repeat) it.
                let Some(id) = op.instance_reference().map(str::to_string) else {
                    let err = Error::Decode {
                        what: "create-instance operation".into(),
                        message: format!(
                            "operation has no instance reference (reference id {:?})",
                            error::sanitize_api_text(op.reference_id().unwrap_or_default())
                        ),
                    };
                    tracing::warn!(error = %err, "create-instance answer without an instance ID; looking the instance up");
                    return self.await_unknown_create(identity, err).await.map(adopted);
                };
                Ok(CreatedInstance {
                    instance: Instance { id, ..preview(req) },
                    operation: Some(op),
                    adopted: false,
                })
            }
            Err(err) if outcome_unknown(&err) => {
                tracing::warn!(error = %err, "create-instance outcome unknown; looking the instance up, never creating again in this attempt");
                self.await_unknown_create(identity, err).await.map(adopted)
            }
            // A 5xx naming capacity most likely refused the create, but a server error is no
            // proof: one lookup adopts an instance it made anyway. Not the full wait of an
            // unknown outcome, which would hold every capacity fallback back by a minute; an
            // instance committed later is found by the NodeClaim's teardown or by GC.
            Err(err @ Error::InsufficientCapacity { status: 500.., .. }) => {
                match self.find_instance(identity).await {
                    Ok(Some(found)) => {
                        tracing::warn!(error = %err, instance = %found.id, "create-instance answered a capacity server error, yet the instance exists; adopting it");
                        Ok(adopted(found))
                    }
                    Ok(None) => Err(err),
                    Err(lookup) => {
                        tracing::debug!(error = %lookup, "lookup after a capacity server error failed");
                        Err(err)
                    }
                }
            }
            Err(err) => Err(err),
        }
    }

    /// Looks the instance of an outcome-unknown create up until it appears (the backend may
    /// commit late) or `create_lookup_wait` passes. A POST is never repeated here: a second
    /// one could succeed beside a late first and leave two VMs.
    async fn await_unknown_create(
        &self,
        identity: &InstanceFilter,
        cause: Error,
    ) -> Result<Instance, Error> {
        let limit = self.inner.config.create_lookup_wait;
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(500);
        loop {
            match self.find_instance(identity).await {
                Ok(Some(found)) => return Ok(found),
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "lookup after an outcome-unknown create failed")
                }
            }
            let elapsed = started.elapsed();
            if elapsed >= limit {
                return Err(Error::CreateOutcomeUnknown {
                    waited_secs: elapsed.as_secs(),
                    message: cause.to_string(),
                });
            }
            tokio::time::sleep(pause.min(limit - elapsed)).await;
            pause = (pause * 2).min(Duration::from_secs(10));
        }
    }

    pub async fn get_instance(&self, id: &str) -> Result<Instance, Error> {
        let id = segment(id, "instance id")?;
        let instance: Instance = self.get_json(format!("/instance/{id}"), "instance").await?;
        answer_about("instance", &id, &instance.id)?;
        Ok(instance)
    }

    /// `GET /instance`, filtered client-side (the server's `labels` query format is undocumented).
    pub async fn list_instances(&self, filter: &InstanceFilter) -> Result<Vec<Instance>, Error> {
        let list: InstanceList = self.get_json("/instance".into(), "instance list").await?;
        Ok(list
            .instances
            .into_iter()
            .filter(|i| filter.matches(i))
            .collect())
    }

    /// The first live (not terminating) instance matching `filter`.
    pub async fn find_instance(&self, filter: &InstanceFilter) -> Result<Option<Instance>, Error> {
        Ok(self.list_instances(filter).await?.into_iter().find(|i| {
            !matches!(
                i.state,
                InstanceState::Destroying | InstanceState::Destroyed | InstanceState::Expunging
            )
        }))
    }

    pub async fn delete_instance(&self, id: &str) -> Result<Operation, Error> {
        let id = segment(id, "instance id")?;
        self.mutate::<()>(Method::DELETE, format!("/instance/{id}"), None, true)
            .await
    }

    pub async fn update_instance(
        &self,
        id: &str,
        req: &UpdateInstanceRequest,
    ) -> Result<Operation, Error> {
        let id = segment(id, "instance id")?;
        self.mutate(Method::PUT, format!("/instance/{id}"), Some(req), true)
            .await
    }

    /// Replaces the instance's labels with `labels`.
    pub async fn update_instance_labels(
        &self,
        id: &str,
        labels: &Labels,
    ) -> Result<Operation, Error> {
        let req = UpdateInstanceRequest {
            labels: Some(labels.clone()),
            ..Default::default()
        };
        self.update_instance(id, &req).await
    }

    // ---- templates ----

    pub async fn list_templates(
        &self,
        visibility: TemplateVisibility,
        family: Option<&str>,
    ) -> Result<Vec<Template>, Error> {
        let mut call = Call::get("/template".into());
        call.query
            .push(("visibility", visibility.as_str().to_string()));
        if let Some(f) = family.filter(|f| !f.is_empty()) {
            call.query.push(("family", f.to_string()));
        }
        let list: TemplateList = decode(&self.send(&call).await?, "template list")?;
        Ok(list.templates)
    }

    pub async fn get_template(&self, id: &str) -> Result<Template, Error> {
        let id = segment(id, "template id")?;
        self.get_json(format!("/template/{id}"), "template").await
    }

    /// `GET /sks-template/{version}/{variant}`: the active node template id.
    pub async fn get_sks_template(
        &self,
        kubernetes_version: &str,
        variant: SksTemplateVariant,
    ) -> Result<String, Error> {
        let version = segment(kubernetes_version, "Kubernetes version")?;
        let active: ActiveTemplate = self
            .get_json(
                format!("/sks-template/{version}/{}", variant.as_str()),
                "active template",
            )
            .await?;
        Ok(active.active_template)
    }

    // ---- SKS ----

    pub async fn get_sks_cluster(&self, id: &str) -> Result<SksCluster, Error> {
        let id = segment(id, "SKS cluster id")?;
        self.get_json(format!("/sks-cluster/{id}"), "SKS cluster")
            .await
    }

    pub async fn list_sks_clusters(&self) -> Result<Vec<SksCluster>, Error> {
        let list: SksClusterList = self
            .get_json("/sks-cluster".into(), "SKS cluster list")
            .await?;
        Ok(list.sks_clusters)
    }

    pub async fn list_sks_versions(&self) -> Result<Vec<String>, Error> {
        let list: SksVersionList = self
            .get_json("/sks-cluster-version".into(), "SKS version list")
            .await?;
        Ok(list.sks_cluster_versions)
    }

    // ---- security groups, private networks, anti-affinity groups ----

    pub async fn list_security_groups(&self) -> Result<Vec<SecurityGroup>, Error> {
        let list: SecurityGroupList = self
            .get_json("/security-group".into(), "security group list")
            .await?;
        Ok(list.security_groups)
    }

    pub async fn get_security_group(&self, id: &str) -> Result<SecurityGroup, Error> {
        let id = segment(id, "security group id")?;
        self.get_json(format!("/security-group/{id}"), "security group")
            .await
    }

    /// `PUT /security-group/{id}:attach`. Not retried on 5xx: a repeated attach conflicts.
    pub async fn attach_instance_to_security_group(
        &self,
        security_group_id: &str,
        instance_id: &str,
    ) -> Result<Operation, Error> {
        let sg = segment(security_group_id, "security group id")?;
        let req = AttachInstanceRequest {
            instance: IdRef::new(instance_id),
            ip: None,
        };
        self.mutate(
            Method::PUT,
            format!("/security-group/{sg}:attach"),
            Some(&req),
            false,
        )
        .await
    }

    pub async fn list_private_networks(&self) -> Result<Vec<PrivateNetwork>, Error> {
        let list: PrivateNetworkList = self
            .get_json("/private-network".into(), "private network list")
            .await?;
        Ok(list.private_networks)
    }

    pub async fn get_private_network(&self, id: &str) -> Result<PrivateNetwork, Error> {
        let id = segment(id, "private network id")?;
        self.get_json(format!("/private-network/{id}"), "private network")
            .await
    }

    /// `PUT /private-network/{id}:attach`. Not retried on 5xx: a repeated attach conflicts.
    pub async fn attach_instance_to_private_network(
        &self,
        private_network_id: &str,
        instance_id: &str,
        ip: Option<&str>,
    ) -> Result<Operation, Error> {
        let pn = segment(private_network_id, "private network id")?;
        let req = AttachInstanceRequest {
            instance: IdRef::new(instance_id),
            ip: ip.map(str::to_string),
        };
        self.mutate(
            Method::PUT,
            format!("/private-network/{pn}:attach"),
            Some(&req),
            false,
        )
        .await
    }

    pub async fn list_anti_affinity_groups(&self) -> Result<Vec<AntiAffinityGroup>, Error> {
        let list: AntiAffinityGroupList = self
            .get_json("/anti-affinity-group".into(), "anti-affinity group list")
            .await?;
        Ok(list.anti_affinity_groups)
    }

    pub async fn get_anti_affinity_group(&self, id: &str) -> Result<AntiAffinityGroup, Error> {
        let id = segment(id, "anti-affinity group id")?;
        self.get_json(format!("/anti-affinity-group/{id}"), "anti-affinity group")
            .await
    }

    /// Resolves a security group by id (when the value is a UUID: the API's ids are, and it
    /// refuses anything else in the path), else by exact name.
    pub async fn resolve_security_group(&self, id_or_name: &str) -> Result<SecurityGroup, Error> {
        resolve(
            || self.get_security_group(id_or_name),
            || self.list_security_groups(),
            id_or_name,
            |g: &SecurityGroup| &g.name,
            "security group",
        )
        .await
    }

    pub async fn resolve_private_network(&self, id_or_name: &str) -> Result<PrivateNetwork, Error> {
        resolve(
            || self.get_private_network(id_or_name),
            || self.list_private_networks(),
            id_or_name,
            |g: &PrivateNetwork| &g.name,
            "private network",
        )
        .await
    }

    pub async fn resolve_anti_affinity_group(
        &self,
        id_or_name: &str,
    ) -> Result<AntiAffinityGroup, Error> {
        resolve(
            || self.get_anti_affinity_group(id_or_name),
            || self.list_anti_affinity_groups(),
            id_or_name,
            |g: &AntiAffinityGroup| &g.name,
            "anti-affinity group",
        )
        .await
    }

    // ---- operations ----

    pub async fn get_operation(&self, id: &str) -> Result<Operation, Error> {
        let id = segment(id, "operation id")?;
        let operation: Operation = self
            .get_json(format!("/operation/{id}"), "operation")
            .await?;
        answer_about("operation", &id, &operation.id)?;
        Ok(operation)
    }

    /// Polls until the operation leaves `pending`. `success` → Ok; `failure`/`timeout` →
    /// [`Error::OperationFailed`]; still pending after the poll timeout → [`Error::Timeout`].
    pub async fn wait_operation(&self, op: &Operation) -> Result<Operation, Error> {
        let policy = &self.inner.config.poll;
        let started = tokio::time::Instant::now();
        let mut current = op.clone();
        let mut consecutive_errors = 0;
        loop {
            // An operation does not change what it acts on: an answer that says otherwise is
            // not about the resource the caller waits for.
            if let (Some(was), Some(now)) = (op.reference_id(), current.reference_id())
                && was != now
            {
                return Err(Error::Decode {
                    what: "operation".into(),
                    message: format!(
                        "operation {} was about {:?}, now answers about {:?}",
                        error::sanitize_api_text(&op.id),
                        error::sanitize_api_text(was),
                        error::sanitize_api_text(now)
                    ),
                });
            }
            match current.state {
                OperationState::Pending => {}
                OperationState::Success => return Ok(current),
                state => {
                    return Err(Error::OperationFailed {
                        id: error::sanitize_api_text(&current.id),
                        state: state.as_str().to_string(),
                        reason: error::sanitize_api_text(
                            current.reason.as_deref().unwrap_or_default(),
                        ),
                        message: error::sanitize_api_text(
                            current.message.as_deref().unwrap_or_default(),
                        ),
                    });
                }
            }
            let elapsed = started.elapsed();
            if elapsed >= policy.timeout {
                return Err(Error::Timeout {
                    what: format!(
                        "operation {} still pending after {:?}",
                        error::sanitize_api_text(&current.id),
                        policy.timeout
                    ),
                });
            }
            tokio::time::sleep(policy.interval_at(elapsed).min(policy.timeout - elapsed)).await;
            match self.get_operation(&current.id).await {
                Ok(next) => {
                    current = next;
                    consecutive_errors = 0;
                }
                Err(err) => {
                    consecutive_errors += 1;
                    if consecutive_errors >= policy.max_consecutive_errors {
                        return Err(err);
                    }
                }
            }
        }
    }
}

/// What the created instance will look like (before it has an ID): to check the identity
/// filter against, and to describe a launch without reading the instance back.
fn preview(req: &CreateInstanceRequest) -> Instance {
    Instance {
        id: String::new(),
        name: req.name.clone().unwrap_or_default(),
        state: InstanceState::Starting,
        created_at: None,
        instance_type: req.instance_type.clone(),
        template: req.template.clone(),
        disk_size: Some(req.disk_size),
        labels: req.labels.clone(),
        user_data: None,
        security_groups: req.security_groups.clone(),
        anti_affinity_groups: req.anti_affinity_groups.clone(),
        private_networks: Vec::new(),
        public_ip: None,
        public_ip_assignment: None,
        ipv6_address: None,
        mac_address: None,
        manager: None,
    }
}

/// By id first; on NotFound or an id-shaped error, by exact name in the list.
async fn resolve<T, G, GFut, F, Fut>(
    by_id: G,
    list: F,
    id_or_name: &str,
    name_of: impl Fn(&T) -> &String,
    what: &str,
) -> Result<T, Error>
where
    G: FnOnce() -> GFut,
    GFut: std::future::Future<Output = Result<T, Error>>,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, Error>>,
{
    let by_id = if uuid::Uuid::parse_str(id_or_name).is_ok() {
        by_id().await
    } else {
        Err(Error::InvalidRequest(format!(
            "{id_or_name:?} is not an id"
        )))
    };
    match by_id {
        Ok(found) => Ok(found),
        Err(Error::NotFound { .. }) | Err(Error::InvalidRequest(_)) => list()
            .await?
            .into_iter()
            .find(|item| name_of(item) == id_or_name)
            .ok_or_else(|| Error::NotFound {
                message: format!("{what} {id_or_name:?} not found by id or name"),
            }),
        Err(other) => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_elide_ids_and_versions() {
        let id = "6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11";
        assert_eq!(operation_name(&Method::POST, "/instance"), "POST /instance");
        assert_eq!(
            operation_name(&Method::GET, &format!("/operation/{id}")),
            "GET /operation/{id}"
        );
        assert_eq!(
            operation_name(&Method::PUT, &format!("/security-group/{id}:attach")),
            "PUT /security-group/{id}:attach"
        );
        assert_eq!(
            operation_name(&Method::GET, "/sks-template/1.34.1/nvidia"),
            "GET /sks-template/{version}/nvidia"
        );
        assert_eq!(operation_name(&Method::GET, "/zone"), "GET /zone");
    }

    #[test]
    fn path_segments_are_validated() {
        assert!(segment("6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11", "id").is_ok());
        assert!(segment("1.34.1", "v").is_ok());
        assert!(segment("../zone", "id").is_err());
        assert!(segment("a/b", "id").is_err());
        assert!(segment("", "id").is_err());
        assert!(segment("..", "id").is_err());
    }

    #[test]
    fn filters_match_labels_and_name() {
        let mut req = CreateInstanceRequest::new("t", "tpl", 20);
        req.name = Some("node-a".into());
        req.labels.insert("k".into(), "v".into());
        let instance = preview(&req);
        assert!(InstanceFilter::labels([("k", "v")]).matches(&instance));
        assert!(
            InstanceFilter::labels([("k", "v")])
                .with_name("node-a")
                .matches(&instance)
        );
        assert!(!InstanceFilter::labels([("k", "w")]).matches(&instance));
        assert!(
            !InstanceFilter::default()
                .with_name("node-b")
                .matches(&instance)
        );
    }

    #[test]
    fn unknown_outcomes() {
        assert!(outcome_unknown(&Error::Server {
            status: 502,
            message: String::new()
        }));
        assert!(!outcome_unknown(&Error::Transport {
            message: String::new(),
            connect: true
        }));
        assert!(!outcome_unknown(&Error::QuotaExceeded {
            status: 403,
            message: String::new()
        }));
    }
}
