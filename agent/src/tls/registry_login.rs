//! Opening a run's registry login: the tenant's sealed login at the registry of the run's
//! image (`ClusterState::registry_credentials`), opened here when this agent holds the CA key,
//! else by the leader (a voter), which answers only for a live run placed on the asking node
//! (`RaftPeer.OpenRegistryLogin`, over mutual TLS).

use std::time::Duration;

use gpu_proto::internal::v1::OpenRegistryLoginRequest;
use gpu_raft_store::registry::registry_of;
use gpu_raft_store::{Job, JobId, NodeId};

use super::TlsIdentity;
use super::sealing;
use crate::raft::Cluster;
use crate::raft::peer_client::with_deadline;

/// A registry login in the clear, for one pull. `Debug` shows no password.
pub struct Login {
    pub registry: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Login({}@{}, <password>)", self.username, self.registry)
    }
}

/// The login `job`'s run `generation` pulls its image with, if its tenant has one for the
/// image's registry. `Err`: it has one, and it cannot be opened (why).
pub async fn for_run(
    cluster: &Cluster,
    tls: Option<&TlsIdentity>,
    job: &Job,
    generation: u64,
) -> Result<Option<Login>, String> {
    let Some(image) = job.spec.container.as_ref().map(|c| c.image.clone()) else {
        return Ok(None);
    };
    let tenant = &job.spec.tenant;
    let registry = registry_of(&image);
    let sealed = cluster.state.read(|s| {
        s.registry_credentials
            .get(tenant)
            .and_then(|m| m.get(&registry))
            .cloned()
    });
    let Some(sealed) = sealed else {
        return Ok(None);
    };
    let why = |e: String| format!("the registry login of tenant {tenant} at {registry}: {e}");
    let local = tls
        .and_then(TlsIdentity::current)
        .filter(|t| t.ca_key_pem.is_some());
    let password = match local {
        Some(material) => {
            sealing::open(&material, tenant, &registry, &sealed).map_err(|e| why(e.to_string()))?
        }
        None => through_leader(cluster, job.id, generation)
            .await
            .map_err(why)?,
    };
    Ok(Some(Login {
        registry,
        username: sealed.username,
        password,
    }))
}

async fn through_leader(cluster: &Cluster, job: JobId, generation: u64) -> Result<String, String> {
    let (_, addr) = cluster
        .leader()
        .ok_or("no leader is known to open it (it holds the CA key)")?;
    let mut client = cluster
        .peers
        .get(&addr)
        .map_err(|s| s.message().to_owned())?;
    let req = OpenRegistryLoginRequest {
        job_id: job,
        generation,
    };
    let reply = client
        .open_registry_login(with_deadline(req, Duration::from_secs(10)))
        .await
        .map_err(|s| s.message().to_owned())?;
    Ok(reply.into_inner().password)
}

/// Whether node `node` may have the login of `job`'s run `generation`: the run is live and
/// placed on it.
pub fn may_open(job: &Job, generation: u64, node: NodeId) -> bool {
    job.state.is_live() && job.generation == generation && job.on_node(node)
}
