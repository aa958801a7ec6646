//! The multi-node test harness: real `gpu-agent` processes on loopback, each with its own data
//! directory and log, with kill/restart knobs and gRPC clients. One cluster runs at a time per
//! test binary (the machines are small; parallel clusters make elections flaky).
//!
//! Clusters are secured as in production: n1 bootstraps (creating the CA, the admin token and
//! the admin's client certificate in the root directory), the harness mints a join token with
//! them, and every other agent enrols with it. Every client connection is mutual TLS.

pub mod fuzz;
pub mod package;
pub mod records;
pub mod webdriver;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_client::ClusterServiceClient;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::{Interceptor, interceptor::InterceptedService};
use tonic::transport::{Channel, Endpoint};

/// Path of a workspace binary built beside this test (`cargo test --workspace` builds them).
pub fn bin(name: &str) -> PathBuf {
    find_bin(name).unwrap_or_else(|missing| {
        panic!(
            "{} is missing: run `cargo build --bins` (or `cargo test --workspace`)",
            missing.display()
        )
    })
}

/// Where workspace binary `name` is: beside the running executable when that is a binary in
/// `target/<profile>/`, else in the directory above (a test in `target/<profile>/deps/`).
/// `Err` holds the path it was expected at.
pub fn find_bin(name: &str) -> Result<PathBuf, PathBuf> {
    let exe = std::env::current_exe().expect("executable path");
    let here = exe.parent().expect("executable directory");
    let beside = here.join(name);
    if beside.exists() {
        return Ok(beside);
    }
    let above = here
        .parent()
        .expect("target/<profile> directory")
        .join(name);
    if above.exists() {
        Ok(above)
    } else if here.ends_with("deps") {
        Err(above)
    } else {
        Err(beside)
    }
}

/// A free loopback port (bound once, then released for the agent to take), never one this
/// process handed out before: the kernel may give a released port to the next `bind(0)` at
/// once, and two agents of one cluster were given the same port (one then failed to listen,
/// "every agent to join" timed out: chaos c15 in CI, the backup test).
pub fn free_addr() -> String {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        if handed_out.insert(addr.port()) {
            return addr.to_string();
        }
    }
}

/// Simulated GPUs per agent, cycled: n1 A100s, n2 H100s and L4s, n3 T4s.
pub const NODE_KINDS: [&str; 3] = ["4xA100-80GB", "2xH100-80GB,2xL4-24GB", "4xT4-16GB"];

/// Where n1 writes the bootstrap admin token, in the cluster's root directory (outside every
/// data directory, so the secret scans of data directories stay meaningful).
pub const ADMIN_TOKEN: &str = "admin.token";
/// The join token the harness mints for the other agents, in the root directory.
pub const JOIN_TOKEN: &str = "join.token";

/// A channel that sends a bearer token with every request.
pub type Conn = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// `Authorization: Bearer <token>`, or nothing; panics on a token no header can carry.
    pub fn new(token: Option<&str>) -> Self {
        Self(token.map(|t| format!("Bearer {t}").parse().expect("a header value")))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Wait for the turn clusters take and hold it: for heavy work (building the failpoints agent)
/// that would disturb a running cluster's timing. Never call it while holding a `Cluster`.
pub fn exclusive() -> MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Where one agent runs: the address it listens on (and others reach it at) and a command
/// prefix it is started under, e.g. `ip netns exec gm1a2bx0-n2` (empty: started directly).
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// `ip:port` the agent listens on and advertises.
    pub addr: String,
    /// Program and arguments put before the agent's own command line.
    pub prefix: Vec<String>,
}

/// Agent config without the per-token, per-tenant or per-source request limits: for tests and
/// benchmarks whose clients would otherwise be slowed down by them.
pub const NO_REQUEST_LIMITS: &str = "[api]\nrequests_per_second = 0\ntenant_requests_per_second = 0\nsource_requests_per_second = 0\n";

