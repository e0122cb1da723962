//! Kubernetes bootstrap tokens, one per NodeClaim: a `kube-system/bootstrap-token-<id>` Secret
//! the new node's kubelet uses once to join (exoscale-provider.md §4.5).
//!
//! The pure parts (generation, the Secret's shape, expiry and "may be deleted" decisions) are
//! separate from the few small async functions that read and write Secrets.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::{DeleteParams, PostParams};
use kube::core::ObjectMeta;
use kube::{Api, Client};
use rand::Rng;
use thiserror::Error;

use crate::apis::NodeClaim;
use crate::apis::labels::{
    BOOTSTRAP_TOKEN_ANNOTATION, TOKEN_CREATED_ANNOTATION, TOKEN_PROVIDER_LABEL,
    TOKEN_PROVIDER_VALUE,
};

pub const NAMESPACE: &str = "kube-system";
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const SECRET_NAME_PREFIX: &str = "bootstrap-token-";
/// The default lifetime (the Go provider's); the controller uses [`token_ttl`] (launch timeout,
/// registration TTL and [`TOKEN_TTL_MARGIN`]) so a node that may still register can still
/// authenticate.
pub const TOKEN_TTL: Duration = Duration::from_secs(10 * 60);
/// Added to the registration TTL: boot time past the TTL check and clock skew.
pub const TOKEN_TTL_MARGIN: Duration = Duration::from_secs(2 * 60);

/// How long a token lives: as long as its node may still register. The token is made before
/// the instance's create (which can queue behind the API's rate limit, or wait a minute for a
/// lookup after an unknown outcome, up to the launch timeout), and the registration deadline
/// counts from the launch: a token counted from its own creation with the registration TTL
/// alone could expire while its NodeClaim still waits for the node.
pub fn token_ttl(launch_timeout: Duration, registration_ttl: Duration) -> Duration {
    launch_timeout + registration_ttl + TOKEN_TTL_MARGIN
}
/// The group SKS binds for node bootstrap. The Go provider also added
/// `system:bootstrappers:ingress`, which no joining path of a worker node needs.
const AUTH_EXTRA_GROUPS: &str = "system:bootstrappers:worker";
/// Token characters, as Kubernetes defines them (`[a-z0-9]`).
const TOKEN_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;
const CREATE_ATTEMPTS: usize = 3;

#[derive(Debug, Error)]
pub enum TokenError {
    #[error("invalid bootstrap token {what}: expected {expected}")]
    Invalid {
        what: &'static str,
        expected: &'static str,
    },
    #[error("bootstrap token Secret {name}: {source}")]
    Kube {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("could not create a bootstrap token with a fresh id after {CREATE_ATTEMPTS} attempts")]
    Collision,
}

impl TokenError {
    /// The Secret a failed create may have stored anyway: the answer was lost (a transport
    /// error, a timeout) or the server failed after the request arrived (5xx); the same rule
    /// as for NodeClaim creates. A refusal (4xx, our own fence) stored nothing.
    pub fn maybe_stored(&self) -> Option<&str> {
        match self {
            TokenError::Kube { name, source }
                if crate::controllers::lost_creates::create_outcome_unknown(source) =>
            {
                Some(name)
            }
            TokenError::Kube { .. } | TokenError::Invalid { .. } | TokenError::Collision => None,
        }
    }
}

/// A token `<id>.<secret>`. The secret never appears in Debug or Display.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

