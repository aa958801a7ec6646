//! Public `SchedulerService`: read the replicated scheduler policy and queue figures; change
//! the policy (operators and admins).

use gpu_proto::v1 as pb;
use gpu_proto::v1::scheduler_service_server::SchedulerService;
use gpu_raft_store::Command;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::from_proto;
use crate::api::status::invalid;
use crate::api::to_proto;
use crate::raft::Cluster;

pub(crate) struct SchedulerApi {
    pub cluster: Cluster,
    pub auth: Auth,
}

#[tonic::async_trait]
impl SchedulerService for SchedulerApi {
    async fn get_scheduler_status(
        &self,
        req: Request<pb::GetSchedulerStatusRequest>,
    ) -> Result<Response<pb::SchedulerStatus>, Status> {
        self.auth
            .check(&req, "scheduler.status", "scheduler", Action::ReadCluster)
            .await?;
        if !req.into_inner().stale {
            self.cluster.linearizable_read().await?;
        }
        Ok(Response::new(
            self.cluster.state.read(to_proto::scheduler_status),
        ))
    }

    async fn set_scheduler_policy(
        &self,
        req: Request<pb::SetSchedulerPolicyRequest>,
    ) -> Result<Response<pb::SchedulerStatus>, Status> {
        let caller = self
            .auth
            .check(
                &req,
                "scheduler.policy.set",
                "scheduler",
                Action::ManageScheduler,
            )
            .await?;
        let current = self.cluster.state.read(|s| s.scheduler.clone());
        let settings = from_proto::scheduler_settings(req.get_ref(), &current).map_err(invalid)?;
        // Early, friendly errors; apply re-checks.
        settings.validate().map_err(invalid)?;
        self.cluster
            .write_as(Command::SetSchedulerPolicy { settings }, caller.on_behalf())
            .await?;
        Ok(Response::new(
            self.cluster.state.read(to_proto::scheduler_status),
        ))
    }
}
