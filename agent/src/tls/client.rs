//! How agents and tools connect to agents: TLS to the cluster's CAs, verifying the agent name
//! [`SERVER_NAME`](super::pki::SERVER_NAME), presenting our own certificate when we have one.
//! Tools use tonic's TLS (`config`, from `gpu_proto::tls`, shared with gpuctl). An agent dials
//! its peers with a rustls configuration of its own (`peer_config`), whose verifier also
//! refuses a peer whose certificate the cluster revoked: a revoked host cannot pose as a
//! member to the agents that call it.

use std::sync::Arc;

use anyhow::Context;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tonic::transport::ClientTlsConfig;

use super::pki::{self, KeyedCert};
use super::server::{cert_der, provider};

pub fn config(ca_cert_pem: &str, me: Option<&KeyedCert>) -> ClientTlsConfig {
    gpu_proto::tls::client_config(
        ca_cert_pem,
        me.map(|me| (me.cert_pem.as_str(), me.key_pem.as_str())),
    )
}

/// Whether a certificate serial (lower-case hex) is on the cluster's revocation list.
pub type Revoked = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// TLS 1.2+ with h2 to a peer agent: its certificate must chain to a CA of `ca_bundle_pem`,
/// name [`pki::SERVER_NAME`], and not be `revoked`; we present `me` when we have it.
pub fn peer_config(
    ca_bundle_pem: &str,
    me: Option<&KeyedCert>,
    revoked: Revoked,
) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    for pem in pki::certs_in(ca_bundle_pem) {
        roots.add(cert_der(&pem)?).context("a CA certificate")?;
    }
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .context("building the server certificate verifier")?;
    let verifier = Arc::new(NotRevoked { inner, revoked });
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match me {
        Some(me) => {
            use rustls::pki_types::PrivateKeyDer;
            use rustls::pki_types::pem::PemObject;
            let key =
                PrivateKeyDer::from_pem_slice(me.key_pem.as_bytes()).context("reading our key")?;
            builder
                .with_client_auth_cert(vec![cert_der(&me.cert_pem)?], key)
                .context("our certificate and key")?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    // A resumed session skips the certificate checks: every connection is a full handshake,
    // so a revoked peer, or one of a retired CA, is caught when it is dialled again.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// The WebPKI checks, then the cluster's revocation list.
struct NotRevoked {
    inner: Arc<WebPkiServerVerifier>,
    revoked: Revoked,
}

impl std::fmt::Debug for NotRevoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotRevoked").finish_non_exhaustive()
    }
}

impl ServerCertVerifier for NotRevoked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let info = pki::inspect(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if (self.revoked)(&info.serial) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Revoked));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