fn is_token_chars(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl BootstrapToken {
    /// A fresh token from the operating system-seeded CSPRNG over the whole `[a-z0-9]` alphabet:
    /// about 82.7 bits of secret, where the Go provider's hex gave 64.
    pub fn generate() -> Self {
        let mut rng = rand::rng();
        let mut draw = |n: usize| -> String {
            (0..n)
                .map(|_| char::from(TOKEN_ALPHABET[rng.random_range(0..TOKEN_ALPHABET.len())]))
                .collect()
        };
        BootstrapToken {
            id: draw(ID_LEN),
            secret: draw(SECRET_LEN),
        }
    }

    /// Validates the Kubernetes token format `[a-z0-9]{6}` / `[a-z0-9]{16}`.
    pub fn from_parts(id: &str, secret: &str) -> Result<Self, TokenError> {
        if !is_token_chars(id, ID_LEN) {
            return Err(TokenError::Invalid {
                what: "id",
                expected: "6 characters [a-z0-9]",
            });
        }
        if !is_token_chars(secret, SECRET_LEN) {
            return Err(TokenError::Invalid {
                what: "secret",
                expected: "16 characters [a-z0-9]",
            });
        }
        Ok(BootstrapToken {
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `<id>.<secret>`, for the node's user data only.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    pub fn secret_name(&self) -> String {
        secret_name(&self.id)
    }
}

pub fn secret_name(token_id: &str) -> String {
    format!("{SECRET_NAME_PREFIX}{token_id}")
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The NodeClaim a token is made for. With its UID the Secret carries an owner reference to
/// it, so Kubernetes' garbage collector deletes the Secret with the NodeClaim even when this
/// controller never got to record the token's name on it (killed between the Secret's create
/// and the launch's write, or a launch whose answer was lost and that a fresh process redid
/// with a new token). The controller itself never lists Secrets, so without the reference such
/// a Secret would stay forever (expired, but an object) where kube-controller-manager's
/// `tokencleaner` is not enabled, which is its default.
#[derive(Clone, Copy, Debug)]
pub struct TokenOwner<'a> {
    pub name: &'a str,
    pub uid: Option<&'a str>,
}

impl<'a> TokenOwner<'a> {
    pub fn named(name: &'a str) -> Self {
        TokenOwner { name, uid: None }
    }

    fn reference(&self) -> Option<OwnerReference> {
        let uid = self.uid.filter(|u| !u.is_empty())?;
        Some(OwnerReference {
            api_version: NodeClaim::api_version(&()).into_owned(),
            kind: NodeClaim::kind(&()).into_owned(),
            name: self.name.into(),
            uid: uid.into(),
            // Blocking the owner's deletion would need `update` on NodeClaim finalizers, and a
            // NodeClaim must never wait on its token.
            block_owner_deletion: None,
            controller: None,
        })
    }
}

/// The Secret for `token`, owned by `owner`, created at `now`, valid for `ttl`.
///
/// Only `usage-bootstrap-authentication`: the node gets the cluster CA in its user data, so no
/// joining path reads `kube-public/cluster-info`, and a signing token would publish there (to
/// anyone) a JWS keyed by the token secret, open to offline guessing.
pub fn build_secret(
    token: &BootstrapToken,
    owner: TokenOwner<'_>,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Secret {
    let nodeclaim = owner.name;
    let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
    let expiration = now
        .checked_add_signed(ttl)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let data: BTreeMap<String, ByteString> = [
        ("token-id", token.id.clone()),
        ("token-secret", token.secret.clone()),
        ("usage-bootstrap-authentication", "true".into()),
        ("auth-extra-groups", AUTH_EXTRA_GROUPS.into()),
        ("expiration", rfc3339(expiration)),
        (
            "description",
            format!("Bootstrap token for {nodeclaim} created by Karpenter"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(token.secret_name()),
            namespace: Some(NAMESPACE.into()),
            owner_references: owner.reference().map(|r| vec![r]),
            labels: Some(BTreeMap::from([(
                TOKEN_PROVIDER_LABEL.to_string(),
                TOKEN_PROVIDER_VALUE.to_string(),
            )])),
            annotations: Some(BTreeMap::from([
                (
                    BOOTSTRAP_TOKEN_ANNOTATION.to_string(),
                    nodeclaim.to_string(),
                ),
                (TOKEN_CREATED_ANNOTATION.to_string(), rfc3339(now)),
            ])),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Secret::default()
    }
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A bootstrap-token Secret this provider made.
pub fn is_ours(secret: &Secret) -> bool {
    secret.type_.as_deref() == Some(SECRET_TYPE)
        && secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(TOKEN_PROVIDER_LABEL))
            .is_some_and(|v| v == TOKEN_PROVIDER_VALUE)
}

/// The NodeClaim the token was made for.
pub fn nodeclaim_of(secret: &Secret) -> Option<&str> {
    annotation(secret, BOOTSTRAP_TOKEN_ANNOTATION)
}

/// Creation time: our annotation, else `metadata.creationTimestamp`. `None` when unknown or
/// unparsable, which callers treat as expired.
pub fn created_at(secret: &Secret) -> Option<DateTime<Utc>> {
    match annotation(secret, TOKEN_CREATED_ANNOTATION) {
        Some(v) => DateTime::parse_from_rfc3339(v)
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        None => secret
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0)),
    }
}

/// The token's `expiration`, or its creation time + [`TOKEN_TTL`] for a Secret without one.
fn expires_at(secret: &Secret) -> Option<DateTime<Utc>> {
    let field = secret
        .data
        .as_ref()
        .and_then(|d| d.get("expiration"))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
        .map(|t| t.with_timezone(&Utc));
    field.or_else(|| {
        created_at(secret)
            .and_then(|c| c.checked_add_signed(chrono::Duration::from_std(TOKEN_TTL).ok()?))
    })
}

/// Time left before the token expires (zero when expired or of unknown age).
pub fn remaining(secret: &Secret, now: DateTime<Utc>) -> Duration {
    expires_at(secret)
        .and_then(|at| (at - now).to_std().ok())
        .unwrap_or(Duration::ZERO)
}

pub fn is_expired(secret: &Secret, now: DateTime<Utc>) -> bool {
    remaining(secret, now).is_zero()
}

// ---- Kubernetes I/O: kept small; the decisions above are the tested part ----

fn secrets(client: &Client) -> Api<Secret> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// Creates a fresh token Secret for `nodeclaim`, retrying on an id collision.
pub async fn create_for_nodeclaim(
    client: &Client,
    nodeclaim: TokenOwner<'_>,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<BootstrapToken, TokenError> {
    let api = secrets(client);
    for _ in 0..CREATE_ATTEMPTS {
        let token = BootstrapToken::generate();
        let secret = build_secret(&token, nodeclaim, now, ttl);
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(token),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(source) => {
                return Err(TokenError::Kube {
                    name: token.secret_name(),
                    source,
                });
            }
        }
    }
    Err(TokenError::Collision)
}

/// Deletes one token Secret by name; an already deleted one is fine. Tokens are never listed:
/// the controller may not read Secrets at all, it deletes the names it recorded.
pub async fn delete_token(client: &Client, name: &str) -> Result<(), TokenError> {
    match secrets(client).delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(TokenError::Kube {
            name: name.to_string(),
            source,
        }),
    }
}

/// The token Secret names recorded on a NodeClaim's annotation value: only names a token of
/// ours can have (`bootstrap-token-` and a six-character `[a-z0-9]` ID). Anyone who may patch
/// NodeClaims can write the annotation, and the names are deleted: any other kube-system
/// Secret named there is ignored (the admission policy refuses the rest).
pub fn recorded(annotation: Option<&str>) -> BTreeSet<String> {
    annotation
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| {
            n.strip_prefix(SECRET_NAME_PREFIX).is_some_and(|id| {
                id.len() == 6
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            })
        })
        .map(str::to_string)
        .collect()
}

