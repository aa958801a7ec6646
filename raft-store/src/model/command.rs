//! The whole Raft log vocabulary: every replicated change is one `Command` in a `LogEntry`.
//!
//! Encodings are frozen: fields added later carry `#[serde(default)]`, and the tests pin the
//! bytes of old entries so a new binary still reads an old log.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::account::Account;
use crate::model::alert::{AlertRule, Remediation, Severity};
use crate::model::audit::{RequestMeta, SignedHead};
use crate::model::auth::TokenRecord;
use crate::model::ca::{CaCert, ResealedCredential};
use crate::model::energy::EnergyReport;
use crate::model::job::{JobSpec, Outcome};
use crate::model::job_update::JobUpdate;
use crate::model::node::{EdgeTerms, Inventory, NodeStatus};
use crate::model::partition::{PartitionSpec, SliceBind};
use crate::model::registry::SealedCredential;
use crate::model::scheduler::SchedulerSettings;
use crate::model::tenant::TenantRecord;
use crate::{JobId, NodeId};

/// One replicated log record. `proposed_at_ms` is stamped by the proposer (the leader); apply
/// uses it as "now" and never reads a clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub proposed_at_ms: u64,
    pub cmd: Command,
    /// Who asked, for API requests; `apply` turns it into exactly one audit entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<RequestMeta>,
    /// Which request this is, for exactly-once writes (`requests.rs`): stamped by the leader
    /// on API requests once every member speaks `PROTOCOL_9`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestStamp>,
}

/// What identifies one API request in the log: who asked, their request id, and which write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestStamp {
    /// The authenticated actor and the request id, `actor\nrequest_id`.
    pub key: String,
    /// A digest of the command (hex, 128 bits of its SHA-256), made by the leader that
    /// stamped it.
    pub digest: String,
}

impl RequestStamp {
    /// The stamp of `cmd`, written for the API request `meta`; `None` for a write no client
    /// asked for (no request id: a membership change's or a renewal's record).
    pub fn of(meta: &RequestMeta, cmd: &Command) -> Option<RequestStamp> {
        if meta.request_id.is_empty() {
            return None;
        }
        // Encoding plain data into memory cannot fail.
        let encoded = serde_json::to_vec(cmd).unwrap_or_default();
        Some(RequestStamp {
            key: format!("{}\n{}", meta.actor, meta.request_id),
            digest: hex::encode(&Sha256::digest(&encoded)[..16]),
        })
    }
}

/// A state change proposed through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// An agent announces itself (on start and whenever its inventory changes). Upsert; marks
    /// the node Ready.
    RegisterNode {
        node: NodeId,
        addr: String,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        inventory: Inventory,
        /// Present when the agent is at an edge site (its `[edge]` configuration).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edge: Option<EdgeTerms>,
        /// The internal protocol version the agent speaks (absent: 1, the version before it
        /// was announced). The leader uses encodings newer than 1 only once every member has
        /// announced them.
        #[serde(
            default = "crate::model::node::first_protocol",
            skip_serializing_if = "crate::model::node::is_first_protocol"
        )]
        protocol: u32,
    },
    /// Set and remove user labels on a registered node.
    SetNodeLabels {
        node: NodeId,
        #[serde(default)]
        set: BTreeMap<String, String>,
        #[serde(default)]
        remove: BTreeSet<String>,
    },
    /// The leader's liveness verdict. Down requeues (or fails) every live job on the node.
    SetNodeStatus {
        node: NodeId,
        status: NodeStatus,
        /// Down requeues a job the cluster had asked to stop (a drain's eviction, a
        /// preemption, a migration) as evicted, without spending an attempt, instead of as
        /// lost: the node's lease has stopped it by now. (Without it: lost, as before.)
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        requeue_evicting: bool,
    },
    /// Stop (or resume) placing new work on a node.
    CordonNode {
        node: NodeId,
        cordoned: bool,
    },
    /// Cordon, and with `evict` ask the node's executor to stop its jobs so they are requeued.
    DrainNode {
        node: NodeId,
        evict: bool,
    },
    /// A new job. With an idempotency key, a retry returns the first job instead.
    SubmitJob {
        /// Boxed: a spec is most of a submission's size, and `Command` stays small.
        spec: Box<JobSpec>,
        #[serde(default)]
        idempotency_key: Option<String>,
        /// Held from the start (`--hold`): pending, not placed until released. Only protocol
        /// 12 agents read it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hold: bool,
        /// The token that submitted it (`Job::submitted_by`): stamped by the leader from the
        /// request's authenticated actor, once every member speaks protocol 12 (an older agent
        /// would drop it and its replica would differ).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    CancelJob {
        job: JobId,
    },
    /// Hold a pending job (it is not placed until released), or release it. Only protocol 11
    /// agents read it.
    HoldJob {
        job: JobId,
        hold: bool,
    },
    /// Cancel every unfinished task of array `array` (its first task's id). Only protocol 11
    /// agents read it.
    CancelArray {
        array: JobId,
    },
    /// Hold (or release) every pending task of array `array`. Only protocol 11 agents read it.
    HoldArray {
        array: JobId,
        hold: bool,
    },
    /// Change a pending job's priority, time limit (shorter only) or GPU count; with `array`,
    /// every pending task of array `job` alike. Only protocol 12 agents read it.
    UpdateJob {
        job: JobId,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        array: bool,
        update: JobUpdate,
    },
    /// Queue a job again: a live one is stopped and requeued without spending an attempt; an
    /// ended one is pending again with its attempts renewed. Only protocol 12 agents read it.
    RequeueJob {
        job: JobId,
        /// Every task of array `job` that is not pending.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        array: bool,
    },
    /// The scheduler's placements, each re-validated on apply.
    BindJobs {
        binds: Vec<Bind>,
    },
    /// The executor started the process of this placement.
    JobStarted {
        job: JobId,
        generation: u64,
    },
    /// What the live run is doing before its command starts (pulling its image), as its
    /// node's supervisor reports it; `None`: that phase is over. Sent at most every few seconds
    /// per run. Only protocol 7 agents read it.
    ReportRunPhase {
        job: JobId,
        generation: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<String>,
    },
    /// The container images node `node`'s runtime holds (canonical names, at most
    /// `container::MAX_NODE_IMAGES`), replacing its last report. Sent when they change. Only
    /// protocol 7 agents read it.
    ReportImages {
        node: NodeId,
        #[serde(default)]
        images: BTreeSet<String>,
    },
    /// The executor saw this placement end.
    JobFinished {
        job: JobId,
        generation: u64,
        outcome: Outcome,
    },
    /// One member of a gang saw its run of this placement exit 0. The gang succeeds when every
    /// member has; any other end of a member ends the whole gang (`JobFinished`).
    GangMemberFinished {
        job: JobId,
        generation: u64,
        node: NodeId,
    },
    /// Why pending jobs cannot be placed right now (scheduler feedback for users).
    /// A new API token (its secret's hash only). `apply` re-checks that the actor may grant it.
    CreateToken {
        token: TokenRecord,
    },
    RevokeToken {
        id: String,
    },
    /// Map token `id` to the Unix account its holder's jobs run as; `None` removes the
    /// mapping (the tenant's default account applies again). Admins only: `apply` re-checks
    /// the actor and the account. Jobs already submitted keep the account they were stamped
    /// with.
    SetTokenAccount {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        account: Option<Account>,
    },
    /// A certificate the cluster CA just issued (for listing and revocation by serial).
    RecordCertificate {
        cert: crate::model::cert::CertRecord,
        /// The join token that enrolled the node the certificate is for: `apply` checks its
        /// terms again and counts down its uses. Absent for renewals and client certificates.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enrolled_with: Option<String>,
    },
    /// Put a serial on the revocation list; agents refuse it from the next request on.
    RevokeCertificate {
        serial: String,
        reason: String,
    },
    /// Record a refused request in the audit log; changes nothing else.
    AuditDenied {
        reason: String,
    },
    /// Record an action taken outside the replicated state (simulated fault injection) and how
    /// it went; changes nothing else.
    RecordAction {
        outcome: String,
    },
    NoteUnschedulable {
        /// (job, reason) pairs. A list, not a map: integer map keys do not survive the
        /// internally tagged JSON encoding of `Command`.
        reasons: Vec<(JobId, String)>,
    },
    /// A new tenant record (refused if one exists); times are stamped by `apply`.
    CreateTenant {
        tenant: TenantRecord,
    },
    /// Replace an existing tenant's quotas, weight and default priority.
    UpdateTenant {
        tenant: TenantRecord,
    },
    /// Set (or with `None` remove) tenant `tenant`'s login at `registry`, its password sealed
    /// by the proposing agent. Admins only (`apply` re-checks). Only protocol 7 agents read it.
    SetRegistryCredential {
        tenant: String,
        registry: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential: Option<SealedCredential>,
    },
    /// The leader's preemptions: stop each job (SIGTERM, grace, SIGKILL, through the
    /// eviction path) so the pending job it names can run; the job is requeued without using
    /// an attempt. Each is re-checked on apply (only downward, never for a borrower).
    PreemptJobs {
        preemptions: Vec<Preempt>,
    },
    /// Replace the scheduler settings (validated on apply).
    SetSchedulerPolicy {
        settings: SchedulerSettings,
    },
    /// Add or replace a replicated alert rule (it overrides a built-in or configured rule of
    /// the same name on every agent).
    SetAlertRule {
        rule: AlertRule,
    },
    /// Remove a replicated alert rule (built-in and configured rules of that name come back).
    DeleteAlertRule {
        name: String,
    },
    /// A GPU's agent saw `rule` fire. Deduplicated: one open alert per rule and GPU. Carries
    /// the rule's severity and remediation, since the rule may be the agent's own.
    RaiseAlert {
        node: NodeId,
        gpu: u32,
        rule: String,
        severity: Severity,
        remediation: Remediation,
        message: String,
    },
    /// `rule` has been clear on the GPU for its hysteresis period.
    ResolveAlert {
        node: NodeId,
        gpu: u32,
        rule: String,
    },
    /// An agent's GPU energy measurements since its last report (counted once per `seq`).
    RecordEnergy {
        report: EnergyReport,
    },
    /// Entries proposed at about the same time, applied in order exactly as if each were an
    /// entry of its own (each with its own time, caller and result): the leader's group commit
    /// (one append and fsync for all of them). Never nested.
    Batch {
        entries: Vec<LogEntry>,
    },
    /// Set a GPU's mode and MIG layout (validated against the model's rules on apply). It
    /// takes effect at once on an idle GPU; on a busy one it waits, and the GPU drains (no new
    /// work) until its jobs have ended: no job is stopped for it. With `if_idle` (the leader's
    /// demand-driven re-slicing) a busy GPU refuses the change instead.
    SetGpuPartition {
        node: NodeId,
        gpu: u32,
        partition: PartitionSpec,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        if_idle: bool,
    },
    /// The scheduler's slice placements (MIG instances, shares), each re-validated on apply.
    BindSlices {
        binds: Vec<SliceBind>,
    },
    /// The leader signed the audit chain's head (with the cluster CA key).
    SignAuditHead {
        head: SignedHead,
    },
    /// Forget what has outlived its use as of the entry's time: expired certificates' records
    /// and old idempotency keys (`apply/expiry.rs`). Proposed by the leader. Only protocol 9
    /// agents read it.
    ForgetExpired,
    /// Move what `retention` no longer keeps out of the state, into every agent's archive
    /// (`apply/archive.rs`). Proposed by the leader. Only protocol 10 agents read it.
    Archive {
        retention: crate::model::retention::Retention,
    },
    /// Trust CA `next` beside the signing CA `current` (named, so that the state holds it from
    /// the first rotation on); `sealed_key` is `next`'s private key sealed under `current`'s.
    /// Only protocol 8 agents read it (and the three below).
    IntroduceCa {
        current: CaCert,
        next: CaCert,
        sealed_key: String,
    },
    /// Sign with the introduced CA `key_id` from now on; `resealed` are the registry logins
    /// sealed under the old CA's key, sealed again under the new one's.
    SwitchCa {
        key_id: String,
        #[serde(default)]
        resealed: Vec<ResealedCredential>,
    },
    /// Trust CA `key_id` no more (or, for a CA introduced but not switched to, call it off).
    RetireCa {
        key_id: String,
    },
    /// The CAs agent `node` has installed (trusts), by key id.
    ReportTrust {
        node: NodeId,
        key_ids: BTreeSet<String>,
    },
}

