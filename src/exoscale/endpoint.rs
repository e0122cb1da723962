//! Choice of the API endpoint: explicit URL, else `https://{environment}-{zone}.exoscale.com/v2`.

use url::Url;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "EXOSCALE_ZONE={0:?}: invalid zone name, expected lowercase letters, digits and '-', e.g. ch-gva-2"
    )]
    InvalidZone(String),
    #[error(
        "EXOSCALE_API_ENVIRONMENT={0:?}: invalid API environment, expected lowercase letters and digits, e.g. api or ppapi"
    )]
    InvalidEnvironment(String),
    #[error("invalid EXOSCALE_API_ENDPOINT {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
}

/// A validated API base URL (its path ends in `/v2`, without a trailing slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint(Url);

impl Endpoint {
    /// `explicit` (EXOSCALE_API_ENDPOINT) wins; otherwise `environment` (EXOSCALE_API_ENVIRONMENT,
    /// default `api`; `ppapi` for pre-production) and the zone build the URL.
    pub fn resolve(
        zone: &str,
        explicit: Option<&str>,
        environment: Option<&str>,
    ) -> Result<Endpoint, EndpointError> {
        if let Some(url) = explicit.map(str::trim).filter(|u| !u.is_empty()) {
            return Endpoint::parse(url);
        }
        if !is_dns_label(zone) {
            return Err(EndpointError::InvalidZone(zone.to_string()));
        }
        let env = environment
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .unwrap_or("api");
        if !env
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(EndpointError::InvalidEnvironment(env.to_string()));
        }
        Endpoint::parse(&format!("https://{env}-{zone}.exoscale.com/v2"))
    }

    /// Parses an explicit base URL; `/v2` is appended when the path is empty.
    /// Plain `http` only reaches a loopback address (the simulated API on this machine):
    /// requests carry signed credentials and user data with bootstrap tokens.
    pub fn parse(url: &str) -> Result<Endpoint, EndpointError> {
        let invalid = |reason: &str| EndpointError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let mut parsed = Url::parse(url).map_err(|e| EndpointError::InvalidUrl {
            // An unparsable URL may still carry credentials before an `@`: not echoed then.
            url: if url.contains('@') {
                "(withheld: it may carry credentials)".into()
            } else {
                url.to_string()
            },
            reason: e.to_string(),
        })?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            // Not echoed: the URL holds a secret.
            return Err(EndpointError::InvalidUrl {
                url: "(withheld: it carries credentials)".into(),
                reason: "must not carry a user name or password".into(),
            });
        }
        match parsed.scheme() {
            "https" => {}
            "http" if is_loopback(&parsed) => {}
            "http" => {
                return Err(invalid(
                    "plain http is only allowed to a loopback address; use https",
                ));
            }
            _ => {
                return Err(invalid(
                    "scheme must be https (or http to a loopback address)",
                ));
            }
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid("must not carry a query or fragment"));
        }
        let path = parsed.path().trim_end_matches('/').to_string();
        parsed.set_path(if path.is_empty() { "/v2" } else { &path });
        Ok(Endpoint(parsed))
    }

    pub fn url(&self) -> &Url {
        &self.0
    }

    /// On a loopback address (a simulated cloud on this machine, never Exoscale).
    pub fn is_loopback(&self) -> bool {
        is_loopback(&self.0)
    }

    /// The full URL of an API path such as `/instance/{id}`.
    pub fn join(&self, path: &str) -> Url {
        let mut url = self.0.clone();
        url.set_path(&format!("{}{}", self.0.path(), path));
        url
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_str())
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_environment_and_override() {
        assert_eq!(
            Endpoint::resolve("ch-gva-2", None, None)
                .unwrap()
                .to_string(),
            "https://api-ch-gva-2.exoscale.com/v2"
        );
        assert_eq!(
            Endpoint::resolve("de-fra-1", None, Some("ppapi"))
                .unwrap()
                .to_string(),
            "https://ppapi-de-fra-1.exoscale.com/v2"
        );
        assert_eq!(
            Endpoint::resolve("x", Some("http://127.0.0.1:8080"), None)
                .unwrap()
                .to_string(),
            "http://127.0.0.1:8080/v2"
        );
        assert_eq!(
            Endpoint::resolve("x", Some("http://127.0.0.1:8080/v2/"), None)
                .unwrap()
                .join("/instance/abc:attach")
                .as_str(),
            "http://127.0.0.1:8080/v2/instance/abc:attach"
        );
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            Endpoint::resolve("CH GVA", None, None),
            Err(EndpointError::InvalidZone("CH GVA".into()))
        );
        assert!(matches!(
            Endpoint::resolve("ch-gva-2", None, Some("pp.api")),
            Err(EndpointError::InvalidEnvironment(_))
        ));
        assert!(matches!(
            Endpoint::parse("ftp://x"),
            Err(EndpointError::InvalidUrl { .. })
        ));
    }

    /// Signed requests and bootstrap tokens never travel in plain text beyond this machine,
    /// and a URL with credentials in it is refused without being repeated.
    #[test]
    fn plain_http_only_to_loopback_and_no_credentials_in_the_url() {
        for local in [
            "http://127.0.0.1:8080",
            "http://[::1]:80",
            "http://localhost:1",
        ] {
            assert!(Endpoint::parse(local).is_ok(), "{local}");
        }
        for remote in ["http://api-ch-gva-2.exoscale.com", "http://10.0.0.1:8080"] {
            let Err(EndpointError::InvalidUrl { reason, .. }) = Endpoint::parse(remote) else {
                panic!("{remote} accepted");
            };
            assert!(reason.contains("loopback"), "{reason}");
        }
        let Err(e) = Endpoint::parse("https://key:s3cret@api-ch-gva-2.exoscale.com/v2") else {
            panic!("credentials in the URL accepted");
        };
        assert!(!e.to_string().contains("s3cret"), "{e}");
        // Nor when the rest of the URL does not parse (a bad port).
        let Err(e) = Endpoint::parse("https://key:s3cret@api-ch-gva-2.exoscale.com:99999/v2")
        else {
            panic!("a bad port accepted");
        };
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
