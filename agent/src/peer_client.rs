//! Outgoing connections to other agents: one lazily connected tonic channel per peer address,
//! reused by Raft replication, write forwarding and joins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use tonic::transport::{Channel, Endpoint};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
pub struct PeerClients {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl PeerClients {
    /// The client for `addr`, creating its channel on first use.
    pub fn get(&self, addr: &str) -> Result<RaftPeerClient<Channel>, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| {
                        tonic::Status::invalid_argument(format!("peer address {addr}: {e}"))
                    })?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .connect_lazy();
                channels.insert(addr.to_owned(), c.clone());
                c
            }
        };
        Ok(RaftPeerClient::new(channel)
            .max_decoding_message_size(gpu_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(gpu_proto::MAX_MESSAGE_BYTES))
    }
}

/// A request with a deadline, the way every peer call is made.
pub fn with_deadline<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(deadline);
    req
}
