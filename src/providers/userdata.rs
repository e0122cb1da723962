//! User data for SKS node images: the `sks-node-agent` TOML (exoscale-api.md §6), gzip-compressed
//! and base64-encoded, as the `user-data` field of `POST /instance`.
//!
//! Pure: every input (token, CA, endpoint, kubelet settings, labels, taints) is passed in.

use std::collections::BTreeMap;
use std::io::Write;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use flate2::Compression;
use flate2::write::GzEncoder;
use serde::Serialize;
use thiserror::Error;

use crate::apis::labels::{NODE_INITIALIZED_LABEL, NODE_REGISTERED_LABEL, UNREGISTERED_TAINT_KEY};
use crate::apis::nodeclass::KubeletConfiguration;
use crate::apis::{Taint, TaintEffect};

use super::bootstrap_token::BootstrapToken;

/// The API refuses `user-data` of 32768 base64 characters or more.
pub const MAX_USER_DATA_LEN: usize = 32767;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum UserDataError {
    #[error("the cluster endpoint (CLUSTER_ENDPOINT) is empty")]
    MissingApiServer,
    /// The node would send its bootstrap token in clear text.
    #[error("the cluster endpoint {0:?} is not an https URL (set CLUSTER_ENDPOINT)")]
    InsecureApiServer(String),
    #[error("the cluster CA bundle is empty")]
    MissingCa,
    #[error("user data is {len} base64 characters, over the API limit of {MAX_USER_DATA_LEN}")]
    TooLarge { len: usize },
    #[error("cannot encode user data: {0}")]
    Encode(String),
}

/// Everything that goes into one node's user data.
#[derive(Clone, Debug)]
pub struct UserDataInput {
    /// `https://host:port` of the kube-apiserver, reachable from the new node.
    pub api_server: String,
    pub bootstrap_token: BootstrapToken,
    /// PEM bundle of the cluster CA.
    pub cluster_ca_pem: Vec<u8>,
    pub cluster_domain: String,
    pub kubelet: KubeletConfiguration,
    /// NodeClaim labels; labels the kubelet may not set itself are dropped by [`render`].
    pub labels: BTreeMap<String, String>,
    /// `spec.taints` and `spec.startupTaints`; the unregistered taint is added by [`render`].
    pub taints: Vec<Taint>,
}

#[derive(Serialize)]
struct Document {
    settings: Settings,
}

