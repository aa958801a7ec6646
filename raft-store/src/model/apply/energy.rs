//! Applying energy reports: a registered node's measurements, counted once per sequence number.

use crate::model::energy::EnergyReport;
use crate::model::outcome::{ApplyResult, Rejection};
use crate::model::state::ClusterState;

impl ClusterState {
    pub(crate) fn record_energy(
        &mut self,
        report: &EnergyReport,
    ) -> Result<ApplyResult, Rejection> {
        if !self.nodes.contains_key(&report.node) {
            return Err(Rejection::UnknownNode { node: report.node });
        }
        self.energy.record(report);
        Ok(ApplyResult::Ok)
    }
}
