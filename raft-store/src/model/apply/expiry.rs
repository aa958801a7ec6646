//! Forgetting what has outlived its use, as of the entry's time (`Command::ForgetExpired`, which
//! the leader proposes when `ClusterState::expired` finds something): the records of
//! certificates expired more than `CERT_RECORD_GRACE_MS` ago (revoked ones too: an expired
//! certificate is refused by its dates, so its revocation need not be listed), and idempotency
//! keys of jobs submitted more than `IDEMPOTENCY_WINDOW_MS` ago (archived ones too), or no longer in the
//! state.
//!
//! A key is honoured for at least its window: until the leader's next look, a little longer.

use crate::model::outcome::ApplyResult;
use crate::model::state::ClusterState;

/// How long past its expiry a certificate's record is kept (still listed by `cert list`).
pub const CERT_RECORD_GRACE_MS: u64 = 24 * 3600 * 1000;
/// How long after its job's submission an idempotency key still returns that job.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;

/// What `ForgetExpired` at some time would forget.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Serials of certificate records.
    pub certificates: Vec<String>,
    /// Scoped (`tenant/key`) idempotency keys.
    pub idempotency_keys: Vec<String>,
}

impl Expired {
    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty() && self.idempotency_keys.is_empty()
    }
}

impl ClusterState {
    /// What has outlived its use at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Expired {
        let certificates = self
            .certificates
            .values()
            .filter(|c| c.not_after_ms.saturating_add(CERT_RECORD_GRACE_MS) < now_ms)
            .map(|c| c.serial.clone())
            .collect();
        let idempotency_keys = self
            .idempotency
            .iter()
            .filter(|(_, job)| {
                self.jobs.get(job).is_none_or(|j| {
                    j.submitted_at_ms.saturating_add(IDEMPOTENCY_WINDOW_MS) < now_ms
                })
            })
            .map(|(key, _)| key.clone())
            .chain(
                self.archived_keys
                    .iter()
                    .filter(|(_, k)| {
                        k.submitted_at_ms.saturating_add(IDEMPOTENCY_WINDOW_MS) < now_ms
                    })
                    .map(|(key, _)| key.clone()),
            )
            .collect();
        Expired {
            certificates,
            idempotency_keys,
        }
    }

    pub(crate) fn forget_expired(&mut self, now_ms: u64) -> ApplyResult {
        let expired = self.expired(now_ms);
        for serial in &expired.certificates {
            self.certificates.remove(serial);
        }
        for key in &expired.idempotency_keys {
            self.idempotency.remove(key);
            self.archived_keys.remove(key);
        }
        ApplyResult::Ok
    }
}
