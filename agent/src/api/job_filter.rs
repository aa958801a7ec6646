//! Which jobs a `ListJobs` or `WatchJobs` request asks for: its filters (state, node, tenant,
//! user, name glob, labels, submitted since), checked on the server so that a narrow query
//! over a large state answers with what it asked for, not a page of everything.

use std::collections::BTreeMap;

use gpu_proto::glob_matches;
use gpu_proto::v1 as pb;
use gpu_raft_store::{Job, JobState};

use crate::api::from_proto;

/// A request's filters, checked.
#[derive(Debug, Default)]
pub(crate) struct JobFilter {
    states: Vec<JobState>,
    node: Option<u64>,
    tenant: String,
    user: String,
    name: String,
    labels: BTreeMap<String, String>,
    submitted_since_ms: Option<u64>,
}

impl JobFilter {
    /// The filters of `req`; `Err` names a state the API does not know.
    pub(crate) fn of(req: &pb::ListJobsRequest) -> Result<Self, String> {
        let mut states = Vec::new();
        for s in &req.states {
            states.push(from_proto::job_state(*s).ok_or_else(|| format!("unknown job state {s}"))?);
        }
        Ok(Self {
            states,
            node: req.node_id,
            tenant: req.tenant.clone(),
            user: req.user.clone(),
            name: req.name.clone(),
            labels: req.labels.clone().into_iter().collect(),
            submitted_since_ms: req.submitted_since_ms,
        })
    }

    /// Whether `job` passes every filter (visibility to the caller is checked apart).
    pub(crate) fn matches(&self, job: &Job) -> bool {
        let spec = &job.spec;
        (self.states.is_empty() || self.states.contains(&job.state))
            && self.node.is_none_or(|n| job.on_node(n))
            && (self.tenant.is_empty() || spec.tenant == self.tenant)
            && (self.user.is_empty() || job.submitted_by.as_deref() == Some(self.user.as_str()))
            && (self.name.is_empty() || glob_matches(&self.name, &spec.name))
            && (self.labels.iter()).all(|(k, v)| spec.labels.get(k) == Some(v))
            && self
                .submitted_since_ms
                .is_none_or(|t| job.submitted_at_ms >= t)
    }
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::JobSpec;

    use super::*;

    fn job(name: &str, labels: &[(&str, &str)], by: Option<&str>, at: u64) -> Job {
        let spec = JobSpec {
            name: name.into(),
            labels: (labels.iter())
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..JobSpec::default()
        };
        let mut j = Job::pending(1, spec, None, at);
        j.submitted_by = by.map(str::to_owned);
        j
    }

    #[test]
    fn every_filter_must_hold() {
        let req = pb::ListJobsRequest {
            states: vec![pb::JobState::Pending as i32],
            user: "alice".into(),
            name: "sweep-*".into(),
            labels: [("team".to_owned(), "vision".to_owned())].into(),
            submitted_since_ms: Some(100),
            ..Default::default()
        };
        let f = JobFilter::of(&req).expect("valid");
        let team = [("team", "vision"), ("x", "y")];
        assert!(f.matches(&job("sweep-1", &team, Some("alice"), 100)));
        assert!(!f.matches(&job("train", &team, Some("alice"), 100)), "name");
        assert!(!f.matches(&job("sweep-1", &[("team", "nlp")], Some("alice"), 100)));
        assert!(!f.matches(&job("sweep-1", &team, Some("bob"), 100)), "user");
        assert!(!f.matches(&job("sweep-1", &team, None, 100)), "no owner");
        assert!(
            !f.matches(&job("sweep-1", &team, Some("alice"), 99)),
            "since"
        );
        let all = JobFilter::of(&pb::ListJobsRequest::default()).expect("valid");
        assert!(all.matches(&job("any", &[], None, 0)));
        let bad = pb::ListJobsRequest {
            states: vec![99],
            ..Default::default()
        };
        assert!(JobFilter::of(&bad).is_err());
    }
}
