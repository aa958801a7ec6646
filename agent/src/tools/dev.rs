//! `gpu-agent dev`: a complete local mesh of N agents on loopback, as child processes of this
//! one, each with its own data directory and log file. Ctrl-C or SIGTERM stops them all.
//! It is secured like production: agent 1 bootstraps (creating a throwaway CA, the admin token
//! and the admin's client certificate in the dev directory); dev then mints a join token with
//! them and the other agents enrol with it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use gpu_proto::v1::cluster_service_client::ClusterServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_proto::v1::{self as pb, GetStatusRequest};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(5);

/// `gpu-agent dev`'s options (also its command line).
#[derive(Debug, clap::Args)]
pub struct DevOptions {
    /// Number of agents.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Directory for data and logs (default: a fresh temporary directory, removed on exit).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// First listening port; agents take consecutive ports. 0 picks free ports.
    #[arg(long, default_value_t = 7070)]
    pub base_port: u16,
    /// Simulated GPUs for every agent (default: a mix of A100, H100+L4 and T4 nodes).
    #[arg(long)]
    pub sim_gpus: Option<String>,
}

/// The admin token of the mesh, in the dev directory (beside it: `admin.crt`, `admin.key`,
/// `ca.crt`, written by the bootstrap agent).
const TOKEN_FILE: &str = "admin.token";
/// The join token the other agents enrol with.
const JOIN_TOKEN_FILE: &str = "join.token";

/// The default mix, so placement by type is visible from the first minute.
const NODE_KINDS: [&str; 3] = ["4xA100-80GB", "2xH100-80GB,2xL4-24GB", "4xT4-16GB"];

struct DevAgent {
    id: u64,
    addr: String,
    /// Where its Prometheus `/metrics` is served.
    metrics: String,
    log: PathBuf,
    child: Child,
}

pub async fn run(opts: DevOptions, cancel: CancellationToken) -> anyhow::Result<()> {
    ensure!(
        (1..=32).contains(&opts.nodes),
        "--nodes must be between 1 and 32"
    );
    let exe = std::env::current_exe().context("locating the gpu-agent binary")?;
    let (dir, throwaway) = match opts.dir {
        Some(d) => (d, false),
        None => (
            std::env::temp_dir().join(format!("gpumesh-dev-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Jobs run as an unprivileged user, who must be able to pass through to their run
    // directories (listing stays closed).
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))
        .with_context(|| format!("opening {} to job users", dir.display()))?;
    let addrs = pick_addrs(opts.nodes, opts.base_port)?;
    // Prometheus metrics beside each agent, on free ports (9400, dcgm-exporter's, may be taken
    // on a GPU host); the banner says where.
    let metrics = pick_addrs(opts.nodes, 0)?;

    let spawn = |i: usize| -> anyhow::Result<DevAgent> {
        let id = i as u64 + 1;
        let log = dir.join(format!("node-{id}.log"));
        let mut cmd = Command::new(&exe);
        cmd.arg("run")
            .args(["--node-id", &id.to_string(), "--listen", &addrs[i]])
            .args(["--metrics-listen", &metrics[i]])
            .arg("--data-dir")
            .arg(dir.join(format!("node-{id}")))
            .args(["--gpu-backend", "sim", "--sim-gpus"])
            .arg(
                opts.sim_gpus
                    .as_deref()
                    .unwrap_or(NODE_KINDS[i % NODE_KINDS.len()]),
            );
        if id == 1 {
            cmd.arg("--bootstrap")
                .arg("--bootstrap-token-file")
                .arg(dir.join(TOKEN_FILE));
        } else {
            cmd.args(["--join", &addrs[0]])
                .arg("--ca-file")
                .arg(dir.join("ca.crt"))
                .arg("--join-token-file")
                .arg(dir.join(JOIN_TOKEN_FILE));
        }
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .context("starting an agent")?;
        Ok(DevAgent {
            id,
            addr: addrs[i].clone(),
            metrics: metrics[i].clone(),
            log,
            child,
        })
    };

    let mut agents = vec![spawn(0)?];
    let creds = Creds { dir: dir.clone() };
    let ready = tokio::select! {
        () = cancel.cancelled() => Ok(None),
        r = async {
            wait_ready(&mut agents, &creds, 1).await?;
            mint_join_token(&agents[0].addr, &creds, opts.nodes).await?;
            for i in 1..addrs.len() {
                agents.push(spawn(i)?);
            }
            wait_ready(&mut agents, &creds, addrs.len()).await
        } => r.map(Some),
    };
    let mut config_written = None;
    let outcome = match ready {
        Ok(Some(leader)) => {
            config_written = print_banner(&agents, leader, &dir);
            watch(&mut agents, &cancel).await;
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    eprintln!("stopping {} agents", agents.len());
    stop(&mut agents).await;
    // The gpuctl config pointed at this mesh; take it away with the mesh (unless it changed).
    if let Some((path, text)) = config_written
        && std::fs::read_to_string(&path).is_ok_and(|now| now == text)
    {
        std::fs::remove_file(&path).ok();
    }
    if throwaway && outcome.is_ok() {
        std::fs::remove_dir_all(&dir).ok();
    }
    outcome
}

fn pick_addrs(n: usize, base_port: u16) -> anyhow::Result<Vec<String>> {
    let mut listeners = Vec::new();
    for i in 0..n {
        let port = if base_port == 0 {
            0
        } else {
            base_port
                .checked_add(i as u16)
                .context("port out of range")?
        };
        let l = std::net::TcpListener::bind(("127.0.0.1", port)).with_context(|| {
            format!("port {port} on 127.0.0.1 is not free; pass --base-port to use other ports (0 picks free ones)")
        })?;
        listeners.push(l);
    }
    // Dropped together at the end, so picks of port 0 cannot collide with each other.
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.to_string()))
        .collect()
}

/// The admin's credentials in the dev directory, as the bootstrap agent wrote them.
struct Creds {
    dir: PathBuf,
}

impl Creds {
    /// A TLS connection to `addr` as the admin, once the files exist.
    async fn connect(&self, addr: &str) -> anyhow::Result<tonic::transport::Channel> {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name));
        let admin = crate::tls::KeyedCert {
            cert_pem: read("admin.crt")?,
            key_pem: read("admin.key")?,
        };
        let tls = crate::tls::client::config(&read("ca.crt")?, Some(&admin));
        Ok(
            tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?
                .tls_config(tls)?
                .connect_timeout(Duration::from_secs(2))
                .connect()
                .await?,
        )
    }

    fn bearer(&self) -> anyhow::Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
        let token = std::fs::read_to_string(self.dir.join(TOKEN_FILE))?;
        Ok(format!("Bearer {}", token.trim()).parse()?)
    }
}