#[derive(Serialize)]
struct Settings {
    kubernetes: Kubernetes,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Kubernetes {
    api_server: String,
    bootstrap_token: String,
    cloud_provider: &'static str,
    cluster_certificate: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cluster_dns_ip: Vec<String>,
    cluster_domain: String,
    image_gc_high_threshold_percent: i32,
    image_gc_low_threshold_percent: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    image_minimum_gc_age: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_pods: Option<i32>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    feature_gates: BTreeMap<String, bool>,
    #[serde(skip_serializing_if = "Reservation::is_empty")]
    kube_reserved: Reservation,
    #[serde(skip_serializing_if = "Reservation::is_empty")]
    system_reserved: Reservation,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    node_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    node_taints: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Reservation {
    #[serde(skip_serializing_if = "String::is_empty")]
    cpu: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    memory: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    ephemeral_storage: String,
}

impl Reservation {
    fn new(cpu: &str, memory: &str, ephemeral_storage: &str) -> Self {
        Reservation {
            cpu: cpu.trim().to_string(),
            memory: memory.trim().to_string(),
            ephemeral_storage: ephemeral_storage.trim().to_string(),
        }
    }

    fn is_empty(&self) -> bool {
        self.cpu.is_empty() && self.memory.is_empty() && self.ephemeral_storage.is_empty()
    }
}

/// Label domains the kubelet refuses to set on its own Node (NodeRestriction), except the
/// listed keys and the `kubelet.`/`node.kubernetes.io` namespaces.
fn kubelet_may_set(key: &str) -> bool {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    if ALLOWED.contains(&key) {
        return true;
    }
    let Some((domain, _)) = key.split_once('/') else {
        return true;
    };
    let restricted = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
    if !(restricted("kubernetes.io") || restricted("k8s.io")) {
        return true;
    }
    restricted("kubelet.kubernetes.io") || restricted("node.kubernetes.io")
}

/// Labels handed to the kubelet: NodeClaim labels minus those the kubelet may not set and the
/// lifecycle labels the core writes when the node registers and initialises.
pub fn kubelet_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| kubelet_may_set(k))
        .filter(|(k, _)| *k != NODE_REGISTERED_LABEL && *k != NODE_INITIALIZED_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn effect_name(effect: TaintEffect) -> &'static str {
    match effect {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// Taints as the node agent wants them: key → `["value:Effect", ...]`, with the unregistered
/// taint the core expects (upstream registration removes it), empty values written `true`
/// (the agent refuses empty values), duplicates removed.
pub fn kubelet_taints(taints: &[Taint]) -> BTreeMap<String, Vec<String>> {
    let unregistered = Taint::new(UNREGISTERED_TAINT_KEY, None, TaintEffect::NoExecute);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in taints.iter().chain(std::iter::once(&unregistered)) {
        let value = t
            .value
            .as_deref()
            .filter(|v| !v.is_empty())
            .unwrap_or("true");
        let entry = format!("{value}:{}", effect_name(t.effect));
        let list = out.entry(t.key.clone()).or_default();
        if !list.contains(&entry) {
            list.push(entry);
        }
    }
    out
}

/// The TOML document, before compression. Useful for tests and `simulate`.
pub fn render_toml(input: &UserDataInput) -> Result<String, UserDataError> {
    let api_server = input.api_server.trim();
    if api_server.is_empty() {
        return Err(UserDataError::MissingApiServer);
    }
    if !api_server
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    {
        return Err(UserDataError::InsecureApiServer(api_server.to_string()));
    }
    if input.cluster_ca_pem.iter().all(u8::is_ascii_whitespace) {
        return Err(UserDataError::MissingCa);
    }
    let k = &input.kubelet;
    let doc = Document {
        settings: Settings {
            kubernetes: Kubernetes {
                api_server: input.api_server.trim().to_string(),
                bootstrap_token: input.bootstrap_token.token().to_string(),
                cloud_provider: "external",
                cluster_certificate: BASE64.encode(&input.cluster_ca_pem),
                cluster_dns_ip: k
                    .cluster_dns
                    .iter()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
                cluster_domain: input.cluster_domain.clone(),
                image_gc_high_threshold_percent: k.image_gc_high_threshold_percent,
                image_gc_low_threshold_percent: k.image_gc_low_threshold_percent,
                image_minimum_gc_age: k.image_minimum_gc_age.clone(),
                max_pods: k.max_pods,
                feature_gates: k.feature_gates.clone(),
                kube_reserved: Reservation::new(
                    &k.kube_reserved.cpu,
                    &k.kube_reserved.memory,
                    &k.kube_reserved.ephemeral_storage,
                ),
                system_reserved: Reservation::new(
                    &k.system_reserved.cpu,
                    &k.system_reserved.memory,
                    &k.system_reserved.ephemeral_storage,
                ),
                node_labels: kubelet_labels(&input.labels),
                node_taints: kubelet_taints(&input.taints),
            },
        },
    };
    toml::to_string(&doc).map_err(|e| UserDataError::Encode(e.to_string()))
}

/// gzip, then standard base64: the form `sks-node-agent` and the API expect.
pub fn encode(toml: &str) -> Result<String, UserDataError> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(toml.as_bytes())
        .map_err(|e| UserDataError::Encode(e.to_string()))?;
    let compressed = gz
        .finish()
        .map_err(|e| UserDataError::Encode(e.to_string()))?;
    let encoded = BASE64.encode(compressed);
    if encoded.len() > MAX_USER_DATA_LEN {
        return Err(UserDataError::TooLarge { len: encoded.len() });
    }
    Ok(encoded)
}

/// The `user-data` value for `POST /instance`.
pub fn render(input: &UserDataInput) -> Result<String, UserDataError> {
    encode(&render_toml(input)?)
}

/// Why stored user data cannot be read back.
#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("user data is gzip-compressed but does not decompress: {0}")]
    Gzip(#[source] std::io::Error),
    #[error("user data inflates beyond {MAX_DECODED_BYTES} bytes")]
    TooLarge,
    #[error("user data is not UTF-8 text")]
    NotUtf8,
}

/// Inflated user data is capped: a gzip bomb in an instance's user data cannot exhaust memory.
pub const MAX_DECODED_BYTES: u64 = 1024 * 1024;

/// The one user-data decoder (provider tests, the simulated API, the simulated kubelet): the
/// way the SKS node agent reads it — base64 (else the text as is), then gunzip when
/// gzip-compressed.
pub fn decode_text(user_data: &str) -> Result<String, DecodeError> {
    use std::io::Read;
    let trimmed = user_data.trim();
    let bytes = BASE64
        .decode(trimmed)
        .unwrap_or_else(|_| trimmed.as_bytes().to_vec());
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut inflated = Vec::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .take(MAX_DECODED_BYTES + 1)
            .read_to_end(&mut inflated)
            .map_err(DecodeError::Gzip)?;
        if inflated.len() as u64 > MAX_DECODED_BYTES {
            return Err(DecodeError::TooLarge);
        }
        inflated
    } else {
        bytes
    };
    String::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)
}

