//! Public `AlertService`: alerts raised by the agents, and the rules in force (list for anyone
//! who may read the cluster; set and delete replicated rules for operators and admins).

use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_server::AlertService;
use gpu_raft_store::alert::builtin_rules;
use gpu_raft_store::{AlertRule, Command};
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::from_proto;
use crate::api::status::invalid;
use crate::api::to_proto;
use crate::raft::Cluster;

pub(crate) struct AlertApi {
    pub cluster: Cluster,
    pub auth: Auth,
    /// This agent's configured rules.
    pub configured: Vec<AlertRule>,
}

#[tonic::async_trait]
impl AlertService for AlertApi {
    async fn list_alerts(
        &self,
        req: Request<pb::ListAlertsRequest>,
    ) -> Result<Response<pb::ListAlertsResponse>, Status> {
        self.auth
            .check(&req, "alert.list", "alert/*", Action::ReadCluster)
            .await?;
        let req = req.into_inner();
        if !req.stale {
            self.cluster.linearizable_read().await?;
        }
        let alerts = self.cluster.state.read(|s| {
            s.alerts
                .values()
                .filter(|a| req.include_resolved || a.is_open())
                .map(to_proto::alert)
                .collect()
        });
        Ok(Response::new(pb::ListAlertsResponse { alerts }))
    }

    async fn list_alert_rules(
        &self,
        req: Request<pb::ListAlertRulesRequest>,
    ) -> Result<Response<pb::ListAlertRulesResponse>, Status> {
        self.auth
            .check(&req, "alert.rule.list", "alert-rule/*", Action::ReadCluster)
            .await?;
        self.cluster.linearizable_read().await?;
        let replicated = self.cluster.state.read(|s| s.alert_rules.clone());
        let mut rules: std::collections::BTreeMap<String, pb::AlertRule> = builtin_rules()
            .iter()
            .map(|r| (r.name.clone(), to_proto::alert_rule(r, "builtin")))
            .collect();
        for r in &self.configured {
            rules.insert(r.name.clone(), to_proto::alert_rule(r, "config"));
        }
        for r in replicated.values() {
            rules.insert(r.name.clone(), to_proto::alert_rule(r, "replicated"));
        }
        Ok(Response::new(pb::ListAlertRulesResponse {
            rules: rules.into_values().collect(),
        }))
    }

    async fn set_alert_rule(
        &self,
        req: Request<pb::AlertRule>,
    ) -> Result<Response<pb::AlertRule>, Status> {
        let object = format!("alert-rule/{}", req.get_ref().name);
        let caller = self
            .auth
            .check(&req, "alert.rule.set", &object, Action::ManageAlerts)
            .await?;
        let rule = from_proto::alert_rule(req.into_inner())
            .to_rule()
            .map_err(invalid)?;
        self.cluster
            .write_as(
                Command::SetAlertRule { rule: rule.clone() },
                caller.on_behalf(),
            )
            .await?;
        Ok(Response::new(to_proto::alert_rule(&rule, "replicated")))
    }

    async fn delete_alert_rule(
        &self,
        req: Request<pb::DeleteAlertRuleRequest>,
    ) -> Result<Response<pb::DeleteAlertRuleResponse>, Status> {
        let name = req.get_ref().name.clone();
        let caller = self
            .auth
            .check(
                &req,
                "alert.rule.delete",
                &format!("alert-rule/{name}"),
                Action::ManageAlerts,
            )
            .await?;
        self.cluster
            .write_as(Command::DeleteAlertRule { name }, caller.on_behalf())
            .await?;
        Ok(Response::new(pb::DeleteAlertRuleResponse {}))
    }
}
