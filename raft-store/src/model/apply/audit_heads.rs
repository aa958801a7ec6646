//! Applying signed audit heads: the leader's signature over the chain's newest entry, kept so
//! that a chain rewritten up to it is caught (`audit::verify_signed`).

use crate::model::audit::SignedHead;
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;

/// The longest key id and signature a head may carry (hex of a SHA-256, of a DER signature).
const MAX_KEY_ID: usize = 64;
const MAX_SIGNATURE: usize = 512;

impl ClusterState {
    /// Record `head` if it names an entry of the chain after the last signed one, with that
    /// entry's hash. The signature is the verifier's to check, with its own trusted keys.
    pub(crate) fn sign_audit_head(
        &mut self,
        head: &SignedHead,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let last = self.audit_heads.last().map_or(0, |h| h.seq);
        if head.seq <= last {
            return Err(invalid(format!(
                "entry {} is not after the last signed head ({last})",
                head.seq
            )));
        }
        let entry = self
            .audit_entry(head.seq)
            .ok_or_else(|| invalid(format!("the audit log has no entry {}", head.seq)))?;
        if entry.hash != head.hash {
            return Err(invalid(format!(
                "entry {}'s hash is not the one signed",
                head.seq
            )));
        }
        let hex_of = |s: &str, max: usize| {
            !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_hexdigit())
        };
        if !hex_of(&head.key_id, MAX_KEY_ID) || !hex_of(&head.signature, MAX_SIGNATURE) {
            return Err(invalid(
                "a signed head's key id and signature must be hex".into(),
            ));
        }
        self.audit_heads.push(SignedHead {
            time_ms: now,
            ..head.clone()
        });
        Ok(ApplyResult::Ok)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::audit::{RequestMeta, SignedHead};
    use crate::model::command::{Command, LogEntry};
    use crate::model::outcome::ApplyResult;
    use crate::model::state::ClusterState;

    fn apply(s: &mut ClusterState, cmd: Command, meta: Option<RequestMeta>) -> ApplyResult {
        s.apply(&LogEntry {
            proposed_at_ms: 7,
            cmd,
            meta,
            request: None,
        })
    }

    fn sign(s: &mut ClusterState, seq: u64, hash: String) -> ApplyResult {
        let head = SignedHead {
            seq,
            hash,
            time_ms: 0,
            key_id: "ab".repeat(32),
            signature: "3045".into(),
        };
        apply(s, Command::SignAuditHead { head }, None)
    }

    #[test]
    fn a_head_must_name_a_later_entry_with_its_hash() {
        let mut s = ClusterState::new();
        let meta = RequestMeta {
            actor: "admin".into(),
            verb: "node.cordon".into(),
            object: "node/1".into(),
            request_id: "r".into(),
            source: "s".into(),
        };
        for _ in 0..3 {
            apply(&mut s, Command::CancelJob { job: 9 }, Some(meta.clone()));
        }
        let hash = |s: &ClusterState, seq: usize| s.audit[seq - 1].hash.clone();
        let before = s.clone();
        let refused = [
            sign(&mut s, 4, "ab".repeat(32)),
            sign(&mut s, 2, hash(&before, 3)),
            sign(&mut s, 0, String::new()),
        ];
        for r in refused {
            assert!(matches!(r, ApplyResult::Rejected { .. }), "{r:?}");
        }
        assert_eq!(s, before, "a refused head changes nothing");

        assert_eq!(sign(&mut s, 2, hash(&before, 2)), ApplyResult::Ok);
        assert!(matches!(
            sign(&mut s, 2, hash(&before, 2)),
            ApplyResult::Rejected { .. }
        ));
        assert_eq!(sign(&mut s, 3, hash(&before, 3)), ApplyResult::Ok);
        assert_eq!(
            s.audit_heads
                .iter()
                .map(|h| (h.seq, h.time_ms))
                .collect::<Vec<_>>(),
            [(2, 7), (3, 7)]
        );
        assert_eq!(s.audit.len(), 3, "a head is not itself audited");
    }
}
