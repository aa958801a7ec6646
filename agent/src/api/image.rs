//! `NodeService.PullImage`'s work: pull a container image on this agent's node, or forward
//! the request to the node's own agent (`RaftPeer.LocalPullImage`), which answers when its pull
//! has ended.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_raft_store::Rejection;
use gpu_raft_store::container::{canonical_image, image_reference};
use tonic::Status;

use crate::api::status::{invalid, pull_failed, rejected};
use crate::host::images::NodeImages;
use crate::raft::Cluster;
use crate::raft::peer_client::with_deadline;

/// The longest a forwarded pull may take (large training images over a slow link).
const PULL_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Pull `req.image` on this node.
pub(crate) async fn pull_here(
    images: &NodeImages,
    req: &pb::PullImageRequest,
) -> Result<pb::PullImageResponse, Status> {
    image_reference(&req.image).map_err(invalid)?;
    let already_present = images.pull(&req.image).await.map_err(pull_failed)?;
    Ok(pb::PullImageResponse {
        node_id: req.node_id,
        image: canonical_image(&req.image),
        already_present,
    })
}

/// Pull `req.image` on node `req.node_id`: here, or through its agent.
pub(crate) async fn pull_on(
    cluster: &Cluster,
    images: &NodeImages,
    req: pb::PullImageRequest,
) -> Result<pb::PullImageResponse, Status> {
    image_reference(&req.image).map_err(invalid)?;
    if req.node_id == cluster.id {
        return pull_here(images, &req).await;
    }
    let node = req.node_id;
    let addr = cluster
        .state
        .read(|s| s.nodes.get(&node).map(|n| n.addr.clone()))
        .ok_or_else(|| rejected(Rejection::UnknownNode { node }))?;
    let mut client = cluster.peers.get(&addr)?;
    let reply = client
        .local_pull_image(with_deadline(req, PULL_DEADLINE))
        .await?;
    Ok(reply.into_inner())
}
