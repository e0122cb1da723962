//! `EXO2-HMAC-SHA256` request signing (exoscale-api.md §1), as pure functions over a URL, a
//! body and an expiry. The sim uses the same message builder to verify.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use url::Url;

use super::credentials::Credentials;

pub const SCHEME: &str = "EXO2-HMAC-SHA256";
/// Signatures are valid for ten minutes, as in egoscale and requests-exoscale-auth.
pub const SIGNATURE_VALIDITY_SECS: i64 = 600;

type HmacSha256 = Hmac<Sha256>;

/// The clock signatures are dated with (re-exported from the neutral [`crate::clock`]).
pub use crate::clock::{Clock, FixedClock, SystemClock};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("query parameter {0:?} is repeated; the signature cannot cover repeated parameters")]
    RepeatedQueryParameter(String),
    #[error("query parameter {0:?} has an empty value; leave it out instead")]
    EmptyQueryParameter(String),
}

/// The query part of the message: sorted parameter names and their decoded values joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedQuery {
    pub names: Vec<String>,
    pub values: String,
}

/// Sorts the URL's query parameters by name and concatenates their decoded values. Refuses
/// repeated and empty parameters, on which the published implementations disagree.
pub fn signed_query(url: &Url) -> Result<SignedQuery, SignError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, value) in url.query_pairs() {
        if !seen.insert(name.to_string()) {
            return Err(SignError::RepeatedQueryParameter(name.into_owned()));
        }
        if value.is_empty() {
            return Err(SignError::EmptyQueryParameter(name.into_owned()));
        }
        pairs.push((name.into_owned(), value.into_owned()));
    }
    pairs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(SignedQuery {
        names: pairs.iter().map(|(n, _)| n.clone()).collect(),
        values: pairs.into_iter().map(|(_, v)| v).collect(),
    })
}

/// The five `\n`-separated segments: `METHOD path`, body, query values, (empty) headers, expiry.
pub fn message(method: &str, path: &str, body: &[u8], query_values: &str, expires: i64) -> Vec<u8> {
    let mut msg = Vec::with_capacity(method.len() + path.len() + body.len() + 64);
    msg.extend_from_slice(method.to_ascii_uppercase().as_bytes());
    msg.push(b' ');
    msg.extend_from_slice(path.as_bytes());
    msg.push(b'\n');
    msg.extend_from_slice(body);
    msg.push(b'\n');
    msg.extend_from_slice(query_values.as_bytes());
    msg.push(b'\n');
    msg.push(b'\n');
    msg.extend_from_slice(expires.to_string().as_bytes());
    msg
}

fn mac(secret: &str, message: &[u8]) -> HmacSha256 {
    let mut mac =
        HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac
}

/// Base64 of HMAC-SHA256(secret, message).
pub fn signature(secret: &str, message: &[u8]) -> String {
    BASE64.encode(mac(secret, message).finalize().into_bytes())
}

/// The `Authorization` header value for a request to `url` with `body`, expiring at `expires`.
pub fn authorization(
    credentials: &Credentials,
    method: &str,
    url: &Url,
    body: &[u8],
    expires: i64,
) -> Result<String, SignError> {
    let query = signed_query(url)?;
    let msg = message(method, url.path(), body, &query.values, expires);
    let sig = signature(credentials.secret.expose(), &msg);
    let mut header = format!("{SCHEME} credential={}", credentials.key);
    if !query.names.is_empty() {
        header.push_str(",signed-query-args=");
        header.push_str(&query.names.join(";"));
    }
    header.push_str(&format!(",expires={expires},signature={sig}"));
    Ok(header)
}

/// The parts of a received `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAuthorization {
    pub credential: String,
    pub signed_query_args: Vec<String>,
    pub expires: i64,
    pub signature: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing or malformed Authorization header: {0}")]
    Malformed(&'static str),
    #[error("signature expired")]
    Expired,
    #[error("signed query argument {0:?} is absent from the query string")]
    MissingSignedArg(String),
    #[error("invalid request signature")]
    BadSignature,
}

/// Parses `EXO2-HMAC-SHA256 credential=…[,signed-query-args=…],expires=…,signature=…`.
pub fn parse_authorization(header: &str) -> Result<ParsedAuthorization, VerifyError> {
    let rest = header
        .strip_prefix(SCHEME)
        .and_then(|r| r.strip_prefix(' '))
        .ok_or(VerifyError::Malformed("scheme is not EXO2-HMAC-SHA256"))?;
    let (mut credential, mut args, mut expires, mut sig) = (None, None, None, None);
    for part in rest.split(',') {
        // Split on the first '=' only: the base64 signature may end in '='.
        let (name, value) = part
            .split_once('=')
            .ok_or(VerifyError::Malformed("part without '='"))?;
        match name {
            "credential" => credential = Some(value.to_string()),
            "signed-query-args" => {
                args = Some(value.split(';').map(str::to_string).collect::<Vec<_>>())
            }
            "expires" => {
                expires = Some(
                    value
                        .parse::<i64>()
                        .map_err(|_| VerifyError::Malformed("expires is not a number"))?,
                )
            }
            "signature" => sig = Some(value.to_string()),
            _ => return Err(VerifyError::Malformed("unknown part")),
        }
    }
    Ok(ParsedAuthorization {
        credential: credential.ok_or(VerifyError::Malformed("no credential"))?,
        signed_query_args: args.unwrap_or_default(),
        expires: expires.ok_or(VerifyError::Malformed("no expires"))?,
        signature: sig.ok_or(VerifyError::Malformed("no signature"))?,
    })
}

