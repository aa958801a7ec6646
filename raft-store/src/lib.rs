//! gpumesh's replicated cluster state: the domain model, the `Command` log vocabulary, the pure
//! `apply`, and openraft 0.9 storage (`RaftLogStorage` + `RaftStateMachine`) on sled.
//!
//! Architecture invariant: this crate knows nothing about gRPC, tonic or prost. It is the
//! authority on what a valid state transition is; callers may pre-validate, apply always re-checks.

#![allow(clippy::result_large_err)] // openraft's StorageError is large by design.

pub mod codec;
pub mod failpoint;
mod model;
mod storage;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod write_trace;

pub use model::{
    alert, audit, auth, ca, cert, container, digest, energy, job, mig, node, partition, registry,
    requests, retention, scheduler, slice_fit, tenant, validate, webhook,
};
pub use storage::{archive, backup};

pub use codec::PROTOCOL_16;

pub use model::account::Account;
pub use model::alert::{Alert, AlertRule};
pub use model::apply::archive::USAGE_BUCKET_MS;
pub use model::apply::expiry::{CERT_RECORD_GRACE_MS, Expired, IDEMPOTENCY_WINDOW_MS};
pub use model::array::{ArraySpec, ArrayTask, IndexRange, MAX_ARRAY_TASKS};
pub use model::audit::{AuditEntry, RequestMeta, SignedHead};
pub use model::auth::{Grant, Role, Seat, TokenLimits, TokenRecord};
pub use model::cert::CertRecord;
pub use model::command::{
    Bind, Command, LogEntry, PROTOCOL_2, PROTOCOL_3, PROTOCOL_4, PROTOCOL_5, PROTOCOL_6,
    PROTOCOL_7, PROTOCOL_8, PROTOCOL_9, PROTOCOL_10, PROTOCOL_11, PROTOCOL_12, PROTOCOL_13,
    PROTOCOL_14, PROTOCOL_15, Preempt, RequestStamp,
};
pub use model::dependency::{AfterKind, Dependency, MAX_DEPENDENCIES, Verdict, parse_dependencies};
pub use model::job::{
    Binding, DEFAULT_RETRY_BACKOFF_S, DEFAULT_TENANT, Job, JobKind, JobSpec, JobState,
    MAX_PHASE_LEN, MAX_RETRY_DELAY_S, MAX_RUNS_KEPT, Outcome, Run, RunPhase, job_name,
    retry_delay_s,
};
pub use model::job_update::JobUpdate;
pub use model::kept_index::{JobChanges, KeptIndex};
pub use model::node::{
    CONTAINER_RUNTIME_LABEL, EdgeTerms, GpuRecord, Inventory, NodeRecord, NodeStatus, SITE_LABEL,
    gpu_fits,
};
pub use model::outcome::{ApplyResult, Rejection};
pub use model::partition::{GpuMode, PartitionSpec, Slice, SliceBind, SliceRequest};
pub use model::scheduler::SchedulerSettings;
pub use model::shared_map::SharedMap;
pub use model::state::ClusterState;
pub use model::tenant::{Quota, TenantRecord};
pub use model::topology::{TOPOLOGY_LABELS, nesting_conflict};
pub use storage::engine::{KvEngine, Scan, SledEngine, Space};
pub use storage::error::OpenError;
pub use storage::format::DATA_FORMAT_VERSION;
pub use storage::log_store::LogStore;
pub use storage::state_machine::{StateMachineStore, StateReader};
pub use storage::store::{DataDir, open};

/// Raft node ids are small integers chosen by the operator (`--node-id`).
pub type NodeId = u64;
/// Job ids, assigned by `apply` in submission order (shown to people as `j-42`).
pub type JobId = u64;

openraft::declare_raft_types!(
    /// The openraft type configuration of gpumesh.
    pub TypeConfig:
        D = LogEntry,
        R = ApplyResult,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft handle specialised to gpumesh.
pub type Raft = openraft::Raft<TypeConfig>;
/// A Raft log entry as openraft stores it.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id (term, leader, index).
pub type LogId = openraft::LogId<NodeId>;
/// openraft's storage error, specialised.
pub type StorageError = openraft::StorageError<NodeId>;
