//! The command line, as clap parses it. Resolution into validated requests happens in the
//! command modules; the value parsers named here live in `ids`, `units` and `args`.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::args::{self, AccountArg, Fault};
use crate::{ids, units};

/// Per-request deadline when `--timeout` is not given.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// `image pull`'s deadline when `--timeout` is not given: large images over a slow link.
pub(crate) const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Parser, Debug)]
#[command(
    name = "gpuctl",
    version = crate::VERSION,
    about = "Control a gpumesh GPU cluster through any of its agents"
)]
pub(crate) struct Cli {
    /// Agent addresses, tried in order until one answers [default: the config file's, else
    /// 127.0.0.1:7070].
    #[arg(long, global = true, env = "GPUCTL_ENDPOINT", value_delimiter = ',')]
    pub endpoint: Option<Vec<String>>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Per-request deadline, e.g. 5s or 500ms [default: 10s]. For `job wait`, the limit on the
    /// whole wait [default: none].
    #[arg(long, global = true, value_parser = units::positive_duration)]
    pub timeout: Option<Duration>,
    /// File holding the bearer token (`<id>.<secret>`). The token itself may instead be given
    /// in the environment as GPUCTL_TOKEN; it is never taken from the command line.
    #[arg(long, global = true, env = "GPUCTL_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// The cluster CA certificate. With it gpuctl speaks TLS and verifies the agent; without
    /// it, plaintext (only agents started with --insecure accept that).
    #[arg(long, global = true, env = "GPUCTL_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) presented to agents; needs --key-file.
    #[arg(long, global = true, env = "GPUCTL_CERT_FILE")]
    pub cert_file: Option<std::path::PathBuf>,
    /// Private key of the client certificate; refused when other users can read it.
    #[arg(long, global = true, env = "GPUCTL_KEY_FILE")]
    pub key_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Noun,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Noun {
    /// Shell completions and man pages generated from this command line (used at install).
    #[command(hide = true, subcommand)]
    Generate(GenerateVerb),
    /// The Raft group: leader, log progress, members.
    #[command(subcommand)]
    Cluster(ClusterVerb),
    /// Registered agents: status, GPUs, labels, schedulability.
    #[command(subcommand)]
    Node(NodeVerb),
    /// Every GPU of the cluster with its state and live telemetry.
    #[command(subcommand)]
    Gpu(GpuVerb),
    /// Container images on the nodes: pre-pull one so jobs using it start at once.
    #[command(subcommand)]
    Image(ImageVerb),
    /// Submit, inspect, follow and cancel jobs.
    #[command(subcommand)]
    Job(JobVerb),
    /// Testing aids for clusters running the simulated GPU backend.
    #[command(subcommand)]
    Debug(DebugVerb),
    /// API tokens: create (the secret is shown once), list, revoke, and which one you use.
    #[command(subcommand)]
    Token(TokenVerb),
    /// The hash-chained audit log of every API mutation and refused request.
    #[command(subcommand)]
    Audit(AuditVerb),
    /// Certificates the cluster CA issued, and revocation.
    #[command(subcommand)]
    Cert(CertVerb),
    /// The scheduling policy the cluster uses, and its queue.
    #[command(subcommand)]
    Scheduler(SchedulerVerb),
    /// GPU alerts raised by the agents, and the rules they evaluate.
    #[command(subcommand)]
    Alert(AlertVerb),
    /// A live view of every GPU: utilization, memory, temperature, power, job, alerts.
    Top {
        /// Refresh period.
        #[arg(long, default_value = "2s", value_parser = units::positive_duration)]
        interval: Duration,
        /// Print one frame and exit (also when stdout is not a terminal).
        #[arg(long)]
        once: bool,
    },
    /// Tenants: quotas per GPU type, fair-share weight, default priority, GPU time.
    #[command(subcommand)]
    Tenant(TenantVerb),
    /// Run a job interactively: `gpuctl run --gpus 1 -- python eval.py`. Submits it (the flags
    /// of `job submit`), shows progress on stderr until it runs, streams its stdout and stderr
    /// live, cancels it on Ctrl-C (a second Ctrl-C exits at once), and exits with the job's
    /// exit code (128+N for signal N; 1 when it failed otherwise or was cancelled).
    Run(Box<SubmitArgs>),
}

#[derive(Subcommand, Debug)]
pub(crate) enum AlertVerb {
    /// Open alerts (with --all, also the most recent resolved ones).
    List {
        #[arg(long)]
        all: bool,
        /// Answer from the contacted agent's replica without asking the leader.
        #[arg(long)]
        stale: bool,
    },
    /// The rules in force: built-in, the contacted agent's config file, replicated.
    #[command(subcommand)]
    Rule(AlertRuleVerb),
}

#[derive(Subcommand, Debug)]
pub(crate) enum AlertRuleVerb {
    /// Every rule and where it comes from.
    List,
    /// Add or replace a replicated rule, e.g. `hot --metric temperature_c --above 85 --for 30s
    /// --action throttle:70`; it overrides a built-in or configured rule of the same name.
    Set(Box<AlertRuleArgs>),
    /// Remove a replicated rule (a built-in or configured one of that name applies again).
    Delete { name: String },
}

#[derive(Args, Debug)]
pub(crate) struct AlertRuleArgs {
    pub name: String,
    /// temperature_c, memory_temperature_c, power_w, utilization_pct, memory_used_pct,
    /// ecc_single_bit, ecc_double_bit, retired_pages, pcie_replays, nvlink_errors, xids.
    #[arg(long)]
    pub metric: Option<String>,
    /// Fire when the metric stays above this for --for.
    #[arg(long, allow_negative_numbers = true)]
    pub above: Option<f64>,
    /// Fire when the metric grows faster than this per minute over --window.
    #[arg(long)]
    pub rate_per_minute: Option<f64>,
    /// Fire when a trend fit over --window reaches this within --within.
    #[arg(long, allow_negative_numbers = true)]
    pub predict_limit: Option<f64>,
    /// A health rule: fire on these XIDs, a new double-bit ECC error or a lost GPU.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub fatal_xids: Option<Vec<u32>>,
    #[arg(long = "for", value_parser = units::parse_duration_arg)]
    pub for_: Option<Duration>,
    #[arg(long, value_parser = units::parse_duration_arg)]
    pub window: Option<Duration>,
    #[arg(long, value_parser = units::parse_duration_arg)]
    pub within: Option<Duration>,
    /// Hysteresis: resolve only after the condition has been false this long.
    #[arg(long, value_parser = units::parse_duration_arg)]
    pub clear_after: Option<Duration>,
    /// warning (default) or critical.
    #[arg(long)]
    pub severity: Option<String>,
    /// none (default), throttle:PCT, quarantine or migrate.
    #[arg(long)]
    pub action: Option<String>,
    /// Switch the rule of this name off everywhere.
    #[arg(long)]
    pub disabled: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum TenantVerb {
    /// Create a tenant record (admins). Without quotas the tenant stays unlimited.
    Create {
        name: String,
        /// TYPE=GUARANTEED[:BORROW], e.g. A100=4:2 (4 guaranteed, 2 more borrowed while idle);
        /// repeatable. GPU types without a quota stay unlimited.
        #[arg(long = "quota", value_name = "TYPE=G[:B]", value_parser = args::quota)]
        quotas: Vec<(String, u32, u32)>,
        /// Fair-share weight (1..=10000; default 1, the weight of a tenant without a record).
        #[arg(long)]
        weight: Option<u32>,
        /// Priority of this tenant's jobs submitted without --priority (default 0).
        #[arg(long, allow_negative_numbers = true)]
        default_priority: Option<i32>,
        /// The highest priority its users and tenant admins may give a job (default: the
        /// default priority).
        #[arg(long, allow_negative_numbers = true)]
        max_priority: Option<i32>,
        /// The most jobs it may have pending at once; a submission beyond is refused
        /// (default: no cap).
        #[arg(long, value_name = "N")]
        max_pending_jobs: Option<u32>,
        #[command(flatten)]
        account: AccountArgs,
        /// A host directory (with what lies below it) the tenant's container jobs may bind
        /// with --mount; repeatable [default: none].
        #[arg(long = "allow-mount", value_name = "DIR")]
        allow_mounts: Vec<String>,
        #[command(flatten)]
        webhook: WebhookArgs,
    },
    /// Change a tenant's quotas, weight, default priority, default account or allowed mounts
    /// (admins).
    Update {
        name: String,
        /// Set or replace the quota of a GPU type; repeatable.
        #[arg(long = "quota", value_name = "TYPE=G[:B]", value_parser = args::quota)]
        quotas: Vec<(String, u32, u32)>,
        /// Remove the quota of a GPU type (it becomes unlimited); repeatable.
        #[arg(long = "remove-quota", value_name = "TYPE")]
        remove_quotas: Vec<String>,
        #[arg(long)]
        weight: Option<u32>,
        #[arg(long, allow_negative_numbers = true)]
        default_priority: Option<i32>,
        #[arg(long, allow_negative_numbers = true)]
        max_priority: Option<i32>,
        /// The most jobs it may have pending at once; 0 removes the cap.
        #[arg(long, value_name = "N")]
        max_pending_jobs: Option<u32>,
        #[command(flatten)]
        account: AccountArgs,
        /// Remove the tenant's default account (its jobs then run as each node's own
        /// jobs.run_as, unless their token maps to an account).
        #[arg(long, conflicts_with = "account")]
        clear_account: bool,
        /// Allow the tenant's container jobs to bind this host directory; repeatable.
        #[arg(long = "allow-mount", value_name = "DIR")]
        allow_mounts: Vec<String>,
        /// No longer allow this host directory; repeatable.
        #[arg(long = "disallow-mount", value_name = "DIR")]
        disallow_mounts: Vec<String>,
        #[command(flatten)]
        webhook: WebhookArgs,
        /// Remove the tenant's webhook.
        #[arg(long, conflicts_with = "webhook")]
        clear_webhook: bool,
    },
    /// The secret that signs the tenant's webhook posts (hex), for its receiver (admins; a
    /// voter answers: it holds the CA key). See docs/notifications.md.
    WebhookSecret { name: String },
    /// One tenant: quotas, GPUs held and GPU time by type, and per job.
    Get {
        name: String,
        #[arg(long)]
        stale: bool,
    },
    /// Every tenant with a record or a job.
    List {
        #[arg(long)]
        stale: bool,
    },
    /// Set the tenant's login at a container registry, used to pull its jobs' images
    /// (admins). The password is read from a file (never the command line), sealed by the
    /// agent (a voter: it holds the CA key) and never shown again.
    SetRegistryCredential {
        tenant: String,
        /// The registry host as images name it: nvcr.io, localhost:5000, docker.io.
        registry: String,
        #[arg(long, required_unless_present = "remove")]
        username: Option<String>,
        /// A file holding the password or token (one line; a final newline is dropped).
        #[arg(long, required_unless_present = "remove", conflicts_with = "remove")]
        password_file: Option<std::path::PathBuf>,
        /// Remove the tenant's login at the registry instead.
        #[arg(long, conflicts_with = "username")]
        remove: bool,
    },
}

/// A tenant's webhook: where the leader posts its jobs' state changes.
#[derive(Args, Debug)]
pub(crate) struct WebhookArgs {
    /// POST every job's state changes here (http:// or https://, signed); jobs of the tenant
    /// may have webhooks of their own at this URL's origin.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Only these events: start, end, failure, requeue (comma-separated) [default: all].
    #[arg(
        long = "webhook-on",
        value_name = "EVENTS",
        value_delimiter = ',',
        requires = "webhook"
    )]
    pub webhook_on: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CertVerb {
    /// Every certificate the cluster issued or revoked.
    List,
    /// Get a client certificate for your token: a key is made here (it never leaves), the
    /// cluster signs it. Needs only the CA file and the token; writes `client.crt` and
    /// `client.key` (0600) into DIR, to use as --cert-file / --key-file.
    Request {
        #[arg(long)]
        out_dir: std::path::PathBuf,
    },
    /// Revoke a certificate by serial: every agent refuses it once it applies the revocation.
    Revoke {
        serial: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// The cluster CA and its rotation: introduce a new CA, switch to it, retire the old one
    /// (docs/operations.md, "Rotating the cluster CA").
    #[command(subcommand)]
    Ca(CaVerb),
}

#[derive(Subcommand, Debug)]
pub(crate) enum CaVerb {
    /// The trusted CAs, which one signs, the members that have not installed every CA, and the
    /// certificates in use from a CA that no longer signs.
    Status,
    /// Write the trust bundle (every trusted CA, PEM) to FILE, or to stdout: what gpuctl's
    /// ca_file and every other client should trust.
    Bundle {
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Step 1: make a new CA and trust it beside the signing one (send it to a voter).
    Introduce,
    /// Step 2: sign with the introduced CA from now on; every agent renews its certificate at
    /// once. Refused until every member has installed the new CA (send it to a voter).
    Switch {
        /// Do not wait for members the cluster declared Down (they must join anew after the
        /// retire).
        #[arg(long)]
        skip_down: bool,
    },
    /// Step 3: trust the old CA no more. Refused while a certificate in use chains to it. With
    /// the key id of an introduced CA, calls the rotation off instead.
    Retire {
        key_id: Option<String>,
        /// Do not wait for members the cluster declared Down to renew.
        #[arg(long)]
        skip_down: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum SchedulerVerb {
    /// The current policy, pending and running jobs, free GPUs.
    Status {
        /// Answer from the contacted agent's replica without asking the leader.
        #[arg(long)]
        stale: bool,
    },
    /// Change the policy.
    #[command(subcommand)]
    Policy(SchedulerPolicyVerb),
}

#[derive(Subcommand, Debug)]
pub(crate) enum SchedulerPolicyVerb {
    /// Set the policy, e.g. `sjf+easy`, `fairshare`, `priority+greedy --aging-per-hour 2`.
    Set {
        /// ORDERING[+BACKFILL]: fcfs|sjf|priority|fairshare|learned, then strict (default)|easy|greedy|conservative.
        policy: String,
        /// Priority points a waiting job gains per hour (priority ordering).
        #[arg(long)]
        aging_per_hour: Option<u32>,
        /// Points taken from a job whose tenant holds all recent usage (priority ordering).
        #[arg(long)]
        fairshare_weight: Option<u32>,
        /// Half-life of past usage in fair-share terms, e.g. 1d, 6h.
        #[arg(long, value_parser = crate::units::whole_seconds)]
        usage_half_life: Option<u64>,
        /// off | reclaim (take GPUs back from tenants borrowing them) | priority (reclaim,
        /// and stop strictly lower-priority jobs; never for a borrower).
        #[arg(long, value_parser = ["off", "reclaim", "priority"])]
        preemption: Option<String>,
        /// The gang starvation guard, e.g. 6h (0s: off): a gang pending this long goes first
        /// and holds the queue with a reservation; with preemption on it may stop
        /// single-node runs of no higher priority.
        #[arg(long, value_parser = crate::units::whole_seconds)]
        gang_wait_limit: Option<u64>,
        /// How long a run is exempt from preemption once placed, e.g. 1h (0s: off): damps a
        /// borrower stopped, placed again and stopped again.
        #[arg(long, value_parser = crate::units::whole_seconds)]
        preempt_exempt: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum TokenVerb {
    /// Mint a token. Prints `<id>.<secret>` once; store it, the cluster keeps only a hash.
    Create {
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Tenant for tenant-admin and user tokens (and optionally viewer tokens).
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        account: AccountArgs,
        /// How long it works (90m, 12h, 30d); default: 24h for a join token, until revoked
        /// for others.
        #[arg(long, value_name = "DURATION", value_parser = units::whole_seconds)]
        ttl: Option<u64>,
        /// A join token's enrolments (default 1).
        #[arg(long, value_name = "N")]
        uses: Option<u32>,
        /// The node ids a join token may enrol: ID or FIRST-LAST (default: any id not yet a
        /// member; enrolling an existing member's id again needs exactly that id here).
        #[arg(long, value_name = "ID[-ID]", value_parser = args::node_ids)]
        node_ids: Option<(u64, u64)>,
        /// Where a join token's nodes may sit in the Raft group: voter (when the autopilot
        /// needs one; the default), learner or edge (learners for good; an edge node must run
        /// with an [edge] section).
        #[arg(long, value_parser = ["voter", "learner", "edge"])]
        seat: Option<String>,
    },
    /// Tokens you may manage.
    List,
    /// Map a token to the Unix account its holder's jobs run as, or --clear the mapping
    /// (admins). Jobs submitted before keep the account they were given.
    SetAccount {
        id: String,
        /// USER or USER:GROUP (names or numeric ids; never root).
        #[arg(
            value_name = "USER[:GROUP]",
            value_parser = args::account,
            required_unless_present = "clear"
        )]
        account: Option<AccountArg>,
        /// Supplementary groups, comma-separated (names or gids).
        #[arg(long, value_name = "G1,G2", value_delimiter = ',', value_parser = args::non_empty, conflicts_with = "clear")]
        groups: Vec<String>,
        /// Remove the mapping: the token's jobs run as its tenant's default account, if any.
        #[arg(long, conflicts_with = "account")]
        clear: bool,
    },
    /// Revoke a token by id; it stops working as soon as each agent applies the revocation.
    Revoke { id: String },
    /// The token this gpuctl uses.
    Whoami,
}

/// `--account USER[:GROUP] [--groups G1,G2]`: who the jobs of a token or tenant run as.
#[derive(Args, Debug)]
pub(crate) struct AccountArgs {
    /// The Unix account the jobs run as: USER or USER:GROUP (names or numeric ids; never
    /// root). Admins only.
    #[arg(long, value_name = "USER[:GROUP]", value_parser = args::account)]
    pub account: Option<AccountArg>,
    /// Supplementary groups of the account, comma-separated (names or gids).
    #[arg(long, value_name = "G1,G2", value_delimiter = ',', value_parser = args::non_empty, requires = "account")]
    pub groups: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KindArg {
    Process,
    Vm,
}

/// A GPU's partitioning mode, as `SetGpuPartition` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum GpuModeArg {
    /// One job holds the whole GPU (the default).
    Whole,
    /// MIG instances per `--layout`, one job each.
    Mig,
    /// Jobs share the GPU by memory and compute share (MPS limits per job).
    Shared,
    /// Whole GPUs for `--kind vm` jobs, handed over by PCI address.
    Passthrough,
}

impl GpuModeArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::Mig => "mig",
            Self::Shared => "shared",
            Self::Passthrough => "passthrough",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum RoleArg {
    Admin,
    Operator,
    TenantAdmin,
    User,
    Viewer,
    /// A join token for `gpu-agent run --join … --join-token-file`: it can only enrol agents.
    Node,
}

#[derive(Subcommand, Debug)]
pub(crate) enum AuditVerb {
    /// Audit entries, oldest first.
    List {
        /// Only entries after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// Check the hash chain and the leader's signed heads; exit 1 when the chain is broken,
    /// rewritten, or older entries are left unsigned.
    Verify {
        /// Also accept heads signed by this CA certificate (PEM file; repeatable): an earlier
        /// cluster's CA, for a chain restored from its backup.
        #[arg(long, value_name = "CA_FILE")]
        trust: Vec<std::path::PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterVerb {
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
    /// Backups of the replicated state (admins only).
    #[command(subcommand)]
    Snapshot(SnapshotVerb),
    /// Hand leadership to another voter (before restarting the leader's host): to N, or to
    /// the most caught-up voter that answers. Refused, changing nothing, for a learner, a
    /// member that is down or lags, or a non-member. Send it to a voter.
    TransferLeader {
        #[arg(long)]
        to: Option<u64>,
        /// Only if node N leads; otherwise change nothing (for scripts: "make sure N does not
        /// lead before restarting it").
        #[arg(long, value_name = "N")]
        from: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum GenerateVerb {
    /// Completions for SHELL on stdout.
    Completion { shell: clap_complete::Shell },
    /// Man pages (gpuctl.1 and one per subcommand) into DIR.
    Man { dir: std::path::PathBuf },
}

#[derive(Subcommand, Debug)]
pub(crate) enum SnapshotVerb {
    /// Save a consistent snapshot of the replicated state to FILE (mode 0600: it holds token
    /// hashes and the audit log), for `gpu-agent restore --from FILE`.
    Save {
        /// Where to write it; replaced atomically.
        file: std::path::PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum NodeVerb {
    /// All registered nodes.
    List {
        #[arg(long)]
        stale: bool,
    },
    /// One node and its GPUs.
    Get {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        id: u64,
        #[arg(long)]
        stale: bool,
    },
    /// Set labels (`key=value`) and remove them (`key-`).
    Label {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        id: u64,
        #[arg(required = true)]
        changes: Vec<String>,
    },
    /// Stop placing new jobs on a node; running jobs keep running.
    Cordon {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        id: u64,
    },
    /// Place new jobs on a node again.
    Uncordon {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        id: u64,
    },
    /// Remove a learner from the cluster for good: it leaves the membership and its
    /// certificates are revoked (the host must join anew under a new id). Refused for a voter,
    /// a non-member, or a node running jobs (drain it first). Send it to a voter.
    Remove {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        id: u64,
    },
    /// Cordon a node and, with --evict, stop its jobs so they are requeued elsewhere.
    Drain {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        id: u64,
        /// Also stop the node's running jobs (they are requeued without spending an attempt).
        #[arg(long)]
        evict: bool,
        /// Return once no job runs on the node any more (with --evict: once its jobs have
        /// stopped and been requeued), so the agent can be stopped; bounded by --timeout.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ImageVerb {
    /// Pull an image on a node (or on every node with a container runtime) through its agent;
    /// waits until the pulls have ended [--timeout default: 30m]. A node that holds the image
    /// already answers at once. `gpuctl node get` lists each node's images.
    Pull {
        /// The node (3 or n3).
        #[arg(long, value_parser = ids::node_id, conflicts_with = "all")]
        node: Option<u64>,
        /// Every node with a container runtime.
        #[arg(long)]
        all: bool,
        /// The image reference, e.g. nvcr.io/nvidia/pytorch:24.05-py3.
        image: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum GpuVerb {
    /// GPUs with state, job and live telemetry.
    List {
        /// Only this node's GPUs (3 or n3).
        #[arg(long, value_parser = ids::node_id)]
        node: Option<u64>,
    },
    /// One GPU's telemetry history, as its agent keeps it in memory (`monitor.retention`).
    Stats {
        /// NODE/GPU, e.g. 2/0 or n2/0.
        #[arg(value_parser = ids::gpu_ref)]
        gpu: (u64, u32),
        /// How far back (e.g. 30s, 10m, 1h).
        #[arg(long, default_value = "10m", value_parser = units::positive_duration)]
        since: std::time::Duration,
    },
    /// Set a GPU's mode and MIG layout: at once on an idle GPU; a busy one drains first (no new
    /// work, no job stopped) and changes when its jobs end.
    Partition {
        /// NODE/GPU, e.g. 2/0 or n2/0.
        #[arg(value_parser = ids::gpu_ref)]
        gpu: (u64, u32),
        #[arg(long, value_enum)]
        mode: GpuModeArg,
        /// MIG instances, comma-separated: PROFILE (at the lowest free start, in order) or
        /// PROFILE@START, e.g. 3g.40gb,2g.20gb,1g.10gb@6. Only with --mode mig.
        #[arg(long, value_delimiter = ',', value_parser = args::non_empty)]
        layout: Vec<String>,
    },
    /// GPU energy used per node and per tenant, and idle GPU time under a green-mode cap.
    Energy {
        /// Answer from the contacted agent's replica without asking the leader.
        #[arg(long)]
        stale: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum JobVerb {
    /// Queue a job: `gpuctl job submit --gpus 2 -- python train.py --lr 0.1`.
    Submit(Box<SubmitArgs>),
    /// Jobs, optionally filtered (state, node, tenant, user, name, labels, age).
    List(JobListArgs),
    /// One job in detail.
    Get {
        /// Job id: 42 or j-42; an array's task: j-7[3].
        #[arg(value_parser = ids::job_ref)]
        id: ids::JobRef,
        #[arg(long)]
        stale: bool,
    },
    /// Why a job is pending, its place in the queue and its estimated start.
    Why {
        /// Job id: 42 or j-42; an array's task: j-7[3].
        #[arg(value_parser = ids::job_ref)]
        id: ids::JobRef,
        #[arg(long)]
        stale: bool,
    },
    /// Cancel jobs, by id or by filter: pending jobs at once, running ones are stopped
    /// (SIGTERM, grace, SIGKILL).
    Cancel(JobSelection),
    /// Keep pending jobs from being placed until they are released.
    Hold(JobSelection),
    /// Let held jobs be placed again.
    Release(JobSelection),
    /// Change what pending jobs ask for: priority (within the tenant's ceiling), a shorter
    /// time limit, the GPU count. An array's id stands for all its pending tasks.
    Update {
        #[command(flatten)]
        selection: JobSelection,
        #[command(flatten)]
        change: JobChange,
    },
    /// Queue jobs again: running ones are stopped and requeued without spending an attempt,
    /// ended ones (still in the cluster's state) are pending again with fresh attempts.
    Requeue(JobSelection),
    /// Write a job's output to stdout as it arrives.
    Logs {
        /// Job id: 42 or j-42; an array's task: j-7[3].
        #[arg(value_parser = ids::job_ref)]
        id: ids::JobRef,
        /// Keep streaming new output until the job finishes.
        #[arg(short, long)]
        follow: bool,
        /// The job's stderr instead of its stdout.
        #[arg(long)]
        stderr: bool,
        /// The gang member (node rank, 0-based) whose output to read [default: 0].
        #[arg(long)]
        rank: Option<u32>,
        /// The run with this attempt number (see `job get`) [default: the latest run].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        attempt: Option<u32>,
    },
    /// Wait until a job has finished, then print it. Exit 0 when it succeeded, 1 when it failed
    /// or was cancelled, 2 on errors or when --timeout (the limit on the whole wait) runs out.
    Wait {
        /// Job id: 42 or j-42; an array's task: j-7[3].
        #[arg(value_parser = ids::job_ref)]
        id: ids::JobRef,
    },
}

/// The jobs `job cancel|hold|release` act on: the ids given, and every unfinished job that
/// matches all the filters given (at least one id or filter).
#[derive(Args, Debug)]
pub(crate) struct JobSelection {
    /// Job ids: 42 or j-42; an array's id stands for all its tasks, j-7[3] for one.
    #[arg(value_parser = ids::job_ref)]
    pub ids: Vec<ids::JobRef>,
    /// Jobs whose name matches this glob (`*`, `?`), e.g. 'sweep-*'.
    #[arg(long)]
    pub name: Option<String>,
    /// Jobs in this state (pending, bound, running); repeat or separate with commas.
    #[arg(long = "state", value_enum, ignore_case = true, value_delimiter = ',')]
    pub states: Vec<JobStateArg>,
    /// This tenant's jobs.
    #[arg(long)]
    pub tenant: Option<String>,
}

/// `job list`: the filters are applied by the agent, which answers in pages.
#[derive(Args, Debug)]
pub(crate) struct JobListArgs {
    /// Only jobs in this state; repeat or separate with commas.
    #[arg(long = "state", value_enum, ignore_case = true, value_delimiter = ',')]
    pub states: Vec<JobStateArg>,
    /// Only jobs placed on this node (3 or n3).
    #[arg(long, value_parser = ids::node_id)]
    pub node: Option<u64>,
    /// Only this tenant's jobs.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only jobs submitted by this token (its id, as `gpuctl token whoami` shows it).
    #[arg(long)]
    pub user: Option<String>,
    /// Only jobs whose name matches this glob (`*`, `?`), e.g. 'sweep-*'.
    #[arg(long)]
    pub name: Option<String>,
    /// Only jobs carrying this label (KEY=VALUE, given with `job submit --label`); repeatable.
    #[arg(short = 'l', long = "label", value_name = "KEY=VALUE", value_parser = args::key_value)]
    pub labels: Vec<(String, String)>,
    /// At most this many jobs [default: all].
    #[arg(long)]
    pub limit: Option<u32>,
    /// Finished jobs only, archived ones included, in the order they ended.
    #[arg(long, conflicts_with = "watch")]
    pub finished: bool,
    /// Only jobs submitted within this long (7d, 12h); with --finished: that ended within it
    /// [default with --finished: 1d].
    #[arg(long, value_parser = units::age)]
    pub since: Option<Duration>,
    /// Every task of an array on a line of its own [default: one line per array].
    #[arg(long)]
    pub tasks: bool,
    /// List, then print each matching job again whenever it changes, until interrupted (with
    /// -o json: one JSON object per line).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Answer from the contacted agent's replica without asking the leader.
    #[arg(long)]
    pub stale: bool,
}

/// What `job update` changes (at least one).
#[derive(Args, Debug, Clone, Copy)]
#[group(required = true, multiple = true)]
pub(crate) struct JobChange {
    /// New scheduling priority; a user's token is held to the tenant's ceiling.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// New time limit, no longer than the current one (e.g. 30m).
    #[arg(long = "time-limit", visible_alias = "wall-time", value_name = "DURATION", value_parser = units::time_limit)]
    pub wall_time: Option<u64>,
    /// New GPU count (in all, split evenly over a gang's nodes).
    #[arg(long)]
    pub gpus: Option<u32>,
}

/// `job submit`. Only syntax is checked here; the server judges the spec and its
/// "invalid argument" answer is printed as is.
#[derive(Args, Debug)]
pub(crate) struct SubmitArgs {
    /// Job name [default: the program's file name, reduced to [A-Za-z0-9._-]].
    #[arg(long)]
    pub name: Option<String>,
    /// Tenant that owns the job [default: the server's "default"].
    #[arg(long)]
    pub tenant: Option<String>,
    /// Number of GPUs (in all: with --nodes, split evenly over the nodes).
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Run as a gang over this many nodes, all or nothing, each member given MASTER_ADDR,
    /// MASTER_PORT, WORLD_SIZE, RANK, NODE_RANK and LOCAL_RANK.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// GPUs on each node of a gang (instead of --gpus: --gpus = --nodes × this).
    #[arg(long, conflicts_with = "gpus")]
    pub gpus_per_node: Option<u32>,
    /// A gang's nodes must all lie in one domain of this level (the node label of that name);
    /// without it a gang goes in the narrowest domain that can hold it now, else anywhere.
    #[arg(long, value_parser = ["nvlink-domain", "rack", "block"])]
    pub topology: Option<String>,
    /// Acceptable GPU types, the most preferred first ("A100,V100": an A100 if one has room,
    /// else a V100); repeat or separate with commas [default: any].
    #[arg(long = "gpu-type", value_delimiter = ',', value_parser = args::non_empty)]
    pub gpu_types: Vec<String>,
    /// Minimum memory per GPU: 40GiB, 80G, 40960MiB; a plain number is MiB.
    #[arg(long, value_parser = units::size_mib)]
    pub min_gpu_memory: Option<u64>,
    /// Only nodes carrying this label (KEY=VALUE); repeatable.
    #[arg(long = "selector", value_name = "KEY=VALUE", value_parser = args::key_value)]
    pub selectors: Vec<(String, String)>,
    /// Scheduling priority; higher runs first, may be negative. Default: the tenant's default
    /// priority (0 without a tenant record).
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Expected run time (e.g. 90m), a scheduling hint; whole seconds.
    #[arg(long, value_parser = units::whole_seconds)]
    pub estimate: Option<u64>,
    /// Time limit: the job is stopped (SIGTERM, grace, SIGKILL) and ends "time limit
    /// exceeded" after running this long, e.g. 90m, 12h, 2days, 1h30m; whole seconds, at most
    /// 366 days; not retried. `--wall-time` is the same flag.
    #[arg(
        long = "time-limit",
        visible_alias = "wall-time",
        value_name = "DURATION",
        value_parser = units::time_limit,
        allow_hyphen_values = true
    )]
    pub wall_time: Option<u64>,
    /// Runs to try before the job counts as failed [default: 1]. A run lost with its node,
    /// and with this above 1 a run that fails (non-zero exit, signal, failed start, out of
    /// memory), is tried again.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Wait before retrying a failed run, doubled for each further attempt, at most 1h
    /// (e.g. 30s) [default: 10s with --max-attempts above 1].
    #[arg(long, value_name = "DURATION", value_parser = units::whole_seconds)]
    pub retry_backoff: Option<u64>,
    /// CPU limit in cores, at most 3 decimals: 0.5, 2, 1.25 [default: no limit].
    #[arg(long, value_name = "CORES", value_parser = cpu_millis)]
    pub cpus: Option<u32>,
    /// Memory limit: 4GiB, 512M, 8192MiB; a plain number is MiB; at least 16MiB [default:
    /// no limit]. A job that goes past it ends "out of memory". `--mem` is the same flag.
    #[arg(long, visible_alias = "mem", value_name = "SIZE", value_parser = units::size_mib)]
    pub memory: Option<u64>,
    /// One MIG instance of this profile (e.g. 1g.10gb) on a GPU in MIG mode, instead of whole
    /// GPUs; the profile must be one the GPU type's model supports.
    #[arg(long, value_name = "PROFILE", value_parser = args::non_empty, conflicts_with_all = ["gpu_mem", "gpus_per_node"])]
    pub mig: Option<String>,
    /// A shared slice of a GPU in shared mode: this much GPU memory (10GiB, 10240MiB; a plain
    /// number is MiB), set as the job's MPS memory limit. Needs --gpu-share.
    #[arg(long, value_name = "SIZE", value_parser = units::size_mib, requires = "gpu_share", conflicts_with = "gpus_per_node")]
    pub gpu_mem: Option<u64>,
    /// A shared slice's compute share in percent (1-100), set as the job's MPS active-thread
    /// percentage. Needs --gpu-mem.
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100), requires = "gpu_mem")]
    pub gpu_share: Option<u32>,
    /// What the job is: a process (default), or a virtual machine given whole pass-through
    /// GPUs by PCI address and not run as a process.
    #[arg(long, value_enum, default_value_t = KindArg::Process, conflicts_with_all = ["mig", "gpu_mem"])]
    pub kind: KindArg,
    /// Environment variable for the job (KEY=VALUE); repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = args::key_value)]
    pub env: Vec<(String, String)>,
    /// Absolute working directory on the node, or inside the image with --image [default: the
    /// job's own directory; the image's].
    #[arg(long)]
    pub workdir: Option<String>,
    /// Run the command in this container image (e.g. nvcr.io/nvidia/pytorch:24.05-py3), with
    /// the node's container runtime; only the job's GPUs are in it.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Bind a host directory into the container (SRC:DST[:ro]); repeatable. SRC must be in the
    /// tenant's allowed mounts.
    #[arg(long = "mount", value_name = "SRC:DST[:ro]", requires = "image")]
    pub mounts: Vec<String>,
    /// Makes retrying this submission safe: a key the cluster has seen returns the original
    /// job instead of queueing a second one.
    ///
    /// Without it, gpuctl generates a random key for this invocation, so that its own failover
    /// to another endpoint can never create two jobs. Pass your own key to make re-running the
    /// whole command (e.g. from a script that retries) safe as well.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Start only after other jobs of the tenant: KIND:JOB, comma-separated or repeated, KIND
    /// one of ok (it succeeded), notok (it failed or was cancelled), any (it ended), start
    /// (it started), e.g. ok:j-12,any:j-13. Once one can never be met the job is cancelled
    /// with that reason.
    #[arg(long, value_name = "KIND:JOB,...")]
    pub after: Vec<String>,
    /// At most one job of the tenant with this job's name runs at a time.
    #[arg(long)]
    pub singleton: bool,
    /// A label of the job's own (KEY=VALUE) to select it by (`job list -l KEY=VALUE`);
    /// repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = args::key_value)]
    pub labels: Vec<(String, String)>,
    /// POST this job's state changes here too (signed; at the origin of the tenant's webhook,
    /// see docs/notifications.md).
    #[arg(long, value_name = "URL")]
    pub notify: Option<String>,
    /// Only these events: start, end, failure, requeue (comma-separated) [default: all].
    #[arg(long = "notify-on", value_name = "EVENTS", value_delimiter = ',')]
    pub notify_on: Vec<String>,
    /// Submit held: the job is pending but not placed until `gpuctl job release`.
    #[arg(long)]
    pub hold: bool,
    /// Submit an array: one task per index, e.g. 0-9999%64 (at most 64 running at once) or
    /// 1,3,5-9:2. Each task sees its index in GPUMESH_ARRAY_TASK_ID and SLURM_ARRAY_TASK_ID;
    /// `job list` shows the array as one line, `j-7[3]` names one task.
    #[arg(long, value_name = "INDEXES[%LIMIT]")]
    pub array: Option<String>,
    /// A batch script to run instead of a command (`gpuctl job submit train.sh`): its
    /// `#SBATCH` and `#GPUMESH` lines set options the command line does not (see
    /// docs/batch-scripts.md), and its text runs with its `#!` interpreter; arguments for it
    /// go after `--`.
    #[arg(value_name = "SCRIPT")]
    pub script: Option<std::path::PathBuf>,
    /// The program and its arguments, after `--`. Run as given, without a shell. With a
    /// script: the script's arguments.
    #[arg(last = true, required_unless_present = "script", value_name = "CMD")]
    pub command: Vec<String>,
}

/// clap parser for `--cpus`: cores as a decimal with at most 3 decimals (`1.5`), in thousandths
/// of a core (`1500`). Zero, signs, exponents, `NaN` and `inf` are refused.
fn cpu_millis(s: &str) -> Result<u32, String> {
    const HINT: &str = "expected cores like 0.5, 2 or 1.25 (at most 3 decimals)";
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) || (s.contains('.') && frac.is_empty()) {
        return Err(HINT.into());
    }
    if frac.len() > 3 {
        return Err("at most 3 decimals (thousandths of a core)".into());
    }
    let frac_millis: u32 = format!("{frac:0<3}").parse().map_err(|_| HINT)?;
    let millis = whole
        .parse::<u32>()
        .ok()
        .and_then(|w| w.checked_mul(1000))
        .and_then(|m| m.checked_add(frac_millis))
        .ok_or("too many cores")?;
    if millis == 0 {
        return Err("must be more than zero".into());
    }
    Ok(millis)
}

/// A job state as typed on the command line (any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum JobStateArg {
    Pending,
    Bound,
    Running,
    Succeeded,
    Failed,
    #[value(alias = "canceled")]
    Cancelled,
}

#[derive(Subcommand, Debug)]
pub(crate) enum DebugVerb {
    /// Inject a fault into a simulated GPU: overheat, ecc, lost, xid:N, or clear to undo.
    Inject {
        /// Node id: 3 or n3.
        #[arg(value_parser = ids::node_id)]
        node: u64,
        /// GPU index on that node.
        gpu: u32,
        /// overheat | ecc | lost | clear | xid:N
        #[arg(value_parser = args::fault)]
        fault: Fault,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpuctl").chain(args.iter().copied()))
    }

    fn submit(args: &[&str]) -> Result<SubmitArgs, clap::Error> {
        let mut full = vec!["job", "submit"];
        full.extend_from_slice(args);
        match parse(&full)?.command {
            Noun::Job(JobVerb::Submit(a)) => Ok(*a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn submit_flags() {
        let a = submit(&[
            "--gpus",
            "2",
            "--gpu-type",
            "A100,H100",
            "--gpu-type",
            "L40S",
            "--min-gpu-memory",
            "40GiB",
            "--selector",
            "zone=a",
            "--priority",
            "-5",
            "--estimate",
            "90m",
            "--wall-time",
            "12h",
            "--max-attempts",
            "3",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--workdir",
            "/data",
            "--idempotency-key",
            "k1",
            "--",
            "python",
            "train.py",
            "--lr",
            "0.1",
        ])
        .expect("parses");
        assert_eq!(a.gpus, 2);
        assert_eq!(a.gpu_types, ["A100", "H100", "L40S"]);
        assert_eq!(a.min_gpu_memory, Some(40_960));
        assert_eq!(a.selectors, [("zone".to_owned(), "a".to_owned())]);
        assert_eq!(a.priority, Some(-5));
        assert_eq!((a.estimate, a.wall_time), (Some(5400), Some(43_200)));
        assert_eq!(a.max_attempts, Some(3));
        assert_eq!(a.env[1], ("B".to_owned(), "x=y".to_owned()));
        assert_eq!(a.command, ["python", "train.py", "--lr", "0.1"]);
    }

    #[test]
    fn gang_flags() {
        let a = submit(&["--nodes", "2", "--gpus-per-node", "4", "--", "x"]).expect("parses");
        assert_eq!((a.nodes, a.gpus_per_node, a.gpus), (2, Some(4), 0));
        let single = submit(&["--gpus", "2", "--", "x"]).expect("parses");
        assert_eq!((single.nodes, single.gpus_per_node), (1, None));
        for bad in [
            &["--gpus", "2", "--gpus-per-node", "1", "--", "x"][..],
            &["--nodes", "-2", "--", "x"],
        ] {
            assert!(submit(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn submit_rejects_bad_syntax() {
        for bad in [
            &["python", "train.py"][..],
            &[],
            &["--"],
            &["--gpus", "-1", "--", "x"],
            &["--gpus", "4294967296", "--", "x"],
            &["--priority", "2147483648", "--", "x"],
            &["--gpu-type", "A100,,H100", "--", "x"],
            &["--min-gpu-memory", "1.5G", "--", "x"],
            &["--selector", "zone", "--", "x"],
            &["--env", "=1", "--", "x"],
            &["--estimate", "500ms", "--", "x"],
            &["--wall-time", "1.5s", "--", "x"],
            &["--time-limit", "-5m", "--", "x"],
            &["--time-limit", "soon", "--", "x"],
            &["--mem", "4GB", "--", "x"],
            &["--max-attempts", "-1", "--", "x"],
            &["--memory", "4GB", "--", "x"],
            &["--memory", "1.5G", "--", "x"],
        ] {
            assert!(submit(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cpus_are_thousandths_of_a_core() {
        for (cores, millis) in [
            ("1.5", 1500),
            ("2", 2000),
            ("0.25", 250),
            ("0.001", 1),
            ("1.250", 1250),
            ("007", 7000),
        ] {
            assert_eq!(cpu_millis(cores), Ok(millis), "{cores}");
        }
        for bad in [
            "", "0", "0.0", "0.000", "-1", "+1", "-0.5", "NaN", "nan", "inf", "1e3", "1.", ".5",
            "1.2345", "1,5", " 1", "1.5 ", "4294968", "1..5",
        ] {
            assert!(cpu_millis(bad).is_err(), "{bad:?}");
        }
        assert!(
            cpu_millis("1.0001")
                .expect_err("too precise")
                .contains("3 decimals")
        );
        let a = submit(&["--cpus", "1.5", "--memory", "4GiB", "--", "x"]).expect("parses");
        assert_eq!((a.cpus, a.memory), (Some(1500), Some(4096)));
        assert!(submit(&["--cpus", "-1", "--", "x"]).is_err());
    }

    #[test]
    fn time_limit_and_mem_are_the_old_flags_too() {
        let new = submit(&["--time-limit", "1h30m", "--mem", "512M", "--", "x"]).expect("parses");
        let old = submit(&["--wall-time", "90m", "--memory", "512MiB", "--", "x"]).expect("old");
        assert_eq!((new.wall_time, new.memory), (Some(5400), Some(512)));
        assert_eq!((old.wall_time, old.memory), (new.wall_time, new.memory));
        // Zero and a year and more are the server's to refuse, with the rule it applies.
        assert_eq!(
            submit(&["--time-limit", "0s", "--", "x"])
                .expect("0")
                .wall_time,
            Some(0)
        );
        let err = submit(&["--time-limit", "-5m", "--", "x"])
            .expect_err("negative")
            .to_string();
        assert!(err.contains("cannot be negative"), "{err}");
    }

    #[test]
    fn accounts_on_tokens_and_tenants() {
        let alice = |group: Option<&str>| AccountArg {
            user: "alice".into(),
            group: group.map(str::to_owned),
        };
        let Noun::Token(TokenVerb::Create { account, .. }) = parse(&[
            "token",
            "create",
            "--role",
            "user",
            "--tenant",
            "a",
            "--account",
            "alice:research",
            "--groups",
            "video,1007",
        ])
        .expect("parses")
        .command
        else {
            panic!("not token create");
        };
        assert_eq!(account.account, Some(alice(Some("research"))));
        assert_eq!(account.groups, ["video", "1007"]);
        let Noun::Token(TokenVerb::SetAccount {
            id, account, clear, ..
        }) = parse(&["token", "set-account", "t1", "alice"])
            .expect("parses")
            .command
        else {
            panic!("not set-account");
        };
        assert_eq!(
            (id.as_str(), account, clear),
            ("t1", Some(alice(None)), false)
        );
        let Noun::Token(TokenVerb::SetAccount { account, clear, .. }) =
            parse(&["token", "set-account", "t1", "--clear"])
                .expect("parses")
                .command
        else {
            panic!("not set-account");
        };
        assert_eq!((account, clear), (None, true));
        let Noun::Tenant(TenantVerb::Update { clear_account, .. }) =
            parse(&["tenant", "update", "b", "--clear-account"])
                .expect("parses")
                .command
        else {
            panic!("not tenant update");
        };
        assert!(clear_account);
        for bad in [
            &["token", "set-account", "t1"][..],
            &["token", "set-account", "t1", "alice", "--clear"],
            &["token", "set-account", "t1", "--clear", "--groups", "video"],
            &["token", "set-account", "t1", ":research"],
            &["token", "set-account", "t1", "alice:"],
            &["token", "create", "--role", "user", "--groups", "video"],
            &["tenant", "create", "b", "--account", ""],
            &[
                "tenant",
                "update",
                "b",
                "--account",
                "bob",
                "--clear-account",
            ],
            &[
                "tenant",
                "create",
                "b",
                "--account",
                "bob",
                "--groups",
                "a,,b",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn job_states_ignore_case() {
        let Noun::Job(JobVerb::List(JobListArgs { states, .. })) = parse(&[
            "job",
            "list",
            "--state",
            "RUNNING,pending",
            "--state",
            "Canceled",
        ])
        .expect("parses")
        .command
        else {
            panic!("not job list");
        };
        assert_eq!(
            states,
            [
                JobStateArg::Running,
                JobStateArg::Pending,
                JobStateArg::Cancelled
            ]
        );
        for s in [
            "pending",
            "bound",
            "running",
            "succeeded",
            "failed",
            "cancelled",
        ] {
            assert!(JobStateArg::from_str(s, true).is_ok(), "{s}");
        }
        for bad in ["", "done", "run", "unspecified"] {
            assert!(parse(&["job", "list", "--state", bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timeout_is_optional_and_global() {
        assert_eq!(parse(&["cluster", "status"]).expect("parses").timeout, None);
        let cli = parse(&["job", "wait", "j-3", "--timeout", "5m"]).expect("parses");
        assert_eq!(cli.timeout, Some(Duration::from_secs(300)));
        assert!(parse(&["job", "wait", "3", "--timeout", "0s"]).is_err());
    }
}
