//! The internal `RaftPeer` gRPC service: Raft RPCs from other agents, plus joins, forwarded
//! writes, read-index, the leader's status view and certificates. Every call but enrolment
//! needs an agent's certificate, and a Raft message must come from the node it names.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_server::RaftPeer;
use gpu_proto::internal::v1::{
    CampaignRequest, CampaignResponse, FetchSigningKeyRequest, FetchSigningKeyResponse,
    IssueCertificateRequest, IssueCertificateResponse, JoinRequest, JoinResponse,
    LeaderStatusRequest, LocalGpuTelemetryRequest, LocalGpuTelemetryResponse,
    OpenRegistryLoginRequest, OpenRegistryLoginResponse, RaftMessage, ReadArchiveRequest,
    ReadArchiveResponse, ReadIndexRequest, ReadIndexResponse, ReadRunLogRequest,
    RenewCertificateRequest,
};
use gpu_proto::v1 as pb;
use gpu_raft_store::write_trace::{self, Stage};
use gpu_raft_store::{NodeId, PROTOCOL_16, TypeConfig, validate};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest};
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::forwarded::{self, Forwarder};
use crate::api::auth::peer::PeerCheck;
use crate::api::auth::rbac::Action;
use crate::api::cluster::status_view;
use crate::api::gpu::{local_inject, local_stats, local_telemetry};
use crate::api::image::pull_here;
use crate::api::logs::{self, LogRequest, LogStream};
use crate::api::status::{bad_payload, incompatible_peer, invalid, sealing_failed};
use crate::gpu::GpuBackend;
use crate::host::images::NodeImages;
use crate::monitor::Telemetry;
use crate::raft::peer_client::with_deadline;
use crate::raft::peer_message::{self, Encoding};
use crate::raft::{Attempt, Cluster, ClusterError, Proposal};
use crate::raft::{archive_fill, protocol, snapshot_wire};
use crate::tls::registry_login;
use crate::tls::{Subject, TlsIdentity};

pub(crate) struct PeerService {
    pub cluster: Cluster,
    pub reachable_within: std::time::Duration,
    pub gpus: Arc<dyn GpuBackend>,
    pub telemetry: Telemetry,
    pub jobs_dir: PathBuf,
    pub peers: PeerCheck,
    pub auth: Auth,
    /// `None` without TLS.
    pub tls: Option<TlsIdentity>,
    /// This node's container images (`LocalPullImage`).
    pub images: NodeImages,
}

impl PeerService {
    fn tls(&self) -> Result<&TlsIdentity, Status> {
        self.tls
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("this agent runs without TLS"))
    }

    /// Sign `csr_pem` for node `node`, record the certificate through Raft (an enrolment
    /// against its join token), and answer.
    async fn certify(
        &self,
        csr_pem: &str,
        node: NodeId,
        by: Option<crate::raft::OnBehalf>,
        enrolled_with: Option<String>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let tls = self.tls()?;
        let cert = tls
            .issue(
                &self.cluster,
                csr_pem,
                &Subject::Node(node),
                by,
                enrolled_with,
            )
            .await?;
        Ok(Response::new(
            tls.answer(cert).map_err(Status::unavailable)?,
        ))
    }
}

