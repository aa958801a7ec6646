//! Outgoing connections to other agents: one lazily connected tonic channel per peer address,
//! reused by Raft replication, write forwarding and joins. With TLS configured, every channel
//! speaks TLS with it; configuring new material (a renewed certificate) drops the old channels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
pub struct PeerClients {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    tls: Option<ClientTlsConfig>,
    channels: HashMap<String, Channel>,
}

impl PeerClients {
    /// Speak TLS with `config` from now on (new channels; calls in flight finish on the old).
    pub fn use_tls(&self, config: ClientTlsConfig) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tls = Some(config);
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

fn connect_lazy(addr: &str, tls: Option<ClientTlsConfig>) -> Result<Channel, tonic::Status> {
    let bad = |e: tonic::transport::Error| {
        tonic::Status::invalid_argument(format!("peer address {addr}: {e}"))
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(bad)?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(bad)?;
    }
    Ok(endpoint.connect_lazy())
}

/// A request with a deadline and our protocol version, the way every peer call is made.
pub(crate) fn with_deadline<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(deadline);
    crate::raft::protocol::stamp(&mut req);
    req
}
