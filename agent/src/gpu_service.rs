//! Public `GpuService`: every GPU of the cluster with live telemetry gathered from the agents
//! that own them, and simulated fault injection forwarded to the owning agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_proto::internal::v1::LocalGpuTelemetryRequest;
use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_server::GpuService;
use gpu_raft_store::{Command, NodeId};
use tonic::{Request, Response, Status};

use crate::auth::Auth;
use crate::auth::rbac::Action;
use crate::cluster::Cluster;
use crate::gpu::{Fault, GpuBackend, GpuError};
use crate::peer_client::with_deadline;
use crate::status::invalid;
use crate::to_proto;

const TELEMETRY_DEADLINE: Duration = Duration::from_secs(1);

pub struct GpuApi {
    pub cluster: Cluster,
    pub auth: Auth,
    pub gpus: Arc<dyn GpuBackend>,
}

/// This agent's GPUs, sampled now, keyed by index.
pub fn local_telemetry(gpus: &dyn GpuBackend) -> HashMap<u32, pb::GpuTelemetry> {
    gpus.sample()
        .into_iter()
        .map(|s| {
            let t = pb::GpuTelemetry {
                utilization_pct: s.utilization_pct,
                memory_used_mib: s.memory_used_mib,
                temperature_c: s.temperature_c,
                power_w: s.power_w,
                power_limit_w: s.power_limit_w,
                sm_clock_mhz: s.sm_clock_mhz,
                healthy: s.healthy,
                error: s.error.unwrap_or_default(),
            };
            (s.index, t)
        })
        .collect()
}

/// Apply a fault request to this agent's backend.
pub fn local_inject(gpus: &dyn GpuBackend, req: &pb::InjectFaultRequest) -> Result<(), Status> {
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
            return Some(local_telemetry(self.gpus.as_ref()));
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
            return Err(Status::not_found(format!("node {id} is not registered")));
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
            .write_as(Command::RecordAction { outcome }, Some(caller.meta))
            .await?;
        result.map(|()| Response::new(pb::InjectFaultResponse {}))
    }
}

impl GpuApi {
    /// Inject the fault here, or on the agent that owns the GPU.
    async fn inject(&self, req: pb::InjectFaultRequest) -> Result<(), Status> {
        if req.node_id == self.cluster.id {
            return local_inject(self.gpus.as_ref(), &req);
        }
        let addr = self
            .cluster
            .state
            .read(|s| s.nodes.get(&req.node_id).map(|n| n.addr.clone()))
            .ok_or_else(|| Status::not_found(format!("node {} is not registered", req.node_id)))?;
        let mut client = self.cluster.peers.get(&addr)?;
        client
            .local_inject_fault(with_deadline(req, Duration::from_secs(5)))
            .await?;
        Ok(())
    }
}
