//! openraft's `RaftNetwork` over the internal gRPC peer service. Payloads are openraft's own
//! request and `Result<response, RaftError>` types, in MessagePack to peers of protocol 16 and
//! in JSON to older ones (`peer_message`); a snapshot chunk's bytes travel beside them
//! (`snapshot_wire`). Injected transport faults
//! (`transport_faults`, off unless an admin sets some) are carried out here, per message.

use gpu_proto::internal::v1::RaftMessage;
use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use gpu_raft_store::write_trace::{self, Stage};
use gpu_raft_store::{NodeId, StateReader, TypeConfig};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::raft::peer_message::{self, Encoding};

use crate::raft::contact::ContactBook;
use crate::raft::peer_client::{PeerClients, with_deadline};
use crate::raft::protocol;
use crate::raft::snapshot_wire::{self, SNAPSHOT_BYTES};
use crate::raft::transport_faults::{Decision, TransportFaults};

/// Creates one `PeerLink` per replication target.
#[derive(Clone)]
pub struct NetworkFactory {
    pub peers: PeerClients,
    pub contacts: ContactBook,
    pub faults: TransportFaults,
    /// The replicated state: which protocol each target registered with.
    pub state: StateReader,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerLink {
        PeerLink {
            target,
            addr: node.addr.clone(),
            peers: self.peers.clone(),
            contacts: self.contacts.clone(),
            faults: self.faults.clone(),
            state: self.state.clone(),
        }
    }
}

pub struct PeerLink {
    target: NodeId,
    addr: String,
    peers: PeerClients,
    contacts: ContactBook,
    faults: TransportFaults,
    state: StateReader,
}

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerLink {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let encoding = self.state.read(|s| Encoding::for_peer(s, self.target));
        let msg = peer_message::pack(req, encoding)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.send(rpc, msg, option).await
    }

    /// Send `msg` as `rpc` (through the injected faults, if any) and decode the answer.
    async fn send<Resp, E>(
        &mut self,
        rpc: Rpc,
        msg: RaftMessage,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = self
            .peers
            .get(&self.addr)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let ttl = option.hard_ttl();
        let (delay, copies, lose_reply) = match self.faults.decide(self.target) {
            Decision::Send { delay, copies } => (delay, copies, false),
            Decision::LoseRequest { delay } => {
                // As on a real network, the caller hears nothing until its deadline.
                tokio::time::sleep(delay + ttl).await;
                return Err(RPCError::Network(NetworkError::new(&InjectedLoss)));
            }
            Decision::LoseReply { delay } => (delay, 1, true),
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let send = |mut client: RaftPeerClient<Channel>, msg: RaftMessage| async move {
            let msg = with_deadline(msg, ttl);
            match rpc {
                Rpc::AppendEntries => client.append_entries(msg).await,
                Rpc::Vote => client.vote(msg).await,
                Rpc::InstallSnapshot => client.install_snapshot(msg).await,
            }
        };
        let reply = if copies > 1 {
            // Both copies race; the peer sees the message twice, the caller one answer.
            let (first, _second) =
                tokio::join!(send(client.clone(), msg.clone()), send(client, msg));
            first
        } else {
            send(client, msg).await
        };
        if lose_reply {
            // The peer acted on the message; its answer is lost and the caller waits it out.
            tokio::time::sleep(ttl).await;
            return Err(RPCError::Network(NetworkError::new(&InjectedLoss)));
        }
        let reply = reply.map_err(|status| match status.code() {
            tonic::Code::Unavailable => RPCError::Unreachable(Unreachable::new(&status)),
            _ => RPCError::Network(NetworkError::new(&status)),
        })?;
        self.contacts.heard_from(self.target);
        if let Some(build) = protocol::build_of(&reply) {
            self.contacts.heard_build(self.target, build);
        }
        let result: Result<Resp, RaftError<NodeId, E>> = peer_message::unpack(reply.get_ref())
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// The error of a message lost by an injected fault.
#[derive(Debug, thiserror::Error)]
#[error("lost by an injected transport fault")]
struct InjectedLoss;

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let indexes = || rpc.entries.iter().map(|e| e.log_id.index);
        write_trace::stamp_each(Stage::Sent, indexes());
        let answer = self.call(Rpc::AppendEntries, &rpc, &option).await;
        write_trace::stamp_each(Stage::Acked, indexes());
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let target = self.target;
        let protocol = self
            .state
            .read(|s| s.nodes.get(&target).map_or(0, |n| n.protocol));
        let as_bytes = protocol >= SNAPSHOT_BYTES;
        let msg = snapshot_wire::pack(rpc, as_bytes, Encoding::for_protocol(protocol))
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.send(Rpc::InstallSnapshot, msg, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}
