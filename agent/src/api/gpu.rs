//! Public `GpuService`: every GPU of the cluster with live telemetry gathered from the agents
//! that own them, and simulated fault injection forwarded to the owning agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_proto::internal::v1::LocalGpuTelemetryRequest;
use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_server::GpuService;
use gpu_raft_store::mig;
use gpu_raft_store::{Command, GpuMode, NodeId, PartitionSpec, Rejection};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::status::{invalid, rejected};
use crate::api::to_proto;
use crate::clock::now_ms;
use crate::gpu::{Fault, GpuBackend, GpuError};
use crate::monitor::Telemetry;
use crate::monitor::attribution::job_of_pid;
use crate::raft::Cluster;
use crate::raft::peer_client::with_deadline;

const TELEMETRY_DEADLINE: Duration = Duration::from_secs(1);
/// A day of 1 Hz history is a few MB: give the owning agent time to send it.
const STATS_DEADLINE: Duration = Duration::from_secs(10);

pub(crate) struct GpuApi {
    pub cluster: Cluster,
    pub auth: Auth,
    pub gpus: Arc<dyn GpuBackend>,
    pub telemetry: Telemetry,
}

/// This agent's GPUs as last sampled, keyed by index.
pub(crate) fn local_telemetry(telemetry: &Telemetry) -> HashMap<u32, pb::GpuTelemetry> {
    telemetry
        .latest()
        .into_iter()
        .map(|r| {
            (
                r.sample.index,
                to_proto::gpu_telemetry(r.sample, job_of_pid),
            )
        })
        .collect()
}

/// The history of one of this agent's GPUs.
pub(crate) fn local_stats(
    telemetry: &Telemetry,
    gpus: &dyn GpuBackend,
    node_id: NodeId,
    req: &pb::GetGpuStatsRequest,
) -> Result<pb::GetGpuStatsResponse, Status> {
    let count = gpus.devices().len();
    if req.gpu_index as usize >= count {
        return Err(Status::not_found(format!(
            "node {node_id} has no GPU {} (it has {count})",
            req.gpu_index
        )));
    }
    let from = match req.since_ms {
        0 => 0,
        back => now_ms().saturating_sub(back),
    };
    let readings = telemetry
        .since(req.gpu_index, from)
        .into_iter()
        .map(|r| pb::GpuReading {
            at_ms: r.at_ms,
            telemetry: Some(to_proto::gpu_telemetry(r.sample, job_of_pid)),
        })
        .collect();
    Ok(pb::GetGpuStatsResponse {
        node_id,
        gpu_index: req.gpu_index,
        readings,
    })
}

/// Apply a fault request to this agent's backend.
pub(crate) fn local_inject(
    gpus: &dyn GpuBackend,
    req: &pb::InjectFaultRequest,
) -> Result<(), Status> {
    let fault = match pb::GpuFault::try_from(req.fault) {
        Ok(pb::GpuFault::Overheat) => Fault::Overheat,
        Ok(pb::GpuFault::Xid) => Fault::Xid(req.xid),
        Ok(pb::GpuFault::Ecc) => Fault::EccError,
        Ok(pb::GpuFault::Lost) => Fault::Lost,
        Ok(pb::GpuFault::Clear) => Fault::Clear,
        _ => return Err(invalid(format!("unknown fault {}", req.fault))),
    };
    gpus.inject(req.gpu_index, fault).map_err(|e| match e {
        GpuError::NoSuchGpu { .. } => Status::not_found(e.to_string()),
        GpuError::Unsupported { .. } => Status::failed_precondition(e.to_string()),
        other => Status::internal(other.to_string()),
    })
}

impl GpuApi {
    async fn telemetry_of(
        &self,
        node: NodeId,
        addr: String,
    ) -> Option<HashMap<u32, pb::GpuTelemetry>> {
        if node == self.cluster.id {
            return Some(local_telemetry(&self.telemetry));
        }
        let mut client = self.cluster.peers.get(&addr).ok()?;
        let reply = client
            .local_gpu_telemetry(with_deadline(
                LocalGpuTelemetryRequest {},
                TELEMETRY_DEADLINE,
            ))
            .await;
        reply
            .ok()
            .map(|r| r.into_inner().gpus.into_iter().collect())
    }
}

#[tonic::async_trait]
impl GpuService for GpuApi {
    async fn list_gpus(
        &self,
        req: Request<pb::ListGpusRequest>,
    ) -> Result<Response<pb::ListGpusResponse>, Status> {
        self.auth
            .check(&req, "gpu.list", "gpu/*", Action::ReadCluster)
            .await?;
        let only = req.into_inner().node_id;
        let nodes: Vec<pb::Node> = self.cluster.state.read(|s| {
            s.nodes
                .values()
                .filter(|n| only.is_none_or(|id| id == n.id))
                .map(to_proto::node)
                .collect()
        });
        if let Some(id) = only
            && nodes.is_empty()
        {
            return Err(rejected(Rejection::UnknownNode { node: id }));
        }
        let samples = futures::future::join_all(
            nodes
                .iter()
                .map(|n| self.telemetry_of(n.id, n.addr.clone())),
        )
        .await;
        let gpus = nodes
            .into_iter()
            .zip(samples)
            .flat_map(|(node, telemetry)| {
                node.gpus.into_iter().map(move |gpu| pb::GpuStatus {
                    node_id: node.id,
                    telemetry: telemetry.as_ref().and_then(|t| t.get(&gpu.index).cloned()),
                    gpu: Some(gpu),
                })
            })
            .collect();
        Ok(Response::new(pb::ListGpusResponse { gpus }))
    }