/// Mint the join token the other agents enrol with (0600 in the dev directory): once each,
/// for nodes 2..=`nodes`.
async fn mint_join_token(addr: &str, creds: &Creds, nodes: usize) -> anyhow::Result<()> {
    let mut client = TokenServiceClient::new(creds.connect(addr).await?);
    let mut req = tonic::Request::new(pb::CreateTokenRequest {
        role: pb::Role::Node as i32,
        tenant: String::new(),
        description: "gpu-agent dev: join token".into(),
        account: None,
        ttl_s: None,
        uses: Some(u32::try_from(nodes.saturating_sub(1).max(1))?),
        node_id_first: 2,
        node_id_last: u64::try_from(nodes.max(2))?,
        seat: String::new(),
    });
    req.metadata_mut().insert("authorization", creds.bearer()?);
    let minted = client
        .create_token(req)
        .await
        .context("minting the join token")?
        .into_inner();
    crate::tls::files::write_file(&creds.dir.join(JOIN_TOKEN_FILE), &minted.bearer, 0o600)
}

/// Wait until a leader exists and `members` agents are members; returns the leader id.
async fn wait_ready(agents: &mut [DevAgent], creds: &Creds, members: usize) -> anyhow::Result<u64> {
    let started = Instant::now();
    let want_voters = members.min(3);
    loop {
        for a in agents.iter_mut() {
            if let Some(status) = a.child.try_wait()? {
                bail!(
                    "agent {} exited with {status} during start-up:\n{}",
                    a.id,
                    log_tail(&a.log)
                );
            }
        }
        if let Ok(s) = status(&agents[0].addr, creds).await {
            let voters = s
                .members
                .iter()
                .filter(|m| m.role == gpu_proto::v1::MemberRole::Voter as i32)
                .count();
            if let Some(leader) = s.leader_id
                && s.members.len() == members
                && voters == want_voters
            {
                return Ok(leader);
            }
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "the mesh did not form within {READY_TIMEOUT:?}; agent logs:\n{}",
                log_tail(&agents[0].log)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn status(addr: &str, creds: &Creds) -> anyhow::Result<gpu_proto::v1::ClusterStatus> {
    let mut client = ClusterServiceClient::new(creds.connect(addr).await?);
    let mut req = tonic::Request::new(GetStatusRequest { stale: false });
    req.set_timeout(Duration::from_secs(2));
    req.metadata_mut().insert("authorization", creds.bearer()?);
    Ok(client.get_status(req).await?.into_inner())
}

/// Tell the user how to reach the mesh; returns the gpuctl config written for it, if any.
fn print_banner(agents: &[DevAgent], leader: u64, dir: &Path) -> Option<(PathBuf, String)> {
    let addrs: Vec<&str> = agents.iter().map(|a| a.addr.as_str()).collect();
    let endpoints = addrs.join(",");
    let token = dir.join(TOKEN_FILE);
    println!(
        "gpumesh dev mesh: {} agents up, leader n{leader}, data and logs in {}",
        agents.len(),
        dir.display()
    );
    println!("endpoint: {endpoints}");
    let metrics: Vec<String> = agents
        .iter()
        .map(|a| format!("http://{}/metrics", a.metrics))
        .collect();
    println!("prometheus: {}", metrics.join(" "));
    println!("token file: {}", token.display());
    // The token goes after `#`: a browser never sends the fragment to a server or a log.
    let admin_token = std::fs::read_to_string(&token).unwrap_or_default();
    println!(
        "console: https://{}/console/login#token={}  (the CA is {}; accept it or import it)",
        addrs[0],
        admin_token.trim(),
        dir.join("ca.crt").display()
    );
    println!();
    let written = write_gpuctl_config(&addrs, dir);
    match &written {
        Ok((path, _)) => println!("gpuctl is set up for this mesh through {}:", path.display()),
        Err(why) => {
            println!("{why}; point gpuctl at this mesh with:");
            println!("  export GPUCTL_ENDPOINT={endpoints}");
            println!("  export GPUCTL_TOKEN_FILE={}", token.display());
            println!("  export GPUCTL_CA_FILE={}", dir.join("ca.crt").display());
            println!(
                "  export GPUCTL_CERT_FILE={}",
                dir.join("admin.crt").display()
            );
            println!(
                "  export GPUCTL_KEY_FILE={}",
                dir.join("admin.key").display()
            );
        }
    }
    println!("  cargo run --release --bin gpuctl -- cluster status");
    println!("  cargo run --release --bin gpuctl -- gpu list");
    println!();
    println!("Ctrl-C stops the mesh.");
    written.ok()
}

const CONFIG_MARKER: &str = "# written by gpu-agent dev";

/// Point gpuctl's config file (`$GPUCTL_CONFIG`, else `~/.config/gpumesh/gpuctl.toml`) at this
/// mesh, unless the file exists and is not one `dev` wrote.
fn write_gpuctl_config(addrs: &[&str], dir: &Path) -> Result<(PathBuf, String), String> {
    let path = match std::env::var_os("GPUCTL_CONFIG") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
            .join(".config/gpumesh/gpuctl.toml"),
    };
    if let Ok(existing) = std::fs::read_to_string(&path)
        && !existing.starts_with(CONFIG_MARKER)
    {
        return Err(format!(
            "left {} alone (it was not written by gpu-agent dev)",
            path.display()
        ));
    }
    let endpoints = addrs
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let file = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    let text = format!(
        "{CONFIG_MARKER}: points gpuctl at a local dev mesh.\nendpoint = [{endpoints}]\n\
         token_file = {}\nca_file = {}\ncert_file = {}\nkey_file = {}\n",
        file(TOKEN_FILE),
        file("ca.crt"),
        file("admin.crt"),
        file("admin.key"),
    );
    let write = || -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &text)
    };
    write().map_err(|e| format!("could not write {}: {e}", path.display()))?;
    Ok((path, text))
}

/// Run until cancelled, reporting agents that exit on their own.
async fn watch(agents: &mut [DevAgent], cancel: &CancellationToken) {
    let mut reported = vec![false; agents.len()];
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        for (a, seen) in agents.iter_mut().zip(reported.iter_mut()) {
            if !*seen && let Ok(Some(status)) = a.child.try_wait() {
                eprintln!(
                    "agent {} exited with {status}; its log: {}",
                    a.id,
                    a.log.display()
                );
                *seen = true;
            }
        }
    }
}

/// SIGTERM every agent, then SIGKILL whatever is still running after the grace period.
async fn stop(agents: &mut [DevAgent]) {
    for a in agents.iter() {
        if let Some(pid) = a.child.id().and_then(|p| i32::try_from(p).ok()) {
            kill(Pid::from_raw(pid), Signal::SIGTERM).ok();
        }
    }
    for a in agents.iter_mut() {
        if tokio::time::timeout(STOP_GRACE, a.child.wait())
            .await
            .is_err()
        {
            a.child.kill().await.ok();
        }
    }
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