impl PeerService {
    /// An enrolment this agent cannot sign (it holds no CA key), passed on to the leader with
    /// the joiner's own token: the leader checks it again.
    async fn pass_on_enrolment(
        &self,
        req: &Request<IssueCertificateRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let not_a_signer = || Status::from(crate::tls::enroll::IssueError::NotASigner);
        let (leader, addr) = self.cluster.leader().ok_or_else(not_a_signer)?;
        if leader == self.cluster.id {
            return Err(not_a_signer());
        }
        let mut passed = with_deadline(req.get_ref().clone(), Duration::from_secs(10));
        if let Some(bearer) = req.metadata().get("authorization") {
            passed
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        let mut client = self.cluster.peers.get(&addr)?;
        client.issue_certificate(passed).await
    }

    /// The leader's own check of a forwarded write (`forwarded::vouch`), against its replica
    /// brought up to date once when the caller's token is not (yet) known here.
    async fn vouch(
        &self,
        node: NodeId,
        sends_credentials: bool,
        proposal: &mut Proposal,
    ) -> Result<(), Status> {
        let from = Forwarder {
            node,
            voter: self.cluster.view().voters.contains(&node),
            sends_credentials,
        };
        let check = |p: &mut Proposal| {
            self.cluster
                .state
                .read(|s| forwarded::vouch(s, from, p, crate::clock::now_ms()))
        };
        let mut verdict = check(proposal);
        if verdict.is_err() && proposal.credential.is_some() {
            self.cluster.linearizable_read().await.ok();
            verdict = check(proposal);
        }
        verdict.map_err(|why| {
            tracing::warn!(node_id = node, %why, "refused a forwarded write");
            Status::permission_denied(why)
        })
    }
}

/// The protocol version a peer request was served under, as the interceptor negotiated it.
#[derive(Clone, Copy)]
struct Spoken(u32);

/// The peer service's interceptor: refuse (and log once per request) an incompatible caller,
/// and hand the version both speak on to the handler (`Spoken`).
#[allow(clippy::result_large_err)] // tonic's interceptor signature.
pub(crate) fn check_protocol(mut req: Request<()>) -> Result<Request<()>, Status> {
    let header = |key| req.metadata().get(key).map(|v| v.to_str().unwrap_or("?"));
    match protocol::negotiate(header(protocol::HEADER), header(protocol::HEADER_MAX)) {
        Ok(version) => {
            req.extensions_mut().insert(Spoken(version));
            Ok(req)
        }
        Err(e) => {
            tracing::warn!(remote = ?req.remote_addr(), error = %e, "refused a peer");
            Err(incompatible_peer(&e))
        }
    }
}

/// The node a Raft message speaks for (the candidate or the leader in its vote).
fn sender(vote: &openraft::Vote<NodeId>) -> NodeId {
    vote.leader_id().node_id
}

/// A Raft answer in the encoding of the request it answers, naming this agent's build (the
/// leader learns each member's from these).
fn reply<T: Serialize>(value: &T, encoding: Encoding) -> Result<Response<RaftMessage>, Status> {
    let msg = peer_message::pack(value, encoding).map_err(|e| Status::internal(e.to_string()))?;
    let mut resp = Response::new(msg);
    protocol::stamp_build(&mut resp);
    Ok(resp)
}

fn not_leader(attempt: Attempt) -> Status {
    match attempt {
        Attempt::Retry(ClusterError::NoLeader) => {
            Status::unavailable("this agent is not the leader")
        }
        Attempt::Retry(e) | Attempt::Fail(e) => e.into(),
    }
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let encoding = Encoding::of(req.get_ref());
        let rpc: AppendEntriesRequest<TypeConfig> =
            peer_message::unpack(req.get_ref()).map_err(bad_payload)?;
        self.peers.node_is(&req, sender(&rpc.vote))?;
        // The entries' indexes, which are consecutive (the message moves into Raft).
        let indexes = rpc.entries.first().zip(rpc.entries.last());
        let indexes = indexes.map(|(first, last)| first.log_id.index..=last.log_id.index);
        write_trace::stamp_each(Stage::Received, indexes.clone().into_iter().flatten());
        let result = self.cluster.raft.append_entries(rpc).await;
        write_trace::stamp_each(Stage::Replied, indexes.into_iter().flatten());
        // Anything but "your vote is stale" comes from the current leader: we are in contact.
        if result
            .as_ref()
            .is_ok_and(|r| !matches!(r, AppendEntriesResponse::HigherVote(_)))
        {
            self.cluster.contacts.heard_from_leader();
        }
        reply(&result, encoding)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let encoding = Encoding::of(req.get_ref());
        let rpc: VoteRequest<NodeId> = peer_message::unpack(req.get_ref()).map_err(bad_payload)?;
        self.peers.node_is(&req, sender(&rpc.vote))?;
        reply(&self.cluster.raft.vote(rpc).await, encoding)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let node = self.peers.node(&req)?;
        let encoding = Encoding::of(req.get_ref());
        let rpc = snapshot_wire::unpack(req.into_inner())
            .map_err(|e| Status::invalid_argument(format!("undecodable snapshot chunk: {e}")))?;
        PeerCheck::is(node, sender(&rpc.vote))?;
        reply(&self.cluster.raft.install_snapshot(rpc).await, encoding)
    }

