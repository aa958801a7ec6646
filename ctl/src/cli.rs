//! The command line, as clap parses it. Resolution into validated requests happens in the
//! command modules.

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "gpuctl",
    version,
    about = "Control a gpumesh GPU cluster through any of its agents"
)]
pub struct Cli {
    /// Agent addresses, tried in order until one answers.
    #[arg(
        long,
        global = true,
        env = "GPUCTL_ENDPOINT",
        value_delimiter = ',',
        default_value = "127.0.0.1:7070"
    )]
    pub endpoint: Vec<String>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Per-request deadline, e.g. 5s or 500ms.
    #[arg(long, global = true, default_value = "10s", value_parser = humantime_duration)]
    pub timeout: std::time::Duration,
    #[command(subcommand)]
    pub command: Noun,
}

fn humantime_duration(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s).ok_or_else(|| format!("{s:?} is not a duration like 500ms, 5s or 1m"))
}

/// A small humantime subset: an integer followed by ms, s or m.
fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(std::time::Duration::from_millis(n)),
        "s" => Some(std::time::Duration::from_secs(n)),
        "m" => Some(std::time::Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
    .filter(|d| !d.is_zero())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Noun {
    /// The Raft group: leader, log progress, members.
    #[command(subcommand)]
    Cluster(ClusterVerb),
    /// Registered agents and their labels.
    #[command(subcommand)]
    Node(NodeVerb),
}

#[derive(Subcommand, Debug)]
pub enum ClusterVerb {
    /// Leader, term, commit/applied index and members.
    Status {
        /// Answer from the contacted agent's replica without asking the leader.
        #[arg(long)]
        stale: bool,
    },
    /// Members with role, reachability and last contact.
    Members {
        #[arg(long)]
        stale: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum NodeVerb {
    /// All registered nodes.
    List {
        #[arg(long)]
        stale: bool,
    },
    /// One node.
    Get {
        id: u64,
        #[arg(long)]
        stale: bool,
    },
    /// Set labels (`key=value`) and remove them (`key-`).
    Label {
        id: u64,
        #[arg(required = true)]
        changes: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("500ms"),
            Some(std::time::Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration("2m"),
            Some(std::time::Duration::from_secs(120))
        );
        for bad in ["", "5", "0s", "s", "5h", "-1s", "99999999999999999999s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
