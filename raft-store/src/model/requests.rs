//! Exactly-once writes: the answers to recent API requests, by caller and request id, so that
//! a request that reaches the log twice (a client or a forwarding agent retrying after a lost
//! answer, a leader change between append and commit) takes effect once and both copies get
//! the first answer.
//!
//! The leader stamps an entry with its `RequestStamp` (`LogEntry::request`, in `command.rs`
//! beside the entry it marks) only once every member speaks `PROTOCOL_9`: an older replica
//! would apply the copy, and the replicas would diverge. A stamp names the caller (the actor the leader authenticated), the request id and a
//! digest of the command, so that one request's second, different write (a submission stamped
//! again after `AccountChanged`) is not taken for a copy of its first.
//!
//! Bounded, deterministically: an answer is kept `WINDOW_MS` after its entry's time, and at most
//! `MAX_KEPT` answers are kept (the oldest go first). Every replica forgets the same answers at
//! the same entry, since only the entries' own times are read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::command::RequestStamp;
use crate::model::outcome::ApplyResult;

/// How long after its entry a request's answer is kept: a retry later than this is applied
/// again.
pub const WINDOW_MS: u64 = 10 * 60 * 1000;
/// The most answers kept: past it, the oldest are forgotten before their window ends (at 5,000
/// writes/s, after 20 s, still longer than any client's retry deadline).
pub const MAX_KEPT: usize = 100_000;

/// One remembered answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Answer {
    digest: String,
    at_ms: u64,
    result: ApplyResult,
}

/// The answers of recent requests. Serialized as the answers alone: the order they are
/// forgotten in is by their entries' times (then keys), which a replica restored from a
/// snapshot rebuilds exactly. Keys and answers are shared, by both indexes and by clones (a
/// snapshot's copy of up to `MAX_KEPT` answers then allocates no string).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestLedger {
    answers: BTreeMap<Arc<str>, Arc<Answer>>,
    /// Every answer's (time, key), oldest first.
    order: BTreeSet<(u64, Arc<str>)>,
}

impl RequestLedger {
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// The first answer to the request `stamp` names, if it was applied before and `now_ms`
    /// is inside its window (and it is still remembered).
    pub fn answer(&self, stamp: &RequestStamp, now_ms: u64) -> Option<&ApplyResult> {
        self.answers
            .get(stamp.key.as_str())
            .filter(|a| a.digest == stamp.digest && now_ms <= a.at_ms.saturating_add(WINDOW_MS))
            .map(|a| &a.result)
    }

    /// Remember `result` as the answer to `stamp`, at `now_ms`, and forget what is past the
    /// window or over the count.
    pub fn remember(&mut self, stamp: &RequestStamp, now_ms: u64, result: &ApplyResult) {
        self.forget_before(now_ms.saturating_sub(WINDOW_MS));
        let answer = Arc::new(Answer {
            digest: stamp.digest.clone(),
            at_ms: now_ms,
            result: result.clone(),
        });
        let key: Arc<str> = Arc::from(stamp.key.as_str());
        if let Some(earlier) = self.answers.insert(key.clone(), answer) {
            // The same request's other write: it is the one to answer now.
            self.order.remove(&(earlier.at_ms, key.clone()));
        }
        self.order.insert((now_ms, key));
        while self.order.len() > MAX_KEPT {
            self.pop_oldest();
        }
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        while self.order.first().is_some_and(|(at, _)| *at < cutoff_ms) {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((_, key)) = self.order.pop_first() {
            self.answers.remove(&key);
        }
    }
}

impl Serialize for RequestLedger {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.answers.iter().map(|(k, a)| (&**k, &**a)))
    }
}

impl<'de> Deserialize<'de> for RequestLedger {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let answers: BTreeMap<Arc<str>, Arc<Answer>> = BTreeMap::<String, Answer>::deserialize(d)?
            .into_iter()
            .map(|(k, a)| (Arc::from(k), Arc::new(a)))
            .collect();
        let order = answers.iter().map(|(k, a)| (a.at_ms, k.clone())).collect();
        Ok(Self { answers, order })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(key: &str, digest: &str) -> RequestStamp {
        RequestStamp {
            key: key.into(),
            digest: digest.into(),
        }
    }

    fn submitted(job: u64) -> ApplyResult {
        ApplyResult::JobSubmitted {
            job,
            existing: false,
        }
    }

    #[test]
    fn a_repeated_request_gets_the_first_answer_and_another_write_does_not() {
        let mut ledger = RequestLedger::default();
        ledger.remember(&stamp("alice\nr1", "d1"), 1_000, &submitted(7));
        let now = 2_000;
        let first = ledger.answer(&stamp("alice\nr1", "d1"), now);
        assert_eq!(first, Some(&submitted(7)));
        let theirs = ledger.answer(&stamp("bob\nr1", "d1"), now);
        assert_eq!(theirs, None, "another caller");
        let other = ledger.answer(&stamp("alice\nr1", "d2"), now);
        assert_eq!(other, None, "another write of the same request");
        ledger.remember(&stamp("alice\nr1", "d2"), 1_001, &submitted(8));
        let latest = ledger.answer(&stamp("alice\nr1", "d2"), now);
        assert_eq!(latest, Some(&submitted(8)));
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn answers_expire_after_the_window_and_are_forgotten_over_the_count() {
        let mut ledger = RequestLedger::default();
        ledger.remember(&stamp("a\n1", "d"), 0, &submitted(1));
        assert!(ledger.answer(&stamp("a\n1", "d"), WINDOW_MS).is_some());
        assert_eq!(ledger.answer(&stamp("a\n1", "d"), WINDOW_MS + 1), None);
        ledger.remember(&stamp("a\n2", "d"), WINDOW_MS, &submitted(2));
        assert_eq!(ledger.len(), 2, "nothing past the window yet");
        ledger.remember(&stamp("a\n3", "d"), WINDOW_MS + 1, &submitted(3));
        assert_eq!(ledger.len(), 2, "the first is forgotten");

        let mut full = RequestLedger::default();
        for i in 0..=MAX_KEPT {
            full.remember(&stamp(&format!("a\n{i}"), "d"), 5, &submitted(1));
        }
        assert_eq!(full.len(), MAX_KEPT);
        let oldest = full.answer(&stamp("a\n0", "d"), 5);
        assert_eq!(oldest, None, "the oldest went first");
    }

    #[test]
    fn a_ledger_read_back_forgets_in_the_same_order() {
        let mut ledger = RequestLedger::default();
        ledger.remember(&stamp("a\n2", "d"), 20, &submitted(2));
        ledger.remember(&stamp("a\n1", "d"), 10, &submitted(1));
        let json = serde_json::to_string(&ledger).expect("encode");
        let mut back: RequestLedger = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, ledger);
        back.remember(&stamp("a\n3", "d"), WINDOW_MS + 15, &submitted(3));
        ledger.remember(&stamp("a\n3", "d"), WINDOW_MS + 15, &submitted(3));
        assert_eq!(back, ledger);
        assert_eq!(back.len(), 2, "a\\n1 forgotten");
    }
}