    async fn join(&self, req: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        // An agent joins as itself; a member may pass on another agent's join to the leader.
        let caller = self.peers.node(&req)?;
        let spoken = req.extensions().get::<Spoken>().map_or(1, |v| v.0);
        let JoinRequest {
            node_id,
            addr,
            edge,
        } = req.into_inner();
        if node_id == 0 {
            return Err(invalid("node_id must be at least 1"));
        }
        validate::addr(&addr).map_err(invalid)?;
        // Once every member speaks protocol 16 the snapshots are MessagePack, which an older
        // agent cannot read: refuse it here rather than let it fail to catch up. (A member
        // passing on a join speaks for itself, not for the joiner.)
        if caller.is_none_or(|c| c == node_id)
            && spoken < PROTOCOL_16
            && self.cluster.lowest_protocol() >= PROTOCOL_16
        {
            return Err(Status::failed_precondition(format!(
                "every member of this mesh speaks protocol {PROTOCOL_16} or newer and sends \
                 snapshots only such agents read; the joining agent speaks {spoken}: upgrade \
                 it first"
            )));
        }
        if let Some(caller) = caller.filter(|c| *c != node_id) {
            let members = self.cluster.view().members;
            if !members.contains_key(&caller) {
                return Err(Status::permission_denied(format!(
                    "node {caller} may not join the cluster as node {node_id}"
                )));
            }
            // A member passes on joins, but only a node itself may move its own address.
            if members.get(&node_id).is_some_and(|known| *known != addr) {
                return Err(Status::permission_denied(format!(
                    "only node {node_id} may change its own address (node {caller} asked for \
                     {addr}); an agent that moved must ask the leader itself"
                )));
            }
        }
        let voter = self.cluster.join(node_id, addr, edge).await?;
        let leader_id = self.cluster.leader().map_or(0, |(id, _)| id);
        Ok(Response::new(JoinResponse { leader_id, voter }))
    }

    async fn propose(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let from = self.peers.node(&req)?;
        let spoken = req.extensions().get::<Spoken>().map_or(1, |v| v.0);
        let encoding = Encoding::of(req.get_ref());
        let mut proposal: Proposal = peer_message::unpack(req.get_ref()).map_err(bad_payload)?;
        if let Some(node) = from {
            let sends_credentials = spoken >= protocol::CREDENTIALS_FORWARDED;
            self.vouch(node, sends_credentials, &mut proposal).await?;
        }
        let result = self
            .cluster
            .write_as_leader(proposal)
            .await
            .map_err(not_leader)?;
        reply(&result, encoding)
    }

    async fn read_index(
        &self,
        req: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        self.peers.node(&req)?;
        let read_index = self
            .cluster
            .read_index_as_leader()
            .await
            .map_err(not_leader)?;
        Ok(Response::new(ReadIndexResponse { read_index }))
    }

    async fn leader_status(
        &self,
        req: Request<LeaderStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        self.peers.node(&req)?;
        if !self.cluster.view().is_leader {
            return Err(Status::unavailable("this agent is not the leader"));
        }
        Ok(Response::new(status_view(
            &self.cluster,
            Some(self.reachable_within),
        )))
    }

    type ReadJobLogStream = LogStream;

    async fn read_job_log(
        &self,
        req: Request<pb::JobLogsRequest>,
    ) -> Result<Response<LogStream>, Status> {
        self.peers.node(&req)?;
        let req = req.into_inner();
        let generation = self
            .cluster
            .state
            .read(|s| {
                s.jobs
                    .get(&req.job_id)
                    .and_then(|j| j.binding.as_ref())
                    .filter(|b| b.node == self.cluster.id)
                    .map(|b| b.generation)
            })
            .ok_or_else(|| {
                Status::not_found(format!("job j-{} did not run on this node", req.job_id))
            })?;
        let req = LogRequest::of(&req, generation);
        Ok(Response::new(logs::stream(
            &self.jobs_dir,
            self.cluster.clone(),
            req,
        )?))
    }

