//! Jobs in the replicated state: what a user asked for (`JobSpec`), where it is bound, and how
//! its life ended.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::NodeId;

pub use crate::JobId;

/// The tenant of every job until tenants exist.
pub const DEFAULT_TENANT: &str = "default";

/// The retry backoff the API gives a job that may be tried more than once and names none.
pub const DEFAULT_RETRY_BACKOFF_S: u64 = 10;

/// The longest wait before a retry, however often the backoff has doubled (also the largest
/// backoff a spec may ask for).
pub const MAX_RETRY_DELAY_S: u64 = 3600;

/// How many runs a job keeps in `Job::runs` (the oldest are dropped first).
pub const MAX_RUNS_KEPT: usize = 32;

/// An idempotency key as the state keeps it (`ClusterState::idempotency`): scoped to its
/// tenant, `tenant/key`.
pub fn scoped_key(tenant: &str, key: &str) -> String {
    format!("{tenant}/{key}")
}

/// What the user submitted. Immutable once accepted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// argv: program then arguments. Never run through a shell.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// Whole GPUs, all on one node (split evenly over `nodes` for a gang). 0 is a CPU-only job.
    #[serde(default)]
    pub gpus: u32,
    /// Acceptable `gpu_type`s, the most preferred first (empty = any): the job takes the
    /// first of them that has room when it is placed ("prefer A100, accept V100").
    #[serde(default)]
    pub gpu_types: Vec<String>,
    #[serde(default)]
    pub min_gpu_memory_mib: u64,
    /// Node labels that must match exactly.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub runtime_estimate_s: Option<u64>,
    #[serde(default)]
    pub wall_time_limit_s: Option<u64>,
    /// How many times the job may be placed (it is requeued after a node loss while attempts
    /// remain).
    #[serde(default = "one")]
    pub max_attempts: u32,
    /// CPU limit in thousandths of a core (cgroup `cpu.max`), if any.
    #[serde(default)]
    pub cpu_millis: Option<u32>,
    /// Memory limit in MiB (cgroup `memory.max`), if any.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// A gang over this many nodes (`gpus / nodes` GPUs on each, all or nothing), run as one
    /// unit with the distributed-training environment; 0 or 1 is a single-node job.
    #[serde(default, skip_serializing_if = "is_single_node")]
    pub nodes: u32,
    /// A gang's nodes must all lie inside one domain of this topology level
    /// (`topology::TOPOLOGY_LABELS`: `nvlink-domain`, `rack` or `block`, a label on the nodes).
    /// Without it a gang is still placed inside the narrowest domain that can hold it now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// One slice of one GPU (a MIG instance or a shared slice) instead of whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<crate::model::partition::SliceRequest>,
    /// `process` (run by the executor) or `vm` (whole pass-through GPUs for a virtual machine).
    #[serde(default, skip_serializing_if = "JobKind::is_process")]
    pub kind: JobKind,
    /// The Unix account the job runs as, stamped by the API from the submitting token's
    /// mapping (else its tenant's default); absent: the executing node's `jobs.run_as`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<crate::model::account::Account>,
    /// Failed runs are retried (while attempts remain) after this many seconds, doubled for
    /// each further attempt; absent: only runs lost with their node are retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff_s: Option<u64>,
    /// Run `command` inside this image (a process job either way: the node's container
    /// runtime is its process); `workdir` is then a directory inside the container. Boxed:
    /// most jobs have none, and `Command` stays small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Box<crate::model::container::ContainerSpec>>,
    /// Jobs this one waits for (`--after ok:j-1,any:j-2`): it is not placed before each has
    /// done what its dependency asks, and it ends, cancelled, once one never can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<crate::model::dependency::Dependency>,
    /// At most one job of its tenant with its name holds GPUs at a time (Slurm's
    /// `--dependency=singleton`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub singleton: bool,
    /// Submitted as an array: one task (a job of this spec) per index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<crate::model::array::ArraySpec>,
    /// The user's own labels, for selecting jobs (`job list -l team=vision`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Where to post this job's state changes, at its tenant's webhook origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<crate::model::webhook::Webhook>,
}