/// The internal protocol version that added `Batch`, `SetGpuPartition`, `BindSlices` and sliced
/// and vm job specs to the log. An agent of version 1 cannot read them: it would fail on the
/// new variants and silently drop the new fields.
pub const PROTOCOL_2: u32 = 2;

/// The internal protocol version that added job accounts (on specs, tokens and tenants),
/// retries of failed runs and the out-of-memory outcome.
pub const PROTOCOL_3: u32 = 3;

/// The internal protocol version that added token limits (expiry; a join token's uses and
/// node ids, counted down and checked when its enrolment is recorded): an older agent would
/// drop them and let an expired or used-up token in.
pub const PROTOCOL_5: u32 = 5;

/// The internal protocol version that added signed audit heads (`SignAuditHead`: an older
/// agent cannot read the command), join tokens bound to a seat (an older agent would drop
/// the binding and let a learner's token make a voter), tenants' pending caps and node
/// verdicts that requeue evicting jobs (`SetNodeStatus::requeue_evicting`).
pub const PROTOCOL_6: u32 = 6;

/// The internal protocol version that added the live run's phase (`ReportRunPhase`: pulling
/// an image), the images a node holds (`ReportImages`) and tenants' sealed registry logins
/// (`SetRegistryCredential`): an older agent cannot read them.
pub const PROTOCOL_7: u32 = 7;

/// The internal protocol version that added CA rotation (`IntroduceCa`, `SwitchCa`,
/// `RetireCa`, `ReportTrust`) and the issuing CA of a recorded certificate
/// (`CertRecord::issuer`, which an older agent would drop): an older agent cannot read them.
pub const PROTOCOL_8: u32 = 8;

/// The internal protocol version that added retention (`Command::Archive`, and the state's
/// `audit_base` and `archived_keys` that only it sets).
pub const PROTOCOL_10: u32 = 10;

/// The internal protocol version that added job dependencies, singletons and holds
/// (`JobSpec::after`, `JobSpec::singleton`, `Command::HoldJob`): an older agent would drop
/// them and place the job at once.
pub const PROTOCOL_11: u32 = 11;

/// The internal protocol version that added updates of pending jobs (`UpdateJob`), requeues
/// (`RequeueJob`) and holds at submission (`SubmitJob::hold`): an older agent cannot read the
/// first two and would place a job submitted held.
pub const PROTOCOL_12: u32 = 12;

/// The internal protocol version that added the learned queue order (`Ordering::Learned`):
/// an older agent cannot read the setting.
pub const PROTOCOL_13: u32 = 13;

/// The internal protocol version that added the gang starvation guard
/// (`SchedulerSettings::gang_wait_limit_s`: an older agent would drop the setting and refuse
/// the preemptions it allows) and gangs' topology levels (`JobSpec::topology`: an older
/// leader would drop it and spread the gang over any nodes).
pub const PROTOCOL_14: u32 = 14;

/// The internal protocol version that added conservative backfill
/// (`Backfill::Conservative`: an older agent cannot read the setting) and the preempt exempt
/// time (`SchedulerSettings::preempt_exempt_s`: an older agent would drop it and accept the
/// preemptions it refuses).
pub const PROTOCOL_15: u32 = 15;

/// The internal protocol version that added exactly-once writes (`LogEntry::request`: an
/// older agent would apply a request's second copy, which the others answer without applying)
/// and `ForgetExpired`.
pub const PROTOCOL_9: u32 = 9;

/// The internal protocol version that added container jobs (`JobSpec::container`) and tenants'
/// allowed mounts: an older agent would run a container job's command on the host.
pub const PROTOCOL_4: u32 = 4;

impl Command {
    /// A plain submission of `spec`: no idempotency key, not held, its owner left for the
    /// leader to stamp.
    pub fn submit(spec: JobSpec) -> Self {
        Command::SubmitJob {
            spec: Box::new(spec),
            idempotency_key: None,
            hold: false,
            owner: None,
        }
    }

