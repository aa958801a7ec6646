//! Filling this agent's archive from its peers. Every agent archives the same records as it
//! applies `Command::Archive`, but a snapshot carries no archive: an agent that installs one
//! (a follower far behind, a new member) lacks what was archived before it. It asks its peers
//! for exactly those records (`StateReader::archive_gaps`) and stores them as they are.
//!
//! Both ends are here: `serve`, what an agent answers (`RaftPeer.ReadArchive`, agents only),
//! and `ArchiveFill`, the task that looks for gaps whenever one may have opened.

use std::time::Duration;

use gpu_proto::internal::v1::{ReadArchiveRequest, ReadArchiveResponse};
use gpu_raft_store::StateReader;
use gpu_raft_store::archive::{Gaps, GapsFrom};
use gpu_raft_store::audit::{self, ChainBase};
use gpu_raft_store::retention::{ArchiveOutbox, ArchivedJob};
use gpu_raft_store::{AuditEntry, SignedHead};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

use crate::raft::Cluster;
use crate::raft::peer_client::with_deadline;

/// Records asked for or answered at once.
pub(crate) const MAX_RECORDS: usize = 1000;
/// How long after a failed fill (a peer did not answer) the next try starts.
const RETRY_AFTER: Duration = Duration::from_secs(2);
const ASK_DEADLINE: Duration = Duration::from_secs(30);

/// `Unavailable` while this agent's archive may lack records a peer holds (it caught up from a
/// snapshot moments ago): the caller asks again (gpuctl does, backing off) and gets the whole
/// history, never a false "unknown job" or a chain with a hole.
pub(crate) fn archive_complete(state: &StateReader) -> Result<(), Status> {
    if state.archive().is_complete() {
        return Ok(());
    }
    Err(Status::unavailable(
        "this agent's history archive is being filled from its peers; ask again shortly, or ask another agent",
    ))
}

/// A read of this agent's archive that failed.
pub(crate) fn archive_failed(e: std::io::Error) -> Status {
    Status::internal(format!("reading the archive: {e}"))
}

/// What this agent's archive holds of `req` (a peer's gaps).
pub(crate) fn serve(
    state: &StateReader,
    req: &ReadArchiveRequest,
) -> Result<ReadArchiveResponse, Status> {
    if req.job_ids.len() > MAX_RECORDS {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_RECORDS} jobs per request"
        )));
    }
    let archive = state.archive();
    let mut out = ReadArchiveResponse::default();
    for id in &req.job_ids {
        if let Some(job) = archive.job(*id).map_err(archive_failed)? {
            out.jobs.push(json(&job)?);
        }
    }
    let through = req
        .audit_through
        .min(req.audit_after.saturating_add(MAX_RECORDS as u64));
    if through > req.audit_after {
        for e in archive.audit(req.audit_after, through) {
            out.audit.push(json(&e.map_err(archive_failed)?)?);
        }
        for h in archive.heads(req.audit_after, through) {
            out.heads.push(json(&h.map_err(archive_failed)?)?);
        }
    }
    Ok(out)
}

fn json<T: serde::Serialize>(record: &T) -> Result<Vec<u8>, Status> {
    serde_json::to_vec(record).map_err(|e| Status::internal(format!("encoding a record: {e}")))
}

/// The task: whenever the archive may be incomplete (at start, after a snapshot install), find
/// its gaps and fill them from the peers that hold them; meanwhile readers are told to ask
/// again (`archive_complete`).
pub(crate) struct ArchiveFill {
    pub cluster: Cluster,
}

impl ArchiveFill {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let archive = self.cluster.state.archive().clone();
        loop {
            if let Some(mark) = archive.take_incomplete() {
                match self.fill().await {
                    Ok(left) => {
                        if let Some(left) = left {
                            info!(
                                jobs = left.jobs.len(),
                                audit = ?left.audit,
                                "archived records that no peer holds (a cluster restored from a backup lacks its history)"
                            );
                        }
                        archive.mark_filled(mark);
                    }
                    Err(e) => {
                        warn!(error = %e, "could not fill this agent's archive; trying again");
                        tokio::select! {
                            () = cancel.cancelled() => return,
                            () = tokio::time::sleep(RETRY_AFTER) => {}
                        }
                        archive.mark_incomplete();
                    }
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = archive.marked_incomplete() => {}
            }
        }
    }

