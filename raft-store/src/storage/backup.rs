//! Cluster backups: the file `gpuctl cluster snapshot save` writes and `gpu-agent restore`
//! reads (one JSON header line — magic, format version, cluster id, index, term, length,
//! SHA-256 — then the state in its canonical snapshot encoding), and `seed`, which turns one into
//! the data directory of the first member of a new cluster.

use std::collections::BTreeMap;
use std::path::Path;

use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, CommittedLeaderId, Membership, StoredMembership, Vote};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::audit::RequestMeta;
use crate::model::state::ClusterState;
use crate::storage::error::OpenError;
use crate::storage::state_machine::{MachineData, StateReader};
use crate::{LogId, NodeId};

/// The first field of every backup: what sets a backup apart from any other file.
pub const BACKUP_MAGIC: &str = "gpumesh-backup";
/// The backup format this binary writes and the newest it reads.
pub const BACKUP_FORMAT: u32 = 1;

/// What a backup says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    pub magic: String,
    pub format: u32,
    /// The source cluster: the SHA-256 fingerprint of its CA certificate.
    pub cluster_id: String,
    /// The log index the state was read at (everything committed up to it is in).
    pub index: u64,
    pub term: u64,
    pub created_at_ms: u64,
    pub len: u64,
    pub sha256: String,
}

/// Why a file is not a usable backup.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("not a gpumesh backup: {0}")]
    Foreign(String),
    #[error(
        "backup format {found} is newer than this binary reads ({BACKUP_FORMAT}); use a newer gpu-agent"
    )]
    FutureFormat { found: u32 },
    #[error("backup is truncated: {have} of {want} state bytes")]
    Truncated { have: u64, want: u64 },
    #[error("backup has {have} state bytes, its header says {want}")]
    TooLong { have: u64, want: u64 },
    #[error("backup checksum {found} does not match its header's {want}: the file is corrupt")]
    Checksum { found: String, want: String },
    #[error("backup state does not decode: {0}")]
    BadState(String),
}

/// Why a data directory could not be seeded from a backup.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error(
        "data directory {0} already holds cluster data; restore into an empty directory (nothing was changed)"
    )]
    NotEmpty(String),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("writing the restored state: {0}")]
    Storage(String),
}

/// A backup of `state`, read at log `index` of `term`.
pub fn encode(
    state: &ClusterState,
    cluster_id: &str,
    index: u64,
    term: u64,
    created_at_ms: u64,
) -> Vec<u8> {
    let payload = crate::model::digest::canonical_bytes(state);
    let header = BackupHeader {
        magic: BACKUP_MAGIC.into(),
        format: BACKUP_FORMAT,
        cluster_id: cluster_id.into(),
        index,
        term,
        created_at_ms,
        len: payload.len() as u64,
        sha256: hex::encode(Sha256::digest(&payload)),
    };
    // A struct of strings and integers always serialises.
    let mut out = serde_json::to_vec(&header).unwrap_or_default();
    out.push(b'\n');
    out.extend_from_slice(&payload);
    out
}

impl StateReader {
    /// A backup of the applied state (`encode`), read at one index under the lock.
    pub fn backup(&self, cluster_id: &str, created_at_ms: u64) -> (u64, Vec<u8>) {
        self.read_applied(|applied, state| {
            let (index, term) = applied.map_or((0, 0), |l| (l.index, l.leader_id.term));
            (index, encode(state, cluster_id, index, term, created_at_ms))
        })
    }
}

/// What a restore changes in a backup's state before it seeds the new cluster (a new CA): the
/// old CA's certificates are marked revoked (the new CA trusts none of them, and `cert list`
/// must not show them as valid), and the restore itself is appended to the audit chain.
pub fn mark_restored(state: &mut ClusterState, header: &BackupHeader, now_ms: u64) {
    for cert in state.certificates.values_mut().filter(|c| !c.revoked) {
        cert.revoked = true;
        cert.revoked_reason = RESTORED_AWAY.into();
    }
    // The restored cluster has a CA of its own: the old cluster's CAs (and any rotation of
    // them under way) are not its.
    state.ca = None;
    let meta = RequestMeta {
        actor: "system:restore".into(),
        verb: "cluster.restore".into(),
        object: format!(
            "backup of cluster {} at index {}",
            header.cluster_id.get(..16).unwrap_or(&header.cluster_id),
            header.index
        ),
        request_id: String::new(),
        source: "gpu-agent restore".into(),
    };
    state.append_audit(now_ms, &meta, "ok".into());
}

/// Why a restored cluster lists its predecessor's certificates as revoked.
pub const RESTORED_AWAY: &str = "issued by the CA of the cluster this one was restored from";

