//! The audit log: one entry per API mutation and per denied request, appended by `apply` in log
//! order and hash-chained, so an edited or deleted entry breaks the chain. A chain rewritten and
//! recomputed from the first edit on is consistent again; what catches it is a signed head: the
//! holder of the cluster CA key (the leader) signs the chain's head at intervals
//! (`SignedHead`), and a head no longer matching the entry it was signed for, or a signature the
//! verifier's trusted keys do not accept, is a rewrite. The signature check itself is the
//! caller's (this crate holds no keys): `verify_signed` takes it as a function.

use std::borrow::Borrow;

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

/// So that the chain checks take entries owned, borrowed or shared (`Arc`, as the state holds
/// them) alike.
impl AsRef<AuditEntry> for AuditEntry {
    fn as_ref(&self) -> &AuditEntry {
        self
    }
}

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

/// Where the checked part of a chain starts: the last entry before it, which left the
/// replicated state for the archive (`retention.rs`). Absent: the chain starts at `GENESIS`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainBase {
    pub seq: u64,
    pub hash: String,
}

/// A chain checked one entry at a time: sequence numbers without gaps, every link, every hash.
struct Walk {
    next_seq: u64,
    prev: String,
    count: usize,
}

impl Walk {
    fn from(base: Option<&ChainBase>) -> Self {
        Self {
            next_seq: base.map_or(1, |b| b.seq + 1),
            prev: base.map_or(GENESIS, |b| b.hash.as_str()).to_owned(),
            count: 0,
        }
    }

    fn push(&mut self, e: &AuditEntry) -> Result<(), String> {
        if e.seq != self.next_seq {
            return Err(format!(
                "entry {} is missing (found seq {} in its place)",
                self.next_seq, e.seq
            ));
        }
        if e.prev_hash != self.prev {
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
        self.prev.clone_from(&e.hash);
        self.next_seq += 1;
        self.count += 1;
        Ok(())
    }
}

/// Check a chain from its start (`verify_from` with no base). Returns the number of entries,
/// or the first break found.
pub fn verify<E: AsRef<AuditEntry>>(entries: impl IntoIterator<Item = E>) -> Result<usize, String> {
    verify_from(None, entries)
}

/// Check the entries that follow `base`: sequence numbers without gaps, every link, every hash.
pub fn verify_from<E: AsRef<AuditEntry>>(
    base: Option<&ChainBase>,
    entries: impl IntoIterator<Item = E>,
) -> Result<usize, String> {
    let mut walk = Walk::from(base);
    for e in entries {
        walk.push(e.as_ref())?;
    }
    Ok(walk.count)
}

/// A signer's word that the chain's entry `seq` has hash `hash`, and so (by the chain) that
/// every entry before it is as it was. Recorded in the replicated state by
/// `Command::SignAuditHead`; `apply` checks that it names an entry and its hash, not the
/// signature (it holds no keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedHead {
    pub seq: u64,
    pub hash: String,
    /// When it was recorded (the proposer's time).
    pub time_ms: u64,
    /// Which key signed: the hex SHA-256 of its public key.
    pub key_id: String,
    /// Hex of the signature over `head_message(seq, hash)`.
    pub signature: String,
}

/// The bytes a head's signature covers.
pub fn head_message(seq: u64, hash: &str) -> Vec<u8> {
    format!("gpumesh audit head\n{seq}\n{hash}").into_bytes()
}

/// What `verify_signed` found in an intact, signed chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coverage {
    pub entries: usize,
    /// The last entry a trusted signature vouches for (0: none).
    pub signed_through: u64,
}

