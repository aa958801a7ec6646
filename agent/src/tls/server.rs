//! The agent's TLS listener. Connections are accepted here (not by tonic) so that the
//! certificate and the trusted CAs can be replaced at run time (renewal, CA rotation) and so that a client without a
//! certificate can still complete a handshake for the one call that gives it one: whether a
//! request may proceed without a certificate is decided per RPC (`api::auth::peer`), not here.
//! A handshake that does not finish in time is dropped; plaintext and HTTP/1.1 fail it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use futures::Stream;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::pki::KeyedCert;

/// How long a client gets to finish its handshake (a few round trips even over a slow link).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; more wait their turn (within the handshake timeout), never
/// holding up the accept loop.
const MAX_HANDSHAKES: usize = 256;
/// Handshakes in progress at once from one address; more from it wait for its own seats:
/// idle connections from one source cannot take the permits everyone else needs.
const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// The ring provider, named explicitly (never a process default that another crate could set).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate this agent presents, and the CAs whose client certificates it accepts;
/// empty until it has them (a joining agent). Both are replaced in place (a renewal, a CA
/// rotation) for the next handshake on.
#[derive(Debug, Default)]
pub struct CertSlot {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    trust: Arc<TrustSlot>,
}

impl CertSlot {
    /// Present `node` and accept clients of the CAs of `ca_bundle_pem` from the next handshake
    /// on.
    pub fn set(&self, node: &KeyedCert, ca_bundle_pem: &str) -> anyhow::Result<()> {
        let key = PrivateKeyDer::from_pem_slice(node.key_pem.as_bytes())
            .context("reading the node key")?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .context("the node key is of an unsupported type")?;
        let certified = CertifiedKey::new(vec![cert_der(&node.cert_pem)?], signer);
        certified.keys_match().map_err(|e| {
            anyhow::anyhow!("the node key does not belong to the node certificate: {e}")
        })?;
        let verifier = client_verifier(ca_bundle_pem)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(certified));
        *self
            .trust
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(verifier);
        Ok(())
    }
}

/// Client certificates verified against every CA of `bundle_pem`; clients without one pass
/// the handshake (each RPC decides whether it needs one).
fn client_verifier(bundle_pem: &str) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for pem in super::pki::certs_in(bundle_pem) {
        roots.add(cert_der(&pem)?).context("a CA certificate")?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")
}

/// The client certificate verifier of the moment (`CertSlot::set`).
#[derive(Debug, Default)]
struct TrustSlot {
    current: RwLock<Option<Arc<dyn ClientCertVerifier>>>,
}

impl TrustSlot {
    fn get(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| rustls::Error::General("this agent trusts no CA yet".into()))
    }
}

impl ClientCertVerifier for TrustSlot {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: the CAs change at run time, and our clients hold one certificate each.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.get()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.get()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.get()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub(crate) fn cert_der(pem: &str) -> anyhow::Result<CertificateDer<'static>> {
    CertificateDer::from_pem_slice(pem.as_bytes()).context("reading a PEM certificate")
}

/// TLS 1.2+ with h2 (HTTP/1.1 for a browser that offers only it), client certificates verified against the cluster's CAs when presented.
pub(crate) fn server_config(slot: Arc<CertSlot>) -> anyhow::Result<Arc<ServerConfig>> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(slot.trust.clone())
        .with_cert_resolver(slot);
    // No session resumption: a resumed session would skip the client certificate's checks
    // against the CAs trusted now (a CA retired since, say). Connections are long-lived.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Handshakes in progress per source address: a semaphore per address, dropped once no
/// handshake from it is in progress or waiting.
#[derive(Clone, Default)]
struct PerAddress(Arc<Mutex<HashMap<IpAddr, Arc<Semaphore>>>>);

impl PerAddress {
    fn of(&self, ip: IpAddr) -> Arc<Semaphore> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(ip)
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_HANDSHAKES_PER_ADDRESS)))
            .clone()
    }

    /// Forget `ip`'s semaphore when nobody else holds or waits on it.
    fn release(&self, ip: IpAddr, semaphore: Arc<Semaphore>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and ours: nobody else is waiting or in a handshake.
        if Arc::strong_count(&semaphore) == 2 {
            map.remove(&ip);
        }
    }
}

/// Accept connections on `listener` and yield the ones whose handshake completed.
pub(crate) fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    cancel: CancellationToken,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let per_address = PerAddress::default();
    tokio::spawn(async move {
        loop {
            let (tcp, from) = tokio::select! {
                () = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            let (permits, per_address) = (permits.clone(), per_address.clone());
            tokio::spawn(async move {
                // First a seat among this address's handshakes, then one of all: a connection
                // waits for them here (within the handshake timeout), never in the accept loop,
                // and one address's idle connections hold at most its own seats.
                let mine = per_address.of(from.ip());
                let handshake = async {
                    let _seat = mine.clone().acquire_owned().await.ok()?;
                    let _permit = permits.acquire_owned().await.ok()?;
                    Some(acceptor.accept(tcp).await)
                };
                let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await;
                per_address.release(from.ip(), mine);
                match outcome {
                    Ok(Some(Ok(stream))) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Some(Err(e))) => debug!(%from, error = %e, "TLS handshake failed"),
                    Ok(None) => {}
                    Err(_) => debug!(%from, "TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) })
}
