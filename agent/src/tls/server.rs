//! The agent's TLS listener. Connections are accepted here (not by tonic) so that the
//! certificate can be replaced at run time (rotation) and so that a client without a
//! certificate can still complete a handshake for the one call that gives it one: whether a
//! request may proceed without a certificate is decided per RPC (`api::auth::peer`), not here.
//! A handshake that does not finish in time is dropped; plaintext and HTTP/1.1 fail it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use futures::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::pki::KeyedCert;

/// How long a client gets to finish its handshake (a few round trips even over a slow link).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; a connection beyond them is closed at once (a flood of
/// half-open handshakes cannot pile up, nor hold up the accept loop).
const MAX_HANDSHAKES: usize = 256;
/// Handshakes in progress at once from one address: idle connections from one source cannot
/// take the permits everyone else needs.
const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// The ring provider, named explicitly (never a process default that another crate could set).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate this agent presents; empty until it has one (a joining agent).
#[derive(Debug, Default)]
pub struct CertSlot {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertSlot {
    /// Present `node` (with the CA certificate as its chain) from the next handshake on.
    pub fn set(&self, node: &KeyedCert, ca_cert_pem: &str) -> anyhow::Result<()> {
        let key = PrivateKeyDer::from_pem_slice(node.key_pem.as_bytes())
            .context("reading the node key")?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .context("the node key is of an unsupported type")?;
        let chain = vec![cert_der(&node.cert_pem)?, cert_der(ca_cert_pem)?];
        let certified = CertifiedKey::new(chain, signer);
        certified.keys_match().map_err(|e| {
            anyhow::anyhow!("the node key does not belong to the node certificate: {e}")
        })?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(certified));
        Ok(())
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

/// TLS 1.2+ with h2, client certificates verified against the cluster CA when presented.
pub(crate) fn server_config(
    ca_cert_pem: &str,
    slot: Arc<CertSlot>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let mut roots = RootCertStore::empty();
    roots
        .add(cert_der(ca_cert_pem)?)
        .context("the CA certificate")?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(slot);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Handshakes in progress per source address.
#[derive(Clone, Default)]
struct PerAddress(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One handshake's place in its address's count, given back when dropped.
struct Seat {
    counts: PerAddress,
    ip: IpAddr,
}

impl PerAddress {
    /// A seat for a handshake from `ip`, unless it already has its share in progress.
    fn enter(&self, ip: IpAddr) -> Option<Seat> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_default();
        if *n >= MAX_HANDSHAKES_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(Seat {
            counts: self.clone(),
            ip,
        })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
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
            let Some(seat) = per_address.enter(from.ip()) else {
                debug!(%from, "too many handshakes from this address; connection closed");
                continue;
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                debug!(%from, "too many handshakes in progress; connection closed");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _held = (permit, seat);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => debug!(%from, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%from, "TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) })
}
