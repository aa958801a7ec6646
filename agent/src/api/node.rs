//! Public `NodeService`: registered agents, their labels and schedulability, and (chaos testing,
//! when the config allows it) faults injected into this agent's Raft transport.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_server::NodeService;
use gpu_raft_store::{Command, NodeId, Rejection, nesting_conflict, validate};
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::from_proto;
use crate::api::image;
use crate::api::leader_route::{Route, route};
use crate::api::node_remove::remove_here;
use crate::api::status::{invalid, rejected};
use crate::api::to_proto;
use crate::host::images::NodeImages;
use crate::raft::Cluster;
use crate::raft::peer_client::with_deadline;
use crate::raft::transport_faults::{FaultRule, TransportFaults};

pub(crate) struct NodeApi {
    pub cluster: Cluster,
    pub auth: Auth,
    /// This agent's Raft transport faults; `None` unless `raft.fault_injection` is set.
    pub transport_faults: Option<TransportFaults>,
    /// This node's container images (pulls asked of this agent for its own node).
    pub images: NodeImages,
}

impl NodeApi {
    async fn consistent(&self, stale: bool) -> Result<(), Status> {
        if !stale {
            self.cluster.linearizable_read().await?;
        }
        Ok(())
    }

    fn node(&self, id: NodeId) -> Result<pb::Node, Status> {
        self.cluster
            .state
            .read(|s| s.nodes.get(&id).map(to_proto::node))
            .ok_or_else(|| rejected(Rejection::UnknownNode { node: id }))
    }

    /// Authorize a node mutation, replicate it with its audit metadata, return the node.
    async fn change<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        id: NodeId,
        cmd: Command,
    ) -> Result<Response<pb::Node>, Status> {
        let caller = self
            .auth
            .check(req, verb, &format!("node/n{id}"), Action::ManageNodes)
            .await?;
        self.cluster.write_as(cmd, caller.on_behalf()).await?;
        Ok(Response::new(self.node(id)?))
    }
}

#[tonic::async_trait]
impl NodeService for NodeApi {
    async fn pull_image(
        &self,
        req: Request<pb::PullImageRequest>,
    ) -> Result<Response<pb::PullImageResponse>, Status> {
        let node = req.get_ref().node_id;
        let caller = self
            .auth
            .check(
                &req,
                "node.pull_image",
                &format!("node/n{node}"),
                Action::ManageNodes,
            )
            .await?;
        let req = req.into_inner();
        validate::free_text("image", &req.image).map_err(invalid)?;
        // The node as the leader knows it (this replica may lag a join).
        self.consistent(false).await?;
        self.node(node)?;
        let image = req.image.clone();
        let result = image::pull_on(&self.cluster, &self.images, req).await;
        // Not a replicated change, but a mutation of the node all the same: audited.
        let outcome = match &result {
            Ok(r) if r.already_present => format!("image {image} already on n{node}"),
            Ok(_) => format!("pulled image {image} on n{node}"),
            Err(s) => format!("pulling image {image} on n{node} failed: {}", s.message()),
        };
        self.cluster
            .write_as(Command::RecordAction { outcome }, caller.on_behalf())
            .await?;
        result.map(Response::new)
    }

    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.auth
            .check(&req, "node.list", "node/*", Action::ReadCluster)
            .await?;
        self.consistent(req.into_inner().stale).await?;
        let nodes = self
            .cluster
            .state
            .read(|s| s.nodes.values().map(to_proto::node).collect());
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn get_node(
        &self,
        req: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let id = req.get_ref().id;
        self.auth
            .check(
                &req,
                "node.get",
                &format!("node/n{id}"),
                Action::ReadCluster,
            )
            .await?;
        self.consistent(req.into_inner().stale).await?;
        Ok(Response::new(self.node(id)?))
    }

