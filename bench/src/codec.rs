//! `gpu-bench codec`: what MessagePack (`gpu_raft_store::codec`, data format 3, protocol 16)
//! saves against the JSON it replaced, on the records agents store and send: the snapshot of a
//! state of many jobs, and the log entries of a job's life (its submission as a client writes
//! it, a scheduler pass binding 64 jobs, a run's end). Each figure is the median of its rounds,
//! JSON and MessagePack measured one after the other on the same values. Beside them, the copy
//! of the state a snapshot takes under the state's lock, while no entry can be applied.
//!
//! The state: 64 nodes of 8 GPUs; a quarter of the jobs pending, the rest bound, started and
//! finished; each submission a client's request (audited, its answer kept for exactly-once
//! writes); then the default retention applied (10,000 finished jobs and audit entries kept).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpu_raft_store::job::Outcome;
use gpu_raft_store::node::Inventory;
use gpu_raft_store::retention::Retention;
use gpu_raft_store::{
    Bind, ClusterState, Command, Entry, GpuRecord, JobSpec, LogEntry, RequestMeta, RequestStamp,
    codec,
};
use openraft::{CommittedLeaderId, EntryPayload, LogId};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::stats::percentile;

/// One encoding of one record.
#[derive(Clone, Copy, Debug)]
pub struct Measure {
    pub bytes: usize,
    pub encode: Duration,
    pub decode: Duration,
}