    /// Fill every gap the peers can: `None` when none is left, else what no peer holds.
    async fn fill(&self) -> anyhow::Result<Option<Gaps>> {
        let state = &self.cluster.state;
        let mut filled = 0usize;
        let mut unreachable = 0;
        let peers: Vec<String> = state.read(|s| {
            (s.nodes.values())
                .filter(|n| n.id != self.cluster.id)
                .map(|n| n.addr.clone())
                .collect()
        });
        let mut left = state.archive_gaps(GapsFrom::default(), MAX_RECORDS)?;
        // One pass over the archive per peer: the cursor moves past what the peer was asked
        // for, whether or not it held it (what it lacked, the next peer is asked for).
        for addr in &peers {
            if left.is_empty() {
                break;
            }
            let mut gaps = left;
            let mut from = GapsFrom::default();
            while !gaps.is_empty() {
                match self.ask(addr, &gaps).await {
                    Ok(n) => filled += n,
                    Err(e) => {
                        warn!(peer = %addr, error = %e, "could not read a peer's archive");
                        unreachable += 1;
                        break;
                    }
                }
                from = GapsFrom {
                    jobs: gaps.jobs.last().map_or(from.jobs, |id| id + 1),
                    audit: (gaps.audit).map_or(from.audit, |(after, through)| {
                        through.min(after + MAX_RECORDS as u64)
                    }),
                };
                gaps = state.archive_gaps(from, MAX_RECORDS)?;
            }
            left = state.archive_gaps(GapsFrom::default(), MAX_RECORDS)?;
        }
        if filled > 0 {
            info!(
                records = filled,
                "filled this agent's archive from its peers"
            );
        }
        match (left.is_empty(), unreachable) {
            (true, _) => Ok(None),
            (false, 0) => Ok(Some(left)),
            (false, _) => anyhow::bail!("{unreachable} peers did not answer"),
        }
    }

    /// Ask the peer at `addr` for `gaps` and store what it holds; returns how many records.
    async fn ask(&self, addr: &str, gaps: &Gaps) -> anyhow::Result<usize> {
        let (audit_after, audit_through) = gaps.audit.unwrap_or((0, 0));
        let req = ReadArchiveRequest {
            job_ids: gaps.jobs.clone(),
            audit_after,
            audit_through,
        };
        let mut client = self.cluster.peers.get(addr)?;
        let answer = client
            .read_archive(with_deadline(req, ASK_DEADLINE))
            .await?
            .into_inner();
        let records = ArchiveOutbox {
            jobs: decode_all::<ArchivedJob>(&answer.jobs)?,
            audit: decode_all::<AuditEntry>(&answer.audit)?,
            heads: decode_all::<SignedHead>(&answer.heads)?,
        };
        let asked: std::collections::BTreeSet<u64> = gaps.jobs.iter().copied().collect();
        anyhow::ensure!(
            records.jobs.iter().all(|j| asked.contains(&j.job.id)),
            "peer {addr} answered with jobs that were not asked for"
        );
        let archive = self.cluster.state.archive();
        self.check_links(audit_after, &records.audit)
            .map_err(|e| anyhow::anyhow!("peer {addr} answered with audit entries that {e}"))?;
        let n = records.jobs.len() + records.audit.len();
        archive.store(records)?;
        archive.flush()?;
        Ok(n)
    }
}

impl ArchiveFill {
    /// Audit entries that follow entry `after` must link to it (as this agent has it) and, when
    /// they reach the state's base, end at its hash: a peer cannot slip in another chain.
    fn check_links(&self, after: u64, entries: &[AuditEntry]) -> Result<(), String> {
        if entries.is_empty() {
            return Ok(());
        }
        let archive = self.cluster.state.archive();
        let from = match after {
            0 => None,
            seq => {
                let prev = archive.audit(seq - 1, seq).next();
                let prev = prev
                    .ok_or_else(|| format!("follow entry {seq}, which this agent lacks"))?
                    .map_err(|e| e.to_string())?;
                Some(ChainBase {
                    seq,
                    hash: prev.hash,
                })
            }
        };
        audit::verify_from(from.as_ref(), entries)
            .map_err(|e| format!("do not link to this agent's chain: {e}"))?;
        let base = self.cluster.state.read(|s| s.audit_base.clone());
        let last = entries.last().map(|e| (e.seq, &e.hash));
        match base {
            Some(b) if last.is_some_and(|(seq, hash)| seq == b.seq && *hash != b.hash) => Err(
                format!("end at another hash than entry {} of the state", b.seq),
            ),
            _ => Ok(()),
        }
    }
}

fn decode_all<T: DeserializeOwned>(records: &[Vec<u8>]) -> anyhow::Result<Vec<T>> {
    records
        .iter()
        .map(|r| Ok(serde_json::from_slice(r)?))
        .collect()
}