/// The annotation value recording `names`.
pub fn record(names: &BTreeSet<String>) -> String {
    names.iter().cloned().collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_create_without_an_answer_may_have_stored_the_secret() {
        let failed = |source: kube::Error| TokenError::Kube {
            name: "bootstrap-token-abc123".into(),
            source,
        };
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "Test")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(
            failed(api(504)).maybe_stored(),
            Some("bootstrap-token-abc123")
        );
        let reset = kube::Error::Service("connection reset by peer".into());
        assert_eq!(failed(reset).maybe_stored(), Some("bootstrap-token-abc123"));
        assert_eq!(failed(api(403)).maybe_stored(), None);
        assert_eq!(failed(api(422)).maybe_stored(), None);
        assert_eq!(TokenError::Collision.maybe_stored(), None);
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn text(secret: &Secret, key: &str) -> String {
        String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
    }

    #[test]
    fn generated_tokens_have_the_kubernetes_format_and_hide_the_secret() {
        let t = BootstrapToken::generate();
        let token = t.token();
        let (id, secret) = token.split_once('.').unwrap();
        assert!(BootstrapToken::from_parts(id, secret).is_ok());
        assert_eq!(t.secret_name(), format!("bootstrap-token-{id}"));
        let debug = format!("{t:?}");
        assert!(!debug.contains(secret), "{debug}");
        assert_ne!(BootstrapToken::generate(), t);
    }

    #[test]
    fn generated_tokens_use_the_whole_alphabet() {
        let drawn: String = (0..200)
            .map(|_| BootstrapToken::generate().token().replace('.', ""))
            .collect();
        assert!(drawn.bytes().all(|b| TOKEN_ALPHABET.contains(&b)));
        // 4 400 characters drawn over 36: every one of them appears (all hex: ~64 bits only).
        for c in TOKEN_ALPHABET {
            assert!(drawn.as_bytes().contains(c), "{} never drawn", *c as char);
        }
    }

    /// A launch that took its whole launch timeout still has a token for the whole
    /// registration TTL after it.
    #[test]
    fn a_token_outlives_the_slowest_launch_plus_the_registration_ttl() {
        let minutes = |m: u64| Duration::from_secs(m * 60);
        // The defaults (5 m launch timeout, 15 m registration TTL): 22 minutes.
        assert_eq!(token_ttl(minutes(5), minutes(15)), minutes(22));
        for (launch, registration) in [(2, 3), (5, 15), (30, 60)] {
            let (launch, registration) = (minutes(launch), minutes(registration));
            let ttl = token_ttl(launch, registration);
            assert!(ttl > launch + registration, "{ttl:?}");
        }
    }

    #[test]
    fn the_ttl_follows_the_registration_ttl() {
        let t = BootstrapToken::from_parts("abc123", "def456ghi789jkl0").unwrap();
        let ttl = Duration::from_secs(30 * 60) + TOKEN_TTL_MARGIN;
        let s = build_secret(&t, TokenOwner::named("nc"), at(0), ttl);
        assert_eq!(text(&s, "expiration"), rfc3339(at(32 * 60)));
        assert_eq!(remaining(&s, at(60)), Duration::from_secs(31 * 60));
        assert!(
            !is_expired(&s, at(31 * 60)),
            "valid past the 10-minute default"
        );
        assert!(is_expired(&s, at(32 * 60)));
    }

    #[test]
    fn malformed_parts_are_refused_naming_the_part() {
        let e = BootstrapToken::from_parts("ABCDEF", "0123456789abcdef").unwrap_err();
        assert!(e.to_string().contains("id"), "{e}");
        let e = BootstrapToken::from_parts("abcdef", "short").unwrap_err();
        assert!(e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn secret_has_the_go_provider_shape() {
        let t = BootstrapToken::from_parts("abc123", "def456ghi789jkl0").unwrap();
        assert_eq!(t.token(), "abc123.def456ghi789jkl0");
        let s = build_secret(&t, TokenOwner::named("default-x7k2p"), at(0), TOKEN_TTL);
        assert_eq!(s.metadata.name.as_deref(), Some("bootstrap-token-abc123"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("kube-system"));
        assert!(is_ours(&s));
        assert_eq!(nodeclaim_of(&s), Some("default-x7k2p"));
        assert_eq!(text(&s, "token-id"), "abc123");
        assert_eq!(text(&s, "token-secret"), "def456ghi789jkl0");
        assert_eq!(text(&s, "usage-bootstrap-authentication"), "true");
        assert!(
            !s.data
                .as_ref()
                .unwrap()
                .contains_key("usage-bootstrap-signing"),
            "a signing token publishes a JWS of its secret in kube-public/cluster-info"
        );
        assert_eq!(text(&s, "auth-extra-groups"), "system:bootstrappers:worker");
        assert_eq!(text(&s, "expiration"), rfc3339(at(600)));
        assert_eq!(created_at(&s), Some(at(0)));
    }

    /// Kubernetes deletes the Secret with its NodeClaim; only a NodeClaim with a UID can own.
    #[test]
    fn the_nodeclaim_owns_its_token_secret() {
        let t = BootstrapToken::generate();
        let owner = TokenOwner {
            name: "default-x7k2p",
            uid: Some("0f6c1a52-5c1e-4d2a-9a43-1d1f4c0e7b11"),
        };
        let s = build_secret(&t, owner, at(0), TOKEN_TTL);
        let refs = s.metadata.owner_references.expect("an owner reference");
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].api_version, "karpenter.sh/v1");
        assert_eq!(refs[0].kind, "NodeClaim");
        assert_eq!(refs[0].name, "default-x7k2p");
        assert_eq!(refs[0].uid, "0f6c1a52-5c1e-4d2a-9a43-1d1f4c0e7b11");
        assert_eq!(refs[0].block_owner_deletion, None);
        for uid in [None, Some("")] {
            let owner = TokenOwner {
                name: "default-x7k2p",
                uid,
            };
            let s = build_secret(&t, owner, at(0), TOKEN_TTL);
            assert_eq!(s.metadata.owner_references, None, "{uid:?}");
        }
    }

    #[test]
    fn ownership_needs_type_and_label() {
        let t = BootstrapToken::generate();
        let mut s = build_secret(&t, TokenOwner::named("nc"), at(0), TOKEN_TTL);
        s.type_ = Some("Opaque".into());
        assert!(!is_ours(&s));
        let mut s = build_secret(&t, TokenOwner::named("nc"), at(0), TOKEN_TTL);
        s.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(TOKEN_PROVIDER_LABEL.into(), "other-provider".into());
        assert!(!is_ours(&s));
        let mut s = build_secret(&t, TokenOwner::named("nc"), at(0), TOKEN_TTL);
        s.metadata.labels = None;
        assert!(!is_ours(&s));
    }

    #[test]
    fn expiry_uses_the_expiration_then_the_creation_time() {
        let t = BootstrapToken::generate();
        let s = build_secret(&t, TokenOwner::named("nc"), at(0), TOKEN_TTL);
        assert!(!is_expired(&s, at(5 * 60)));
        assert!(is_expired(&s, at(11 * 60)));
        assert_eq!(remaining(&s, at(60)), Duration::from_secs(9 * 60));

        // Without an `expiration` (a Secret of an older version): created + the default TTL.
        let without_expiration = || {
            let mut s = build_secret(&t, TokenOwner::named("nc"), at(0), TOKEN_TTL);
            s.data.as_mut().unwrap().remove("expiration");
            s
        };
        let s = without_expiration();
        assert!(!is_expired(&s, at(5 * 60)));
        assert!(is_expired(&s, at(11 * 60)));
        let mut s = without_expiration();
        s.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(TOKEN_CREATED_ANNOTATION);
        s.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(at(0).timestamp()).unwrap(),
        ));
        assert!(!is_expired(&s, at(120)));
        assert!(is_expired(&s, at(11 * 60)));

        let mut s = without_expiration();
        s.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(TOKEN_CREATED_ANNOTATION.into(), "yesterday".into());
        assert!(
            is_expired(&s, at(0)),
            "unparsable creation time counts as expired"
        );
    }

    #[test]
    fn recorded_token_names_round_trip_and_foreign_entries_are_ignored() {
        let names = recorded(Some(
            "bootstrap-token-abc123, bootstrap-token-def456,kube-root-ca,bootstrap-token-signer-key,bootstrap-token-ABC123,",
        ));
        assert_eq!(
            names,
            BTreeSet::from([
                "bootstrap-token-abc123".to_string(),
                "bootstrap-token-def456".to_string()
            ])
        );
        assert_eq!(recorded(Some(&record(&names))), names);
        assert!(recorded(None).is_empty());
    }
}