impl Placement {
    /// An agent on a free loopback port, started directly.
    pub fn loopback() -> Self {
        Self {
            addr: free_addr(),
            prefix: Vec::new(),
        }
    }
}

/// What the cluster's agents run: a binary other than the workspace's `gpu-agent` (a
/// failpoints build, say) and environment variables every agent starts with (`FAIL_POINTS`).
#[derive(Clone, Debug, Default)]
pub struct AgentCommand {
    /// The agent binary; `None`: `bin("gpu-agent")`.
    pub bin: Option<PathBuf>,
    /// Set in every agent's environment (`Agent::env`, changeable per agent before a restart).
    pub env: Vec<(String, String)>,
    /// Every agent's simulated GPUs (`sim_gpus`, e.g. "8xA100-80GB"); `None`: `NODE_KINDS` in
    /// turn.
    pub sim_gpus: Option<String>,
}

pub struct Agent {
    pub id: u64,
    pub addr: String,
    /// The command prefix from its `Placement` (empty for loopback agents).
    pub prefix: Vec<String>,
    pub config: PathBuf,
    /// Flags after `run --config FILE` (a joiner's CA and join token files).
    pub flags: Vec<std::ffi::OsString>,
    pub log: PathBuf,
    /// Extra environment for its next start.
    pub env: BTreeMap<String, String>,
    child: Option<Child>,
}

pub struct Cluster {
    pub root: tempfile::TempDir,
    /// The agent binary every start runs.
    pub agent_bin: PathBuf,
    pub agents: BTreeMap<u64, Agent>,
    voter_target: usize,
    extra_toml: String,
    sim_gpus: Option<String>,
    _turn: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Start `n` agents: n1 bootstraps, the others join through it. `extra_toml` is appended to
    /// every agent's config, inside its `[raft]` table unless it opens tables of its own. Waits until all are members and the voter seats are filled.
    pub async fn start(n: u64, voter_target: usize, extra_toml: &str) -> Cluster {
        let loopback = (0..n).map(|_| Placement::loopback()).collect();
        Self::start_placed(voter_target, extra_toml, loopback).await
    }

    /// `start` with agent `i` (from 1) at `placements[i - 1]`: its own address and command
    /// prefix (network-namespace scenarios).
    pub async fn start_placed(
        voter_target: usize,
        extra_toml: &str,
        placements: Vec<Placement>,
    ) -> Cluster {
        Self::start_with(
            voter_target,
            extra_toml,
            placements,
            AgentCommand::default(),
        )
        .await
    }

    /// `start_placed` running `agent`'s binary with its environment.
    pub async fn start_with(
        voter_target: usize,
        extra_toml: &str,
        placements: Vec<Placement>,
        agent: AgentCommand,
    ) -> Cluster {
        Self::start_prepared(voter_target, extra_toml, placements, agent, |_| {}).await
    }

