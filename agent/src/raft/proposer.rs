//! The leader's group commit. openraft 0.9 appends one client write at a time and waits for its
//! fsync before it takes the next, so N concurrent writes cost N fsyncs in series. The proposer
//! gathers the writes that are waiting at the same moment into one `Command::Batch` entry: one
//! append, one fsync and one replication round for all of them, each still applied as an entry
//! of its own (its own time, caller and result).
//!
//! At most `MAX_IN_FLIGHT` batches are in openraft's hands at once; what arrives meanwhile waits
//! and forms the next batch, so batches grow with the load and a lone write goes alone, encoded
//! exactly as before batching existed. Batches are written only once every member has announced
//! `PROTOCOL_2` (during a rolling upgrade from older agents, every write is its own entry), and
//! a command that only version 2 reads (`Command::protocol`) is refused until then.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gpu_raft_store::write_trace::{self, Stage};
use gpu_raft_store::{
    ApplyResult, Command, LogEntry, NodeId, PROTOCOL_2, PROTOCOL_9, PROTOCOL_12, Raft,
    RequestStamp, StateReader, TypeConfig,
};
use openraft::error::{ClientWriteError, Fatal};
use openraft::raft::ClientWriteResult;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::error::{Attempt, ClusterError};
use super::proposal::{Proposal, Written};
use crate::clock::now_ms;

/// Batches in openraft's hands at once: two lets one append while the other replicates.
const MAX_IN_FLIGHT: usize = 2;
/// How long a write whose answer raft dropped waits for raft to say why it stopped.
const STOP_CAUSE_WAIT: Duration = Duration::from_secs(1);
/// Entries in one batch.
const MAX_BATCH_ENTRIES: usize = 256;
/// Encoded bytes in one batch (a lone entry may be larger). With `config::MAX_PAYLOAD_ENTRIES`
/// entries per AppendEntries this keeps a replication message well inside the gRPC limit.
pub(crate) const MAX_BATCH_BYTES: usize = 256 * 1024;
/// Encoded bytes one client's write may put in the log: no more than a batch, so that
/// `config::MAX_PAYLOAD_ENTRIES` of them still fit one replication message (a few large
/// submissions must not stall replication). The agents' own writes are bounded by their makers.
pub(crate) const MAX_CLIENT_ENTRY_BYTES: usize = MAX_BATCH_BYTES;

type Reply = oneshot::Sender<Result<Written, Attempt>>;

/// A proposal waiting for its turn, with its encoded size.
struct Waiting {
    proposal: Proposal,
    bytes: usize,
    reply: Reply,
}

/// The handle writers propose through; proposals are committed in the order they arrive.
#[derive(Clone)]
pub(crate) struct Proposer {
    tx: mpsc::UnboundedSender<Waiting>,
    counts: Arc<Counts>,
}

/// What this proposer has handed to Raft since the agent started.
#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    entries: AtomicU64,
}

impl Counts {
    fn add(&self, writes: usize) {
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
        self.entries.fetch_add(1, Ordering::Relaxed);
    }
}