/// `verify_from`, and every signed head: it names an entry of the chain (or its base), and
/// that entry still has the hash that was signed; and `check_signature` accepts the last head (a
/// trusted key, a valid signature), which through the chain vouches for every entry up to it (so
/// one signature is checked, however long the chain). Entries after the last head are the ones
/// not signed yet; one older than `unsigned_grace_ms` before the chain's newest entry means heads
/// were removed, or never made. Entries and heads are read once, in order: an archive of any
/// length is checked without being held in memory.
pub fn verify_signed<E: AsRef<AuditEntry>, H: Borrow<SignedHead>>(
    base: Option<&ChainBase>,
    entries: impl IntoIterator<Item = E>,
    heads: impl IntoIterator<Item = H>,
    check_signature: impl Fn(&SignedHead) -> Result<(), String>,
    unsigned_grace_ms: u64,
) -> Result<Coverage, String> {
    let mut walk = Walk::from(base);
    let mut heads = heads.into_iter().peekable();
    let mut signed = Signed::default();
    if let Some(base) = base {
        while let Some(head) = heads.next_if(|h| h.borrow().seq <= base.seq) {
            signed.accept(head.borrow(), base.seq, &base.hash)?;
        }
    }
    // (seq, time) of the entries after the last head matched so far.
    let mut unsigned: Vec<(u64, u64)> = Vec::new();
    let mut newest = 0;
    for e in entries {
        let e = e.as_ref();
        walk.push(e)?;
        newest = e.time_ms;
        unsigned.push((e.seq, e.time_ms));
        while let Some(head) = heads.next_if(|h| h.borrow().seq <= e.seq) {
            signed.accept(head.borrow(), e.seq, &e.hash)?;
            unsigned.clear();
        }
    }
    if let Some(head) = heads.next() {
        return Err(format!(
            "a signed head names entry {}, which the chain does not have: entries were removed",
            head.borrow().seq
        ));
    }
    if let Some(last) = &signed.last {
        check_signature(last)
            .map_err(|why| format!("the signed head of entry {}: {why}", last.seq))?;
    }
    let stale = unsigned
        .iter()
        .take_while(|(_, time)| time.saturating_add(unsigned_grace_ms) < newest)
        .last();
    if let (Some((first, _)), Some((stale, _))) = (unsigned.first(), stale) {
        return Err(format!(
            "entries {first} to {stale} are older than the signing interval allows and no signed head covers them: heads were removed or never made"
        ));
    }
    Ok(Coverage {
        entries: walk.count,
        signed_through: signed.last.map_or(0, |h| h.seq),
    })
}

/// The signed heads matched so far.
#[derive(Default)]
struct Signed {
    last: Option<SignedHead>,
}

impl Signed {
    /// `head`, met at entry `seq` with hash `hash`: it must come after the last one and name
    /// that very entry with its hash.
    fn accept(&mut self, head: &SignedHead, seq: u64, hash: &str) -> Result<(), String> {
        let through = self.last.as_ref().map_or(0, |h| h.seq);
        if head.seq <= through {
            return Err(format!(
                "the signed head of entry {} comes after the one of entry {through}",
                head.seq
            ));
        }
        if head.seq != seq {
            return Err(format!(
                "a signed head names entry {}, which the chain does not have: entries were removed",
                head.seq
            ));
        }
        if head.hash != hash {
            return Err(format!(
                "entry {} does not have the hash signed for it: the chain up to it was rewritten",
                head.seq
            ));
        }
        self.last = Some(head.clone());
        Ok(())
    }
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
        assert_eq!(verify(chain(5)), Ok(5));
        assert_eq!(verify(&[] as &[AuditEntry]), Ok(0));
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

    /// Heads "signed" by a stand-in: the signature is the key id and the message, so the test
    /// checks the rules of the chain, not cryptography.
    fn head(chain: &[AuditEntry], seq: u64) -> SignedHead {
        let hash = chain[seq as usize - 1].hash.clone();
        SignedHead {
            seq,
            signature: format!("k1:{}", hex::encode(head_message(seq, &hash))),
            hash,
            time_ms: seq * 10,
            key_id: "k1".into(),
        }
    }