/// Verifies a parsed header against the request as received, egoscale-style: the values of
/// the listed names, in the listed order, decoded from the query string.
pub fn verify(
    auth: &ParsedAuthorization,
    secret: &str,
    method: &str,
    path: &str,
    query_pairs: &[(String, String)],
    body: &[u8],
    now_unix: i64,
) -> Result<(), VerifyError> {
    if auth.expires < now_unix {
        return Err(VerifyError::Expired);
    }
    let mut values = String::new();
    for name in &auth.signed_query_args {
        let value = query_pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| VerifyError::MissingSignedArg(name.clone()))?;
        values.push_str(value);
    }
    let msg = message(method, path, body, &values, auth.expires);
    let expected = BASE64
        .decode(&auth.signature)
        .map_err(|_| VerifyError::BadSignature)?;
    mac(secret, &msg)
        .verify_slice(&expected)
        .map_err(|_| VerifyError::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream() -> Credentials {
        Credentials::new(
            "EXOxxxxxxxxxxxxxxxxxxxxxxxx",
            "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
        )
    }

    fn local() -> Credentials {
        Credentials::new(
            "EXO0123456789abcdef01234567",
            "TestSecret-0123456789-abcdefghijklmnopqrstuv",
        )
    }

    fn sign(c: &Credentials, method: &str, url: &str, body: &str, expires: i64) -> String {
        authorization(
            c,
            method,
            &Url::parse(url).unwrap(),
            body.as_bytes(),
            expires,
        )
        .unwrap()
    }

    const UPSTREAM_EXPIRES: i64 = 3376684800;
    const LOCAL_EXPIRES: i64 = 1700000600;
    const GVA: &str = "https://api-ch-gva-2.exoscale.com";

    #[test]
    fn upstream_vector_get_zone() {
        assert_eq!(
            sign(
                &upstream(),
                "GET",
                "https://api.exoscale.com/v2/zone",
                "",
                UPSTREAM_EXPIRES
            ),
            "EXO2-HMAC-SHA256 credential=EXOxxxxxxxxxxxxxxxxxxxxxxxx,expires=3376684800,\
             signature=Ntbq/p0HVmA3Zg1HHY+Lq1vjFGi7HeMrrgXDS5jRNlY="
        );
    }

    #[test]
    fn upstream_vector_get_zone_with_query() {
        assert_eq!(
            sign(
                &upstream(),
                "GET",
                "https://api.exoscale.com/v2/zone?k1=v1&k2=v2",
                "",
                UPSTREAM_EXPIRES
            ),
            "EXO2-HMAC-SHA256 credential=EXOxxxxxxxxxxxxxxxxxxxxxxxx,signed-query-args=k1;k2,\
             expires=3376684800,signature=iqOBz13+44L5j0uJclE8hmUhQQcvtCSoPEOXYK6liqY="
        );
    }

    #[test]
    fn upstream_vector_post_with_body() {
        assert_eq!(
            sign(
                &upstream(),
                "POST",
                "https://api.exoscale.com/v2/load-balancer",
                r#"{"name": "foo"}"#,
                UPSTREAM_EXPIRES
            ),
            "EXO2-HMAC-SHA256 credential=EXOxxxxxxxxxxxxxxxxxxxxxxxx,expires=3376684800,\
             signature=duldkM0+pgWRtUznj0rMrZauzsYOtSVLn1LCGcs7CcE="
        );
    }

    #[test]
    fn vector_a_query_args_out_of_order() {
        let url = format!("{GVA}/v2/template?visibility=public&family=ubuntu");
        let q = signed_query(&Url::parse(&url).unwrap()).unwrap();
        let msg = message("GET", "/v2/template", b"", &q.values, LOCAL_EXPIRES);
        assert_eq!(msg, b"GET /v2/template\n\nubuntupublic\n\n1700000600");
        assert_eq!(msg.len(), 42);
        assert_eq!(
            sign(&local(), "GET", &url, "", LOCAL_EXPIRES),
            "EXO2-HMAC-SHA256 credential=EXO0123456789abcdef01234567,\
             signed-query-args=family;visibility,expires=1700000600,\
             signature=F0uDLBqOgd/BfzZdOPG5yPL73tam86odMvSi532O15w="
        );
    }

    #[test]
    fn vector_b_post_instance() {
        let body = r#"{"name":"node-1","instance-type":{"id":"b6e9d1e8-89fc-4db3-aaa4-9b4c5b1d0844"},"template":{"id":"cbd89eb1-c66c-4637-9483-904d7e36c318"},"disk-size":50}"#;
        let msg = message("POST", "/v2/instance", body.as_bytes(), "", LOCAL_EXPIRES);
        assert_eq!(msg.len(), 182);
        assert_eq!(
            sign(
                &local(),
                "POST",
                &format!("{GVA}/v2/instance"),
                body,
                LOCAL_EXPIRES
            ),
            "EXO2-HMAC-SHA256 credential=EXO0123456789abcdef01234567,expires=1700000600,\
             signature=cGAH/fmz+GrpExDS7SB1zek13XrGi+1bZP1x4X9zOvs="
        );
    }

    #[test]
    fn vector_table() {
        let cases = [
            (
                "GET",
                "/v2/zone",
                "",
                "expires=1700000600,signature=YT43jboVigK8xoVE5vmQ0P9AD6aebOPPGDFcbnZ0qyM=",
            ),
            (
                "GET",
                "/v2/instance?labels=app%3Dweb&manager-type=instance-pool",
                "",
                "signed-query-args=labels;manager-type,expires=1700000600,signature=9gkPIZb/5CA1h7JnM431WKP6uDeKoDT+1WYXQl3RjfE=",
            ),
            (
                "GET",
                "/v2/sks-template/1.34.1/nvidia",
                "",
                "expires=1700000600,signature=NbeAVMRDzlJIiYmhbop2qk8QS+cuSzLX2dmrqR4ZpLY=",
            ),
            (
                "DELETE",
                "/v2/instance/6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11",
                "",
                "expires=1700000600,signature=biqO3E31BegqL1zpVFBcLXVj8B2O39Y0NY7P1CyC+dw=",
            ),
            (
                "PUT",
                "/v2/private-network/0b2c1f3e-6d7a-4c1b-8e9f-a1b2c3d4e5f6:attach",
                r#"{"instance":{"id":"6a7a4f0e-3e0c-4c3b-9d58-3f1f1f0c2b11"}}"#,
                "expires=1700000600,signature=JnTH/ZFScp4gZdHNWQTnqk9Tsb9kWvH/yVMZVN/3cVc=",
            ),
        ];
        for (method, path, body, tail) in cases {
            let header = sign(
                &local(),
                method,
                &format!("{GVA}{path}"),
                body,
                LOCAL_EXPIRES,
            );
            let expected =
                format!("EXO2-HMAC-SHA256 credential=EXO0123456789abcdef01234567,{tail}");
            assert_eq!(header, expected, "{method} {path}");
        }
    }

    #[test]
    fn repeated_and_empty_query_parameters_are_refused() {
        let url = Url::parse("https://x/v2/zone?a=1&a=2").unwrap();
        assert_eq!(
            authorization(&local(), "GET", &url, b"", 1),
            Err(SignError::RepeatedQueryParameter("a".into()))
        );
        let url = Url::parse("https://x/v2/zone?b=").unwrap();
        assert_eq!(
            authorization(&local(), "GET", &url, b"", 1),
            Err(SignError::EmptyQueryParameter("b".into()))
        );
    }

    #[test]
    fn verify_accepts_what_authorization_produces_and_rejects_tampering() {
        let c = local();
        let url = Url::parse(&format!(
            "{GVA}/v2/instance?labels=app%3Dweb&manager-type=x"
        ))
        .unwrap();
        let header = authorization(&c, "GET", &url, b"", LOCAL_EXPIRES).unwrap();
        let parsed = parse_authorization(&header).unwrap();
        assert_eq!(parsed.credential, c.key);
        assert_eq!(parsed.signed_query_args, vec!["labels", "manager-type"]);
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let secret = c.secret.expose();
        assert_eq!(
            verify(
                &parsed,
                secret,
                "GET",
                url.path(),
                &pairs,
                b"",
                LOCAL_EXPIRES - 1
            ),
            Ok(())
        );
        assert_eq!(
            verify(
                &parsed,
                secret,
                "GET",
                url.path(),
                &pairs,
                b"",
                LOCAL_EXPIRES + 1
            ),
            Err(VerifyError::Expired)
        );
        assert_eq!(
            verify(&parsed, "wrong", "GET", url.path(), &pairs, b"", 0),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(&parsed, secret, "DELETE", url.path(), &pairs, b"", 0),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(&parsed, secret, "GET", url.path(), &pairs[..1], b"", 0),
            Err(VerifyError::MissingSignedArg("manager-type".into()))
        );
        assert!(parse_authorization("Bearer abc").is_err());
    }

    #[test]
    fn fixed_clock_is_settable() {
        let clock = FixedClock::at(10);
        assert_eq!(clock.now_unix(), 10);
        clock.set(20);
        assert_eq!(clock.now_unix(), 20);
        assert!(SystemClock.now_unix() > 1_700_000_000);
    }
}
