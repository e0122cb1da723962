//! One typed error for every API call, parsed from all error body shapes (exoscale-api.md §4).

use std::time::Duration;

use serde::Deserialize;

/// Errors of the Exoscale client. Messages come from the API; no variant carries credentials.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("not found: {message}")]
    NotFound { message: String },
    /// Bad or expired signature, unknown key, or IAM denial (401/403).
    #[error("unauthorized ({status}): {message}")]
    Unauthorized { status: u16, message: String },
    #[error("rate limited: {message}")]
    RateLimited {
        retry_after: Option<Duration>,
        message: String,
    },
    /// The organisation's quota for a resource is used up.
    #[error("quota exceeded ({status}): {message}")]
    QuotaExceeded { status: u16, message: String },
    /// The zone has no capacity for the request (e.g. GPU hosts).
    #[error("insufficient capacity ({status}): {message}")]
    InsufficientCapacity { status: u16, message: String },
    /// Any other 4xx: validation, conflict, precondition.
    #[error("request rejected ({status}): {message}")]
    BadRequest { status: u16, message: String },
    #[error("server error ({status}): {message}")]
    Server { status: u16, message: String },
    #[error("timed out: {what}")]
    Timeout { what: String },
    #[error("transport error: {message}")]
    Transport {
        message: String,
        /// True when the connection failed before the request could have been sent.
        connect: bool,
    },
    #[error("cannot decode {what}: {message}")]
    Decode { what: String, message: String },
    #[error("operation {id} ended in state {state}: {reason} {message}")]
    OperationFailed {
        id: String,
        state: String,
        reason: String,
        message: String,
    },
    #[error("zone {zone:?} is not served by this endpoint (known zones: {known})")]
    UnknownZone { zone: String, known: String },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A create that may have been committed was not found within the lookup wait. The
    /// attempt failed; the next one looks the instance up before creating anything.
    #[error(
        "create outcome unknown: not found after {waited_secs} s of lookups (cause: {message}); not created again in this attempt"
    )]
    CreateOutcomeUnknown { waited_secs: u64, message: String },
    /// The endpoint answered with a redirect, which is never followed.
    #[error(
        "the API answered {status}, a redirect to {location}; redirects are never followed (check EXOSCALE_API_ENDPOINT)"
    )]
    Redirected { status: u16, location: String },
    /// A write refused before it was sent: this replica does not lead (never retried).
    #[error(transparent)]
    Fenced(#[from] crate::fence::Fenced),
}

impl Error {
    /// Quota or capacity problems: the provider maps these to InsufficientCapacity.
    pub fn is_capacity_error(&self) -> bool {
        match self {
            Error::QuotaExceeded { .. } | Error::InsufficientCapacity { .. } => true,
            Error::OperationFailed {
                reason, message, ..
            } => capacity_kind(&format!("{reason} {message}")).is_some(),
            _ => false,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Transient failures that a retry may cure.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::RateLimited { .. } | Error::Timeout { .. } | Error::Transport { .. } => true,
            Error::Server { status, .. } => *status != 501,
            _ => false,
        }
    }

    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::Unauthorized { .. } => "unauthorized",
            Error::RateLimited { .. } => "rate_limited",
            Error::QuotaExceeded { .. } => "quota_exceeded",
            Error::InsufficientCapacity { .. } => "insufficient_capacity",
            Error::BadRequest { .. } => "bad_request",
            Error::Server { .. } => "server",
            Error::Timeout { .. } => "timeout",
            Error::Transport { .. } => "transport",
            Error::Decode { .. } => "decode",
            Error::OperationFailed { .. } => "operation_failed",
            Error::UnknownZone { .. } => "unknown_zone",
            Error::InvalidRequest(_) => "invalid_request",
            Error::Fenced(_) => "fenced",
            Error::Redirected { .. } => "redirected",
            Error::CreateOutcomeUnknown { .. } => "create_outcome_unknown",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum CapacityKind {
    Quota,
    Capacity,
}

fn capacity_kind(message: &str) -> Option<CapacityKind> {
    let m = message.to_ascii_lowercase();
    if m.contains("quota") || m.contains("limit reached") || m.contains("limit exceeded") {
        Some(CapacityKind::Quota)
    } else if m.contains("capacity")
        || m.contains("no host")
        || m.contains("insufficient")
        || m.contains("not enough resources")
        || m.contains("is full")
    {
        Some(CapacityKind::Capacity)
    } else {
        None
    }
}

/// The longest wait a server may ask for (body `retry_after` or `Retry-After`); longer or
/// malformed values (1e300, 2^64, NaN) are capped here instead of overflowing a `Duration`.
pub const MAX_SERVER_WAIT: Duration = Duration::from_secs(3600);
/// At most this many characters of a message from the API enter our errors, logs and output.
pub const MAX_API_TEXT: usize = 512;

/// A server-provided number of seconds as a bounded wait; `None` when not a usable number.
pub fn server_wait(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        secs.min(MAX_SERVER_WAIT.as_secs_f64()),
    ))
}

