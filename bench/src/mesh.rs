//! gpumesh as a benchmark target: a 3-agent loopback mesh (real processes, sled with fsync,
//! mutual TLS, bearer tokens) from the test harness; a write is one job submission.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_raft_store::write_trace;
use gpu_tests::{AgentCommand, Cluster, Conn, NO_REQUEST_LIMITS, Placement};
use prost::Message;

use crate::target::{Crashable, Target};

pub struct Mesh {
    pub cluster: Cluster,
}

impl Mesh {
    /// Start `n` agents, all voters, with the agent's default Raft timings and no per-token
    /// request limit (every client shares the admin token; the limit is not what is measured).
    pub async fn start(n: u64) -> Mesh {
        Mesh {
            cluster: Cluster::start(n, n as usize, NO_REQUEST_LIMITS).await,
        }
    }

    /// `start`, with every agent stamping its writes' stages into `trace_dir`
    /// (`gpu_raft_store::write_trace`).
    pub async fn start_traced(n: u64, trace_dir: &Path) -> Mesh {
        let loopback = (0..n).map(|_| Placement::loopback()).collect();
        let agent = AgentCommand {
            env: vec![(
                write_trace::TRACE_DIR_ENV.to_owned(),
                trace_dir.display().to_string(),
            )],
            ..AgentCommand::default()
        };
        Mesh {
            cluster: Cluster::start_with(n as usize, NO_REQUEST_LIMITS, loopback, agent).await,
        }
    }
}

/// The submission every write sends: a one-GPU job whose node selector no node matches, so
/// it stays queued and the benchmark measures the replicated write, not the executor.
pub fn submission(seq: u64) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        spec: Some(pb::JobSpec {
            name: "bench".into(),
            command: vec!["/bin/true".into()],
            gpus: 1,
            node_selector: HashMap::from([("bench".to_owned(), "never-placed".to_owned())]),
            ..Default::default()
        }),
        idempotency_key: format!("bench-{seq:016x}"),
        hold: false,
    }
}

/// Bytes of one submission on the wire (etcd's puts carry the same).
pub fn submission_bytes() -> usize {
    submission(0).encoded_len()
}

/// One client's connection, for submissions and for `WhoAmI` round trips.
pub struct MeshClient {
    jobs: JobServiceClient<Conn>,
    auth: TokenServiceClient<Conn>,
}

impl Target for Mesh {
    type Client = MeshClient;

    fn members(&self) -> usize {
        self.cluster.agents.len()
    }

    fn pids(&self) -> Vec<u32> {
        let ids = self.cluster.agents.keys();
        ids.filter_map(|id| self.cluster.pid(*id)).collect()
    }

    async fn connect(&self, client: usize) -> anyhow::Result<Self::Client> {
        let id = (client % self.members()) as u64 + 1;
        let conn = self.cluster.channel(id).await?;
        Ok(MeshClient {
            jobs: JobServiceClient::new(conn.clone()),
            auth: TokenServiceClient::new(conn),
        })
    }

    async fn write(&self, client: &mut Self::Client, seq: u64) -> anyhow::Result<()> {
        client.jobs.submit_job(submission(seq)).await?;
        Ok(())
    }

    /// `WhoAmI`: the token and certificate checked, answered from the member's own state.
    async fn round_trip(&self, client: &mut Self::Client) -> anyhow::Result<()> {
        client.auth.who_am_i(pb::WhoAmIRequest {}).await?;
        Ok(())
    }
}

impl Crashable for Mesh {
    async fn leader(&self) -> anyhow::Result<usize> {
        Ok(self.cluster.leader().await as usize - 1)
    }

    fn kill(&mut self, member: usize) {
        self.cluster.kill(member as u64 + 1);
    }

    async fn restart(&mut self, member: usize) -> anyhow::Result<()> {
        let id = member as u64 + 1;
        self.cluster.start_agent(id);
        let leader = self.cluster.leader().await;
        let commit = self.cluster.status(leader, false).await?.commit_index;
        self.cluster
            .wait_applied(id, commit, Duration::from_secs(30))
            .await;
        Ok(())
    }
}
