//! Fixtures for this crate's integration tests (`tests/*.rs`), behind the `testing` feature:
//! log entries, GPUs, registrations, job specs and a log-store entry, one home for each.
//!
//! Nothing in the crate names this module: it sits above both rooms, so the unit tests inside
//! `model/` and `storage/` keep their few local helpers rather than point back up here.

use std::collections::BTreeMap;

use openraft::{CommittedLeaderId, EntryPayload, LogId};

use crate::model::command::{Command, LogEntry};
use crate::model::job::JobSpec;
use crate::model::node::{GpuRecord, Inventory};
use crate::model::outcome::ApplyResult;
use crate::model::state::ClusterState;
use crate::{Entry, NodeId};

/// `cmd` as proposed at `ms`, by the system (no request metadata).
pub fn at(ms: u64, cmd: Command) -> LogEntry {
    LogEntry {
        proposed_at_ms: ms,
        cmd,
        meta: None,
        request: None,
    }
}

/// A healthy GPU `GPU-<index>`, on no NUMA node, with no NVLink peers.
pub fn gpu(index: u32, model: &str, gpu_type: &str, memory_mib: u64) -> GpuRecord {
    GpuRecord {
        index,
        uuid: format!("GPU-{index}"),
        model: model.into(),
        gpu_type: gpu_type.into(),
        memory_mib,
        numa_node: None,
        nvlink_peers: vec![],
        healthy: true,
    }
}

/// Node `node` (at `127.0.0.1:<7000 + node>`, 8 cores, 64 GiB, no labels, not at an edge
/// site, protocol 1) registering with `gpus`.
pub fn register(node: NodeId, gpus: Vec<GpuRecord>) -> Command {
    Command::RegisterNode {
        node,
        addr: format!("127.0.0.1:{}", 7000 + node),
        labels: BTreeMap::new(),
        inventory: Inventory {
            gpus,
            cpu_cores: 8,
            memory_mib: 65_536,
        },
        edge: None,
        protocol: 1,
    }
}

/// A plain process job `job` of tenant `default` running `true` on `gpus` whole GPUs of any
/// type, with 2 attempts.
pub fn spec(gpus: u32) -> JobSpec {
    JobSpec {
        name: "job".into(),
        command: vec!["true".into()],
        gpus,
        max_attempts: 2,
        ..JobSpec::default()
    }
}

/// Apply `SubmitJob { spec, key }` at 1 ms.
pub fn submit(s: &mut ClusterState, spec: JobSpec, key: Option<&str>) -> ApplyResult {
    s.apply(&at(
        1,
        Command::SubmitJob {
            spec: Box::new(spec),
            idempotency_key: key.map(Into::into),
            hold: false,
            owner: None,
        },
    ))
}

/// The Raft log entry at `index` (term 1, leader 1): node `index` registering at `h<index>:7070`
/// with nothing, proposed at `index` ms.
pub fn register_entry(index: u64) -> Entry {
    let cmd = Command::RegisterNode {
        node: index,
        addr: format!("h{index}:7070"),
        labels: BTreeMap::new(),
        inventory: Inventory::default(),
        edge: None,
        protocol: 1,
    };
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(LogEntry {
            proposed_at_ms: index,
            cmd,
            meta: None,
            request: None,
        }),
    }
}