/// Read and verify a backup: a foreign, newer, truncated or corrupt file is refused with why.
pub fn decode(bytes: &[u8]) -> Result<(BackupHeader, ClusterState), BackupError> {
    let Some(newline) = bytes.iter().take(64 * 1024).position(|&b| b == b'\n') else {
        return Err(BackupError::Foreign("no header line".into()));
    };
    let header: serde_json::Value = serde_json::from_slice(&bytes[..newline])
        .map_err(|_| BackupError::Foreign("the first line is not a JSON header".into()))?;
    if header.get("magic").and_then(|m| m.as_str()) != Some(BACKUP_MAGIC) {
        return Err(BackupError::Foreign(format!(
            "the header does not say {BACKUP_MAGIC:?}"
        )));
    }
    if let Some(found) = header.get("format").and_then(|f| f.as_u64())
        && found > u64::from(BACKUP_FORMAT)
    {
        return Err(BackupError::FutureFormat {
            found: u32::try_from(found).unwrap_or(u32::MAX),
        });
    }
    let header: BackupHeader = serde_json::from_value(header)
        .map_err(|e| BackupError::Foreign(format!("bad header: {e}")))?;
    let payload = &bytes[newline + 1..];
    let have = payload.len() as u64;
    if have < header.len {
        return Err(BackupError::Truncated {
            have,
            want: header.len,
        });
    }
    if have > header.len {
        return Err(BackupError::TooLong {
            have,
            want: header.len,
        });
    }
    let found = hex::encode(Sha256::digest(payload));
    if found != header.sha256 {
        return Err(BackupError::Checksum {
            found,
            want: header.sha256,
        });
    }
    let state =
        serde_json::from_slice(payload).map_err(|e| BackupError::BadState(e.to_string()))?;
    Ok((header, state))
}

/// Make `dir` (empty or absent) the data directory of node `node` at `addr`, the one voter of a
/// new cluster whose state is `state` as of `index`: a snapshot at log id (term 1, `node`,
/// `index`) naming only this node as member, and a vote for term 1. On start, openraft takes the
/// snapshot as applied and committed, and the node elects itself; others then join it.
pub async fn seed(
    dir: &Path,
    node: NodeId,
    addr: &str,
    state: ClusterState,
    index: u64,
) -> Result<(), SeedError> {
    if dir.join("raft").exists() || dir.join("snapshot").exists() {
        return Err(SeedError::NotEmpty(dir.display().to_string()));
    }
    let (_lock, mut log, sm) = crate::storage::store::open(dir)?;
    let log_id = LogId::new(CommittedLeaderId::new(1, node), index.max(1));
    let membership = Membership::new(
        vec![[node].into_iter().collect()],
        BTreeMap::from([(node, BasicNode::new(addr))]),
    );
    let data = MachineData {
        last_applied: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        state,
    };
    sm.seed(data)
        .map_err(|e| SeedError::Storage(e.to_string()))?;
    log.save_vote(&Vote::new(1, node))
        .await
        .map_err(|e| SeedError::Storage(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ClusterState {
        ClusterState {
            next_job_id: 42,
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let bytes = encode(&state(), "ab12", 17, 3, 1000);
        let (header, back) = decode(&bytes).expect("decodes");
        assert_eq!(
            (header.index, header.term, header.cluster_id.as_str()),
            (17, 3, "ab12")
        );
        assert_eq!(
            crate::model::digest::canonical_bytes(&back),
            crate::model::digest::canonical_bytes(&state())
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let good = encode(&state(), "ab12", 17, 3, 1000);
        let check = |bytes: &[u8], want: &str| {
            let err = decode(bytes).expect_err("must be refused").to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        };
        check(&good[..good.len() - 5], "truncated");
        let header_end = good.iter().position(|&b| b == b'\n').unwrap_or(0);
        check(&good[..header_end], "no header line");
        check(&good[..header_end + 1], "truncated");
        check(b"", "not a gpumesh backup");
        check(b"\x7fELF\x02\x01\x01\0\n\0\0", "not a gpumesh backup");
        check(b"{\"magic\":\"etcd\"}\n{}", "not a gpumesh backup");
        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x20;
        check(&flipped, "checksum");
        let mut longer = good.clone();
        longer.push(b' ');
        check(&longer, "says");
        let text = String::from_utf8(good.clone()).expect("utf-8");
        check(
            text.replacen("\"format\":1", "\"format\":9", 1).as_bytes(),
            "newer",
        );
    }

    #[tokio::test]
    async fn seeding_refuses_a_directory_with_data_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        seed(dir.path(), 1, "127.0.0.1:1", state(), 10)
            .await
            .expect("seed an empty dir");
        let before = std::fs::read(dir.path().join("snapshot")).expect("snapshot written");
        let err = seed(dir.path(), 2, "127.0.0.1:2", ClusterState::default(), 99)
            .await
            .expect_err("second seed refused");
        assert!(err.to_string().contains("already holds"), "{err}");
        assert_eq!(
            std::fs::read(dir.path().join("snapshot")).expect("still there"),
            before
        );
        // The seeded directory opens, with the state and its index.
        let (_d, _log, sm) = crate::storage::store::open(dir.path()).expect("reopen");
        let reader = sm.reader();
        assert_eq!(reader.applied_index(), 10);
        assert_eq!(reader.read(|s| s.next_job_id), 42);
    }

    #[test]
    fn a_restore_revokes_the_old_certificates_and_is_audited() {
        let mut s = state();
        s.certificates.insert(
            "0a".into(),
            crate::model::cert::CertRecord {
                serial: "0a".into(),
                subject: "node 1".into(),
                not_after_ms: u64::MAX,
                issued_at_ms: 1,
                revoked: false,
                revoked_reason: String::new(),
                issuer: String::new(),
            },
        );
        let bytes = encode(&s, "ab12", 17, 3, 1000);
        let (header, mut restored) = decode(&bytes).expect("decode");
        mark_restored(&mut restored, &header, 5000);
        let cert = &restored.certificates["0a"];
        assert!(cert.revoked && cert.revoked_reason == RESTORED_AWAY);
        let entry = restored.audit.last().expect("audited");
        assert_eq!(
            (entry.verb.as_str(), entry.time_ms, entry.seq),
            ("cluster.restore", 5000, 1)
        );
        assert_eq!(crate::model::audit::verify(&restored.audit), Ok(1));
    }
}
