//! etcd as a benchmark target: a cluster of the real `etcd` binary on loopback (the
//! Debian package `etcd-server`, installed when missing), data on the same disk as gpumesh's,
//! default timings and fsync. A write is one `Put` of a submission-sized value. It runs in
//! plain HTTP (how etcd starts by default) or with mutual TLS for clients and peers
//! (`etcd_tls.rs`), which is how gpumesh always runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tonic::transport::Channel;

use crate::etcd_tls::EtcdTls;
use crate::etcdserverpb::kv_client::KvClient;
use crate::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::etcdserverpb::{PutRequest, RangeRequest, StatusRequest};
use crate::target::{Crashable, Target};

pub struct Etcd {
    bin: PathBuf,
    dir: tempfile::TempDir,
    members: Vec<Member>,
    value: Vec<u8>,
    tls: Option<EtcdTls>,
}

/// How etcd's members and clients talk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// Plain HTTP, no client certificates: etcd's default.
    Plain,
    /// Mutual TLS for clients and peers, as gpumesh runs.
    MutualTls,
}

struct Member {
    name: String,
    client: String,
    peer: String,
    child: Option<Child>,
}

/// The `etcd` binary: on `PATH`, else installed with apt (as root) and then on `PATH`.
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(found) = on_path("etcd") {
        return Ok(found);
    }
    eprintln!("etcd is not installed: apt-get install -y etcd-server");
    let status = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends", "etcd-server"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get (install etcd-server yourself, or pass --skip-etcd)")?;
    if !status.success() {
        bail!("apt-get install etcd-server failed ({status}); install it or pass --skip-etcd");
    }
    on_path("etcd").context("etcd-server installed, but no `etcd` on PATH")
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

impl Etcd {
    /// Start `n` members and wait until they elect a leader. Puts carry `value_bytes` bytes.
    pub async fn start(n: usize, value_bytes: usize, security: Security) -> anyhow::Result<Etcd> {
        let bin = binary()?;
        let dir = tempfile::tempdir()?;
        let tls = match security {
            Security::Plain => None,
            Security::MutualTls => Some(EtcdTls::make(dir.path())?),
        };
        let members = (0..n)
            .map(|i| Member {
                name: format!("e{}", i + 1),
                client: gpu_tests::free_addr(),
                peer: gpu_tests::free_addr(),
                child: None,
            })
            .collect();
        let mut etcd = Etcd {
            bin,
            dir,
            members,
            value: vec![b'v'; value_bytes],
            tls,
        };
        for i in 0..n {
            etcd.spawn(i)?;
        }
        etcd.wait_healthy().await?;
        Ok(etcd)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let scheme = self.scheme();
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={scheme}://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let dir = self.dir.path();
        let m = &self.members[i];
        let log = std::fs::File::create(dir.join(format!("{}.log", m.name)))?;
        let child = Command::new(&self.bin)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(data_dir(dir, &m.name))
            .arg(format!("--listen-client-urls={scheme}://{}", m.client))
            .arg(format!("--advertise-client-urls={scheme}://{}", m.client))
            .arg(format!("--listen-peer-urls={scheme}://{}", m.peer))
            .arg(format!(
                "--initial-advertise-peer-urls={scheme}://{}",
                m.peer
            ))
            .args(self.tls.iter().flat_map(EtcdTls::flags))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=gpumesh-bench")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    async fn channel(&self, i: usize) -> anyhow::Result<Channel> {
        let addr = format!("{}://{}", self.scheme(), self.members[i].client);
        let mut endpoint = Channel::from_shared(addr)?.connect_timeout(Duration::from_secs(2));
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.client())?;
        }
        Ok(endpoint.connect().await?)
    }

    /// The leader's member id as member `i` reports it (0 while it knows none), and its own.
    async fn status(&self, i: usize) -> anyhow::Result<(u64, u64)> {
        let mut c = MaintenanceClient::new(self.channel(i).await?);
        let s = c.status(StatusRequest {}).await?.into_inner();
        let own = s.header.map_or(0, |h| h.member_id);
        Ok((s.leader, own))
    }

    /// Wait until every running member names the same leader and a put goes through.
    async fn wait_healthy(&self) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if self.healthy().await {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!(
                    "etcd did not become healthy in 30 s; logs in {}",
                    self.dir.path().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn healthy(&self) -> bool {
        let mut leaders = Vec::new();
        for i in 0..self.members.len() {
            match self.status(i).await {
                Ok((leader, _)) if leader != 0 => leaders.push(leader),
                _ => return false,
            }
        }
        leaders.dedup();
        if leaders.len() != 1 {
            return false;
        }
        match self.connect(0).await {
            Ok(mut c) => self.write(&mut c, u64::MAX).await.is_ok(),
            Err(_) => false,
        }
    }
}

fn data_dir(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}.etcd"))
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Target for Etcd {
    type Client = KvClient<Channel>;

    fn members(&self) -> usize {
        self.members.len()
    }

    fn pids(&self) -> Vec<u32> {
        let children = self.members.iter().filter_map(|m| m.child.as_ref());
        children.map(Child::id).collect()
    }

    async fn connect(&self, client: usize) -> anyhow::Result<Self::Client> {
        Ok(KvClient::new(self.channel(client % self.members()).await?))
    }

    async fn write(&self, client: &mut Self::Client, seq: u64) -> anyhow::Result<()> {
        let put = PutRequest {
            key: format!("bench/{seq:016x}").into_bytes(),
            value: self.value.clone(),
        };
        client.put(put).await?;
        Ok(())
    }

    async fn round_trip(&self, client: &mut Self::Client) -> anyhow::Result<()> {
        let range = RangeRequest {
            key: b"bench/none".to_vec(),
            serializable: true,
        };
        client.range(range).await?;
        Ok(())
    }
}

impl Crashable for Etcd {
    async fn leader(&self) -> anyhow::Result<usize> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            for i in 0..self.members.len() {
                if let Ok((leader, own)) = self.status(i).await
                    && leader != 0
                    && leader == own
                {
                    return Ok(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("etcd has no leader after 30 s")
    }

    fn kill(&mut self, member: usize) {
        if let Some(mut child) = self.members[member].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn restart(&mut self, member: usize) -> anyhow::Result<()> {
        self.spawn(member)?;
        self.wait_healthy().await
    }
}
