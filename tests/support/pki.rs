//! Throwaway PKI for one control plane: a CA, the apiserver's serving certificate and the
//! service-account signing key, written as PEM files.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

/// Paths of the PEM files the components read, plus the CA for the client side.
pub struct Pki {
    pub ca_cert_pem: String,
    pub ca_cert_file: PathBuf,
    pub serving_cert_file: PathBuf,
    pub serving_key_file: PathBuf,
    pub service_account_key_file: PathBuf,
    pub service_account_public_key_file: PathBuf,
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

fn rcgen_error(what: &'static str) -> impl Fn(rcgen::Error) -> String {
    move |e| format!("generating {what}: {e}")
}

fn named(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// Generates the PKI into `dir`.
pub fn generate(dir: &Path) -> Result<Pki, String> {
    let ca_key = KeyPair::generate().map_err(rcgen_error("CA key"))?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = named("karpenter-exoscale-test-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(rcgen_error("CA certificate"))?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate().map_err(rcgen_error("serving key"))?;
    let mut serving_params = CertificateParams::default();
    serving_params.distinguished_name = named("kube-apiserver");
    // kube-rs over rustls checks IP SANs when it reaches the server by IP.
    serving_params.subject_alt_names = vec![
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::DnsName("localhost".try_into().map_err(rcgen_error("SAN"))?),
        SanType::DnsName(
            "kubernetes.default.svc"
                .try_into()
                .map_err(rcgen_error("SAN"))?,
        ),
    ];
    serving_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving_params
        .signed_by(&serving_key, &issuer)
        .map_err(rcgen_error("serving certificate"))?;

    // The apiserver signs service-account tokens with it; kube-controller-manager too.
    let service_account_key = KeyPair::generate().map_err(rcgen_error("service-account key"))?;

    Ok(Pki {
        ca_cert_pem: ca_cert.pem(),
        ca_cert_file: write(dir, "ca.crt", &ca_cert.pem())?,
        serving_cert_file: write(dir, "apiserver.crt", &serving_cert.pem())?,
        serving_key_file: write(dir, "apiserver.key", &serving_key.serialize_pem())?,
        service_account_key_file: write(dir, "sa.key", &service_account_key.serialize_pem())?,
        // --service-account-key-file does not derive the public key from a PKCS#8 key.
        service_account_public_key_file: write(
            dir,
            "sa.pub",
            &service_account_key.public_key_pem(),
        )?,
    })
}
