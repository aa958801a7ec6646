//! A recording client: each submit or read goes to one named agent over a fresh connection with
//! a deadline, and is recorded as invoke, then ok / fail / info.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::history::{Event, OpKind, Phase, Recorder};

/// How a submission ended, as far as the client can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(u64),
    /// Certainly not applied (no connection, or a refusal of the request itself).
    Fail,
    /// Unknown: the request may have been applied.
    Info,
}

#[derive(Clone)]
pub struct Client {
    /// Mutual-TLS endpoints of the agents, as the cluster's admin.
    endpoints: BTreeMap<u64, Endpoint>,
    token: String,
    recorder: Arc<Recorder>,
}

impl Client {
    pub fn new(cluster: &gpu_tests::Cluster, recorder: Arc<Recorder>) -> Client {
        Client {
            endpoints: cluster
                .agents
                .keys()
                .map(|id| {
                    let endpoint = cluster
                        .endpoint(*id, Some(cluster.admin_identity()))
                        .expect("agent endpoint");
                    (*id, endpoint)
                })
                .collect(),
            token: cluster.admin_token(),
            recorder,
        }
    }

    pub fn nodes(&self) -> Vec<u64> {
        self.endpoints.keys().copied().collect()
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    async fn connect(
        &self,
        via: u64,
        deadline: Duration,
    ) -> Result<JobServiceClient<Channel>, String> {
        let endpoint = self.endpoints.get(&via).ok_or(format!("no agent n{via}"))?;
        let channel = endpoint
            .clone()
            .connect_timeout(deadline)
            .timeout(deadline)
            .connect()
            .await
            .map_err(|e| format!("connect n{via}: {e}"))?;
        Ok(JobServiceClient::new(channel))
    }

    fn request<T>(&self, msg: T, deadline: Duration) -> Result<tonic::Request<T>, String> {
        let mut req = tonic::Request::new(msg);
        let header = format!("Bearer {}", self.token)
            .parse()
            .map_err(|_| "token is not a valid header".to_owned())?;
        req.metadata_mut().insert("authorization", header);
        req.set_timeout(deadline);
        Ok(req)
    }

    /// Submit `spec` under `key` through agent `via`; records the operation.
    pub async fn submit(
        &self,
        process: &str,
        via: u64,
        spec: pb::JobSpec,
        key: &str,
        deadline: Duration,
    ) -> anyhow::Result<Outcome> {
        let base = Event {
            key: Some(key.to_owned()),
            via: Some(via),
            ..Event::new(process, Phase::Invoke, OpKind::Submit)
        };
        self.recorder.record(base.clone())?;
        let msg = pb::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: key.to_owned(),
        };
        let (outcome, event) = match self.connect(via, deadline).await {
            Err(e) => (
                Outcome::Fail,
                Event {
                    phase: Phase::Fail,
                    error: Some(e),
                    ..base
                },
            ),
            Ok(mut c) => match self.request(msg, deadline) {
                Err(e) => (
                    Outcome::Fail,
                    Event {
                        phase: Phase::Fail,
                        error: Some(e),
                        ..base
                    },
                ),
                Ok(req) => match c.submit_job(req).await {
                    Ok(resp) => {
                        let r = resp.into_inner();
                        let value = r.existing.then(|| "existing".to_owned());
                        let ev = Event {
                            phase: Phase::Ok,
                            job_id: Some(r.job_id),
                            value,
                            ..base
                        };
                        (Outcome::Ok(r.job_id), ev)
                    }
                    Err(s) => {
                        let (o, phase) = if definite(s.code()) {
                            (Outcome::Fail, Phase::Fail)
                        } else {
                            (Outcome::Info, Phase::Info)
                        };
                        let error = Some(format!("{:?}: {}", s.code(), s.message()));
                        (
                            o,
                            Event {
                                phase,
                                error,
                                ..base
                            },
                        )
                    }
                },
            },
        };
        self.recorder.record(event)?;
        Ok(outcome)
    }

    /// Read job `id`'s state through agent `via` (a linearizable read); records it. Returns
    /// the state name when the read succeeded.
    pub async fn read(
        &self,
        process: &str,
        via: u64,
        id: u64,
        deadline: Duration,
    ) -> anyhow::Result<Option<String>> {
        let base = Event {
            job_id: Some(id),
            via: Some(via),
            ..Event::new(process, Phase::Invoke, OpKind::Read)
        };
        self.recorder.record(base.clone())?;
        let msg = pb::GetJobRequest { id, stale: false };
        let result = match self.connect(via, deadline).await {
            Err(e) => Err(e),
            Ok(mut c) => match self.request(msg, deadline) {
                Err(e) => Err(e),
                Ok(req) => c
                    .get_job(req)
                    .await
                    .map(|j| state_name(j.into_inner().state))
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
            },
        };
        let (state, event) = match result {
            Ok(state) => (
                Some(state.clone()),
                Event {
                    phase: Phase::Ok,
                    value: Some(state),
                    ..base
                },
            ),
            Err(e) => (
                None,
                Event {
                    phase: Phase::Fail,
                    error: Some(e),
                    ..base
                },
            ),
        };
        self.recorder.record(event)?;
        Ok(state)
    }
}

/// Status codes that mean the request itself was refused, so it certainly took no effect.
fn definite(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::AlreadyExists
            | tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::OutOfRange
    )
}

/// `JobState` name for a wire value (`JOB_STATE_SUCCEEDED`, …).
pub fn state_name(state: i32) -> String {
    pb::JobState::try_from(state)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_else(|_| format!("UNKNOWN({state})"))
}