    /// `start_with`, calling `prepare` once every agent's config is written and before any
    /// starts (to seed n1's data directory from a backup, say).
    pub async fn start_prepared(
        voter_target: usize,
        extra_toml: &str,
        placements: Vec<Placement>,
        agent: AgentCommand,
        prepare: impl FnOnce(&Cluster),
    ) -> Cluster {
        let n = placements.len() as u64;
        let turn = ONE_CLUSTER_AT_A_TIME
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let root = tempfile::tempdir().expect("tempdir");
        let addrs: Vec<String> = placements.iter().map(|p| p.addr.clone()).collect();
        let mut cluster = Cluster {
            root,
            agent_bin: agent.bin.unwrap_or_else(|| bin("gpu-agent")),
            agents: BTreeMap::new(),
            voter_target,
            extra_toml: extra_toml.to_owned(),
            sim_gpus: agent.sim_gpus.clone(),
            _turn: turn,
        };
        for (id, placement) in (1..=n).zip(placements) {
            let token = cluster.root.path().join(JOIN_TOKEN);
            let joiner = (id > 1).then(|| (addrs[0].as_str(), token.as_path()));
            let env = agent.env.iter().cloned().collect();
            cluster.configure_agent(id, placement, joiner, env);
        }
        prepare(&cluster);
        for id in 1..=n {
            cluster.start_agent(id);
            if id == 1 {
                cluster
                    .wait_for("n1 to lead", Duration::from_secs(20), |c| async move {
                        c.status(1, true)
                            .await
                            .is_ok_and(|s| s.leader_id == Some(1))
                    })
                    .await;
                cluster.mint_join_token().await;
            }
        }
        // Edge agents are learners only: they never take a voter seat.
        let edge = cluster
            .agents
            .values()
            .filter(|a| is_edge_config(&a.config))
            .count();
        let want_voters = (n as usize - edge).min(voter_target);
        cluster
            .wait_for(
                "every agent to join",
                Duration::from_secs(60),
                |c| async move {
                    c.status(1, false).await.is_ok_and(|s| {
                        s.members.len() == n as usize && voters(&s).len() == want_voters
                    })
                },
            )
            .await;
        // And to register: until then the leader counts it as speaking no protocol, and
        // refuses changes that need a newer one.
        cluster
            .wait_for(
                "every agent to register",
                Duration::from_secs(30),
                |c| async move {
                    for id in 1..=n {
                        if c.node(1, id, false).await.is_err() {
                            return false;
                        }
                    }
                    true
                },
            )
            .await;
        cluster
    }

    /// Write agent `id`'s config: n1 bootstraps; a `joiner` joins through the address given,
    /// enrolling with the join token in the file given.
    fn configure_agent(
        &mut self,
        id: u64,
        placement: Placement,
        joiner: Option<(&str, &Path)>,
        env: BTreeMap<String, String>,
    ) {
        let root = self.root.path();
        let addr = placement.addr;
        let data = root.join(format!("node-{id}"));
        let (start, flags) = match joiner {
            None => {
                let token = root.join(ADMIN_TOKEN);
                (
                    format!("bootstrap = true\nbootstrap_token_file = {token:?}"),
                    Vec::new(),
                )
            }
            Some((seed, token)) => (
                format!("join = [{seed:?}]"),
                vec![
                    "--ca-file".into(),
                    root.join("ca.crt").into_os_string(),
                    "--join-token-file".into(),
                    token.as_os_str().to_owned(),
                ],
            ),
        };
        let gpus =
            (self.sim_gpus.as_deref()).unwrap_or(NODE_KINDS[(id as usize - 1) % NODE_KINDS.len()]);
        let extra_toml = &self.extra_toml;
        // Short job timings keep failure tests fast, unless the test brings its own.
        let jobs = if extra_toml.contains("[jobs]") {
            ""
        } else {
            "[jobs]\nlease = \"2s\"\ndown_after = \"4s\"\nstop_grace = \"2s\"\n"
        };
        let toml = format!(
            "node_id = {id}\nlisten = {addr:?}\ndata_dir = {data:?}\njoin_timeout = \"30s\"\n\
             gpu_backend = \"sim\"\nsim_gpus = {gpus:?}\n{start}\n\
             {jobs}[raft]\nvoter_target = {}\n{extra_toml}\n",
            self.voter_target
        );
        let config = root.join(format!("node-{id}.toml"));
        std::fs::write(&config, toml).expect("write config");
        let log = root.join(format!("node-{id}.log"));
        self.agents.insert(
            id,
            Agent {
                id,
                addr,
                prefix: placement.prefix,
                config,
                flags,
                log,
                env,
                child: None,
            },
        );
    }

    /// Add agent `id` on loopback, joining through n1 with the join token in `token_file`,
    /// and start it (the caller waits for what it expects of the join).
    pub fn add_agent(&mut self, id: u64, token_file: &Path) {
        let seed = self.addr(1).to_owned();
        let placement = Placement::loopback();
        self.configure_agent(id, placement, Some((&seed, token_file)), BTreeMap::new());
        self.start_agent(id);
    }

