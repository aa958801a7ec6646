//! Applying certificates: recording what the cluster CA issued, and the revocation list.

use crate::model::cert::{self, CertRecord};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;
use crate::model::validate;

impl ClusterState {
    pub(crate) fn record_certificate(
        &mut self,
        cert: &CertRecord,
    ) -> Result<ApplyResult, Rejection> {
        cert::check_serial(&cert.serial).map_err(invalid)?;
        if self.certificates.contains_key(&cert.serial) {
            return Err(invalid(format!(
                "certificate {} is already recorded",
                cert.serial
            )));
        }
        let mut cert = cert.clone();
        cert.revoked = false;
        cert.revoked_reason.clear();
        self.certificates.insert(cert.serial.clone(), cert);
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn revoke_certificate(
        &mut self,
        serial: &str,
        reason: &str,
    ) -> Result<ApplyResult, Rejection> {
        cert::check_serial(serial).map_err(invalid)?;
        validate::free_text("revocation reason", reason).map_err(invalid)?;
        let record = self
            .certificates
            .entry(serial.to_owned())
            .or_insert_with(|| CertRecord {
                serial: serial.to_owned(),
                subject: String::new(),
                not_after_ms: 0,
                issued_at_ms: 0,
                revoked: false,
                revoked_reason: String::new(),
            });
        record.revoked = true;
        record.revoked_reason = reason.to_owned();
        Ok(ApplyResult::Ok)
    }

    /// Whether a presented certificate serial is on the revocation list.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.certificates.get(serial).is_some_and(|c| c.revoked)
    }
}
