//! Mutual TLS for the etcd baseline, configured as gpumesh always runs: clients and peers
//! present certificates signed by the cluster's CA, and every member checks them
//! (`--client-cert-auth`, `--peer-client-cert-auth`). One certificate serves every member and
//! the clients, for `127.0.0.1` (etcd checks a peer's certificate against its address).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The files etcd reads, and what its clients present.
pub struct EtcdTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client: ClientTlsConfig,
}

impl EtcdTls {
    /// Make a CA and a certificate signed by it, written under `dir`.
    pub fn make(dir: &Path) -> anyhow::Result<EtcdTls> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca_params.self_signed(&ca_key)?.pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert_pem = params.signed_by(&key, &issuer)?.pem();
        let key_pem = key.serialize_pem();
        let tls = EtcdTls {
            ca: dir.join("ca.pem"),
            cert: dir.join("member.pem"),
            key: dir.join("member-key.pem"),
            client: ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_pem))
                .identity(Identity::from_pem(&cert_pem, &key_pem)),
        };
        for (path, pem) in [
            (&tls.ca, &ca_pem),
            (&tls.cert, &cert_pem),
            (&tls.key, &key_pem),
        ] {
            std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(tls)
    }

    /// etcd's flags for client and peer mutual TLS.
    pub fn flags(&self) -> Vec<String> {
        let file = |flag: &str, path: &Path| format!("--{flag}={}", path.display());
        vec![
            file("cert-file", &self.cert),
            file("key-file", &self.key),
            file("trusted-ca-file", &self.ca),
            "--client-cert-auth".into(),
            file("peer-cert-file", &self.cert),
            file("peer-key-file", &self.key),
            file("peer-trusted-ca-file", &self.ca),
            "--peer-client-cert-auth".into(),
        ]
    }

    /// What a client connects with.
    pub fn client(&self) -> ClientTlsConfig {
        self.client.clone()
    }
}
