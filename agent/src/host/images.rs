//! The container images this node holds: listed from its runtime (podman), reported through
//! Raft when the list changes (`Command::ReportImages`, checked every `containers.image_refresh`
//! and at once after a pull here), and pulled on an operator's request (`gpuctl image pull`).
//! Only podman keeps a node-wide image store; apptainer and enroot cache per user, so a node
//! running those reports nothing and refuses pulls.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::container::{MAX_NODE_IMAGES, canonical_image, image_reference};
use gpu_raft_store::{Command, NodeId};
use tokio::process::Command as Process;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{ContainerSettings, RuntimeKind};
use crate::raft::{Cluster, ClusterError};

/// Why a pull on this node failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(
        "node {node} has no podman (its container runtime: {runtime}); only podman keeps images for every job"
    )]
    NoPodman { node: NodeId, runtime: String },
    #[error("pulling image {image} on node {node}: {reason}")]
    Failed {
        node: NodeId,
        image: String,
        reason: String,
    },
}

/// This node's image store, shared by the reporter and the API.
#[derive(Clone, Debug)]
pub struct NodeImages {
    node: NodeId,
    /// podman, when it is the runtime container jobs use here.
    podman: Option<PathBuf>,
    /// What runs container jobs here, for the refusal's text.
    runtime: String,
    /// Wakes the reporter (a pull just ended).
    changed: Arc<Notify>,
}

impl NodeImages {
    pub fn new(node: NodeId, containers: &ContainerSettings) -> Self {
        let installed = containers.installed();
        let runtime = installed
            .as_ref()
            .map_or_else(|| "none".to_owned(), |(kind, _)| kind.to_string());
        let podman = installed
            .filter(|(kind, _)| *kind == RuntimeKind::Podman)
            .map(|(_, program)| program);
        Self {
            node,
            podman,
            runtime,
            changed: Arc::new(Notify::new()),
        }
    }

    /// The images podman holds, canonical, at most `MAX_NODE_IMAGES` (the newest); empty
    /// without podman.
    pub async fn list(&self) -> Result<BTreeSet<String>, String> {
        let Some(podman) = &self.podman else {
            return Ok(BTreeSet::new());
        };
        let (ok, out, err) =
            run(podman, &["images", "--format", "{{.Repository}}:{{.Tag}}"]).await?;
        if !ok {
            return Err(format!("podman images: {}", last_line(&err)));
        }
        Ok(parse_listing(&out))
    }

    /// Make sure the node holds `image` (canonical or not): `Ok(true)` when it already did
    /// (no registry asked), `Ok(false)` when it was pulled. Wakes the reporter either way.
    pub async fn pull(&self, image: &str) -> Result<bool, PullError> {
        let Some(podman) = &self.podman else {
            return Err(PullError::NoPodman {
                node: self.node,
                runtime: self.runtime.clone(),
            });
        };
        let failed = |reason: String| PullError::Failed {
            node: self.node,
            image: image.to_owned(),
            reason,
        };
        let result = match run(podman, &["image", "exists", image]).await {
            Ok((true, _, _)) => Ok(true),
            _ => match run(podman, &["pull", "--quiet", image]).await {
                Ok((true, _, _)) => Ok(false),
                Ok((false, _, err)) => Err(failed(last_line(&err))),
                Err(e) => Err(failed(e)),
            },
        };
        self.changed.notify_one();
        result
    }
}

async fn run(program: &std::path::Path, args: &[&str]) -> Result<(bool, String, String), String> {
    let out = Process::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("{}: {e}", program.display()))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no reason given")
        .to_owned()
}

/// `podman images --format {{.Repository}}:{{.Tag}}` (newest first) as canonical names: the
/// untagged (`<none>`) and invalid ones left out, at most `MAX_NODE_IMAGES` (the first listed).
pub fn parse_listing(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("<none>"))
        .filter(|l| image_reference(l).is_ok())
        .map(canonical_image)
        .take(MAX_NODE_IMAGES)
        .collect()
}

/// Reports the node's images whenever they differ from what the replicated state shows.
pub(crate) struct ImageReporter {
    pub cluster: Cluster,
    pub images: NodeImages,
    pub every: Duration,
}

impl ImageReporter {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let node = self.images.node;
        loop {
            match self.images.list().await {
                Ok(held) => self.report(node, held).await,
                Err(e) => warn!(node_id = node, error = %e, "cannot list this node's images"),
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.images.changed.notified() => {}
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    async fn report(&self, node: NodeId, held: BTreeSet<String>) {
        let shown = self
            .cluster
            .state
            .read(|s| s.nodes.get(&node).map(|n| n.images.clone()));
        // Not registered yet: the next round reports.
        if shown.is_none_or(|shown| shown == held) {
            return;
        }
        let count = held.len();
        match self
            .cluster
            .write(Command::ReportImages { node, images: held })
            .await
        {
            Ok(_) => info!(
                node_id = node,
                images = count,
                "reported this node's images"
            ),
            // A mesh with agents older than protocol 7 cannot read the report yet.
            Err(e @ ClusterError::NeedsUpgrade { .. }) => {
                debug!(node_id = node, error = %e, "images not reported");
            }
            Err(e) => warn!(node_id = node, error = %e, "reporting images failed; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_becomes_canonical_names_bounded_and_without_untagged_images() {
        let listing = "localhost/gpumesh-test-1:1\n\
                       docker.io/library/busybox:latest\n\
                       <none>:<none>\n\
                       quay.io/x/y:<none>\n\
                       Not Valid:x\n\
                       \n";
        let names: Vec<String> = parse_listing(listing).into_iter().collect();
        assert_eq!(
            names,
            [
                "docker.io/library/busybox:latest",
                "localhost/gpumesh-test-1:1"
            ]
        );
        let many: String = (0..MAX_NODE_IMAGES + 10)
            .map(|i| format!("localhost/img:{i}\n"))
            .collect();
        let kept = parse_listing(&many);
        assert_eq!(kept.len(), MAX_NODE_IMAGES);
        assert!(kept.contains("localhost/img:0"), "the newest are kept");
        assert!(!kept.contains(&format!("localhost/img:{}", MAX_NODE_IMAGES)));
        assert!(gpu_raft_store::container::node_images(&kept).is_ok());
    }
}