    async fn label_node(
        &self,
        req: Request<pb::LabelNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let id = req.get_ref().id;
        let object = format!("node/n{id}");
        let caller = self
            .auth
            .check(&req, "node.label", &object, Action::ManageNodes)
            .await?;
        let r = req.get_ref();
        let set: BTreeMap<String, String> = r.set.clone().into_iter().collect();
        let remove: BTreeSet<String> = r.remove.iter().cloned().collect();
        if set.is_empty() && remove.is_empty() {
            return Err(invalid(
                "nothing to change: give labels to set or keys to remove",
            ));
        }
        if set.len() > validate::MAX_LABELS || remove.len() > validate::MAX_LABELS {
            return Err(invalid(format!(
                "at most {} labels per request",
                validate::MAX_LABELS
            )));
        }
        for (k, v) in &set {
            validate::user_label_key(k).map_err(invalid)?;
            validate::label_value(v).map_err(invalid)?;
        }
        for k in &remove {
            validate::label_key(k).map_err(invalid)?;
        }
        self.consistent(false).await?;
        if let Some(why) = self.cluster.state.read(|s| {
            let mut after = s.nodes.get(&id)?.clone();
            after.labels = after.labels_after(&set, &remove);
            let others = s
                .nodes
                .iter()
                .map(|(n, r)| (*n, r.effective_labels().into_owned()));
            nesting_conflict(id, &after.effective_labels(), others)
        }) {
            return Err(Status::failed_precondition(format!(
                "{why}; nothing was changed"
            )));
        }
        let cmd = Command::SetNodeLabels {
            node: id,
            set,
            remove,
        };
        self.cluster.write_as(cmd, caller.on_behalf()).await?;
        Ok(Response::new(self.node(id)?))
    }

    async fn cordon_node(
        &self,
        req: Request<pb::CordonNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let pb::CordonNodeRequest { id, cordoned } = *req.get_ref();
        let verb = if cordoned {
            "node.cordon"
        } else {
            "node.uncordon"
        };
        self.change(&req, verb, id, Command::CordonNode { node: id, cordoned })
            .await
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let pb::DrainNodeRequest { id, evict } = *req.get_ref();
        if evict {
            self.consistent(false).await?;
            if let Some(why) = self.cluster.state.read(|s| s.eviction_strands(id)) {
                return Err(Status::failed_precondition(why));
            }
        }
        self.change(
            &req,
            "node.drain",
            id,
            Command::DrainNode { node: id, evict },
        )
        .await
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let id = req.get_ref().id;
        let caller = self
            .auth
            .check(
                &req,
                "node.remove",
                &format!("node/n{id}"),
                Action::ManageNodes,
            )
            .await?;
        let req = req.into_inner();
        let result = match route(&self.cluster) {
            Err(s) => Err(s),
            Ok(Route::Here) => remove_here(&self.cluster, id).await,
            Ok(Route::Leader(mut leader)) => leader
                .remove_node(with_deadline(req, Duration::from_secs(30)))
                .await
                .map(Response::into_inner),
        };
        let outcome = match &result {
            Ok(r) => format!("removed n{id}, revoked {}", r.revoked.join(", ")),
            Err(s) => format!("removing n{id} refused: {}", s.message()),
        };
        self.cluster
            .write_as(Command::RecordAction { outcome }, caller.on_behalf())
            .await?;
        result.map(Response::new)
    }

    async fn inject_network_fault(
        &self,
        req: Request<pb::InjectNetworkFaultRequest>,
    ) -> Result<Response<pb::InjectNetworkFaultResponse>, Status> {
        let object = format!("node/n{}/raft-transport", req.get_ref().node_id);
        let caller = self
            .auth
            .check(
                &req,
                "node.inject-network-fault",
                &object,
                Action::InjectNetworkFaults,
            )
            .await?;
        let checked = self.transport_rule(req.get_ref());
        // Not a replicated change, but a mutation all the same: it goes in the audit log, and
        // before the rule takes effect (a rule that cuts this agent off could stop the write).
        let outcome = match &checked {
            Ok((_, what)) => what.clone(),
            Err(s) => format!("failed: {}", s.message()),
        };
        self.cluster
            .write_as(Command::RecordAction { outcome }, caller.on_behalf())
            .await?;
        let ((faults, rule), _) = checked?;
        faults.set(rule, req.get_ref().seed);
        Ok(Response::new(pb::InjectNetworkFaultResponse {}))
    }
}

impl NodeApi {
    /// The faults handle and the validated rule the request asks for, with what it does (for the
    /// audit log).
    fn transport_rule(
        &self,
        req: &pb::InjectNetworkFaultRequest,
    ) -> Result<((TransportFaults, FaultRule), String), Status> {
        let faults = self.transport_faults.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "fault injection is disabled on this agent (raft.fault_injection = false)",
            )
        })?;
        if req.node_id != self.cluster.id {
            return Err(invalid(format!(
                "this is node {}, not node {}: send the request to the agent to fault",
                self.cluster.id, req.node_id
            )));
        }
        let rule = from_proto::fault_rule(req);
        rule.validate().map_err(invalid)?;
        let what = if rule.is_none() {
            "raft transport healed".to_owned()
        } else {
            format!("raft transport faults {rule:?} seed {}", req.seed)
        };
        Ok(((faults.clone(), rule), what))
    }
}