/// What a job is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// A command the executor runs as a process (the default).
    #[default]
    Process,
    /// A virtual machine given whole GPUs in pass-through mode by PCI address; not run as a
    /// process by gpumesh (a hypervisor integration starts it).
    Vm,
}

impl JobKind {
    pub fn is_process(&self) -> bool {
        *self == JobKind::Process
    }
}

fn is_single_node(n: &u32) -> bool {
    *n <= 1
}

impl JobSpec {
    /// How many nodes the job spans.
    pub fn node_count(&self) -> u32 {
        self.nodes.max(1)
    }

    /// GPUs on each of its nodes.
    pub fn gpus_per_node(&self) -> u32 {
        self.gpus / self.node_count()
    }
}

/// The spec that every omitted field decodes to: no GPUs, the default tenant, one attempt.
impl Default for JobSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            tenant: default_tenant(),
            command: Vec::new(),
            env: BTreeMap::new(),
            workdir: None,
            gpus: 0,
            gpu_types: Vec::new(),
            min_gpu_memory_mib: 0,
            node_selector: BTreeMap::new(),
            priority: 0,
            runtime_estimate_s: None,
            wall_time_limit_s: None,
            max_attempts: one(),
            cpu_millis: None,
            memory_mib: None,
            nodes: 0,
            topology: None,
            slice: None,
            kind: JobKind::default(),
            account: None,
            retry_backoff_s: None,
            container: None,
            after: Vec::new(),
            singleton: false,
            array: None,
            labels: BTreeMap::new(),
            notify: None,
        }
    }
}

fn default_tenant() -> String {
    DEFAULT_TENANT.to_owned()
}

fn one() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Bound,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// Bound or Running: the job holds GPUs.
    pub fn is_live(self) -> bool {
        matches!(self, JobState::Bound | JobState::Running)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            JobState::Pending => "Pending",
            JobState::Bound => "Bound",
            JobState::Running => "Running",
            JobState::Succeeded => "Succeeded",
            JobState::Failed => "Failed",
            JobState::Cancelled => "Cancelled",
        };
        f.write_str(s)
    }
}

/// Where a live job runs. `generation` increases with every placement of the job, so a report
/// or a process from an earlier placement can always be told apart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub generation: u64,
    /// The slice of `gpus[0]` a sliced job holds (MIG instance or share); none for whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<crate::model::partition::Slice>,
}

/// How one run of a job ended, as the executor saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
    FailedToStart {
        message: String,
    },
    WallTimeExceeded,
    /// Killed by the kernel for using more memory than the job's limit.
    OutOfMemory {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit_mib: Option<u64>,
    },
    Cancelled,
    /// Stopped so the node could be drained; the job is requeued without using an attempt.
    Evicted,
    /// The process disappeared (agent restart without it, node declared down).
    Lost {
        message: String,
    },
    /// Stopped by its own agent after losing contact with the cluster for longer than its lease.
    Fenced,
}

impl Outcome {
    /// Whether the run failed on its own (a non-zero exit, a signal, a failed start, the
    /// memory limit): the ends `--max-attempts` retries once a retry backoff is set. A time
    /// limit is not one of them: the user said how long a run may take, and another run would
    /// most likely be stopped at the same point. Cancelled, evicted, lost and fenced runs have
    /// rules of their own.
    pub fn is_failed_run(&self) -> bool {
        match self {
            Outcome::Exited { code } => *code != 0,
            Outcome::Signaled { .. }
            | Outcome::FailedToStart { .. }
            | Outcome::OutOfMemory { .. } => true,
            Outcome::WallTimeExceeded
            | Outcome::Cancelled
            | Outcome::Evicted
            | Outcome::Lost { .. }
            | Outcome::Fenced => false,
        }
    }
}

