//! `gpu-agent run`'s command-line flags that override keys of the configuration file, defined
//! once: clap parses them, and `Overrides::apply` lays them over the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use gpu_raft_store::NodeId;

use super::file::{FileConfig, MonitorSection, TlsSection};
use crate::gpu::BackendKind;

/// Command-line values that override the file.
#[derive(Debug, Default, clap::Args)]
pub struct Overrides {
    /// This agent's Raft node id: unique, at least 1, stable for the host's life.
    #[arg(long)]
    pub node_id: Option<NodeId>,
    /// Address to listen on for peers and clients.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address others use to reach this agent (default: --listen).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Where the vote, Raft log, snapshots and job runs live (locked while running).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Create a new cluster with this agent as its first member.
    #[arg(long, conflicts_with = "join")]
    pub bootstrap: bool,
    /// Join an existing cluster through any of these members.
    #[arg(long, value_delimiter = ',')]
    pub join: Option<Vec<String>>,
    /// Node labels, k=v,k=v.
    #[arg(long, value_delimiter = ',', value_parser = parse_label)]
    pub labels: Option<Vec<(String, String)>>,
    /// GPU backend: nvml (real GPUs), sim (simulated), auto (nvml when the driver loads).
    #[arg(long)]
    pub gpu_backend: Option<BackendKind>,
    /// Simulated GPUs, e.g. 4xA100-80GB,2xT4-16GB.
    #[arg(long)]
    pub sim_gpus: Option<String>,
    /// Where --bootstrap writes the first admin token (default: <data-dir>/bootstrap-admin.token).
    #[arg(long)]
    pub bootstrap_token_file: Option<PathBuf>,
    /// Plaintext without certificates; refused unless listening and advertising on loopback.
    #[arg(long)]
    pub insecure: bool,
    /// Joining: the cluster CA certificate to trust (the bootstrap agent's <data-dir>/tls/ca.crt).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Joining: a file holding a join token (`gpuctl token create --role node`). Never a flag
    /// value: secrets do not belong in argv.
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// Serve Prometheus metrics over plain HTTP at ADDR/metrics (config: monitor.metrics_listen).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

impl Overrides {
    /// The file with every flag given laid over its key; a switch (`--bootstrap`,
    /// `--insecure`) can turn its key on, never off.
    pub(super) fn apply(self, file: FileConfig) -> FileConfig {
        FileConfig {
            node_id: self.node_id.or(file.node_id),
            listen: self.listen.or(file.listen),
            advertise: self.advertise.or(file.advertise),
            data_dir: self.data_dir.or(file.data_dir),
            bootstrap: self.bootstrap.then_some(true).or(file.bootstrap),
            join: self.join.or(file.join),
            labels: self.labels.map(|l| l.into_iter().collect()).or(file.labels),
            gpu_backend: self.gpu_backend.or(file.gpu_backend),
            sim_gpus: self.sim_gpus.or(file.sim_gpus),
            bootstrap_token_file: self.bootstrap_token_file.or(file.bootstrap_token_file),
            tls: TlsSection {
                insecure: self.insecure.then_some(true).or(file.tls.insecure),
                ca_file: self.ca_file.or(file.tls.ca_file),
                join_token_file: self.join_token_file.or(file.tls.join_token_file),
                ..file.tls
            },
            monitor: MonitorSection {
                metrics_listen: self.metrics_listen.or(file.monitor.metrics_listen),
                ..file.monitor
            },
            ..file
        }
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("label {s:?} is not k=v"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        flags: Overrides,
    }

    fn flags(args: &[&str]) -> clap::error::Result<Overrides> {
        Run::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|r| r.flags)
    }

    #[test]
    fn flags_lay_over_the_file() {
        let file = FileConfig::parse(
            "bootstrap = true\nlabels = { site = \"b\" }\n[tls]\nca_file = \"ca.crt\"\n",
        )
        .expect("parses");
        let given = flags(&[
            "--labels",
            "site=a,rack=r1",
            "--insecure",
            "--metrics-listen",
            "127.0.0.1:9100",
        ])
        .expect("valid flags");
        let f = given.apply(file);
        let labels = BTreeMap::from([("rack".into(), "r1".into()), ("site".into(), "a".into())]);
        assert_eq!(
            f.labels,
            Some(labels),
            "--labels replaces the file's labels"
        );
        assert_eq!(
            (f.bootstrap, f.tls.insecure),
            (Some(true), Some(true)),
            "a switch left off keeps the file's key"
        );
        assert_eq!(f.tls.ca_file, Some(PathBuf::from("ca.crt")));
        assert_eq!(f.monitor.metrics_listen, "127.0.0.1:9100".parse().ok());
        assert!(flags(&["--labels", "site"]).is_err(), "a label is k=v");
        assert!(flags(&["--bootstrap", "--join", "a:1"]).is_err());
    }
}