    fn trusted(h: &SignedHead) -> Result<(), String> {
        let want = format!("k1:{}", hex::encode(head_message(h.seq, &h.hash)));
        if h.key_id == "k1" && h.signature == want {
            Ok(())
        } else {
            Err(format!(
                "key {} is not trusted or its signature is wrong",
                h.key_id
            ))
        }
    }

    #[test]
    fn a_signed_chain_verifies_up_to_its_last_head() {
        let c = chain(6);
        let heads = [head(&c, 2), head(&c, 5)];
        let cov = verify_signed(None, &c, &heads, trusted, 1_000).expect("intact");
        assert_eq!(
            cov,
            Coverage {
                entries: 6,
                signed_through: 5
            }
        );
    }

    #[test]
    fn a_rewritten_and_recomputed_chain_breaks_its_signed_head() {
        let mut c = chain(6);
        let heads = [head(&c, 5)];
        // The whole chain recomputed from the edit on: `verify` alone is satisfied.
        c[2].actor = "someone-else".into();
        for i in 2..c.len() {
            c[i].prev_hash = c[i - 1].hash.clone();
            c[i].hash = c[i].compute_hash();
        }
        assert_eq!(verify(&c), Ok(6), "the recomputed chain is consistent");
        let problem = verify_signed(None, &c, &heads, trusted, 1_000).expect_err("rewrite");
        assert!(
            problem.contains("entry 5 does not have the hash signed for it"),
            "{problem}"
        );
    }

    #[test]
    fn a_chain_is_checked_from_its_archived_base() {
        let c = chain(6);
        let heads = [head(&c, 2), head(&c, 3), head(&c, 5)];
        let base = ChainBase {
            seq: 3,
            hash: c[2].hash.clone(),
        };
        // Entries 1-3 and the head of entry 2 were archived; the head of the base itself is
        // checked against the base.
        assert_eq!(
            verify_signed(Some(&base), &c[3..], &heads[1..], trusted, 1_000),
            Ok(Coverage {
                entries: 3,
                signed_through: 5
            })
        );
        // The archive and the live part, read in order, are the whole chain.
        assert_eq!(
            verify_signed(None, &c, &heads, trusted, 1_000),
            Ok(Coverage {
                entries: 6,
                signed_through: 5
            })
        );
        let moved = ChainBase {
            hash: c[1].hash.clone(),
            ..base.clone()
        };
        let problem = verify_from(Some(&moved), &c[3..]).expect_err("another base");
        assert!(problem.contains("entry 4 does not link"), "{problem}");
        let problem =
            verify_signed(Some(&base), &c[3..], &heads, trusted, 1_000).expect_err("head 2");
        assert!(
            problem.contains("names entry 2, which the chain does not have"),
            "{problem}"
        );
    }

    #[test]
    fn forged_removed_and_missing_heads_are_refused() {
        let c = chain(6);
        let mut forged = head(&c, 4);
        forged.key_id = "k2".into();
        let problem =
            verify_signed(None, &c, &[head(&c, 2), forged], trusted, 1_000).expect_err("forged");
        assert!(
            problem.contains("signed head of entry 4: key k2 is not trusted"),
            "{problem}"
        );

        let problem =
            verify_signed(None, &c[..3], &[head(&c, 4)], trusted, 1_000).expect_err("cut");
        assert!(
            problem.contains("names entry 4, which the chain does not have"),
            "{problem}"
        );

        // No head at all, and the first entries are older than the grace: refused; within
        // the grace (signing has not come round yet) they are fine.
        let problem =
            verify_signed(None, &c, &[] as &[SignedHead], trusted, 25).expect_err("stripped");
        assert!(
            problem.contains("entries 1 to 3 are older than"),
            "{problem}"
        );
        assert_eq!(
            verify_signed(None, &c, &[head(&c, 3)], trusted, 25),
            Ok(Coverage {
                entries: 6,
                signed_through: 3
            })
        );
    }
}