/// Inverse of [`encode`], for tests and diagnostics.
pub fn decode(encoded: &str) -> Option<String> {
    decode_text(encoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_decoder_reads_plain_base64_and_gzip_and_refuses_a_bomb() {
        let toml = "[settings.kubernetes]\nbootstrap-token = \"x\"\n";
        // Plain text is read trimmed, as the agent does.
        assert_eq!(decode_text(toml).unwrap(), toml.trim());
        assert_eq!(decode_text(&BASE64.encode(toml)).unwrap(), toml);
        assert_eq!(decode_text(&encode(toml).unwrap()).unwrap(), toml);
        let mut bomb = GzEncoder::new(Vec::new(), Compression::best());
        bomb.write_all(&vec![b'a'; (MAX_DECODED_BYTES + 1) as usize])
            .unwrap();
        let bomb = BASE64.encode(bomb.finish().unwrap());
        assert!(matches!(decode_text(&bomb), Err(DecodeError::TooLarge)));
        assert!(matches!(
            decode_text(&BASE64.encode([0x1f, 0x8b, 0, 1, 2])),
            Err(DecodeError::Gzip(_))
        ));
    }

    fn input() -> UserDataInput {
        UserDataInput {
            api_server: "https://cluster.example:443".into(),
            bootstrap_token: BootstrapToken::from_parts("abcdef", "0123456789abcdef").unwrap(),
            cluster_ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
                .to_vec(),
            cluster_domain: "cluster.local".into(),
            kubelet: KubeletConfiguration::default(),
            labels: BTreeMap::from([
                ("karpenter.sh/nodepool".into(), "default".into()),
                ("kubernetes.io/arch".into(), "amd64".into()),
                ("node-role.kubernetes.io/worker".into(), "".into()),
                (
                    "node.kubernetes.io/instance-type".into(),
                    "standard.medium".into(),
                ),
                ("karpenter.sh/registered".into(), "true".into()),
                ("team".into(), "a".into()),
            ]),
            taints: vec![
                Taint::new("dedicated", Some("gpu"), TaintEffect::NoSchedule),
                Taint::new("dedicated", Some("gpu"), TaintEffect::NoSchedule),
                Taint::new("startup", None, TaintEffect::NoExecute),
            ],
        }
    }

    #[test]
    fn restricted_labels_are_not_handed_to_the_kubelet() {
        let labels = kubelet_labels(&input().labels);
        assert!(labels.contains_key("karpenter.sh/nodepool"));
        assert!(labels.contains_key("kubernetes.io/arch"));
        assert!(labels.contains_key("node.kubernetes.io/instance-type"));
        assert!(labels.contains_key("team"));
        assert!(!labels.contains_key("node-role.kubernetes.io/worker"));
        assert!(!labels.contains_key("karpenter.sh/registered"));
    }

    #[test]
    fn taints_include_unregistered_and_fill_empty_values() {
        let t = kubelet_taints(&input().taints);
        assert_eq!(t["dedicated"], vec!["gpu:NoSchedule"]);
        assert_eq!(t["startup"], vec!["true:NoExecute"]);
        assert_eq!(t[UNREGISTERED_TAINT_KEY], vec!["true:NoExecute"]);
    }

    #[test]
    fn render_round_trips_through_gzip_and_base64() {
        let encoded = render(&input()).unwrap();
        let toml_text = decode(&encoded).unwrap();
        assert_eq!(toml_text, render_toml(&input()).unwrap());
        let v: toml::Table = toml_text.parse().unwrap();
        let k = &v["settings"]["kubernetes"];
        assert_eq!(
            k["bootstrap-token"].as_str(),
            Some("abcdef.0123456789abcdef")
        );
        assert_eq!(k["cloud-provider"].as_str(), Some("external"));
        assert_eq!(k["kube-reserved"]["cpu"].as_str(), Some("200m"));
        assert_eq!(
            k["system-reserved"]["ephemeral-storage"].as_str(),
            Some("3Gi")
        );
    }

    #[test]
    fn debug_never_shows_the_token_secret() {
        let debug = format!("{:?}", input());
        assert!(!debug.contains("0123456789abcdef"), "{debug}");
    }

    #[test]
    fn missing_inputs_are_named() {
        let mut i = input();
        i.cluster_ca_pem.clear();
        assert_eq!(render(&i).unwrap_err(), UserDataError::MissingCa);
        let mut i = input();
        i.api_server = " ".into();
        assert_eq!(render(&i).unwrap_err(), UserDataError::MissingApiServer);
        // The token would travel in clear text.
        i.api_server = "http://10.0.0.1:6443".into();
        assert!(matches!(
            render(&i).unwrap_err(),
            UserDataError::InsecureApiServer(_)
        ));
    }

    #[test]
    fn oversized_user_data_is_refused() {
        // Random-looking labels do not compress: enough of them exceed the limit.
        let mut i = input();
        for n in 0..2000u32 {
            let v = format!("{:x}", sha2_like(n));
            i.labels.insert(format!("example.com/l{n}"), v);
        }
        assert!(matches!(render(&i), Err(UserDataError::TooLarge { .. })));
    }

    fn sha2_like(n: u32) -> u128 {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(n.to_le_bytes());
        u128::from_le_bytes(d[..16].try_into().unwrap())
    }
}
