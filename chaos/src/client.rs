//! A recording client: each submit or read goes to one named agent over a fresh connection with
//! a deadline, and is recorded as invoke, then ok / fail / info.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_client::ClusterServiceClient;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::node_service_client::NodeServiceClient;
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

/// What makes a submission's retries one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyed {
    /// The job's idempotency key.
    Idempotency,
    /// The request id alone (`x-request-id`), the job keyless.
    RequestId,
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

    async fn channel(&self, via: u64, deadline: Duration) -> Result<Channel, String> {
        let endpoint = self.endpoints.get(&via).ok_or(format!("no agent n{via}"))?;
        endpoint
            .clone()
            .connect_timeout(deadline)
            .timeout(deadline)
            .connect()
            .await
            .map_err(|e| format!("connect n{via}: {e}"))
    }

    /// A job client connected to `via`, and `msg` as a request with our token and `deadline`.
    async fn connect<T>(
        &self,
        via: u64,
        msg: T,
        deadline: Duration,
    ) -> Result<(JobServiceClient<Channel>, tonic::Request<T>), String> {
        let c = JobServiceClient::new(self.channel(via, deadline).await?);
        Ok((c, self.request(msg, deadline)?))
    }

    /// Agent `via`'s own view of the cluster (a stale read: what it believes now), not
    /// recorded — the observer records what it needs.
    pub async fn own_status(
        &self,
        via: u64,
        deadline: Duration,
    ) -> Result<pb::ClusterStatus, String> {
        let mut c = ClusterServiceClient::new(self.channel(via, deadline).await?);
        let req = self.request(pb::GetStatusRequest { stale: true }, deadline)?;
        c.get_status(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    }

    /// Put `req`'s transport faults in force on agent `via` (its `node_id`), as the admin; not
    /// recorded — the nemesis records what it does.
    pub async fn inject_network_fault(
        &self,
        via: u64,
        req: pb::InjectNetworkFaultRequest,
        deadline: Duration,
    ) -> Result<(), String> {
        let mut c = NodeServiceClient::new(self.channel(via, deadline).await?);
        let req = self.request(req, deadline)?;
        c.inject_network_fault(req)
            .await
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
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

    /// Submit `spec` under idempotency key `key` through agent `via`; records the operation.
    pub async fn submit(
        &self,
        process: &str,
        via: u64,
        spec: pb::JobSpec,
        key: &str,
        deadline: Duration,
    ) -> anyhow::Result<Outcome> {
        self.submit_keyed(process, via, spec, key, Keyed::Idempotency, deadline)
            .await
    }

    /// `submit`, with `key` sent as `keyed` says: as the idempotency key, or, as a raw API
    /// client without one would, only as the request id (`x-request-id`) of every try, where
    /// exactly-once writes alone keep retries from creating a job each. Recorded under `key`.
    pub async fn submit_keyed(
        &self,
        process: &str,
        via: u64,
        spec: pb::JobSpec,
        key: &str,
        keyed: Keyed,
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
            idempotency_key: match keyed {
                Keyed::Idempotency => key.to_owned(),
                Keyed::RequestId => String::new(),
            },
            hold: false,
        };
        let connected = self
            .connect(via, msg, deadline)
            .await
            .and_then(|(c, mut req)| {
                if keyed == Keyed::RequestId {
                    let id = key
                        .parse()
                        .map_err(|_| format!("{key:?} cannot be a header"))?;
                    req.metadata_mut().insert("x-request-id", id);
                }
                Ok((c, req))
            });
        let (outcome, event) = match connected {
            Err(e) => (
                Outcome::Fail,
                Event {
                    phase: Phase::Fail,
                    error: Some(e),
                    ..base
                },
            ),
            Ok((mut c, req)) => match c.submit_job(req).await {
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
        };
        self.recorder.record(event)?;
        Ok(outcome)
    }

    /// Read job `id`'s state through agent `via` (a linearizable read); records it with the
    /// job's generation. Returns the state name (`NOT_FOUND` for no such job) when the read
    /// succeeded.
    pub async fn read(
        &self,
        process: &str,
        via: u64,
        id: u64,
        deadline: Duration,
    ) -> anyhow::Result<Option<String>> {
        self.read_with(process, via, id, deadline, false).await
    }

    /// `read`, or with `stale` a read of `via`'s local replica without asking the leader
    /// (`--stale`): what the checkers must catch when it is taken for a linearizable one.
    pub async fn read_with(
        &self,
        process: &str,
        via: u64,
        id: u64,
        deadline: Duration,
        stale: bool,
    ) -> anyhow::Result<Option<String>> {
        let base = Event {
            job_id: Some(id),
            via: Some(via),
            ..Event::new(process, Phase::Invoke, OpKind::Read)
        };
        self.recorder.record(base.clone())?;
        let msg = pb::GetJobRequest {
            id,
            stale,
            array_index: None,
        };
        let result = match self.connect(via, msg, deadline).await {
            Err(e) => Err(e),
            Ok((mut c, req)) => match c.get_job(req).await {
                Ok(j) => {
                    let j = j.into_inner();
                    Ok((state_name(j.state), Some(j.generation)))
                }
                // A linearizable "no such job" is an answer too.
                Err(s) if s.code() == tonic::Code::NotFound => Ok((NOT_FOUND.to_owned(), None)),
                Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
            },
        };
        let (state, event) = match result {
            Ok((state, generation)) => (
                Some(state.clone()),
                Event {
                    phase: Phase::Ok,
                    value: Some(state),
                    generation,
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

/// The value of a read that found no such job.
pub const NOT_FOUND: &str = "NOT_FOUND";

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