    /// How many commands this is: a batch's entries, else one.
    pub fn commands(&self) -> u64 {
        match self {
            Command::Batch { entries } => entries.len() as u64,
            _ => 1,
        }
    }

    /// The oldest internal protocol whose agents apply this command correctly. A leader proposes
    /// it only once every member has registered with at least this version.
    pub fn protocol(&self) -> u32 {
        match self {
            Command::SetSchedulerPolicy { settings }
                if settings.backfill == crate::model::scheduler::Backfill::Conservative
                    || settings.preempt_exempt_s != 0 =>
            {
                PROTOCOL_15
            }
            Command::SetSchedulerPolicy { settings } if settings.gang_wait_limit_s != 0 => {
                PROTOCOL_14
            }
            Command::SubmitJob { spec, .. } if spec.topology.is_some() => PROTOCOL_14,
            Command::SetSchedulerPolicy { settings }
                if settings.ordering == crate::model::scheduler::Ordering::Learned =>
            {
                PROTOCOL_13
            }
            Command::UpdateJob { .. }
            | Command::RequeueJob { .. }
            | Command::SubmitJob { hold: true, .. }
            | Command::SubmitJob { owner: Some(_), .. } => PROTOCOL_12,
            Command::HoldJob { .. } | Command::CancelArray { .. } | Command::HoldArray { .. } => {
                PROTOCOL_11
            }
            Command::SubmitJob { spec, .. } if !spec.labels.is_empty() || spec.notify.is_some() => {
                PROTOCOL_12
            }
            Command::CreateTenant { tenant } | Command::UpdateTenant { tenant }
                if tenant.webhook.is_some() =>
            {
                PROTOCOL_12
            }
            Command::SubmitJob { spec, .. }
                if !spec.after.is_empty() || spec.singleton || spec.array.is_some() =>
            {
                PROTOCOL_11
            }
            Command::Archive { .. } => PROTOCOL_10,
            Command::ForgetExpired => PROTOCOL_9,
            Command::Batch { .. }
            | Command::SetGpuPartition { .. }
            | Command::BindSlices { .. } => PROTOCOL_2,
            Command::IntroduceCa { .. }
            | Command::SwitchCa { .. }
            | Command::RetireCa { .. }
            | Command::ReportTrust { .. } => PROTOCOL_8,
            Command::RecordCertificate { cert, .. } if !cert.issuer.is_empty() => PROTOCOL_8,
            Command::ReportRunPhase { .. }
            | Command::ReportImages { .. }
            | Command::SetRegistryCredential { .. } => PROTOCOL_7,
            Command::SignAuditHead { .. }
            | Command::SetNodeStatus {
                requeue_evicting: true,
                ..
            } => PROTOCOL_6,
            Command::CreateToken { token } if token.limits.seat.is_some() => PROTOCOL_6,
            Command::CreateTenant { tenant } | Command::UpdateTenant { tenant }
                if tenant.max_pending_jobs.is_some() =>
            {
                PROTOCOL_6
            }
            Command::CreateToken { token } if !token.limits.is_none() => PROTOCOL_5,
            Command::CreateTenant { tenant } | Command::UpdateTenant { tenant }
                if tenant.max_priority.is_some() =>
            {
                PROTOCOL_5
            }
            Command::RecordCertificate {
                enrolled_with: Some(_),
                ..
            } => PROTOCOL_5,
            Command::SubmitJob { spec, .. } if spec.container.is_some() => PROTOCOL_4,
            Command::CreateTenant { tenant } | Command::UpdateTenant { tenant }
                if !tenant.allowed_mounts.is_empty() =>
            {
                PROTOCOL_4
            }
            Command::SubmitJob { spec, .. }
                if spec.account.is_some() || spec.retry_backoff_s.is_some() =>
            {
                PROTOCOL_3
            }
            Command::CreateToken { token } if token.account.is_some() => PROTOCOL_3,
            Command::SetTokenAccount { .. } => PROTOCOL_3,
            Command::CreateTenant { tenant } | Command::UpdateTenant { tenant }
                if tenant.account.is_some() =>
            {
                PROTOCOL_3
            }
            Command::JobFinished {
                outcome: Outcome::OutOfMemory { .. },
                ..
            } => PROTOCOL_3,
            Command::SubmitJob { spec, .. } if spec.slice.is_some() || !spec.kind.is_process() => {
                PROTOCOL_2
            }
            _ => 1,
        }
    }
}

/// How a `SubmitJob` asks for its job, beside the spec.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Submission<'a> {
    pub key: Option<&'a str>,
    /// Held from the start.
    pub hold: bool,
    /// The token that submitted it, as the leader stamped it.
    pub owner: Option<&'a str>,
}

/// One placement decision: `job` onto these GPU indexes of `node`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub job: JobId,
    pub node: NodeId,
    #[serde(default)]
    pub gpus: Vec<u32>,
}

/// One preemption: stop run `generation` of `job` for the pending job `for_job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preempt {
    pub job: JobId,
    pub generation: u64,
    pub for_job: JobId,
}

