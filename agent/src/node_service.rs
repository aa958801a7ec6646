//! Public `NodeService`: registered agents and their labels.

use std::collections::{BTreeMap, BTreeSet};

use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_server::NodeService;
use gpu_raft_store::{Command, NodeId, validate};
use tonic::{Request, Response, Status};

use crate::cluster::Cluster;
use crate::status::invalid;
use crate::to_proto;

pub struct NodeApi {
    pub cluster: Cluster,
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
            .ok_or_else(|| Status::not_found(format!("node {id} is not registered")))
    }
}

#[tonic::async_trait]
impl NodeService for NodeApi {
    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
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
        let req = req.into_inner();
        self.consistent(req.stale).await?;
        Ok(Response::new(self.node(req.id)?))
    }

    async fn label_node(
        &self,
        req: Request<pb::LabelNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let req = req.into_inner();
        let set: BTreeMap<String, String> = req.set.into_iter().collect();
        let remove: BTreeSet<String> = req.remove.into_iter().collect();
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
            validate::label_key(k).map_err(invalid)?;
            validate::label_value(v).map_err(invalid)?;
        }
        for k in &remove {
            validate::label_key(k).map_err(invalid)?;
        }
        self.cluster
            .write(Command::SetNodeLabels {
                node: req.id,
                set,
                remove,
            })
            .await?;
        Ok(Response::new(self.node(req.id)?))
    }

    async fn cordon_node(
        &self,
        req: Request<pb::CordonNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let req = req.into_inner();
        self.cluster
            .write(Command::CordonNode {
                node: req.id,
                cordoned: req.cordoned,
            })
            .await?;
        Ok(Response::new(self.node(req.id)?))
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let req = req.into_inner();
        self.cluster
            .write(Command::DrainNode {
                node: req.id,
                evict: req.evict,
            })
            .await?;
        Ok(Response::new(self.node(req.id)?))
    }
}
