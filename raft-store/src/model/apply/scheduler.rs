//! Applying the scheduler settings: replaced as a whole, validated here.

use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::scheduler::SchedulerSettings;
use crate::model::state::ClusterState;

impl ClusterState {
    pub(crate) fn set_scheduler_policy(
        &mut self,
        settings: &SchedulerSettings,
    ) -> Result<ApplyResult, Rejection> {
        settings.validate().map_err(invalid)?;
        self.scheduler = settings.clone();
        Ok(ApplyResult::Ok)
    }
}