    pub fn start_agent(&mut self, id: u64) {
        let agent_bin = self.agent_bin.clone();
        let agent = self.agents.get_mut(&id).expect("known agent");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&agent.log)
            .expect("log file");
        let mut command = match agent.prefix.split_first() {
            None => Command::new(&agent_bin),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&agent_bin);
                c
            }
        };
        let child = command
            .arg("run")
            .arg("--config")
            .arg(&agent.config)
            .args(&agent.flags)
            // GPUMESH_AGENT_LOG: the agents' RUST_LOG, for a post-mortem.
            .env(
                "RUST_LOG",
                std::env::var("GPUMESH_AGENT_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
            )
            .envs(&agent.env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gpu-agent");
        agent.child = Some(child);
    }

    /// `kill -9` an agent and reap it.
    pub fn kill(&mut self, id: u64) {
        let agent = self.agents.get_mut(&id).expect("known agent");
        if let Some(mut child) = agent.child.take() {
            child.kill().expect("kill -9");
            child.wait().expect("reap");
        }
    }

    /// If agent `id` has exited on its own (a crash), reap it and return how it ended; it then
    /// counts as stopped (`heal` restarts it).
    pub fn exited(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let agent = self.agents.get_mut(&id).expect("known agent");
        let status = agent
            .child
            .as_mut()?
            .try_wait()
            .expect("wait on an agent")?;
        agent.child = None;
        Some(status)
    }

    /// `SIGSTOP` agent `id`: it keeps its sockets and state but does nothing until `resume`
    /// (its job supervisors, in their own process groups, keep running).
    pub fn pause(&self, id: u64) {
        self.signal(id, nix::sys::signal::Signal::SIGSTOP);
    }

    /// `SIGTERM` agent `id`: a graceful shutdown (`exited` tells when it is over).
    pub fn terminate(&self, id: u64) {
        self.signal(id, nix::sys::signal::Signal::SIGTERM);
    }

    /// `SIGCONT` an agent stopped by `pause`.
    pub fn resume(&self, id: u64) {
        self.signal(id, nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, id: u64, signal: nix::sys::signal::Signal) {
        let child = self.agents[&id].child.as_ref().expect("a running agent");
        let pid = i32::try_from(child.id()).expect("pid fits i32");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to n{id}: {e}"));
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.agents[&id].child.is_some()
    }

    pub fn running(&self) -> Vec<u64> {
        self.agents
            .keys()
            .copied()
            .filter(|id| self.is_running(*id))
            .collect()
    }

    /// The process id of agent `id`, if it is running.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.agents[&id].child.as_ref().map(Child::id)
    }

    pub fn addr(&self, id: u64) -> &str {
        &self.agents[&id].addr
    }

    /// A connection to agent `id` acting with the cluster's bootstrap admin token.
    pub async fn channel(&self, id: u64) -> Result<Conn, tonic::Status> {
        self.channel_as(id, Some(&self.admin_token())).await
    }

    /// A connection to agent `id` sending `bearer` (`<id>.<secret>`), or no token at all.
    pub async fn channel_as(&self, id: u64, bearer: Option<&str>) -> Result<Conn, tonic::Status> {
        let channel = self
            .endpoint(id, Some(self.admin_identity()))?
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let header = bearer
            .map(|b| format!("Bearer {b}").parse())
            .transpose()
            .map_err(|_| tonic::Status::invalid_argument("token is not a valid header"))?;
        Ok(InterceptedService::new(channel, Bearer(header)))
    }

    /// Wait until every running agent answers its own status (restarted agents need a moment
    /// before they listen).
    pub async fn wait_serving(&self) {
        self.wait_for(
            "every running agent to serve",
            Duration::from_secs(30),
            |c| async move {
                for id in c.running() {
                    if c.status(id, true).await.is_err() {
                        return false;
                    }
                }
                true
            },
        )
        .await;
    }

    /// A TLS endpoint for agent `id` trusting the cluster CA and presenting `identity` (a client
    /// certificate and key, PEM), or none.
    pub fn endpoint(
        &self,
        id: u64,
        identity: Option<(String, String)>,
    ) -> Result<Endpoint, tonic::Status> {
        let identity =
            identity.map(|(cert_pem, key_pem)| gpu_agent::tls::KeyedCert { cert_pem, key_pem });
        let tls = gpu_agent::tls::client::config(&self.read_root("ca.crt"), identity.as_ref());
        Endpoint::from_shared(format!("https://{}", self.addr(id)))
            .and_then(|e| e.tls_config(tls))
            .map(|e| {
                e.connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(15))
            })
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))
    }

    /// Agent `id`'s own certificate and key, from its data directory.
    pub fn node_identity(&self, id: u64) -> (String, String) {
        let tls = self.root.path().join(format!("node-{id}/tls"));
        let read = |f: &str| {
            let path = tls.join(f);
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        (read("node.crt"), read("node.key"))
    }

    /// The admin's client certificate and key n1 wrote at bootstrap.
    pub fn admin_identity(&self) -> (String, String) {
        (self.read_root("admin.crt"), self.read_root("admin.key"))
    }

    fn read_root(&self, name: &str) -> String {
        std::fs::read_to_string(self.root.path().join(name)).unwrap_or_default()
    }

    /// `gpuctl`, set up like an admin's shell for this cluster: CA, client certificate and
    /// token from the root directory, no user config file. Endpoints are the caller's to add.
    pub fn gpuctl(&self) -> Command {
        let mut cmd = Command::new(bin("gpuctl"));
        let root = self.root.path();
        cmd.env("GPUCTL_CONFIG", "/nonexistent/gpuctl.toml")
            .env("GPUCTL_CA_FILE", root.join("ca.crt"))
            .env("GPUCTL_CERT_FILE", root.join("admin.crt"))
            .env("GPUCTL_KEY_FILE", root.join("admin.key"))
            .env("GPUCTL_TOKEN_FILE", root.join(ADMIN_TOKEN))
            .env_remove("GPUCTL_TOKEN")
            .env_remove("GPUCTL_ENDPOINT");
        cmd
    }

    /// `gpuctl -o json ARGS` against agent `via`, as the admin: its exit code, its JSON answer
    /// (`Null` when it printed none) and its stderr.
    pub fn gpuctl_json(&self, via: u64, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
        let out = self
            .gpuctl()
            .args(["--endpoint", self.addr(via), "-o", "json"])
            .args(args)
            .output()
            .expect("run gpuctl");
        (
            out.status.code(),
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Mint a join token through n1 and leave it 0600 in the root directory.
    async fn mint_join_token(&self) {
        use std::os::unix::fs::PermissionsExt;
        let mut tokens = gpu_proto::v1::token_service_client::TokenServiceClient::new(
            self.channel(1).await.expect("channel to n1"),
        );
        let minted = tokens
            .create_token(pb::CreateTokenRequest {
                role: pb::Role::Node as i32,
                tenant: String::new(),
                description: "test harness join token".into(),
                account: None,
                // Every agent of a test enrols with it, some more than once.
                uses: Some(1000),
                ..Default::default()
            })
            .await
            .expect("mint a join token")
            .into_inner();
        let path = self.root.path().join(JOIN_TOKEN);
        std::fs::write(&path, minted.bearer).expect("write the join token");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }

    /// The bootstrap admin token n1 wrote (empty until it has).
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.root.path().join(ADMIN_TOKEN))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    pub async fn status(&self, via: u64, stale: bool) -> Result<pb::ClusterStatus, tonic::Status> {
        let mut c = ClusterServiceClient::new(self.channel(via).await?);
        Ok(c.get_status(pb::GetStatusRequest { stale })
            .await?
            .into_inner())
    }

    /// Set one label on `node`, sending the write to agent `via`.
    /// Agent `via`'s own replica: its applied index and the digest of its state there.
    pub async fn state_digest(&self, via: u64) -> Result<pb::StateDigest, tonic::Status> {
        let mut c = ClusterServiceClient::new(self.channel(via).await?);
        Ok(c.get_state_digest(pb::GetStateDigestRequest {})
            .await?
            .into_inner())
    }

    pub async fn label(
        &self,
        via: u64,
        node: u64,
        key: &str,
        value: &str,
    ) -> Result<pb::Node, tonic::Status> {
        let mut c = NodeServiceClient::new(self.channel(via).await?);
        let req = pb::LabelNodeRequest {
            id: node,
            set: [(key.to_owned(), value.to_owned())].into_iter().collect(),
            remove: Vec::new(),
        };
        Ok(c.label_node(req).await?.into_inner())
    }

    pub async fn node(&self, via: u64, node: u64, stale: bool) -> Result<pb::Node, tonic::Status> {
        let mut c = NodeServiceClient::new(self.channel(via).await?);
        Ok(c.get_node(pb::GetNodeRequest { id: node, stale })
            .await?
            .into_inner())
    }

    pub async fn submit(
        &self,
        via: u64,
        spec: pb::JobSpec,
        key: &str,
    ) -> Result<pb::SubmitJobResponse, tonic::Status> {
        let mut c = JobServiceClient::new(self.channel(via).await?);
        let req = pb::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: key.to_owned(),
            hold: false,
        };
        Ok(c.submit_job(req).await?.into_inner())
    }

    pub async fn job(&self, via: u64, id: u64) -> Result<pb::Job, tonic::Status> {
        let mut c = JobServiceClient::new(self.channel(via).await?);
        Ok(c.get_job(pb::GetJobRequest {
            id,
            stale: false,
            array_index: None,
        })
        .await?
        .into_inner())
    }

    /// Every job, page after page, as agent `via` answers.
    pub async fn list_jobs(&self, via: u64) -> Result<Vec<pb::Job>, tonic::Status> {
        let mut c = JobServiceClient::new(self.channel(via).await?);
        let mut req = pb::ListJobsRequest::default();
        let mut jobs = Vec::new();
        loop {
            let page = c.list_jobs(req.clone()).await?.into_inner();
            jobs.extend(page.jobs);
            match page.next_after_id {
                Some(after) => req.after_id = after,
                None => return Ok(jobs),
            }
        }
    }

    pub async fn cancel(&self, via: u64, id: u64) -> Result<pb::Job, tonic::Status> {
        let mut c = JobServiceClient::new(self.channel(via).await?);
        Ok(c.cancel_job(pb::CancelJobRequest {
            id,
            array_index: None,
        })
        .await?
        .into_inner())
    }

    /// Poll job `id` through any running agent until `done` holds; returns it.
    pub async fn wait_job(
        &self,
        id: u64,
        timeout: Duration,
        done: impl Fn(&pb::Job) -> bool,
    ) -> pb::Job {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < timeout {
            for via in self.running() {
                if let Ok(j) = self.job(via, id).await {
                    if done(&j) {
                        return j;
                    }
                    last = Some(j);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "job j-{id} did not reach the expected state in {timeout:?}; last seen {last:?}\n{}",
            self.logs()
        );
    }

    /// The leader as seen by the first running agent that knows a running one.
    pub async fn leader(&self) -> u64 {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            for id in self.running() {
                if let Ok(s) = self.status(id, true).await
                    && let Some(l) = s.leader_id
                    && self.is_running(l)
                {
                    return l;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no leader among running agents after 30s\n{}", self.logs());
    }

    /// Poll `check` until it holds; panic with agent logs after `timeout`.
    pub async fn wait_for<'a, F, Fut>(&'a self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut(&'a Cluster) -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check(self).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            self.logs()
        );
    }

    /// Wait until agent `id` has applied the entry at `index` (its own replica, answering
    /// without the leader); panic with agent logs after `timeout`.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) {
        self.wait_for(
            &format!("n{id} to apply index {index}"),
            timeout,
            |c| async move {
                c.status(id, true)
                    .await
                    .is_ok_and(|s| s.applied_index >= index)
            },
        )
        .await;
    }

    /// Agent `id`'s jobs directory: `jobs.dir`'s default, `<data_dir>-jobs`.
    pub fn jobs_dir(&self, id: u64) -> PathBuf {
        self.root.path().join(format!("node-{id}-jobs"))
    }

    /// The directory of run `generation` of `job` on agent `id` (in its default jobs directory).
    pub fn run_dir(&self, id: u64, job: u64, generation: u64) -> PathBuf {
        self.jobs_dir(id).join(format!("j-{job}-g{generation}"))
    }

    /// The outcome the supervisor of that run recorded, once it has (`exit.json` exists, blank,
    /// from the run's start).
    pub fn run_outcome(
        &self,
        id: u64,
        job: u64,
        generation: u64,
    ) -> Option<gpu_raft_store::Outcome> {
        let bytes = std::fs::read(self.run_dir(id, job, generation).join("exit.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Everything agent `id` has logged so far (all its runs).
    pub fn log_of(&self, id: u64) -> String {
        self.agents
            .get(&id)
            .and_then(|a| std::fs::read_to_string(&a.log).ok())
            .unwrap_or_default()
    }

    /// The last lines of every agent's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for a in self.agents.values() {
            let text = std::fs::read_to_string(&a.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- n{} ({}) ---\n", a.id, a.log.display()));
            out.push_str(&lines[lines.len().saturating_sub(25)..].join("\n"));
            out.push('\n');
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        // Data directories and agent logs, for a post-mortem of a test or a benchmark.
        if std::env::var_os("GPUMESH_KEEP_TEST_DIR").is_some() {
            let kept =
                std::mem::replace(&mut self.root, tempfile::tempdir().expect("tempdir")).keep();
            eprintln!("kept the cluster's directory: {}", kept.display());
        }
        for id in self.running() {
            self.kill(id);
        }
    }
}

/// Make the agent configured in `config` an edge agent at `site` (its `site` label and an
/// `[edge]` table with `enabled = true` plus `edge_keys`). For `Cluster::start_prepared`'s
/// `prepare`, before the agent first starts.
pub fn make_edge(config: &Path, site: &str, edge_keys: &str) -> std::io::Result<()> {
    let text = std::fs::read_to_string(config)?;
    std::fs::write(
        config,
        format!("labels = {{ site = {site:?} }}\n{text}\n{EDGE_TABLE}{edge_keys}\n"),
    )
}

const EDGE_TABLE: &str = "[edge]\nenabled = true\n";

fn is_edge_config(config: &Path) -> bool {
    std::fs::read_to_string(config).is_ok_and(|t| t.contains(EDGE_TABLE))
}

/// The body of `GET /metrics` at `addr`, an agent's `monitor.metrics_listen` (plain HTTP/1.1).
pub fn scrape(addr: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(head.to_owned()));
    }
    Ok(body.to_owned())
}

/// A job spec running `sh -c script` on `gpus` GPUs.
pub fn shell_job(name: &str, gpus: u32, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.to_owned(),
        command: vec!["/bin/sh".into(), "-c".into(), script.to_owned()],
        gpus,
        max_attempts: 1,
        ..Default::default()
    }
}

pub fn is_terminal(j: &pb::Job) -> bool {
    [
        pb::JobState::Succeeded,
        pb::JobState::Failed,
        pb::JobState::Cancelled,
    ]
    .iter()
    .any(|s| *s as i32 == j.state)
}

pub fn voters(s: &pb::ClusterStatus) -> Vec<u64> {
    s.members
        .iter()
        .filter(|m| m.role == pb::MemberRole::Voter as i32)
        .map(|m| m.node_id)
        .collect()
}

#[cfg(test)]
mod tests {
    /// Regression: released ports came back from the next `bind(0)`, so two agents of one
    /// cluster could be given one port (dozens of repeats in 2,000 calls here before the fix).
    #[test]
    fn free_addr_never_repeats() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let addr = super::free_addr();
            assert!(seen.insert(addr.clone()), "{addr} handed out twice");
        }
    }
}