    async fn read_archive(
        &self,
        req: Request<ReadArchiveRequest>,
    ) -> Result<Response<ReadArchiveResponse>, Status> {
        self.peers.node(&req)?;
        let state = self.cluster.state.clone();
        let req = req.into_inner();
        // Off the async workers: a thousand records read from disk.
        let answer = tokio::task::spawn_blocking(move || archive_fill::serve(&state, &req))
            .await
            .map_err(|e| Status::internal(format!("reading the archive: {e}")))??;
        Ok(Response::new(answer))
    }

    type ReadRunLogStream = LogStream;

    /// The caller (the agent a client asked) resolved the rank and attempt to this node and
    /// generation and authorized the client; this agent serves what it has on disk.
    async fn read_run_log(
        &self,
        req: Request<ReadRunLogRequest>,
    ) -> Result<Response<LogStream>, Status> {
        self.peers.node(&req)?;
        let req = req.into_inner();
        let req = LogRequest {
            job: req.job_id,
            generation: req.generation,
            stream: req.stream,
            follow: req.follow,
            offset: req.offset,
        };
        Ok(Response::new(logs::stream(
            &self.jobs_dir,
            self.cluster.clone(),
            req,
        )?))
    }

    async fn local_gpu_telemetry(
        &self,
        req: Request<LocalGpuTelemetryRequest>,
    ) -> Result<Response<LocalGpuTelemetryResponse>, Status> {
        self.peers.node(&req)?;
        Ok(Response::new(LocalGpuTelemetryResponse {
            gpus: local_telemetry(&self.telemetry).into_iter().collect(),
        }))
    }

    async fn local_gpu_stats(
        &self,
        req: Request<pb::GetGpuStatsRequest>,
    ) -> Result<Response<pb::GetGpuStatsResponse>, Status> {
        self.peers.node(&req)?;
        local_stats(
            &self.telemetry,
            self.gpus.as_ref(),
            self.cluster.id,
            req.get_ref(),
        )
        .map(Response::new)
    }

    async fn open_registry_login(
        &self,
        req: Request<OpenRegistryLoginRequest>,
    ) -> Result<Response<OpenRegistryLoginResponse>, Status> {
        let Some(node) = self.peers.node(&req)? else {
            return Err(Status::failed_precondition(
                "registry logins are opened only over TLS",
            ));
        };
        let r = req.into_inner();
        let found = self.cluster.state.read(|s| {
            let job = s.jobs.get(&r.job_id)?;
            if !registry_login::may_open(job, r.generation, node) {
                return None;
            }
            let image = &job.spec.container.as_ref()?.image;
            let registry = gpu_raft_store::registry::registry_of(image);
            let sealed = s
                .registry_credentials
                .get(&job.spec.tenant)?
                .get(&registry)?
                .clone();
            Some((job.spec.tenant.clone(), registry, sealed))
        });
        let Some((tenant, registry, sealed)) = found else {
            return Err(Status::permission_denied(format!(
                "node {node} has no live run j-{} g{} with a registry login",
                r.job_id, r.generation
            )));
        };
        let material = self
            .tls()?
            .current()
            .ok_or_else(|| sealing_failed(crate::tls::sealing::SealError::NoKey))?;
        let password = crate::tls::sealing::open(&material, &tenant, &registry, &sealed)
            .map_err(sealing_failed)?;
        Ok(Response::new(OpenRegistryLoginResponse {
            registry,
            username: sealed.username,
            password,
        }))
    }

    async fn local_pull_image(
        &self,
        req: Request<pb::PullImageRequest>,
    ) -> Result<Response<pb::PullImageResponse>, Status> {
        self.peers.node(&req)?;
        pull_here(&self.images, req.get_ref())
            .await
            .map(Response::new)
    }

    async fn local_inject_fault(
        &self,
        req: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        self.peers.node(&req)?;
        local_inject(self.gpus.as_ref(), &req.into_inner())?;
        Ok(Response::new(pb::InjectFaultResponse {}))
    }