impl fmt::Display for LogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} @{}ms", self.cmd, self.proposed_at_ms)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Batch { entries } => write!(f, "batch of {}", entries.len()),
            Command::RegisterNode {
                node,
                addr,
                labels,
                inventory,
                edge,
                ..
            } => {
                write!(
                    f,
                    "register n{node} {addr} ({} gpus, {} labels)",
                    inventory.gpus.len(),
                    labels.len()
                )?;
                match edge {
                    Some(e) => write!(
                        f,
                        " edge {} lease {}ms down {}ms",
                        e.site, e.lease_ms, e.down_after_ms
                    ),
                    None => Ok(()),
                }
            }
            Command::SetNodeLabels { node, set, remove } => {
                write!(f, "label n{node} +{} -{}", set.len(), remove.len())
            }
            Command::SetNodeStatus { node, status, .. } => write!(f, "status n{node} {status:?}"),
            Command::CordonNode { node, cordoned } => {
                write!(
                    f,
                    "{} n{node}",
                    if *cordoned { "cordon" } else { "uncordon" }
                )
            }
            Command::DrainNode { node, evict } => write!(f, "drain n{node} evict={evict}"),
            Command::SubmitJob {
                spec,
                idempotency_key,
                hold,
                ..
            } => write!(
                f,
                "submit {:?} gpus={} key={}{}",
                spec.name,
                spec.gpus,
                idempotency_key.as_deref().unwrap_or("-"),
                if *hold { " held" } else { "" }
            ),
            Command::CancelJob { job } => write!(f, "cancel j-{job}"),
            Command::HoldJob { job, hold } => {
                write!(f, "{} j-{job}", if *hold { "hold" } else { "release" })
            }
            Command::UpdateJob { job, array, update } => {
                let what = if *array { "array " } else { "" };
                write!(f, "update {what}j-{job} {update}")
            }
            Command::RequeueJob { job, array } => {
                let what = if *array { "array " } else { "" };
                write!(f, "requeue {what}j-{job}")
            }
            Command::CancelArray { array } => write!(f, "cancel array j-{array}"),
            Command::HoldArray { array, hold } => {
                let verb = if *hold { "hold" } else { "release" };
                write!(f, "{verb} array j-{array}")
            }
            Command::BindJobs { binds } => {
                f.write_str("bind")?;
                for b in binds {
                    write!(f, " j-{}->n{}{:?}", b.job, b.node, b.gpus)?;
                }
                Ok(())
            }
            Command::JobStarted { job, generation } => write!(f, "started j-{job} g{generation}"),
            Command::ReportRunPhase {
                job,
                generation,
                phase,
            } => match phase {
                Some(p) => write!(f, "phase j-{job} g{generation}: {p}"),
                None => write!(f, "phase j-{job} g{generation} over"),
            },
            Command::ReportImages { node, images } => {
                write!(f, "images n{node}: {}", images.len())
            }
            // Never the sealed password, nor the username.
            Command::SetRegistryCredential {
                tenant,
                registry,
                credential,
            } => match credential {
                Some(_) => write!(f, "registry credential {tenant}@{registry} set"),
                None => write!(f, "registry credential {tenant}@{registry} removed"),
            },
            Command::JobFinished {
                job,
                generation,
                outcome,
            } => {
                write!(f, "finished j-{job} g{generation}: {outcome}")
            }
            Command::CreateToken { token } => {
                write!(f, "token create {} {}", token.id, token.role)
            }
            Command::RevokeToken { id } => write!(f, "token revoke {id}"),
            Command::SetTokenAccount { id, account } => match account {
                Some(a) => write!(f, "token account {id} = {a}"),
                None => write!(f, "token account {id} cleared"),
            },
            Command::RecordCertificate { cert, .. } => {
                write!(f, "certificate issued {} {}", cert.serial, cert.subject)
            }
            Command::RevokeCertificate { serial, .. } => {
                write!(f, "certificate revoke {serial}")
            }
            Command::IntroduceCa { current, next, .. } => write!(
                f,
                "ca introduce {} beside {}",
                short(&next.key_id),
                short(&current.key_id)
            ),
            Command::SwitchCa { key_id, resealed } => write!(
                f,
                "ca switch to {} ({} logins resealed)",
                short(key_id),
                resealed.len()
            ),
            Command::RetireCa { key_id } => write!(f, "ca retire {}", short(key_id)),
            Command::ReportTrust { node, key_ids } => {
                write!(f, "trust n{node}:")?;
                key_ids
                    .iter()
                    .try_for_each(|id| write!(f, " {}", short(id)))
            }
            Command::AuditDenied { reason } => write!(f, "denied: {reason}"),
            Command::RecordAction { outcome } => write!(f, "action: {outcome}"),
            Command::NoteUnschedulable { reasons } => write!(f, "unschedulable x{}", reasons.len()),
            Command::GangMemberFinished {
                job,
                generation,
                node,
            } => write!(f, "gang member n{node} of j-{job} g{generation} exited 0"),
            Command::PreemptJobs { preemptions } => {
                f.write_str("preempt")?;
                for p in preemptions {
                    write!(f, " j-{}g{}->j-{}", p.job, p.generation, p.for_job)?;
                }
                Ok(())
            }
            Command::CreateTenant { tenant } => {
                write!(
                    f,
                    "tenant create {} ({} quotas)",
                    tenant.name,
                    tenant.quotas.len()
                )
            }
            Command::UpdateTenant { tenant } => {
                write!(
                    f,
                    "tenant update {} ({} quotas)",
                    tenant.name,
                    tenant.quotas.len()
                )
            }
            Command::SetSchedulerPolicy { settings } => {
                write!(f, "scheduler policy {}", settings.spec())
            }
            Command::SetAlertRule { rule } => {
                write!(f, "alert rule {} = {}", rule.name, rule.condition)
            }
            Command::DeleteAlertRule { name } => write!(f, "alert rule {name} deleted"),
            Command::RaiseAlert {
                node, gpu, rule, ..
            } => write!(f, "alert {rule} raised on n{node}/{gpu}"),
            Command::ResolveAlert { node, gpu, rule } => {
                write!(f, "alert {rule} resolved on n{node}/{gpu}")
            }
            Command::RecordEnergy { report } => {
                write!(f, "energy n{} {} mJ", report.node, report.gpu_mj)
            }
            Command::SetGpuPartition {
                node,
                gpu,
                partition,
                if_idle,
            } => write!(
                f,
                "partition n{node}/{gpu} {partition}{}",
                if *if_idle { " if idle" } else { "" }
            ),
            Command::BindSlices { binds } => {
                f.write_str("bind slices")?;
                for b in binds {
                    write!(f, " j-{}->n{}/{} {}", b.job, b.node, b.gpu, b.slice)?;
                }
                Ok(())
            }
            Command::SignAuditHead { head } => {
                write!(f, "audit head {} signed by {}", head.seq, head.key_id)
            }
            Command::ForgetExpired => f.write_str("forget expired records"),
            Command::Archive { retention } => write!(
                f,
                "archive jobs finished {} s ago or beyond the newest {}, audit beyond the newest {}",
                retention.finished_max_age_ms / 1000,
                retention.finished_keep,
                retention.audit_keep
            ),
        }
    }
}