/// Seconds to wait before the run after failed attempt `failed_attempt` (1-based) of a job
/// whose retry backoff is `backoff_s`: the backoff, doubled for every attempt after the
/// first, at most `MAX_RETRY_DELAY_S`.
pub fn retry_delay_s(backoff_s: u64, failed_attempt: u32) -> u64 {
    let doublings = failed_attempt.saturating_sub(1).min(63);
    backoff_s
        .saturating_mul(1u64 << doublings)
        .min(MAX_RETRY_DELAY_S)
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Exited { code } => write!(f, "exited with code {code}"),
            Outcome::Signaled { signal } => write!(f, "killed by signal {signal}"),
            Outcome::FailedToStart { message } => write!(f, "failed to start: {message}"),
            Outcome::WallTimeExceeded => f.write_str("time limit exceeded"),
            Outcome::OutOfMemory {
                limit_mib: Some(mib),
            } => write!(f, "out of memory (limit {mib} MiB)"),
            Outcome::OutOfMemory { limit_mib: None } => f.write_str("out of memory"),
            Outcome::Cancelled => f.write_str("cancelled"),
            Outcome::Evicted => f.write_str("evicted"),
            Outcome::Lost { message } => write!(f, "lost: {message}"),
            Outcome::Fenced => f.write_str("fenced: its node lost contact with the cluster"),
        }
    }
}

/// One run of a job (one placement, one generation), kept after it ended: the job's history of
/// attempts, and where to find each run's logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The job's attempt count when it was placed (an evicted run gives its attempt back, so
    /// the run after it has the same number).
    pub attempt: u32,
    pub generation: u64,
    /// The node of each rank (one for a single-node job).
    pub nodes: Vec<NodeId>,
    pub bound_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// How it ended; none while it is live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// A job and everything the cluster knows about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    pub state: JobState,
    pub submitted_at_ms: u64,
    /// Placements so far (an eviction gives one back).
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub generation: u64,
    /// The current placement while Bound/Running; afterwards, where it last ran.
    #[serde(default)]
    pub binding: Option<Binding>,
    /// Why it is still pending, or why it failed.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub outcome: Option<Outcome>,
    #[serde(default)]
    pub cancel_requested: bool,
    #[serde(default)]
    pub evict_requested: bool,
    /// Its eviction was asked for by `job requeue` (the reason it is pending again says so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requeue_requested: bool,
    #[serde(default)]
    pub bound_at_ms: Option<u64>,
    #[serde(default)]
    pub started_at_ms: Option<u64>,
    #[serde(default)]
    pub finished_at_ms: Option<u64>,
    /// GPU-milliseconds by GPU type of the runs that have ended (accounted by `apply` from the
    /// binding, bind to end). The live run is added by `tenant::job_gpu_time`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_ms: BTreeMap<String, u64>,
    /// Set when the leader preempted this job to make room for that one; the scheduler does
    /// not place it again while that job is still pending. Cleared by the next placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_for: Option<JobId>,
    /// A gang's members in rank order (member 0 is also `binding`); empty for single-node jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gang: Vec<Binding>,
    /// Gang members whose run of the current generation exited 0.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub gang_done: BTreeSet<NodeId>,
    /// Its runs, oldest first, at most `MAX_RUNS_KEPT`; the last is the live one while the job
    /// is Bound or Running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<Run>,
    /// A job requeued after a failed run is not placed before this time (its retry backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
    /// What a live run does before its command starts ("pulling image REF: …"), as its node
    /// last reported it (`Command::ReportRunPhase`); stale once the run it names has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RunPhase>,
    /// The jobs of `spec.after` whose dependency is not met yet; it is placed only once none
    /// is left.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub waiting_for: BTreeSet<JobId>,
    /// Held (`job hold`): a pending job that is not placed until it is released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// The array it is a task of, and its index there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_task: Option<crate::model::array::ArrayTask>,
    /// The token that submitted it (none: submitted before protocol 12, or by the system).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
}

