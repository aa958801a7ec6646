//! Outgoing connections to other agents: one lazily connected tonic channel per peer address,
//! reused by Raft replication, write forwarding and joins. With TLS configured, every channel
//! dials through `TlsDialer` with the agent's own rustls configuration
//! (`tls::client::peer_config`: the cluster's CAs, and its revocation list); configuring new
//! material (a renewed certificate, a CA rotation) drops the old channels.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
pub struct PeerClients {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    tls: Option<Arc<ClientConfig>>,
    channels: HashMap<String, Channel>,
}

impl PeerClients {
    /// Speak TLS with `config` from now on (new channels; calls in flight finish on the old).
    pub fn use_tls(&self, config: Arc<ClientConfig>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tls = Some(config);
        inner.channels.clear();
    }

    /// Drop every channel: the next call to a peer dials it again (and checks its
    /// certificate anew). Calls in flight finish on the old channels.
    pub fn redial(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.channels.clear();
    }

    /// The client for `addr`, creating its channel on first use.
    pub fn get(&self, addr: &str) -> Result<RaftPeerClient<Channel>, tonic::Status> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let channel = match inner.channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = connect_lazy(addr, inner.tls.clone())?;
                inner.channels.insert(addr.to_owned(), c.clone());
                c
            }
        };
        Ok(RaftPeerClient::new(channel)
            .max_decoding_message_size(gpu_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(gpu_proto::MAX_MESSAGE_BYTES))
    }
}

fn connect_lazy(addr: &str, tls: Option<Arc<ClientConfig>>) -> Result<Channel, tonic::Status> {
    let bad = |e: tonic::transport::Error| {
        tonic::Status::invalid_argument(format!("peer address {addr}: {e}"))
    };
    // The scheme only names the transport to tonic: TLS, when configured, is the dialer's.
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(bad)?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(match tls {
        Some(config) => endpoint.connect_with_connector_lazy(TlsDialer(TlsConnector::from(config))),
        None => endpoint.connect_lazy(),
    })
}

/// Dials a peer over TCP and TLS, verifying it as the agent name (never by address).
#[derive(Clone)]
struct TlsDialer(TlsConnector);

type Dialed = TokioIo<TlsStream<TcpStream>>;

impl tower::Service<Uri> for TlsDialer {
    type Response = Dialed;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Dialed, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.0.clone();
        Box::pin(async move {
            let host = uri.host().ok_or("a peer address without a host")?;
            let port = uri.port_u16().ok_or("a peer address without a port")?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(gpu_proto::TLS_SERVER_NAME)?;
            Ok(TokioIo::new(connector.connect(name, tcp).await?))
        })
    }
}

/// A request with a deadline and our protocol version, the way every peer call is made.
pub(crate) fn with_deadline<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(deadline);
    crate::raft::protocol::stamp(&mut req);
    req
}