    async fn issue_certificate(
        &self,
        req: Request<IssueCertificateRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let node = req.get_ref().node_id;
        let caller = self
            .auth
            .check_enrolment(
                &req,
                "node.enrol",
                &format!("node/{node}"),
                Action::JoinNode,
            )
            .await?;
        if node == 0 {
            return Err(invalid("node_id must be at least 1"));
        }
        // The join token's terms, here for a clear answer; `apply` checks them again and
        // counts the use when it records the certificate.
        let is_member = self.cluster.view().members.contains_key(&node);
        let token = &caller.identity.token_id;
        let terms = self.cluster.state.read(|s| {
            s.tokens.get(token).map(|t| {
                t.may_enrol(node)?;
                if is_member {
                    t.may_re_enrol(node)
                } else {
                    Ok(())
                }
            })
        });
        if let Some(Err(why)) = terms {
            self.auth.record_denial(&caller, &why).await;
            return Err(Status::permission_denied(why));
        }
        if !self.tls()?.is_signer() {
            return self.pass_on_enrolment(&req).await;
        }
        self.certify(
            &req.get_ref().csr_pem,
            node,
            caller.on_behalf(),
            Some(token.clone()),
        )
        .await
    }

    async fn fetch_signing_key(
        &self,
        req: Request<FetchSigningKeyRequest>,
    ) -> Result<Response<FetchSigningKeyResponse>, Status> {
        let node = self
            .peers
            .node(&req)?
            .ok_or_else(|| Status::failed_precondition("this agent runs without TLS"))?;
        if !self.cluster.view().voters.contains(&node) {
            return Err(Status::permission_denied(format!(
                "only voters hold the CA key, and node {node} is not one"
            )));
        }
        let ca_key_pem = self
            .tls()?
            .current()
            .and_then(|t| t.ca_key_pem)
            .ok_or_else(|| Status::unavailable("this agent does not hold the CA key"))?;
        tracing::info!(node_id = node, "handed the CA key to a new voter");
        Ok(Response::new(FetchSigningKeyResponse { ca_key_pem }))
    }

    async fn transfer_leadership(
        &self,
        req: Request<pb::TransferLeadershipRequest>,
    ) -> Result<Response<pb::TransferLeadershipResponse>, Status> {
        crate::api::leader_route::from_a_voter(&self.cluster, self.peers.node(&req)?)?;
        crate::api::cluster::transfer_here(&self.cluster, self.reachable_within, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        crate::api::leader_route::from_a_voter(&self.cluster, self.peers.node(&req)?)?;
        crate::api::node_remove::remove_here(&self.cluster, req.get_ref().id)
            .await
            .map(Response::new)
    }

    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let node = self.peers.node(&req)?;
        let leader = self.cluster.view().leader;
        let from = match (node, leader) {
            (Some(n), Some(l)) if n == l => n,
            (None, Some(l)) => l,
            _ => {
                return Err(Status::permission_denied(
                    "only the leader may ask a voter to campaign",
                ));
            }
        };
        if !self.cluster.view().voters.contains(&self.cluster.id) {
            return Err(Status::failed_precondition("a learner cannot lead"));
        }
        tokio::spawn(crate::raft::transfer::campaign(self.cluster.clone(), from));
        Ok(Response::new(CampaignResponse {}))
    }

    async fn renew_certificate(
        &self,
        req: Request<RenewCertificateRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let node = self
            .peers
            .node(&req)?
            .ok_or_else(|| Status::failed_precondition("this agent runs without TLS"))?;
        // Audited, with the node its certificate names as the actor.
        let meta = gpu_raft_store::RequestMeta {
            actor: format!("node {node}"),
            verb: "cert.renew".into(),
            object: format!("node/{node}"),
            request_id: String::new(),
            source: req.remote_addr().map(|a| a.to_string()).unwrap_or_default(),
        };
        let by = crate::raft::OnBehalf {
            meta,
            credential: None,
        };
        self.certify(&req.get_ref().csr_pem, node, Some(by), None)
            .await
    }
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::*;

    #[test]
    fn a_stamped_request_passes_the_check() {
        let mut req = Request::new(());
        protocol::stamp(&mut req);
        let served = check_protocol(req).expect("served");
        let spoken = served.extensions().get::<Spoken>().map(|v| v.0);
        assert_eq!(
            spoken,
            Some(protocol::PROTOCOL_VERSION),
            "handed on to the handler"
        );
        let mut req = Request::new(());
        let newer = protocol::PROTOCOL_VERSION + 1;
        req.metadata_mut()
            .insert(protocol::HEADER, MetadataValue::from(newer));
        let status = check_protocol(req).expect_err("refused");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(
            status.message().contains(&format!("versions {newer}")),
            "{}",
            status.message()
        );
    }
}