/// One record in both encodings.
#[derive(Clone, Debug)]
pub struct Row {
    pub what: String,
    pub json: Measure,
    pub packed: Measure,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Figures {
    /// The snapshot, then each log entry.
    pub rows: Vec<Row>,
    /// The median copy of the state under its lock.
    pub copy: Duration,
}

const NODES: u64 = 64;
const GPUS_PER_NODE: u32 = 8;

/// Measure a state of `jobs` jobs (its encodings and its copy) and the entries of a job's
/// life, `rounds` times each.
pub fn measure(jobs: u64, rounds: usize) -> anyhow::Result<Figures> {
    let state = state_of(jobs)?;
    let mut rows = vec![row::<ClusterState>(
        format!("snapshot, {jobs} jobs"),
        &state,
        rounds,
    )?];
    let copy = median(
        (0..rounds.max(1))
            .map(|_| {
                let start = Instant::now();
                let copy = std::hint::black_box(state.clone());
                let took = start.elapsed();
                drop(copy);
                took
            })
            .collect(),
    );
    let binds = (0..64)
        .map(|job| Bind {
            job,
            node: 1 + job % NODES,
            gpus: vec![(job % u64::from(GPUS_PER_NODE)) as u32],
        })
        .collect();
    let life = [
        ("entry: a submission", submit(7, Some(meta(7).request_id))),
        ("entry: a pass binding 64 jobs", Command::BindJobs { binds }),
        (
            "entry: a run's end",
            Command::JobFinished {
                job: 7,
                generation: 1,
                outcome: Outcome::Exited { code: 0 },
            },
        ),
    ];
    for (what, cmd) in life {
        let entry = entry(9_999, cmd);
        rows.push(row::<Entry>(what.into(), &entry, rounds * 100)?);
    }
    Ok(Figures { rows, copy })
}

fn row<T: Serialize + DeserializeOwned>(
    what: String,
    value: &T,
    rounds: usize,
) -> anyhow::Result<Row> {
    let json = time(
        rounds,
        || Ok(serde_json::to_vec(value)?),
        |b| Ok(serde_json::from_slice::<T>(b).map(drop)?),
    )?;
    let packed = time(
        rounds,
        || Ok(codec::to_vec(value)?),
        |b| Ok(codec::from_slice::<T>(b).map(drop)?),
    )?;
    Ok(Row { what, json, packed })
}

fn time(
    rounds: usize,
    encode: impl Fn() -> anyhow::Result<Vec<u8>>,
    decode: impl Fn(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Measure> {
    let bytes = encode()?;
    let (mut enc, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        std::hint::black_box(encode()?);
        enc.push(start.elapsed());
        let start = Instant::now();
        decode(std::hint::black_box(&bytes))?;
        dec.push(start.elapsed());
    }
    Ok(Measure {
        bytes: bytes.len(),
        encode: median(enc),
        decode: median(dec),
    })
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    percentile(&samples, 50.0).unwrap_or_default()
}

/// The module's state of `jobs` jobs.
fn state_of(jobs: u64) -> anyhow::Result<ClusterState> {
    let mut state = ClusterState::default();
    let mut index = 0;
    let mut apply = |state: &mut ClusterState, cmd: Command| -> anyhow::Result<()> {
        index += 1;
        let meta = matches!(cmd, Command::SubmitJob { .. }).then(|| meta(index));
        let request = meta.as_ref().and_then(|m| RequestStamp::of(m, &cmd));
        let entry = LogEntry {
            proposed_at_ms: 1_000 + index,
            cmd,
            meta,
            request,
        };
        if let gpu_raft_store::ApplyResult::Rejected { reason } = state.apply(&entry) {
            anyhow::bail!("{}: {reason}", entry.cmd);
        }
        Ok(())
    };
    for node in 1..=NODES {
        apply(&mut state, register(node))?;
    }
    for job in 1..=jobs {
        apply(&mut state, submit(job, None))?;
        if job * 4 > jobs * 3 {
            continue;
        }
        let node = 1 + job % NODES;
        let bind = Bind {
            job,
            node,
            gpus: vec![0],
        };
        apply(&mut state, Command::BindJobs { binds: vec![bind] })?;
        apply(&mut state, Command::JobStarted { job, generation: 1 })?;
        let outcome = Outcome::Exited {
            code: i32::from(job % 10 == 0),
        };
        apply(
            &mut state,
            Command::JobFinished {
                job,
                generation: 1,
                outcome,
            },
        )?;
    }
    let retention = Retention::default();
    apply(&mut state, Command::Archive { retention })?;
    // What left the state goes to the archive's files, which this state has none of.
    state.archive_outbox = Default::default();
    Ok(state)
}

fn register(node: u64) -> Command {
    let gpus = (0..GPUS_PER_NODE)
        .map(|index| GpuRecord {
            index,
            uuid: format!("GPU-{node:04}-{index}-5f1c2a7e-93d4-4b1e"),
            model: "NVIDIA A100-SXM4-80GB".into(),
            gpu_type: "A100".into(),
            memory_mib: 81_920,
            numa_node: Some(index / 4),
            nvlink_peers: (0..GPUS_PER_NODE).filter(|p| *p != index).collect(),
            healthy: true,
        })
        .collect();
    Command::RegisterNode {
        node,
        addr: format!("10.0.{}.{}:7070", node / 256, node % 256),
        labels: BTreeMap::from([("rack".into(), format!("r{}", node / 8))]),
        inventory: Inventory {
            gpus,
            cpu_cores: 128,
            memory_mib: 1_048_576,
        },
        edge: None,
        protocol: gpu_raft_store::PROTOCOL_16,
    }
}

/// A training job much like the ones people submit: a name, a command line, a few variables.
fn submit(job: u64, idempotency_key: Option<String>) -> Command {
    let spec = JobSpec {
        name: format!("resnet50-sweep-{job}"),
        command: ["python", "train.py", "--config", "configs/resnet50.yaml"]
            .into_iter()
            .map(String::from)
            .chain([format!("--seed={job}")])
            .collect(),
        env: BTreeMap::from([
            ("WANDB_PROJECT".into(), "vision".into()),
            ("NCCL_DEBUG".into(), "WARN".into()),
        ]),
        gpus: 1,
        runtime_estimate_s: Some(3_600),
        max_attempts: 2,
        ..JobSpec::default()
    };
    Command::SubmitJob {
        spec: Box::new(spec),
        idempotency_key,
        hold: false,
        owner: None,
    }
}

fn meta(job: u64) -> RequestMeta {
    RequestMeta {
        actor: "token:t4e83bbd5c679".into(),
        verb: "job.submit".into(),
        object: format!("job resnet50-sweep-{job}"),
        request_id: format!("req-{job:016x}"),
        source: "10.0.0.17:53122".into(),
    }
}

fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(3, 1), index),
        payload: EntryPayload::Normal(LogEntry {
            proposed_at_ms: 1_700_000_000_000,
            cmd,
            meta: Some(meta(index)),
            request: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_encodings_are_measured_on_a_real_state() {
        let figures = measure(40, 1).expect("measures");
        assert_eq!(figures.rows.len(), 4);
        assert!(figures.copy > Duration::ZERO);
        for row in &figures.rows {
            assert!(
                row.packed.bytes > 0 && row.json.bytes > row.packed.bytes,
                "{row:?}"
            );
        }
        let state = state_of(40).expect("state");
        let finished = state
            .jobs
            .values()
            .filter(|j| j.state.is_terminal())
            .count();
        assert_eq!(
            finished, 30,
            "three quarters finished, none past the retention"
        );
        assert_eq!((state.requests.len(), state.audit.len()), (40, 40));
    }
}