    async fn get_gpu_stats(
        &self,
        req: Request<pb::GetGpuStatsRequest>,
    ) -> Result<Response<pb::GetGpuStatsResponse>, Status> {
        let object = format!("gpu/n{}/{}", req.get_ref().node_id, req.get_ref().gpu_index);
        self.auth
            .check(&req, "gpu.stats", &object, Action::ReadCluster)
            .await?;
        let req = req.into_inner();
        if req.node_id == self.cluster.id {
            return local_stats(&self.telemetry, self.gpus.as_ref(), self.cluster.id, &req)
                .map(Response::new);
        }
        let mut client = self.peer_of(req.node_id)?;
        let reply = client
            .local_gpu_stats(with_deadline(req, STATS_DEADLINE))
            .await?;
        Ok(reply)
    }

    async fn get_energy(
        &self,
        req: Request<pb::GetEnergyRequest>,
    ) -> Result<Response<pb::EnergyReport>, Status> {
        self.auth
            .check(&req, "gpu.energy", "gpu/*", Action::ReadCluster)
            .await?;
        if !req.get_ref().stale {
            self.cluster.linearizable_read().await?;
        }
        Ok(Response::new(self.cluster.state.read(to_proto::energy)))
    }

    async fn inject_fault(
        &self,
        req: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        let object = format!("gpu/n{}/{}", req.get_ref().node_id, req.get_ref().gpu_index);
        let caller = self
            .auth
            .check(&req, "gpu.inject", &object, Action::ManageNodes)
            .await?;
        let result = self.inject(req.into_inner()).await;
        // Not a replicated change, but a mutation all the same: it goes in the audit log.
        let outcome = match &result {
            Ok(()) => "ok".to_owned(),
            Err(s) => format!("failed: {}", s.message()),
        };
        self.cluster
            .write_as(Command::RecordAction { outcome }, caller.on_behalf())
            .await?;
        result.map(|()| Response::new(pb::InjectFaultResponse {}))
    }

    async fn set_gpu_partition(
        &self,
        req: Request<pb::SetGpuPartitionRequest>,
    ) -> Result<Response<pb::Gpu>, Status> {
        let r = req.get_ref();
        let (node, gpu) = (r.node_id, r.gpu_index);
        let caller = self
            .auth
            .check(
                &req,
                "gpu.partition",
                &format!("gpu/n{node}/{gpu}"),
                Action::ManageNodes,
            )
            .await?;
        let r = req.into_inner();
        let mode = GpuMode::parse(r.mode.trim()).map_err(invalid)?;
        let model = self.cluster.state.read(|s| {
            s.nodes
                .get(&node)
                .and_then(|n| n.gpu(gpu))
                .map(|g| g.model.clone())
        });
        let Some(model) = model else {
            return Err(Status::not_found(format!(
                "GPU n{node}/{gpu} does not exist"
            )));
        };
        let layout = match (mode, mig::model(&model)) {
            (GpuMode::Mig, Some(m)) => m.parse_layout(&r.mig).map_err(invalid)?,
            (GpuMode::Mig, None) => return Err(invalid(format!("{model} is not MIG-capable"))),
            _ if !r.mig.is_empty() => {
                return Err(invalid(format!(
                    "a MIG layout needs mode mig, not {}",
                    mode.name()
                )));
            }
            _ => Vec::new(),
        };
        let cmd = Command::SetGpuPartition {
            node,
            gpu,
            partition: PartitionSpec { mode, mig: layout },
            if_idle: false,
        };
        self.cluster.write_as(cmd, caller.on_behalf()).await?;
        let gpu = self.cluster.state.read(|s| {
            s.nodes
                .get(&node)
                .map(to_proto::node)
                .and_then(|n| n.gpus.into_iter().find(|g| g.index == gpu))
        });
        gpu.map(Response::new)
            .ok_or_else(|| Status::not_found(format!("GPU n{node}/{} is gone", r.gpu_index)))
    }
}

impl GpuApi {
    /// A client of node `node`'s agent.
    fn peer_of(&self, node: NodeId) -> Result<RaftPeerClient<Channel>, Status> {
        let addr = self
            .cluster
            .state
            .read(|s| s.nodes.get(&node).map(|n| n.addr.clone()))
            .ok_or_else(|| rejected(Rejection::UnknownNode { node }))?;
        self.cluster.peers.get(&addr)
    }

    /// Inject the fault here, or on the agent that owns the GPU.
    async fn inject(&self, req: pb::InjectFaultRequest) -> Result<(), Status> {
        if req.node_id == self.cluster.id {
            return local_inject(self.gpus.as_ref(), &req);
        }
        let mut client = self.peer_of(req.node_id)?;
        client
            .local_inject_fault(with_deadline(req, Duration::from_secs(5)))
            .await?;
        Ok(())
    }
}