impl Proposer {
    /// Start the proposer of this agent's Raft node. It proposes only while the node is leader:
    /// otherwise openraft refuses, and each caller gets `Attempt::Retry`.
    pub(crate) fn spawn(raft: Raft, state: StateReader) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        tokio::spawn(run(raft, state, rx, counts.clone()));
        Self { tx, counts }
    }

    /// (writes proposed, log entries they became) since the agent started.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.counts.writes.load(Ordering::Relaxed),
            self.counts.entries.load(Ordering::Relaxed),
        )
    }

    /// Propose on this node and wait until the write is committed and applied here. The
    /// proposer stamps the entry's time as it hands it to Raft.
    pub(crate) async fn propose(&self, proposal: Proposal) -> Result<Written, Attempt> {
        let bytes = serde_json::to_vec(&proposal).map_or(usize::MAX, |b| b.len());
        if proposal.meta.is_some() && bytes > MAX_CLIENT_ENTRY_BYTES {
            return Err(Attempt::Fail(ClusterError::TooLarge {
                bytes,
                max: MAX_CLIENT_ENTRY_BYTES,
            }));
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Waiting {
                proposal,
                bytes,
                reply,
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(
    raft: Raft,
    state: StateReader,
    mut rx: mpsc::UnboundedReceiver<Waiting>,
    counts: Arc<Counts>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut next: Option<Waiting> = None;
    loop {
        let first = match next.take() {
            Some(w) => w,
            None => match rx.recv().await {
                Some(w) => w,
                None => return,
            },
        };
        let lowest = lowest_member_protocol(&raft, &state);
        if let Err(refusal) = admit(&first.proposal.cmd, lowest) {
            let _ = first.reply.send(Err(Attempt::Fail(refusal)));
            continue;
        }
        if lowest < PROTOCOL_2 {
            // As before batching: each write its own entry, all of them handed over at once.
            counts.add(1);
            propose_plain(&raft, first, None, lowest).await;
            continue;
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut group = vec![first];
        let mut bytes = group[0].bytes;
        while group.len() < MAX_BATCH_ENTRIES {
            match rx.try_recv() {
                Ok(w) if admit(&w.proposal.cmd, lowest).is_err() => {
                    next = Some(w);
                    break;
                }
                Ok(w) if bytes.saturating_add(w.bytes) <= MAX_BATCH_BYTES => {
                    bytes += w.bytes;
                    group.push(w);
                }
                Ok(w) => {
                    next = Some(w);
                    break;
                }
                Err(_) => break,
            }
        }
        counts.add(group.len());
        if group.len() == 1 {
            propose_plain(&raft, group.remove(0), Some(permit), lowest).await;
        } else {
            propose_batch(&raft, group, permit, lowest).await;
        }
    }
}

/// Hand one write to Raft as an entry of its own; `permit` (if any) is held until it lands.
/// `lowest`: the oldest protocol a member speaks.
async fn propose_plain(
    raft: &Raft,
    w: Waiting,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    lowest: u32,
) {
    write_trace::stamp(Stage::Proposed, 0);
    let landing = raft
        .client_write_ff(stamp(w.proposal, now_ms(), lowest))
        .await;
    let raft = raft.clone();
    tokio::spawn(async move {
        let _ = w.reply.send(single(landed(&raft, landing).await));
        drop(permit);
    });
}

/// Hand `group` to Raft as one `Command::Batch` entry and fan its results out when it lands.
async fn propose_batch(
    raft: &Raft,
    group: Vec<Waiting>,
    permit: tokio::sync::OwnedSemaphorePermit,
    lowest: u32,
) {
    let now = now_ms();
    let mut replies = Vec::with_capacity(group.len());
    let entries = group
        .into_iter()
        .map(|w| {
            replies.push(w.reply);
            stamp(w.proposal, now, lowest)
        })
        .collect();
    let batch = LogEntry {
        proposed_at_ms: now,
        cmd: Command::Batch { entries },
        meta: None,
        request: None,
    };
    let n = replies.len();
    write_trace::stamp(Stage::Proposed, 0);
    let landing = raft.client_write_ff(batch).await;
    let raft = raft.clone();
    tokio::spawn(async move {
        let outcome = landed(&raft, landing).await;
        for (reply, result) in replies.into_iter().zip(fan_out(outcome, n)) {
            let _ = reply.send(result);
        }
        drop(permit);
    });
}

type Landing = Result<oneshot::Receiver<ClientWriteResult<TypeConfig>>, Fatal<NodeId>>;

/// Wait for a handed-over entry to land. Raft drops the entry's responder only when it stops,
/// so the error then names the fatal error it stopped on (a full or failing disk), read from
/// its metrics, which it updates as it stops.
async fn landed(raft: &Raft, landing: Landing) -> Landed {
    let rx = landing.map_err(|fatal| fatal.to_string())?;
    if let Ok(answer) = rx.await {
        return Ok(answer);
    }
    let mut metrics = raft.metrics();
    let _ = tokio::time::timeout(
        STOP_CAUSE_WAIT,
        metrics.wait_for(|m| m.running_state.is_err()),
    )
    .await;
    Err(match &metrics.borrow().running_state {
        Err(fatal) => format!("raft stopped: {fatal}"),
        Ok(()) => "raft stopped".to_owned(),
    })
}

/// The entry `proposal` becomes at `now`; an API request's is stamped for exactly-once
/// apply when every member speaks `PROTOCOL_9` (`lowest`).
fn stamp(mut proposal: Proposal, now: u64, lowest: u32) -> LogEntry {
    // A submission records who made it (the actor the leader authenticated), once every
    // replica keeps it.
    if let (Command::SubmitJob { owner, .. }, Some(meta)) = (&mut proposal.cmd, &proposal.meta)
        && lowest >= PROTOCOL_12
        && !meta.actor.starts_with("system:")
    {
        *owner = Some(meta.actor.clone());
    }
    let request = match &proposal.meta {
        Some(meta) if lowest >= PROTOCOL_9 => RequestStamp::of(meta, &proposal.cmd),
        _ => None,
    };
    LogEntry {
        proposed_at_ms: now,
        cmd: proposal.cmd,
        meta: proposal.meta,
        request,
    }
}

/// Whether a command may be proposed while the oldest member speaks protocol `lowest`: what
/// version 1 reads always may (a cluster being formed has no registered member yet).
fn admit(cmd: &Command, lowest: u32) -> Result<(), ClusterError> {
    let needed = cmd.protocol();
    if needed <= 1 || needed <= lowest {
        Ok(())
    } else {
        Err(ClusterError::NeedsUpgrade { needed, lowest })
    }
}

/// The oldest protocol any member of the current configuration registered with.
pub(crate) fn lowest_member_protocol(raft: &Raft, state: &StateReader) -> u32 {
    let members: Vec<NodeId> = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .collect();
    state.read(|s| s.lowest_protocol(members))
}

type Landed = Result<ClientWriteResult<TypeConfig>, String>;

/// A plain entry's outcome as its writer sees it.
fn single(outcome: Landed) -> Result<Written, Attempt> {
    let reply = outcome.map_err(|e| Attempt::Fail(ClusterError::Raft(e)))?;
    match reply {
        Ok(reply) => Ok(Written {
            index: reply.log_id.index,
            result: reply.data,
        }),
        Err(e) => Err(refused(&e)),
    }
}

/// A batch's outcome as each of its `n` writers sees it: its own result at the batch's index,
/// or the batch's failure.
fn fan_out(outcome: Landed, n: usize) -> Vec<Result<Written, Attempt>> {
    match single(outcome) {
        Ok(Written {
            index,
            result: ApplyResult::Batch { results },
        }) if results.len() == n => results
            .into_iter()
            .map(|result| Ok(Written { index, result }))
            .collect(),
        Ok(other) => {
            let e = format!("a batch of {n} applied as {:?}", other.result);
            (0..n)
                .map(|_| Err(Attempt::Fail(ClusterError::Raft(e.clone()))))
                .collect()
        }
        Err(Attempt::Retry(_)) => (0..n)
            .map(|_| Err(Attempt::Retry(ClusterError::NoLeader)))
            .collect(),
        Err(Attempt::Fail(e)) => {
            let e = e.to_string();
            (0..n)
                .map(|_| Err(Attempt::Fail(ClusterError::Raft(e.clone()))))
                .collect()
        }
    }
}

fn refused(e: &ClientWriteError<NodeId, openraft::BasicNode>) -> Attempt {
    match e {
        ClientWriteError::ForwardToLeader(_) => Attempt::Retry(ClusterError::NoLeader),
        other => Attempt::Fail(ClusterError::Raft(other.to_string())),
    }
}

fn stopped() -> Attempt {
    Attempt::Fail(ClusterError::Raft(
        "this agent's proposer has stopped".into(),
    ))
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{Inventory, LogId};
    use openraft::error::ForwardToLeader;
    use openraft::raft::ClientWriteResponse;

    use super::*;

    fn landed(index: u64, data: ApplyResult) -> Landed {
        Ok(Ok(ClientWriteResponse {
            log_id: LogId::new(openraft::CommittedLeaderId::new(3, 1), index),
            data,
            membership: None,
        }))
    }

    #[test]
    fn each_writer_of_a_batch_gets_its_own_result_at_the_batch_index() {
        let results = vec![
            ApplyResult::Ok,
            ApplyResult::Rejected {
                reason: gpu_raft_store::Rejection::UnknownNode { node: 9 },
            },
        ];
        let out = fan_out(landed(17, ApplyResult::Batch { results }), 2);
        let out: Vec<_> = out
            .into_iter()
            .map(|r| r.map(|w| (w.index, w.result)).map_err(|_| ()))
            .collect();
        assert!(matches!(out[0], Ok((17, ApplyResult::Ok))), "{out:?}");
        assert!(
            matches!(out[1], Ok((17, ApplyResult::Rejected { .. }))),
            "{out:?}"
        );
    }

    #[test]
    fn a_lost_leadership_is_a_retry_and_a_broken_batch_a_failure_for_every_writer() {
        let moved: Landed = Ok(Err(ClientWriteError::ForwardToLeader(
            ForwardToLeader::empty(),
        )));
        let out = fan_out(moved, 3);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|r| matches!(r, Err(Attempt::Retry(_)))));
        let short = fan_out(landed(4, ApplyResult::Batch { results: vec![] }), 2);
        assert!(short.iter().all(|r| matches!(r, Err(Attempt::Fail(_)))));
        let stopped = fan_out(Err("raft stopped".into()), 2);
        assert!(stopped.iter().all(|r| matches!(r, Err(Attempt::Fail(_)))));
    }

    #[test]
    fn a_submission_is_stamped_with_its_owner_only_when_every_member_keeps_it() {
        let submit = Proposal {
            cmd: Command::submit(Default::default()),
            meta: Some(gpu_raft_store::RequestMeta {
                actor: "alice".into(),
                verb: "job.submit".into(),
                object: "job/x".into(),
                request_id: "r1".into(),
                source: "10.0.0.9:5000".into(),
            }),
            credential: None,
        };
        let owner = |lowest| match stamp(submit.clone(), 5, lowest).cmd {
            Command::SubmitJob { owner, .. } => owner,
            other => panic!("{other}"),
        };
        assert_eq!(owner(PROTOCOL_12).as_deref(), Some("alice"));
        assert_eq!(owner(PROTOCOL_12 - 1), None, "n-1 would drop it");
    }

    #[test]
    fn api_requests_are_stamped_for_exactly_once_apply_only_when_every_member_reads_it() {
        let request = |request_id: &str| Proposal {
            cmd: Command::CancelJob { job: 3 },
            meta: Some(gpu_raft_store::RequestMeta {
                actor: "alice".into(),
                verb: "job.cancel".into(),
                object: "job/3".into(),
                request_id: request_id.into(),
                source: "10.0.0.9:5000".into(),
            }),
            credential: None,
        };
        let stamped = stamp(request("r1"), 5, PROTOCOL_9).request;
        assert!(stamped.is_some_and(|s| s.key == "alice\nr1"));
        assert_eq!(
            stamp(request("r1"), 5, PROTOCOL_9 - 1).request,
            None,
            "n-1 reads no stamp"
        );
        assert_eq!(
            stamp(request(""), 5, PROTOCOL_9).request,
            None,
            "no request id"
        );
        let own_report = Proposal {
            meta: None,
            ..request("r1")
        };
        assert_eq!(
            stamp(own_report, 5, PROTOCOL_9).request,
            None,
            "not an API request"
        );
    }

    #[test]
    fn batches_wait_until_every_member_has_registered_a_protocol_that_reads_them() {
        let mut state = gpu_raft_store::ClusterState::default();
        let register = |node, protocol| LogEntry {
            proposed_at_ms: 1,
            cmd: Command::RegisterNode {
                node,
                addr: format!("10.0.0.{node}:7070"),
                labels: Default::default(),
                inventory: Inventory::default(),
                edge: None,
                protocol,
            },
            meta: None,
            request: None,
        };
        state.apply(&register(1, 2));
        state.apply(&register(2, 1));
        assert_eq!(state.lowest_protocol([1]), PROTOCOL_2);
        assert_eq!(state.lowest_protocol([1, 2]), 1, "n2 speaks 1");
        assert_eq!(state.lowest_protocol([1, 3]), 0, "n3 not registered");
        state.apply(&register(2, 2));
        assert_eq!(state.lowest_protocol([1, 2]), PROTOCOL_2, "n2 upgraded");
    }

    #[test]
    fn what_only_version_2_reads_is_refused_until_every_member_speaks_it() {
        let partition = Command::SetGpuPartition {
            node: 1,
            gpu: 0,
            partition: gpu_raft_store::PartitionSpec::default(),
            if_idle: false,
        };
        let cordon = Command::SetNodeStatus {
            node: 1,
            status: gpu_raft_store::NodeStatus::Down,
            requeue_evicting: false,
        };
        assert!(
            admit(&cordon, 0).is_ok(),
            "a forming cluster writes version 1"
        );
        assert!(admit(&partition, PROTOCOL_2).is_ok());
        let refused = admit(&partition, 1).map_err(|e| e.to_string());
        let Err(why) = refused else {
            panic!("a version 1 member must not be handed a partition change");
        };
        assert!(
            why.contains("protocol 2") && why.contains("upgrade"),
            "{why}"
        );
    }
}