/// A live run's phase before its command starts, as its node reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPhase {
    /// The run (generation) it describes.
    pub generation: u64,
    pub text: String,
    /// When the node first reported a phase for this run (the log entry's time).
    pub since_ms: u64,
}

/// The longest phase text a node may report (it is truncated before it is sent).
pub const MAX_PHASE_LEN: usize = 200;

impl Job {
    /// A job just submitted: pending, never run.
    pub fn pending(id: JobId, spec: JobSpec, idempotency_key: Option<String>, now_ms: u64) -> Self {
        Self {
            id,
            spec,
            idempotency_key,
            state: JobState::Pending,
            submitted_at_ms: now_ms,
            attempts: 0,
            generation: 0,
            binding: None,
            reason: None,
            outcome: None,
            cancel_requested: false,
            evict_requested: false,
            requeue_requested: false,
            bound_at_ms: None,
            started_at_ms: None,
            finished_at_ms: None,
            gpu_ms: BTreeMap::new(),
            preempted_for: None,
            gang: Vec::new(),
            gang_done: Default::default(),
            runs: Vec::new(),
            not_before_ms: None,
            phase: None,
            waiting_for: BTreeSet::new(),
            held: false,
            array_task: None,
            submitted_by: None,
        }
    }

    /// The live run's phase, if its node reported one for the current run.
    pub fn live_phase(&self) -> Option<&RunPhase> {
        self.phase
            .as_ref()
            .filter(|p| self.state.is_live() && p.generation == self.generation)
    }

    /// End a pending job, never run again, as cancelled at `now_ms`, saying `why` (none: a
    /// user's cancel).
    pub(crate) fn cancel_pending(&mut self, now_ms: u64, why: Option<String>) {
        self.state = JobState::Cancelled;
        self.outcome = Some(Outcome::Cancelled);
        self.not_before_ms = None;
        self.finished_at_ms = Some(now_ms);
        self.reason = why;
    }

    /// Whether it waits for its retry time at `now_ms` (pending, not before a later time).
    pub fn waits_for_retry(&self, now_ms: u64) -> bool {
        self.state == JobState::Pending && self.not_before_ms.is_some_and(|t| t > now_ms)
    }

    /// `attempt 2/3 after 20 s`: the retry a job requeued after a failed run waits for.
    pub fn retry_note(&self, delay_s: u64) -> String {
        format!(
            "attempt {}/{} after {delay_s} s",
            self.attempts.saturating_add(1),
            self.spec.max_attempts
        )
    }

    /// The record of run `generation`, if it is still kept.
    pub fn run(&self, generation: u64) -> Option<&Run> {
        self.runs.iter().rev().find(|r| r.generation == generation)
    }

    pub(crate) fn run_mut(&mut self, generation: u64) -> Option<&mut Run> {
        self.runs
            .iter_mut()
            .rev()
            .find(|r| r.generation == generation)
    }

    /// Every part of its (current or last) placement: the gang members in rank order, or the
    /// one binding.
    pub fn members(&self) -> impl Iterator<Item = &Binding> {
        let single = if self.gang.is_empty() {
            self.binding.as_ref()
        } else {
            None
        };
        self.gang.iter().chain(single)
    }

    /// Its member on `node` with its rank (0 for a single-node job).
    pub fn member_on(&self, node: NodeId) -> Option<(usize, &Binding)> {
        self.members().enumerate().find(|(_, b)| b.node == node)
    }

    /// Whether any part of its placement is on `node`.
    pub fn on_node(&self, node: NodeId) -> bool {
        self.member_on(node).is_some()
    }
}

/// `j-42`, the way job ids are shown to people.
pub fn job_name(id: JobId) -> String {
    format!("j-{id}")
}