/// The first 16 hex digits of a key id, as people read it.
fn short(key_id: &str) -> &str {
    key_id.get(..16).unwrap_or(key_id)
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn entry(cmd: Command) -> LogEntry {
        LogEntry {
            proposed_at_ms: 1_700_000_000_000,
            cmd,
            meta: None,
            request: None,
        }
    }

    /// Frozen encodings: if one of these changes, old logs on disk no longer decode.
    #[test]
    fn encodings_are_frozen() {
        let register = entry(Command::RegisterNode {
            node: 3,
            addr: "10.0.0.3:7070".into(),
            labels: BTreeMap::from([("rack".into(), "r1".into())]),
            inventory: Inventory::default(),
            edge: None,
            protocol: 1,
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"register_node","node":3,"addr":"10.0.0.3:7070","labels":{"rack":"r1"},"inventory":{"gpus":[],"cpu_cores":0,"memory_mib":0}}}"#]]
            .assert_eq(&serde_json::to_string(&register).unwrap_or_default());

        let label = entry(Command::SetNodeLabels {
            node: 3,
            set: BTreeMap::from([("zone".into(), "b".into())]),
            remove: BTreeSet::from(["rack".into()]),
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"set_node_labels","node":3,"set":{"zone":"b"},"remove":["rack"]}}"#]]
            .assert_eq(&serde_json::to_string(&label).unwrap_or_default());

        let policy = entry(Command::SetSchedulerPolicy {
            settings: SchedulerSettings {
                ordering: crate::model::scheduler::Ordering::Sjf,
                backfill: crate::model::scheduler::Backfill::Easy,
                aging_per_hour: 1,
                fairshare_weight: 10,
                usage_half_life_s: 86_400,
                preemption: crate::model::scheduler::Preemption::Off,
                gang_wait_limit_s: 0,
                preempt_exempt_s: 0,
            },
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"set_scheduler_policy","settings":{"ordering":"sjf","backfill":"easy","aging_per_hour":1,"fairshare_weight":10,"usage_half_life_s":86400}}}"#]]
            .assert_eq(&serde_json::to_string(&policy).unwrap_or_default());

        let tenant = entry(Command::CreateTenant {
            tenant: crate::model::tenant::TenantRecord {
                name: "vision".into(),
                quotas: BTreeMap::from([(
                    "A100".into(),
                    crate::model::tenant::Quota {
                        guaranteed: 4,
                        borrow: 2,
                    },
                )]),
                weight: 2,
                default_priority: -1,
                created_at_ms: 0,
                updated_at_ms: 0,
                account: None,
                allowed_mounts: Vec::new(),
                max_priority: None,
                max_pending_jobs: None,
                webhook: None,
            },
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"create_tenant","tenant":{"name":"vision","quotas":{"A100":{"guaranteed":4,"borrow":2}},"weight":2,"default_priority":-1,"created_at_ms":0,"updated_at_ms":0}}}"#]]
            .assert_eq(&serde_json::to_string(&tenant).unwrap_or_default());
        let preempt = entry(Command::PreemptJobs {
            preemptions: vec![Preempt {
                job: 3,
                generation: 2,
                for_job: 9,
            }],
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"preempt_jobs","preemptions":[{"job":3,"generation":2,"for_job":9}]}}"#]]
            .assert_eq(&serde_json::to_string(&preempt).unwrap_or_default());

        let member = entry(Command::GangMemberFinished {
            job: 4,
            generation: 1,
            node: 2,
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"gang_member_finished","job":4,"generation":1,"node":2}}"#]]
            .assert_eq(&serde_json::to_string(&member).unwrap_or_default());
        let update = entry(Command::UpdateTenant {
            tenant: crate::model::tenant::TenantRecord {
                name: "a".into(),
                quotas: BTreeMap::new(),
                weight: 1,
                default_priority: 0,
                created_at_ms: 3,
                updated_at_ms: 4,
                account: None,
                allowed_mounts: Vec::new(),
                max_priority: None,
                max_pending_jobs: None,
                webhook: None,
            },
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"update_tenant","tenant":{"name":"a","quotas":{},"weight":1,"default_priority":0,"created_at_ms":3,"updated_at_ms":4}}}"#]]
            .assert_eq(&serde_json::to_string(&update).unwrap_or_default());

        // An update written before `borrow`, `weight` or `default_priority` existed still decodes.
        let old = r#"{"proposed_at_ms":5,"cmd":{"type":"update_tenant","tenant":{"name":"a","quotas":{"T4":{"guaranteed":1}}}}}"#;
        let decoded: LogEntry = serde_json::from_str(old).expect("old tenant entry decodes");
        let Command::UpdateTenant { tenant } = decoded.cmd else {
            panic!("{decoded:?}");
        };
        assert_eq!((tenant.weight, tenant.default_priority), (1, 0));
        assert_eq!(tenant.quotas["T4"].limit(), 1);
    }

    #[test]
    fn alert_encodings_are_frozen() {
        use crate::model::alert::{Condition, Metric, Number};
        let rule = entry(Command::SetAlertRule {
            rule: AlertRule {
                name: "hot".into(),
                condition: Condition::Above {
                    metric: Metric::TemperatureC,
                    threshold: Number(85.5),
                    for_ms: 30_000,
                },
                severity: Severity::Critical,
                remediation: Remediation::Throttle { power_pct: 70 },
                clear_after_ms: 60_000,
                enabled: true,
            },
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"set_alert_rule","rule":{"name":"hot","condition":{"kind":"above","metric":"temperature_c","threshold":85.5,"for_ms":30000},"severity":"critical","remediation":{"kind":"throttle","power_pct":70},"clear_after_ms":60000,"enabled":true}}}"#]]
            .assert_eq(&serde_json::to_string(&rule).unwrap_or_default());
        let raise = entry(Command::RaiseAlert {
            node: 2,
            gpu: 1,
            rule: "gpu-failing".into(),
            severity: Severity::Critical,
            remediation: Remediation::Migrate,
            message: "XID 79".into(),
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"raise_alert","node":2,"gpu":1,"rule":"gpu-failing","severity":"critical","remediation":{"kind":"migrate"},"message":"XID 79"}}"#]]
            .assert_eq(&serde_json::to_string(&raise).unwrap_or_default());
        let resolve = entry(Command::ResolveAlert {
            node: 2,
            gpu: 1,
            rule: "gpu-failing".into(),
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"resolve_alert","node":2,"gpu":1,"rule":"gpu-failing"}}"#]]
            .assert_eq(&serde_json::to_string(&resolve).unwrap_or_default());
        let energy = entry(Command::RecordEnergy {
            report: EnergyReport {
                node: 2,
                seq: 1_700_000_000_000,
                gpu_mj: 90_000,
                green_capped_ms: 4_000,
                jobs: vec![(7, 60_000)],
            },
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"record_energy","report":{"node":2,"seq":1700000000000,"gpu_mj":90000,"green_capped_ms":4000,"jobs":[[7,60000]]}}}"#]]
            .assert_eq(&serde_json::to_string(&energy).unwrap_or_default());
    }

    #[test]
    fn partition_encodings_are_frozen() {
        let bytes: Vec<String> = every_command()
            .into_iter()
            .filter(|c| {
                matches!(
                    c,
                    Command::SetGpuPartition { .. } | Command::BindSlices { .. }
                )
            })
            .map(|c| serde_json::to_string(&entry(c)).unwrap_or_default())
            .collect();
        expect![[r#"
            {"proposed_at_ms":1700000000000,"cmd":{"type":"set_gpu_partition","node":1,"gpu":0,"partition":{"mode":"mig","mig":[{"profile":"3g.40gb","start":4}]},"if_idle":true}}
            {"proposed_at_ms":1700000000000,"cmd":{"type":"bind_slices","binds":[{"job":7,"node":1,"gpu":0,"slice":{"kind":"mig","profile":"3g.40gb","start":4}},{"job":8,"node":1,"gpu":1,"slice":{"kind":"shared","memory_mib":10240,"share":25}}]}}"#]].assert_eq(&bytes.join("\n"));
        let Some(Command::SubmitJob { spec, .. }) = every_command()
            .into_iter()
            .find(|c| matches!(c, Command::SubmitJob { .. }))
        else {
            panic!("a submit");
        };
        let sliced = |slice, kind| {
            entry(Command::submit(JobSpec {
                name: "s".into(),
                gpus: 1,
                slice: Some(slice),
                kind,
                ..(*spec).clone()
            }))
        };
        let mig = sliced(
            crate::model::partition::SliceRequest::Mig {
                profile: "1g.10gb".into(),
            },
            crate::model::job::JobKind::Process,
        );
        let vm = sliced(
            crate::model::partition::SliceRequest::Shared {
                memory_mib: 1024,
                share: 25,
            },
            crate::model::job::JobKind::Vm,
        );
        let submit = [mig, vm]
            .iter()
            .map(|e| serde_json::to_string(e).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        expect![[r#"
            {"proposed_at_ms":1700000000000,"cmd":{"type":"submit_job","spec":{"name":"s","tenant":"t","command":["python"],"env":{"A":"1"},"workdir":"/srv","gpus":1,"gpu_types":["A100"],"min_gpu_memory_mib":1,"node_selector":{"site":"x"},"priority":-3,"runtime_estimate_s":5,"wall_time_limit_s":6,"max_attempts":2,"cpu_millis":null,"memory_mib":null,"slice":{"kind":"mig","profile":"1g.10gb"}},"idempotency_key":null}}
            {"proposed_at_ms":1700000000000,"cmd":{"type":"submit_job","spec":{"name":"s","tenant":"t","command":["python"],"env":{"A":"1"},"workdir":"/srv","gpus":1,"gpu_types":["A100"],"min_gpu_memory_mib":1,"node_selector":{"site":"x"},"priority":-3,"runtime_estimate_s":5,"wall_time_limit_s":6,"max_attempts":2,"cpu_millis":null,"memory_mib":null,"slice":{"kind":"shared","memory_mib":1024,"share":25},"kind":"vm"},"idempotency_key":null}}"#]].assert_eq(&submit);
    }

    #[test]
    fn old_entries_without_optional_fields_decode() {
        let old = r#"{"proposed_at_ms":5,"cmd":{"type":"register_node","node":1,"addr":"a:1"}}"#;
        let decoded: LogEntry = serde_json::from_str(old).expect("old entry decodes");
        assert_eq!(
            decoded.cmd,
            Command::RegisterNode {
                node: 1,
                addr: "a:1".into(),
                labels: BTreeMap::new(),
                inventory: Inventory::default(),
                edge: None,
                protocol: 1,
            }
        );
    }

    /// One of every command, with every collection non-empty.
    fn every_command() -> Vec<Command> {
        use crate::model::job::{JobSpec, Outcome};
        use crate::model::node::{GpuRecord, Inventory, NodeStatus};
        let spec = JobSpec {
            name: "train".into(),
            tenant: "t".into(),
            command: vec!["python".into()],
            env: BTreeMap::from([("A".into(), "1".into())]),
            workdir: Some("/srv".into()),
            gpus: 2,
            gpu_types: vec!["A100".into()],
            min_gpu_memory_mib: 1,
            node_selector: BTreeMap::from([("site".into(), "x".into())]),
            priority: -3,
            runtime_estimate_s: Some(5),
            wall_time_limit_s: Some(6),
            max_attempts: 2,
            cpu_millis: None,
            memory_mib: None,
            nodes: 0,
            topology: None,
            slice: None,
            kind: Default::default(),
            account: None,
            retry_backoff_s: None,
            container: None,
            after: Vec::new(),
            singleton: false,
            array: None,
            labels: BTreeMap::new(),
            notify: None,
        };
        let gpu = GpuRecord {
            index: 1,
            uuid: "GPU-1".into(),
            model: "A100-80GB".into(),
            gpu_type: "A100".into(),
            memory_mib: 81920,
            numa_node: Some(0),
            nvlink_peers: vec![2],
            healthy: true,
        };
        vec![
            Command::RegisterNode {
                node: 1,
                addr: "h:1".into(),
                labels: BTreeMap::from([("k".into(), "v".into())]),
                inventory: Inventory {
                    gpus: vec![gpu],
                    cpu_cores: 8,
                    memory_mib: 9,
                },
                edge: Some(EdgeTerms {
                    site: "x".into(),
                    lease_ms: 60_000,
                    down_after_ms: 90_000,
                }),
                protocol: 2,
            },
            Command::SetNodeLabels {
                node: 1,
                set: BTreeMap::from([("k".into(), "v".into())]),
                remove: BTreeSet::from(["x".into()]),
            },
            Command::SetNodeStatus {
                node: 1,
                status: NodeStatus::Down,
                requeue_evicting: false,
            },
            Command::CordonNode {
                node: 1,
                cordoned: true,
            },
            Command::DrainNode {
                node: 1,
                evict: true,
            },
            Command::SubmitJob {
                spec: Box::new(spec),
                idempotency_key: Some("k".into()),
                hold: false,
                owner: None,
            },
            Command::CancelJob { job: 7 },
            Command::HoldJob { job: 7, hold: true },
            Command::CancelArray { array: 7 },
            Command::HoldArray {
                array: 7,
                hold: true,
            },
            Command::UpdateJob {
                job: 7,
                array: true,
                update: JobUpdate {
                    priority: Some(3),
                    wall_time_limit_s: Some(60),
                    gpus: Some(2),
                },
            },
            Command::RequeueJob {
                job: 7,
                array: true,
            },
            Command::BindJobs {
                binds: vec![Bind {
                    job: 7,
                    node: 1,
                    gpus: vec![0, 1],
                }],
            },
            Command::JobStarted {
                job: 7,
                generation: 1,
            },
            Command::JobFinished {
                job: 7,
                generation: 1,
                outcome: Outcome::Signaled { signal: 9 },
            },
            Command::JobFinished {
                job: 7,
                generation: 1,
                outcome: Outcome::Lost {
                    message: "m".into(),
                },
            },
            Command::NoteUnschedulable {
                reasons: vec![(7, "why".into())],
            },
            Command::CreateToken {
                token: crate::model::auth::TokenRecord {
                    id: "t1".into(),
                    secret_sha256: "ab".repeat(32),
                    role: crate::model::auth::Role::TenantAdmin,
                    tenant: Some("a".into()),
                    description: "d".into(),
                    created_at_ms: 1,
                    created_by: "system:bootstrap".into(),
                    revoked: false,
                    account: None,
                    limits: Default::default(),
                },
            },
            Command::RevokeToken { id: "t1".into() },
            Command::SetTokenAccount {
                id: "t1".into(),
                account: Some(Account {
                    user: "bob".into(),
                    group: Some("research".into()),
                    groups: vec!["video".into()],
                }),
            },
            Command::RecordCertificate {
                cert: crate::model::cert::CertRecord {
                    serial: "0a".into(),
                    subject: "node 2".into(),
                    not_after_ms: 9,
                    issued_at_ms: 1,
                    revoked: false,
                    revoked_reason: String::new(),
                    issuer: String::new(),
                },
                enrolled_with: None,
            },
            Command::RevokeCertificate {
                serial: "0a".into(),
                reason: "stolen".into(),
            },
            Command::AuditDenied {
                reason: "no".into(),
            },
            Command::RecordAction {
                outcome: "ok".into(),
            },
            Command::GangMemberFinished {
                job: 7,
                generation: 1,
                node: 2,
            },
            Command::SetGpuPartition {
                node: 1,
                gpu: 0,
                partition: PartitionSpec {
                    mode: crate::model::partition::GpuMode::Mig,
                    mig: vec![crate::model::mig::Instance {
                        profile: "3g.40gb".into(),
                        start: 4,
                    }],
                },
                if_idle: true,
            },
            Command::BindSlices {
                binds: vec![
                    SliceBind {
                        job: 7,
                        node: 1,
                        gpu: 0,
                        slice: crate::model::partition::Slice::Mig {
                            profile: "3g.40gb".into(),
                            start: 4,
                        },
                    },
                    SliceBind {
                        job: 8,
                        node: 1,
                        gpu: 1,
                        slice: crate::model::partition::Slice::Shared {
                            memory_mib: 10_240,
                            share: 25,
                        },
                    },
                ],
            },
            Command::PreemptJobs {
                preemptions: vec![Preempt {
                    job: 7,
                    generation: 1,
                    for_job: 8,
                }],
            },
            Command::CreateTenant {
                tenant: crate::model::tenant::TenantRecord {
                    name: "a".into(),
                    quotas: BTreeMap::from([("T4".into(), crate::model::tenant::Quota::default())]),
                    weight: 1,
                    default_priority: 0,
                    created_at_ms: 1,
                    updated_at_ms: 2,
                    account: None,
                    allowed_mounts: Vec::new(),
                    max_priority: None,
                    max_pending_jobs: None,
                    webhook: None,
                },
            },
            Command::UpdateTenant {
                tenant: crate::model::tenant::TenantRecord {
                    name: "a".into(),
                    quotas: BTreeMap::new(),
                    weight: 3,
                    default_priority: 4,
                    created_at_ms: 1,
                    updated_at_ms: 2,
                    account: None,
                    allowed_mounts: Vec::new(),
                    max_priority: None,
                    max_pending_jobs: None,
                    webhook: None,
                },
            },
            Command::SetSchedulerPolicy {
                settings: SchedulerSettings {
                    ordering: crate::model::scheduler::Ordering::FairShare,
                    backfill: crate::model::scheduler::Backfill::Easy,
                    aging_per_hour: 2,
                    fairshare_weight: 3,
                    usage_half_life_s: 3600,
                    preemption: crate::model::scheduler::Preemption::Priority,
                    gang_wait_limit_s: 0,
                    preempt_exempt_s: 0,
                },
            },
            Command::SignAuditHead {
                head: SignedHead {
                    seq: 4,
                    hash: "ab".repeat(32),
                    time_ms: 0,
                    key_id: "cd".repeat(32),
                    signature: "3045".into(),
                },
            },
            Command::ReportRunPhase {
                job: 7,
                generation: 2,
                phase: Some("pulling image busybox".into()),
            },
            Command::ReportImages {
                node: 2,
                images: BTreeSet::from(["docker.io/library/busybox:latest".into()]),
            },
            Command::SetRegistryCredential {
                tenant: "t".into(),
                registry: "nvcr.io".into(),
                credential: Some(SealedCredential {
                    username: "robot".into(),
                    sealed: "0a1b".into(),
                    key_id: "ef".repeat(32),
                    set_at_ms: 0,
                }),
            },
            Command::Batch {
                entries: vec![
                    entry(Command::CancelJob { job: 7 }),
                    entry(Command::SetNodeStatus {
                        node: 1,
                        status: NodeStatus::Down,
                        requeue_evicting: false,
                    }),
                ],
            },
        ]
    }

    /// Fields added to `JobSpec` and `SchedulerSettings` later are left out at their defaults,
    /// so the bytes of entries that do not use them are what older binaries wrote.
    #[test]
    fn defaults_of_added_fields_are_not_written() {
        let submit = every_command()
            .into_iter()
            .find(|c| matches!(c, Command::SubmitJob { .. }))
            .expect("a submit");
        let bytes = serde_json::to_string(&entry(submit)).unwrap_or_default();
        assert!(!bytes.contains("\"nodes\""), "{bytes}");
        let policy = serde_json::to_string(&SchedulerSettings::default()).unwrap_or_default();
        assert!(!policy.contains("preemption"), "{policy}");
    }

    /// Every command must survive the trip through the Raft log's encodings (an openraft
    /// entry, in MessagePack on disk and between new agents, in JSON to older ones). An entry
    /// that does not decode would stop the replica that stored it.
    #[test]
    fn every_command_round_trips_through_a_log_entry() {
        for cmd in every_command() {
            let entry = crate::Entry {
                log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), 3),
                payload: openraft::EntryPayload::Normal(LogEntry {
                    proposed_at_ms: 1,
                    cmd: cmd.clone(),
                    meta: None,
                    request: None,
                }),
            };
            let bytes = serde_json::to_vec(&entry).expect("encode");
            let back: crate::Entry = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{cmd} does not decode: {e}"));
            assert_eq!(back, entry);
            let packed = crate::codec::to_vec(&entry).expect("pack");
            let back: crate::Entry = crate::codec::from_slice(&packed)
                .unwrap_or_else(|e| panic!("{cmd} does not decode from MessagePack: {e}"));
            assert_eq!(back, entry);
        }
    }

    /// A version 1 agent reads every command of version 1 and nothing else: the commands and
    /// fields that came with protocol 2 must say so, or a leader would hand them to it.
    #[test]
    fn only_what_protocol_2_added_waits_for_protocol_2() {
        let added = ["batch", "set_gpu_partition", "bind_slices"];
        // Commands later protocols added (tested in `accounts_wait_for_protocol_3`,
        // `signed_audit_heads_wait_for_protocol_6` and `image_reports_wait_for_protocol_7`).
        let added_by_3 = [
            "set_token_account",
            "sign_audit_head",
            "report_run_phase",
            "report_images",
            "set_registry_credential",
            "hold_job",
            "cancel_array",
            "hold_array",
            "update_job",
            "requeue_job",
        ];
        for cmd in every_command() {
            let tag = serde_json::to_value(&cmd).expect("encode")["type"].clone();
            let is_new = added.iter().any(|t| tag == *t);
            if added_by_3.iter().any(|t| tag == *t) {
                continue;
            }
            assert_eq!(cmd.protocol(), if is_new { PROTOCOL_2 } else { 1 }, "{cmd}");
        }
        let Some(Command::SubmitJob { spec, .. }) = every_command()
            .into_iter()
            .find(|c| matches!(c, Command::SubmitJob { .. }))
        else {
            panic!("every_command has a submission");
        };
        let spec = *spec;
        let submit = |spec| Command::submit(spec);
        let mut sliced = spec.clone();
        sliced.slice = Some(crate::model::partition::SliceRequest::Mig {
            profile: "1g.10gb".into(),
        });
        let mut vm = spec;
        vm.kind = crate::model::job::JobKind::Vm;
        assert_eq!(submit(sliced).protocol(), PROTOCOL_2);
        assert_eq!(submit(vm).protocol(), PROTOCOL_2);
    }

    /// A version 10 agent would drop a job's dependencies and place it at once, and cannot
    /// read a hold.
    #[test]
    fn dependencies_and_holds_wait_for_protocol_11() {
        let plain = JobSpec {
            name: "n".into(),
            ..JobSpec::default()
        };
        let submit = |spec| Command::submit(spec);
        let after = JobSpec {
            after: crate::model::dependency::parse_dependencies("ok:j-1").expect("parses"),
            ..plain.clone()
        };
        let singleton = JobSpec {
            singleton: true,
            ..plain.clone()
        };
        let array = JobSpec {
            array: Some("0-3%2".parse().expect("parses")),
            ..plain.clone()
        };
        assert_eq!(submit(array).protocol(), PROTOCOL_11);
        assert!(submit(plain).protocol() < PROTOCOL_11);
        assert_eq!(submit(after).protocol(), PROTOCOL_11);
        assert_eq!(submit(singleton).protocol(), PROTOCOL_11);
        let hold = Command::HoldJob {
            job: 1,
            hold: false,
        };
        assert_eq!(hold.protocol(), PROTOCOL_11);
    }

    /// A version 12 agent cannot read the learned order; a version 13 agent would drop the
    /// gang wait limit and refuse the preemptions it allows, and drop a gang's topology level;
    /// a version 14 agent cannot read conservative backfill. Off, the limit is not written.
    #[test]
    fn the_learned_order_the_gang_wait_limit_topology_and_conservative_backfill_wait() {
        use crate::model::scheduler::{Backfill, Ordering, SchedulerSettings};
        let set = |settings| Command::SetSchedulerPolicy { settings };
        let plain = SchedulerSettings::default();
        let learned = SchedulerSettings {
            ordering: Ordering::Learned,
            ..plain.clone()
        };
        let guarded = SchedulerSettings {
            gang_wait_limit_s: 3600,
            ..plain.clone()
        };
        let conservative = SchedulerSettings {
            backfill: Backfill::Conservative,
            ..guarded.clone()
        };
        assert_eq!(set(conservative).protocol(), PROTOCOL_15);
        let exempt = SchedulerSettings {
            preempt_exempt_s: 600,
            ..plain.clone()
        };
        assert_eq!(set(exempt).protocol(), PROTOCOL_15);
        assert!(
            !serde_json::to_string(&plain)
                .expect("encodes")
                .contains("gang_wait_limit_s")
        );
        assert!(set(plain).protocol() < PROTOCOL_13);
        assert_eq!(set(learned).protocol(), PROTOCOL_13);
        assert_eq!(set(guarded).protocol(), PROTOCOL_14);
        let in_one_rack = JobSpec {
            gpus: 16,
            nodes: 2,
            topology: Some("rack".into()),
            ..JobSpec::default()
        };
        assert_eq!(Command::submit(in_one_rack).protocol(), PROTOCOL_14);
    }

    /// A version 11 agent cannot read an update or a requeue, and would place a job
    /// submitted held.
    #[test]
    fn updates_requeues_and_holds_at_submission_wait_for_protocol_12() {
        let submit = |hold| Command::SubmitJob {
            spec: Box::new(JobSpec {
                name: "n".into(),
                ..JobSpec::default()
            }),
            idempotency_key: None,
            hold,
            owner: None,
        };
        assert_eq!(submit(true).protocol(), PROTOCOL_12);
        let labelled = Command::submit(JobSpec {
            name: "n".into(),
            labels: BTreeMap::from([("team".into(), "vision".into())]),
            ..JobSpec::default()
        });
        assert_eq!(labelled.protocol(), PROTOCOL_12);
        let owned = Command::SubmitJob {
            spec: Box::default(),
            idempotency_key: None,
            hold: false,
            owner: Some("alice".into()),
        };
        assert_eq!(owned.protocol(), PROTOCOL_12);
        assert!(submit(false).protocol() < PROTOCOL_12);
        let update = Command::UpdateJob {
            job: 1,
            array: false,
            update: JobUpdate::default(),
        };
        assert_eq!(update.protocol(), PROTOCOL_12);
        let requeue = Command::RequeueJob {
            job: 1,
            array: false,
        };
        assert_eq!(requeue.protocol(), PROTOCOL_12);
    }

    /// A version 2 agent would drop an account it cannot read (and run the job as its own
    /// `jobs.run_as`): every command that carries one, or changes one, waits for protocol 3.
    #[test]
    fn accounts_wait_for_protocol_3() {
        let alice = Some(Account::user("alice"));
        let mut carrying = Vec::new();
        let mut plain = Vec::new();
        for cmd in every_command() {
            match cmd {
                Command::CreateToken { mut token } => {
                    plain.push(Command::CreateToken {
                        token: token.clone(),
                    });
                    token.account.clone_from(&alice);
                    carrying.push(Command::CreateToken { token });
                }
                Command::CreateTenant { mut tenant } => {
                    plain.push(Command::CreateTenant {
                        tenant: tenant.clone(),
                    });
                    tenant.account.clone_from(&alice);
                    carrying.push(Command::UpdateTenant {
                        tenant: tenant.clone(),
                    });
                    carrying.push(Command::CreateTenant { tenant });
                }
                Command::SubmitJob {
                    mut spec,
                    idempotency_key,
                    hold: false,
                    owner: None,
                } => {
                    plain.push(Command::SubmitJob {
                        spec: spec.clone(),
                        idempotency_key: idempotency_key.clone(),
                        hold: false,
                        owner: None,
                    });
                    spec.account.clone_from(&alice);
                    carrying.push(Command::SubmitJob {
                        spec,
                        idempotency_key,
                        hold: false,
                        owner: None,
                    });
                }
                _ => {}
            }
        }
        carrying.push(Command::SetTokenAccount {
            id: "t1".into(),
            account: alice,
        });
        carrying.push(Command::SetTokenAccount {
            id: "t1".into(),
            account: None,
        });
        assert_eq!((carrying.len(), plain.len()), (6, 3));
        for cmd in carrying {
            assert_eq!(cmd.protocol(), PROTOCOL_3, "{cmd}");
        }
        for cmd in plain {
            assert_eq!(cmd.protocol(), 1, "{cmd}");
        }
    }

    #[test]
    fn container_jobs_and_allowed_mounts_wait_for_protocol_4_and_their_encoding_is_frozen() {
        use crate::model::container::{ContainerSpec, Mount};
        use crate::model::job::JobSpec;
        let spec = JobSpec {
            name: "train".into(),
            command: vec!["python".into()],
            container: Some(Box::new(ContainerSpec {
                image: "localhost/train:1".into(),
                mounts: vec![Mount {
                    source: "/data".into(),
                    target: "/data".into(),
                    read_only: true,
                }],
            })),
            ..JobSpec::default()
        };
        let submit = Command::submit(spec.clone());
        assert_eq!(submit.protocol(), PROTOCOL_4);
        let plain = Command::submit(JobSpec {
            container: None,
            ..spec
        });
        assert_eq!(plain.protocol(), 1);
        let tenant = crate::model::tenant::TenantRecord {
            allowed_mounts: vec!["/data".into()],
            ..crate::model::tenant::TenantRecord::named("a")
        };
        let create = Command::CreateTenant {
            tenant: tenant.clone(),
        };
        assert_eq!(create.protocol(), PROTOCOL_4);
        assert_eq!(Command::UpdateTenant { tenant }.protocol(), PROTOCOL_4);
        expect![[r#"{"proposed_at_ms":1,"cmd":{"type":"submit_job","spec":{"name":"train","tenant":"default","command":["python"],"env":{},"workdir":null,"gpus":0,"gpu_types":[],"min_gpu_memory_mib":0,"node_selector":{},"priority":0,"runtime_estimate_s":null,"wall_time_limit_s":null,"max_attempts":1,"cpu_millis":null,"memory_mib":null,"container":{"image":"localhost/train:1","mounts":[{"source":"/data","target":"/data","read_only":true}]}},"idempotency_key":null}}"#]]
            .assert_eq(&serde_json::to_string(&LogEntry { proposed_at_ms: 1, cmd: submit, meta: None, request: None,
 }).expect("encodes"));
    }

    #[test]
    fn token_limits_and_enrolments_wait_for_protocol_5_and_their_encoding_is_frozen() {
        use crate::model::auth::{Role, TokenLimits, TokenRecord};
        let token = TokenRecord {
            id: "j1".into(),
            secret_sha256: "ab".repeat(32),
            role: Role::Node,
            tenant: None,
            description: String::new(),
            created_at_ms: 1,
            created_by: "t1".into(),
            revoked: false,
            account: None,
            limits: TokenLimits {
                expires_at_ms: Some(86_400_001),
                uses_left: Some(1),
                node_ids: Some((4, 8)),
                seat: None,
            },
        };
        let create = Command::CreateToken {
            token: token.clone(),
        };
        assert_eq!(create.protocol(), PROTOCOL_5);
        let seated = Command::CreateToken {
            token: TokenRecord {
                limits: TokenLimits {
                    seat: Some(crate::model::auth::Seat::Learner),
                    ..token.limits.clone()
                },
                ..token.clone()
            },
        };
        assert_eq!(seated.protocol(), PROTOCOL_6);
        let unlimited = Command::CreateToken {
            token: TokenRecord {
                limits: TokenLimits::default(),
                ..token
            },
        };
        assert_eq!(unlimited.protocol(), 1);
        let enrolled = Command::RecordCertificate {
            cert: crate::model::cert::CertRecord {
                serial: "0b".into(),
                subject: "node 4".into(),
                not_after_ms: 9,
                issued_at_ms: 1,
                revoked: false,
                revoked_reason: String::new(),
                issuer: String::new(),
            },
            enrolled_with: Some("j1".into()),
        };
        assert_eq!(enrolled.protocol(), PROTOCOL_5);
        let bytes: Vec<String> = [create, enrolled]
            .into_iter()
            .map(|c| serde_json::to_string(&entry(c)).unwrap_or_default())
            .collect();
        expect![[r#"
            {"proposed_at_ms":1700000000000,"cmd":{"type":"create_token","token":{"id":"j1","secret_sha256":"abababababababababababababababababababababababababababababababab","role":"node","tenant":null,"description":"","created_at_ms":1,"created_by":"t1","revoked":false,"limits":{"expires_at_ms":86400001,"uses_left":1,"node_ids":[4,8]}}}}
            {"proposed_at_ms":1700000000000,"cmd":{"type":"record_certificate","cert":{"serial":"0b","subject":"node 4","not_after_ms":9,"issued_at_ms":1,"revoked":false,"revoked_reason":""},"enrolled_with":"j1"}}"#]].assert_eq(&bytes.join("\n"));
    }

    #[test]
    fn retention_waits_for_protocol_10_and_its_encoding_is_frozen() {
        let archive = Command::Archive {
            retention: crate::model::retention::Retention::default(),
        };
        assert_eq!(archive.protocol(), PROTOCOL_10);
        let bytes = serde_json::to_string(&entry(archive)).unwrap_or_default();
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"archive","retention":{"finished_max_age_ms":86400000,"finished_keep":10000,"audit_keep":10000}}}"#]].assert_eq(&bytes);
    }

    #[test]
    fn account_encodings_are_frozen() {
        let bytes: Vec<String> = every_command()
            .into_iter()
            .filter(|c| matches!(c, Command::SetTokenAccount { .. }))
            .chain([Command::SetTokenAccount {
                id: "t2".into(),
                account: None,
            }])
            .map(|c| serde_json::to_string(&entry(c)).unwrap_or_default())
            .collect();
        expect![[r#"
            {"proposed_at_ms":1700000000000,"cmd":{"type":"set_token_account","id":"t1","account":{"user":"bob","group":"research","groups":["video"]}}}
            {"proposed_at_ms":1700000000000,"cmd":{"type":"set_token_account","id":"t2"}}"#]]
        .assert_eq(&bytes.join("\n"));
        let set = every_command()
            .into_iter()
            .find(|c| matches!(c, Command::SetTokenAccount { .. }))
            .expect("a set_token_account");
        assert_eq!(set.to_string(), "token account t1 = bob:research (+video)");
        let cleared = Command::SetTokenAccount {
            id: "t2".into(),
            account: None,
        };
        assert_eq!(cleared.to_string(), "token account t2 cleared");
    }

    #[test]
    fn display_is_compact() {
        let e = entry(Command::SetNodeLabels {
            node: 2,
            set: BTreeMap::from([("a".into(), "b".into())]),
            remove: BTreeSet::new(),
        });
        assert_eq!(e.to_string(), "label n2 +1 -0 @1700000000000ms");
    }

    #[test]
    fn signed_audit_heads_wait_for_protocol_6() {
        let heads: Vec<Command> = every_command()
            .into_iter()
            .filter(|c| matches!(c, Command::SignAuditHead { .. }))
            .collect();
        assert_eq!(heads.len(), 1);
        for cmd in heads {
            assert_eq!(cmd.protocol(), PROTOCOL_6, "{cmd}");
            expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"sign_audit_head","head":{"seq":4,"hash":"abababababababababababababababababababababababababababababababab","time_ms":0,"key_id":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","signature":"3045"}}}"#]].assert_eq(&serde_json::to_string(&entry(cmd)).unwrap_or_default());
        }
    }

    #[test]
    fn image_reports_wait_for_protocol_7() {
        let reports: Vec<String> = every_command()
            .into_iter()
            .filter(|c| {
                matches!(
                    c,
                    Command::ReportRunPhase { .. }
                        | Command::ReportImages { .. }
                        | Command::SetRegistryCredential { .. }
                )
            })
            .map(|cmd| {
                assert_eq!(cmd.protocol(), PROTOCOL_7, "{cmd}");
                serde_json::to_string(&entry(cmd)).unwrap_or_default()
            })
            .collect();
        expect![[r#"
            [
                "{\"proposed_at_ms\":1700000000000,\"cmd\":{\"type\":\"report_run_phase\",\"job\":7,\"generation\":2,\"phase\":\"pulling image busybox\"}}",
                "{\"proposed_at_ms\":1700000000000,\"cmd\":{\"type\":\"report_images\",\"node\":2,\"images\":[\"docker.io/library/busybox:latest\"]}}",
                "{\"proposed_at_ms\":1700000000000,\"cmd\":{\"type\":\"set_registry_credential\",\"tenant\":\"t\",\"registry\":\"nvcr.io\",\"credential\":{\"username\":\"robot\",\"sealed\":\"0a1b\",\"key_id\":\"efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef\",\"set_at_ms\":0}}}",
            ]
        "#]]
        .assert_debug_eq(&reports);
    }
}