/// API-provided text made safe to show: control characters (ESC, CR, LF, other C0/C1, DEL)
/// escaped so nothing can redraw a terminal or forge a line, and cut to [`MAX_API_TEXT`]
/// characters with a note of the original size.
pub fn sanitize_api_text(text: &str) -> String {
    let mut out = String::new();
    for (shown, c) in text.chars().enumerate() {
        if shown == MAX_API_TEXT {
            out.push_str(&format!("… ({} bytes in all)", text.len()));
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The union of the three JSON error shapes: `{"message"}`, `{"error","retry_after"}` and
/// RFC 9457 problem details.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    message: Option<String>,
    error: Option<String>,
    retry_after: Option<f64>,
    title: Option<String>,
    detail: Option<String>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

impl ErrorBody {
    fn text(&self) -> Option<String> {
        let mut parts: Vec<String> = Vec::new();
        for p in [&self.message, &self.error, &self.title, &self.detail]
            .into_iter()
            .flatten()
        {
            if !p.is_empty() {
                parts.push(p.clone());
            }
        }
        for e in &self.errors {
            match e {
                serde_json::Value::String(s) => parts.push(s.clone()),
                serde_json::Value::Object(o) => {
                    let loc = o.get("location").and_then(|v| v.as_str()).unwrap_or("");
                    let detail = o.get("detail").and_then(|v| v.as_str()).unwrap_or("");
                    parts.push(format!("{loc} {detail}").trim().to_string());
                }
                other => parts.push(other.to_string()),
            }
        }
        (!parts.is_empty()).then(|| parts.join(": "))
    }
}

/// Maps an HTTP error response to a typed error. `retry_after_header` is the parsed
/// `Retry-After` header, which wins over a `retry_after` body field.
pub fn from_response(status: u16, body: &[u8], retry_after_header: Option<Duration>) -> Error {
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let api_text = parsed.as_ref().and_then(ErrorBody::text);
    // Only the API's own error document says "no such resource". A 404 without one (an HTML
    // page from a proxy or load balancer, an empty body) says nothing about the resource: read
    // as "not found", it would let a NodeClaim go while its instance still runs.
    let api_says_not_found = api_text.is_some();
    let message = api_text.unwrap_or_else(|| {
        let raw = String::from_utf8_lossy(body).trim().to_string();
        if raw.is_empty() {
            format!("HTTP {status}")
        } else {
            raw
        }
    });
    let message = sanitize_api_text(&message);
    let retry_after = retry_after_header
        .map(|d| d.min(MAX_SERVER_WAIT))
        .or_else(|| {
            parsed
                .as_ref()
                .and_then(|b| b.retry_after)
                .and_then(server_wait)
        });
    match status {
        429 => Error::RateLimited {
            retry_after,
            message,
        },
        404 if api_says_not_found => Error::NotFound { message },
        404 => Error::Server { status, message },
        400..=499 => match capacity_kind(&message) {
            Some(CapacityKind::Quota) => Error::QuotaExceeded { status, message },
            Some(CapacityKind::Capacity) => Error::InsufficientCapacity { status, message },
            None if status == 401 || status == 403 => Error::Unauthorized { status, message },
            None => Error::BadRequest { status, message },
        },
        _ => match capacity_kind(&message) {
            Some(CapacityKind::Capacity) if status == 503 => {
                Error::InsufficientCapacity { status, message }
            }
            _ => Error::Server { status, message },
        },
    }
}

/// Parses `Retry-After`: delay-seconds or an HTTP date (relative to `now_unix`).
pub fn parse_retry_after(value: &str, now_unix: i64) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs).min(MAX_SERVER_WAIT));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value)
        .ok()?
        .timestamp();
    Some(Duration::from_secs(at.saturating_sub(now_unix).max(0) as u64).min(MAX_SERVER_WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the API's own error document is proof that a resource does not exist.
    #[test]
    fn a_404_without_the_apis_error_document_is_not_not_found() {
        let e = from_response(404, br#"{"message":"Instance not found"}"#, None);
        assert!(e.is_not_found(), "{e:?}");
        for body in [&b"<html><body>404 Not Found</body></html>"[..], b"", b"{}"] {
            let e = from_response(404, body, None);
            assert!(!e.is_not_found(), "{e:?}");
            assert!(matches!(e, Error::Server { status: 404, .. }), "{e:?}");
        }
    }

    #[test]
    fn absurd_server_waits_are_capped_not_panics() {
        for body in [
            &br#"{"error":"x","retry_after":1e300}"#[..],
            br#"{"error":"x","retry_after":18446744073709551616}"#,
        ] {
            let e = from_response(429, body, None);
            assert!(
                matches!(e, Error::RateLimited { retry_after: Some(d), .. } if d == MAX_SERVER_WAIT),
                "{e:?}"
            );
        }
        let e = from_response(429, br#"{"error":"x","retry_after":-5}"#, None);
        assert!(
            matches!(
                e,
                Error::RateLimited {
                    retry_after: None,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(server_wait(f64::NAN), None);
        assert_eq!(server_wait(f64::INFINITY), None);
        assert_eq!(
            parse_retry_after("18446744073709551615", 0),
            Some(MAX_SERVER_WAIT)
        );
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", 0),
            Some(MAX_SERVER_WAIT)
        );
    }

    #[test]
    fn api_text_is_bounded_and_cannot_drive_a_terminal() {
        let huge = "x".repeat(20 * 1024 * 1024);
        let e = from_response(400, format!(r#"{{"message":"{huge}"}}"#).as_bytes(), None);
        let text = e.to_string();
        assert!(text.len() < 1024, "{} bytes", text.len());
        assert!(text.contains("20971520 bytes in all"), "{text}");
        // JSON escapes: ESC, CR and LF once decoded.
        let forged = r"\u001b[2K\r✓ credentials: ok\nreal";
        let e = from_response(400, format!(r#"{{"message":"{forged}"}}"#).as_bytes(), None);
        let text = e.to_string();
        assert!(
            !text.contains('\u{1b}') && !text.contains('\r') && !text.contains('\n'),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}[2K\\r"), "{text:?}");
        let raw = from_response(502, b"line1\nline2\x1b[31m", None).to_string();
        assert!(!raw.contains('\n') && !raw.contains('\u{1b}'), "{raw:?}");
    }

    #[test]
    fn classic_message_shape() {
        assert_eq!(
            from_response(404, br#"{"message":"Instance not found"}"#, None),
            Error::NotFound {
                message: "Instance not found".into()
            }
        );
        assert_eq!(
            from_response(403, br#"{"message":"Invalid request signature"}"#, None),
            Error::Unauthorized {
                status: 403,
                message: "Invalid request signature".into()
            }
        );
        assert!(matches!(
            from_response(
                503,
                br#"{"message":"Endpoint template temporarily unavailable"}"#,
                None
            ),
            Error::Server { status: 503, .. }
        ));
    }

    #[test]
    fn error_shape_with_retry_after_in_body() {
        let e = from_response(429, br#"{"error":"slow down","retry_after":7}"#, None);
        assert_eq!(
            e,
            Error::RateLimited {
                retry_after: Some(Duration::from_secs(7)),
                message: "slow down".into()
            }
        );
        let e = from_response(
            429,
            br#"{"error":"x","retry_after":7}"#,
            Some(Duration::from_secs(2)),
        );
        assert!(
            matches!(e, Error::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(2))
        );
    }

    #[test]
    fn problem_details_shape() {
        let body = br##"{"type":"#/http-problem-types/request-invalid-body","title":"Invalid Request Body","status":422,"errors":[{"location":"$['x']","detail":"bad"},"other"]}"##;
        match from_response(422, body, None) {
            Error::BadRequest { status, message } => {
                assert_eq!(status, 422);
                assert_eq!(message, "Invalid Request Body: $['x'] bad: other");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn non_json_and_empty_bodies() {
        assert_eq!(
            from_response(502, b"<html>bad gateway</html>", None),
            Error::Server {
                status: 502,
                message: "<html>bad gateway</html>".into()
            }
        );
        assert_eq!(
            from_response(500, b"", None),
            Error::Server {
                status: 500,
                message: "HTTP 500".into()
            }
        );
    }

    #[test]
    fn quota_and_capacity_are_recognised() {
        let e = from_response(
            403,
            br#"{"message":"Quota exceeded for resource instance"}"#,
            None,
        );
        assert!(matches!(e, Error::QuotaExceeded { status: 403, .. }));
        assert!(e.is_capacity_error());
        let e = from_response(
            412,
            br#"{"message":"Insufficient capacity for gpu3.small"}"#,
            None,
        );
        assert!(matches!(e, Error::InsufficientCapacity { status: 412, .. }));
        assert!(
            !from_response(400, br#"{"message":"disk-size too small"}"#, None).is_capacity_error()
        );
        let op = Error::OperationFailed {
            id: "1".into(),
            state: "failure".into(),
            reason: "unavailable".into(),
            message: "no host available".into(),
        };
        assert!(op.is_capacity_error());
    }

    #[test]
    fn retry_after_parsing() {
        assert_eq!(parse_retry_after("3", 0), Some(Duration::from_secs(3)));
        let now = chrono::DateTime::parse_from_rfc2822("Wed, 21 Oct 2015 07:28:00 GMT")
            .unwrap()
            .timestamp();
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(parse_retry_after("soon", 0), None);
    }

    #[test]
    fn transient_classification() {
        assert!(
            Error::Server {
                status: 503,
                message: String::new()
            }
            .is_transient()
        );
        assert!(
            !Error::Server {
                status: 501,
                message: String::new()
            }
            .is_transient()
        );
        assert!(
            !Error::NotFound {
                message: String::new()
            }
            .is_transient()
        );
    }
}
