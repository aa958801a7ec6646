//! Public `ClusterService`: the Raft group's state as the leader (or, with `stale`, this agent)
//! sees it, this agent's replica digest, and backups of the replicated state.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;

use gpu_proto::internal::v1::LeaderStatusRequest;
use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_server::ClusterService;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::leader_route::{Route, route};
use crate::api::to_proto::{self, Liveness};
use crate::raft::peer_client::with_deadline;
use crate::raft::{Attempt, Cluster, ClusterError, retry_until, transfer};
use gpu_raft_store::Command;

pub(crate) struct ClusterApi {
    pub cluster: Cluster,
    pub auth: Auth,
    pub reachable_within: Duration,
    /// What backups name as their source cluster: the CA certificate's fingerprint.
    pub cluster_id: String,
}

/// This agent's view; with `liveness` (leader only) members carry reachability.
pub(crate) fn status_view(
    cluster: &Cluster,
    reachable_within: Option<Duration>,
) -> pb::ClusterStatus {
    let liveness = reachable_within.map(|r| Liveness {
        contacts: &cluster.contacts,
        reachable_within: r,
    });
    let protocols = cluster.state.read(|s| {
        s.nodes
            .iter()
            .map(|(&id, n)| (id, n.protocol))
            .collect::<BTreeMap<_, _>>()
    });
    to_proto::cluster_status(
        &cluster.view(),
        &protocols,
        cluster.voter_target(),
        liveness,
    )
}

/// Hand leadership over as the leader (`to`, or the best voter): who leads afterwards.
pub(crate) async fn transfer_here(
    cluster: &Cluster,
    reachable_within: Duration,
    req: pb::TransferLeadershipRequest,
) -> Result<pb::TransferLeadershipResponse, Status> {
    let view = cluster.view();
    if !view.is_leader {
        return Err(Status::unavailable("this agent is not the leader"));
    }
    if req.from.is_some_and(|from| from != cluster.id) {
        return Ok(pb::TransferLeadershipResponse {
            from: cluster.id,
            leader: cluster.id,
        });
    }
    let to = req.to;
    let answered = |id| cluster.contacts.heard_within(id, reachable_within);
    let to = transfer::choose(&view, to, answered).map_err(Status::failed_precondition)?;
    let leader = transfer::hand_over(cluster, to)
        .await
        .map_err(Status::aborted)?;
    Ok(pb::TransferLeadershipResponse {
        from: cluster.id,
        leader,
    })
}

#[tonic::async_trait]
impl ClusterService for ClusterApi {
    async fn transfer_leadership(
        &self,
        req: Request<pb::TransferLeadershipRequest>,
    ) -> Result<Response<pb::TransferLeadershipResponse>, Status> {
        let caller = self
            .auth
            .check(
                &req,
                "cluster.transfer-leader",
                "cluster",
                Action::ManageNodes,
            )
            .await?;
        let req = req.into_inner();
        let to = req.to;
        let result = match route(&self.cluster) {
            Err(s) => Err(s),
            Ok(Route::Here) => transfer_here(&self.cluster, self.reachable_within, req).await,
            Ok(Route::Leader(mut leader)) => leader
                .transfer_leadership(with_deadline(req, Duration::from_secs(10)))
                .await
                .map(Response::into_inner),
        };
        let outcome = match &result {
            Ok(r) if r.leader == r.from => {
                format!("n{} leads and stays (not the one named)", r.from)
            }
            Ok(r) if Some(r.leader) == to || to.is_none() => {
                format!("leadership moved from n{} to n{}", r.from, r.leader)
            }
            Ok(r) => format!(
                "leadership moved from n{} to n{} (n{} was asked for)",
                r.from,
                r.leader,
                to.unwrap_or_default()
            ),
            Err(s) => format!("leadership transfer refused: {}", s.message()),
        };
        self.cluster
            .write_as(Command::RecordAction { outcome }, caller.on_behalf())
            .await?;
        result.map(Response::new)
    }

    async fn get_status(
        &self,
        req: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        self.auth
            .check(&req, "cluster.status", "cluster", Action::ReadCluster)
            .await?;
        if req.into_inner().stale {
            return Ok(Response::new(status_view(&self.cluster, None)));
        }
        let status = retry_until(Duration::from_secs(5), || async {
            match self.cluster.leader() {
                None => Err(Attempt::Retry(ClusterError::NoLeader)),
                Some((id, _)) if id == self.cluster.id => {
                    Ok(status_view(&self.cluster, Some(self.reachable_within)))
                }
                Some((_, addr)) => {
                    let mut client = self
                        .cluster
                        .peers
                        .get(&addr)
                        .map_err(|s| Attempt::Fail(ClusterError::Remote(s)))?;
                    match client
                        .leader_status(with_deadline(
                            LeaderStatusRequest {},
                            Duration::from_secs(2),
                        ))
                        .await
                    {
                        Ok(r) => Ok(r.into_inner()),
                        Err(s) if s.code() == tonic::Code::Unavailable => {
                            Err(Attempt::Retry(ClusterError::Remote(s)))
                        }
                        Err(s) => Err(Attempt::Fail(ClusterError::Remote(s))),
                    }
                }
            }
        })
        .await?;
        Ok(Response::new(status))
    }

    async fn get_state_digest(
        &self,
        req: Request<pb::GetStateDigestRequest>,
    ) -> Result<Response<pb::StateDigest>, Status> {
        self.auth
            .check(&req, "cluster.digest", "cluster", Action::ReadCluster)
            .await?;
        // One encoding of the state (as a snapshot makes), hashed outside the state lock.
        let (index, sha256) = self.cluster.state.applied_digest();
        Ok(Response::new(to_proto::state_digest(
            self.cluster.id,
            index,
            sha256,
        )))
    }

    async fn save_snapshot(
        &self,
        req: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<pb::ClusterBackup>, Status> {
        let (index, data) = self.backup(&req).await?;
        crate::api::status::fits_in_a_message("the backup (use StreamSnapshot)", data.len())?;
        Ok(Response::new(to_proto::cluster_backup(
            index,
            data,
            self.cluster_id.clone(),
        )))
    }

    type StreamSnapshotStream = BackupStream;

    async fn stream_snapshot(
        &self,
        req: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<BackupStream>, Status> {
        let (index, data) = self.backup(&req).await?;
        let pieces = to_proto::backup_pieces(index, &data, &self.cluster_id, BACKUP_PIECE_BYTES);
        Ok(Response::new(Box::pin(futures::stream::iter(
            pieces.into_iter().map(Ok),
        ))))
    }
}

/// The pieces of a streamed backup.
pub(crate) type BackupStream =
    Pin<Box<dyn Stream<Item = Result<pb::ClusterBackup, Status>> + Send>>;

/// The largest piece of a streamed backup, well inside the message limit.
const BACKUP_PIECE_BYTES: usize = 4 * 1024 * 1024;

impl ClusterApi {
    /// The backup file of the replicated state, at a read index taken after `req` arrived
    /// (admins only).
    async fn backup<T>(&self, req: &Request<T>) -> Result<(u64, Vec<u8>), Status> {
        self.auth
            .check(req, "cluster.snapshot", "cluster", Action::Backup)
            .await?;
        // Everything committed before the call is in the backup.
        self.cluster.linearizable_read().await?;
        Ok(self
            .cluster
            .state
            .backup(&self.cluster_id, crate::clock::now_ms()))
    }
}
