//! gpumesh's replicated cluster state: the domain model, the `Command` log vocabulary, the pure
//! `apply`, and openraft 0.9 storage (`RaftLogStorage` + `RaftStateMachine`) on sled.
//!
//! Architecture invariant: this crate knows nothing about gRPC, tonic or prost. It is the
//! authority on what a valid state transition is; callers may pre-validate, apply always re-checks.

#![allow(clippy::result_large_err)] // openraft's StorageError is large by design.

pub mod alert;
pub mod audit;
pub mod auth;
pub mod backup;
pub mod cert;
mod command;
pub mod digest;
pub mod energy;
mod engine;
mod error;
pub mod failpoint;
pub mod job;
pub mod job_log;
mod log_flush;
mod log_store;
pub mod mig;
pub mod node;
pub mod partition;
pub mod scheduler;
pub mod slice_fit;
mod snapshot_file;
mod snapshot_gate;
mod state;
mod state_machine;
mod store;
pub mod tenant;
pub mod validate;

pub use alert::{Alert, AlertRule};
pub use audit::{AuditEntry, RequestMeta};
pub use auth::{Grant, Role, TokenRecord};
pub use cert::CertRecord;
pub use command::{ApplyResult, Bind, Command, LogEntry, PROTOCOL_2, Preempt, Rejection};
pub use engine::{KvEngine, SledEngine, Space};
pub use error::OpenError;
pub use job::{Binding, DEFAULT_TENANT, Job, JobId, JobKind, JobSpec, JobState, Outcome, job_name};
pub use log_store::LogStore;
pub use node::{EdgeTerms, GpuRecord, Inventory, NodeRecord, NodeStatus, SITE_LABEL};
pub use partition::{GpuMode, PartitionSpec, Slice, SliceBind, SliceRequest};
pub use scheduler::SchedulerSettings;
pub use state::{ClusterState, gpu_fits};
pub use state_machine::{StateMachineStore, StateReader};
pub use store::{DATA_FORMAT_VERSION, DataDir, open};
pub use tenant::{Quota, TenantRecord};

/// Raft node ids are small integers chosen by the operator (`--node-id`).
pub type NodeId = u64;

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
