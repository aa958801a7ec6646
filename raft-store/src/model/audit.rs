//! The audit log: one entry per API mutation and per denied request, appended by `apply` in log
//! order and hash-chained, so an edited or deleted entry breaks the chain.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Who asked for a replicated change, for the audit log. Set by the agent that authenticated
/// the request; clients cannot supply it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestMeta {
    /// Token id, or `anonymous`.
    pub actor: String,
    /// API verb, e.g. `job.submit`.
    pub verb: String,
    /// What it acts on, e.g. `job/j-42`, `node/n3`.
    pub object: String,
    pub request_id: String,
    /// Client address as the agent saw it.
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub seq: u64,
    pub time_ms: u64,
    pub actor: String,
    pub verb: String,
    pub object: String,
    /// `ok`, `rejected: …` or `denied: …`.
    pub outcome: String,
    pub request_id: String,
    pub source: String,
    pub prev_hash: String,
    pub hash: String,
}

/// The hash the first entry chains from.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

impl AuditEntry {
    pub fn new(
        seq: u64,
        time_ms: u64,
        meta: &RequestMeta,
        outcome: String,
        prev_hash: &str,
    ) -> Self {
        let mut e = AuditEntry {
            seq,
            time_ms,
            actor: meta.actor.clone(),
            verb: meta.verb.clone(),
            object: meta.object.clone(),
            outcome,
            request_id: meta.request_id.clone(),
            source: meta.source.clone(),
            prev_hash: prev_hash.to_owned(),
            hash: String::new(),
        };
        e.hash = e.compute_hash();
        e
    }

    /// SHA-256 over every field but `hash`, in a fixed, unambiguous encoding.
    pub fn compute_hash(&self) -> String {
        let fields = (
            self.seq,
            self.time_ms,
            &self.actor,
            &self.verb,
            &self.object,
            &self.outcome,
            &self.request_id,
            &self.source,
            &self.prev_hash,
        );
        let bytes = serde_json::to_vec(&fields).unwrap_or_default();
        hex::encode(Sha256::digest(bytes))
    }
}

/// Check a chain from its start: sequence numbers without gaps, every link, every hash.
/// Returns the number of entries, or the first break found.
pub fn verify(entries: &[AuditEntry]) -> Result<usize, String> {
    let mut prev = GENESIS.to_owned();
    for (i, e) in entries.iter().enumerate() {
        let want_seq = i as u64 + 1;
        if e.seq != want_seq {
            return Err(format!(
                "entry {want_seq} is missing (found seq {} in its place)",
                e.seq
            ));
        }
        if e.prev_hash != prev {
            return Err(format!(
                "entry {} does not link to the entry before it",
                e.seq
            ));
        }
        if e.compute_hash() != e.hash {
            return Err(format!(
                "entry {} was modified (its hash does not match its content)",
                e.seq
            ));
        }
        prev.clone_from(&e.hash);
    }
    Ok(entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u64) -> Vec<AuditEntry> {
        let meta = RequestMeta {
            actor: "t1".into(),
            verb: "job.submit".into(),
            object: "job/j-1".into(),
            request_id: "r".into(),
            source: "127.0.0.1:5".into(),
        };
        let mut out: Vec<AuditEntry> = Vec::new();
        for seq in 1..=n {
            let prev = out.last().map_or(GENESIS.to_owned(), |e| e.hash.clone());
            out.push(AuditEntry::new(seq, seq * 10, &meta, "ok".into(), &prev));
        }
        out
    }

    #[test]
    fn an_intact_chain_verifies() {
        assert_eq!(verify(&chain(5)), Ok(5));
        assert_eq!(verify(&[]), Ok(0));
    }

    #[test]
    fn edits_and_deletions_are_detected() {
        let mut edited = chain(5);
        edited[2].actor = "someone-else".into();
        assert!(
            verify(&edited)
                .expect_err("edit")
                .contains("entry 3 was modified")
        );

        let mut deleted = chain(5);
        deleted.remove(1);
        assert!(
            verify(&deleted)
                .expect_err("deletion")
                .contains("entry 2 is missing")
        );

        // Re-hashing the edited entry alone does not help: the next link breaks.
        let mut rehashed = chain(5);
        rehashed[2].outcome = "denied".into();
        rehashed[2].hash = rehashed[2].compute_hash();
        assert!(
            verify(&rehashed)
                .expect_err("relink")
                .contains("entry 4 does not link")
        );
    }
}
