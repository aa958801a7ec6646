//! gpuctl end to end against an in-process fake of the public API: exit codes, the stdout/stderr
//! split, raw log bytes, idempotent submits, failover. The fake answers from fixed scripts; the
//! real agents are tested in `tests/`.

use std::collections::HashMap;
use std::future::Future;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_server::{GpuService, GpuServiceServer};
use gpu_proto::v1::job_service_server::{JobService, JobServiceServer};
use gpu_proto::v1::node_service_server::{NodeService, NodeServiceServer};
use tonic::codegen::tokio_stream;
use tonic::{Request, Response, Status};

/// Job 1 goes Pending → Running → Succeeded over three polls; job 2 has failed; job 3 runs
/// forever; anything else does not exist. Job 4's log stream breaks after its first chunk the
/// first time it is read.
#[derive(Clone, Default)]
struct Fake {
    polls: Arc<Mutex<HashMap<u64, u32>>>,
    /// Offsets asked for by `JobLogs`, in order.
    log_offsets: Arc<Mutex<Vec<u64>>>,
    submits: Arc<Mutex<Vec<pb::SubmitJobRequest>>>,
    /// The `x-request-id` of each submission, in order.
    submit_request_ids: Arc<Mutex<Vec<String>>>,
    /// Every submission fails as a connection reset mid-call would (the answer lost).
    loses_submits: bool,
    /// How many more submissions to refuse as rate-limited (`u32::MAX`: all of them).
    busy_submits: Arc<Mutex<u32>>,
    faults: Arc<Mutex<Vec<pb::InjectFaultRequest>>>,
}

const LOG: &[u8] = b"hello \xff\x00world\n";

fn job(id: u64, state: pb::JobState) -> pb::Job {
    pb::Job {
        id,
        spec: Some(pb::JobSpec {
            name: format!("job{id}"),
            command: vec!["python".into(), "train.py".into()],
            gpus: 1,
            ..Default::default()
        }),
        state: state as i32,
        submitted_at_ms: 1_700_000_000_000,
        ..Default::default()
    }
}

impl Fake {
    fn lookup(&self, id: u64) -> Result<pb::Job, Status> {
        let mut polls = self.polls.lock().unwrap_or_else(PoisonError::into_inner);
        let n = polls.entry(id).or_default();
        *n += 1;
        let state = match (id, *n) {
            (1, 1) => pb::JobState::Pending,
            (1, 2) => pb::JobState::Running,
            (1, _) => pb::JobState::Succeeded,
            (2, _) => pb::JobState::Failed,
            (3, _) => pb::JobState::Running,
            _ => return Err(Status::not_found(format!("job j-{id} does not exist"))),
        };
        Ok(job(id, state))
    }
}

type LogStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::LogChunk, Status>> + Send + 'static>,
>;

#[tonic::async_trait]
impl JobService for Fake {
    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let request_id = req
            .metadata()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        self.submit_request_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request_id);
        if self.loses_submits {
            return Err(Status::unavailable("transport error: connection reset"));
        }
        {
            let mut busy = self
                .busy_submits
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *busy > 0 {
                if *busy != u32::MAX {
                    *busy -= 1;
                }
                return Err(Status::resource_exhausted(
                    "token t1 is over its rate limit",
                ));
            }
        }
        let req = req.into_inner();
        self.submits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(req.clone());
        if req.spec.is_some_and(|s| s.name == "bad") {
            return Err(Status::invalid_argument("job name \"bad\" is reserved"));
        }
        let existing = req.idempotency_key == "seen";
        Ok(Response::new(pb::SubmitJobResponse {
            job_id: if existing { 5 } else { 6 },
            existing,
        }))
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        self.lookup(req.into_inner().id).map(Response::new)
    }

    async fn list_jobs(
        &self,
        _: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        Ok(Response::new(pb::ListJobsResponse {
            jobs: vec![job(2, pb::JobState::Failed), job(3, pb::JobState::Running)],
            next_after_id: None,
            next_before_id: None,
        }))
    }

    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let mut job = job(req.into_inner().id, pb::JobState::Running);
        job.cancel_requested = true;
        Ok(Response::new(job))
    }

    async fn hold_job(
        &self,
        req: Request<pb::HoldJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let mut job = job(req.into_inner().id, pb::JobState::Pending);
        job.held = true;
        Ok(Response::new(job))
    }

    async fn release_job(
        &self,
        req: Request<pb::HoldJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        Ok(Response::new(job(
            req.into_inner().id,
            pb::JobState::Pending,
        )))
    }

    async fn update_job(
        &self,
        req: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let req = req.into_inner();
        let mut job = job(req.id, pb::JobState::Pending);
        if let Some(spec) = job.spec.as_mut() {
            spec.priority = req.priority;
        }
        Ok(Response::new(job))
    }

    type WatchJobsStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::WatchJobsResponse, Status>> + Send>,
    >;

    async fn watch_jobs(
        &self,
        _req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<Self::WatchJobsStream>, Status> {
        Err(Status::unimplemented("no watches here"))
    }

    async fn requeue_job(
        &self,
        req: Request<pb::RequeueJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        Ok(Response::new(job(
            req.into_inner().id,
            pb::JobState::Pending,
        )))
    }

    async fn explain_job(
        &self,
        req: Request<pb::ExplainJobRequest>,
    ) -> Result<Response<pb::JobExplanation>, Status> {
        let id = req.into_inner().id;
        if id != 7 {
            return Err(Status::not_found(format!("job j-{id} does not exist")));
        }
        Ok(Response::new(pb::JobExplanation {
            job_id: 7,
            state: pb::JobState::Pending as i32,
            reason: "waiting for 2 GPUs to be free".into(),
            queue_position: 2,
            pending_jobs: 4,
            estimated_start_ms: None,
            estimate_note: "no estimate".into(),
            policy: "fcfs+easy".into(),
        }))
    }

    type JobLogsStream = LogStream;

    async fn job_logs(
        &self,
        req: Request<pb::JobLogsRequest>,
    ) -> Result<Response<LogStream>, Status> {
        let req = req.into_inner();
        if req.job_id != 1 && req.job_id != 4 {
            return Err(Status::failed_precondition("job has not run yet"));
        }
        let first_read = {
            let mut offsets = self
                .log_offsets
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            offsets.push(req.offset);
            offsets.len() == 1
        };
        let skip = usize::try_from(req.offset)
            .unwrap_or(usize::MAX)
            .min(LOG.len());
        let chunks: Vec<Result<pb::LogChunk, Status>> = LOG[skip..]
            .chunks(6)
            .map(|c| {
                Ok(pb::LogChunk {
                    data: c.to_vec(),
                    skipped: 0,
                })
            })
            .collect();
        if req.job_id == 4 && first_read {
            // The stream's task dies mid-way: the client sees the HTTP/2 stream reset.
            let first = tokio_stream::iter(chunks.into_iter().take(1));
            let broken = DiesLater(Box::pin(tokio::time::sleep(
                std::time::Duration::from_millis(200),
            )));
            return Ok(Response::new(Box::pin(tokio_stream::StreamExt::chain(
                first, broken,
            ))));
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }
}

/// A stream that, once its delay is over, panics: the agent's stream task dies and the client
/// sees its HTTP/2 stream reset (the delay lets the chunks before it reach the client first).
struct DiesLater(std::pin::Pin<Box<tokio::time::Sleep>>);

impl tokio_stream::Stream for DiesLater {
    type Item = Result<pb::LogChunk, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        match self.0.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => panic!("fake agent dies mid-stream"),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

#[tonic::async_trait]
impl NodeService for Fake {
    /// n1 and n2 have a container runtime, n3 has none.
    async fn list_nodes(
        &self,
        _: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let node = |id: u64, runtime: bool| pb::Node {
            id,
            labels: runtime
                .then(|| {
                    (
                        "gpumesh.io/container-runtime".to_owned(),
                        "podman".to_owned(),
                    )
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        Ok(Response::new(pb::ListNodesResponse {
            nodes: vec![node(3, false), node(2, true), node(1, true)],
        }))
    }

    /// n1 pulls, n2 holds the image already, any other node fails.
    async fn pull_image(
        &self,
        req: Request<pb::PullImageRequest>,
    ) -> Result<Response<pb::PullImageResponse>, Status> {
        let req = req.into_inner();
        match req.node_id {
            1 | 2 => Ok(Response::new(pb::PullImageResponse {
                node_id: req.node_id,
                image: format!("docker.io/library/{}:latest", req.image),
                already_present: req.node_id == 2,
            })),
            n => Err(Status::aborted(format!(
                "pulling image {} on node {n}: unauthorized",
                req.image
            ))),
        }
    }

    async fn get_node(
        &self,
        req: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        Ok(Response::new(pb::Node {
            id: req.into_inner().id,
            addr: "10.0.0.1:7070".into(),
            status: pb::NodeStatus::Ready as i32,
            ..Default::default()
        }))
    }

    async fn label_node(
        &self,
        _: Request<pb::LabelNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn cordon_node(
        &self,
        req: Request<pb::CordonNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let req = req.into_inner();
        Ok(Response::new(pb::Node {
            id: req.id,
            addr: "10.0.0.1:7070".into(),
            status: pb::NodeStatus::Ready as i32,
            cordoned: req.cordoned,
            ..Default::default()
        }))
    }

    async fn drain_node(
        &self,
        _: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn inject_network_fault(
        &self,
        _: Request<pb::InjectNetworkFaultRequest>,
    ) -> Result<Response<pb::InjectNetworkFaultResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn remove_node(
        &self,
        _: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

#[tonic::async_trait]
impl GpuService for Fake {
    async fn list_gpus(
        &self,
        _: Request<pb::ListGpusRequest>,
    ) -> Result<Response<pb::ListGpusResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn get_energy(
        &self,
        _: Request<pb::GetEnergyRequest>,
    ) -> Result<Response<pb::EnergyReport>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn set_gpu_partition(
        &self,
        _: Request<pb::SetGpuPartitionRequest>,
    ) -> Result<Response<pb::Gpu>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn get_gpu_stats(
        &self,
        _: Request<pb::GetGpuStatsRequest>,
    ) -> Result<Response<pb::GetGpuStatsResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn inject_fault(
        &self,
        req: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(req.into_inner());
        Ok(Response::new(pb::InjectFaultResponse {}))
    }
}

/// Serve a fresh fake on a free port for the rest of the test process.
fn serve() -> (Fake, String) {
    serve_fake(Fake::default())
}

fn serve_fake(fake: Fake) -> (Fake, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    let served = fake.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().expect("addr"))
                    .expect("bind");
            tx.send(incoming.local_addr().expect("addr").to_string())
                .expect("send");
            tonic::transport::Server::builder()
                .add_service(JobServiceServer::new(served.clone()))
                .add_service(NodeServiceServer::new(served.clone()))
                .add_service(GpuServiceServer::new(served))
                .serve_with_incoming(incoming)
                .await
                .expect("serve");
        });
    });
    (fake, rx.recv().expect("address"))
}

fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

fn gpuctl(endpoint: &str, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .env_remove("GPUCTL_ENDPOINT")
        .env_remove("GPUCTL_TOKEN")
        .env_remove("GPUCTL_TOKEN_FILE")
        .env("GPUCTL_CONFIG", "/nonexistent/gpuctl.toml")
        .output()
        .expect("run gpuctl");
    Run {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn text(run: &Run) -> String {
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn wait_exits_0_on_success_and_prints_the_job() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["job", "wait", "j-1"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        text(&run).contains("State:       Succeeded\n"),
        "{}",
        text(&run)
    );
    // Not a terminal: no progress line.
    assert_eq!(run.stderr, "");
}

#[test]
fn wait_exits_1_on_failure() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["-o", "json", "job", "wait", "2"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let job: serde_json::Value = serde_json::from_slice(&run.stdout).expect("json");
    assert_eq!(job["state"], "failed");
    assert_eq!(job["id"], 2);
}

#[test]
fn wait_timeout_names_the_state() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["job", "wait", "3", "--timeout", "1200ms"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stdout.is_empty());
    assert_eq!(run.stderr, "error: timed out after 1.2s, job is Running\n");
}

#[test]
fn why_prints_the_reason_position_and_estimate() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["-o", "json", "job", "why", "j-7"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let why: serde_json::Value = serde_json::from_slice(&run.stdout).expect("json");
    assert_eq!(why["reason"], "waiting for 2 GPUs to be free");
    assert_eq!(
        (why["queue_position"].as_u64(), why["jobs_ahead"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(why["estimated_start_ms"], serde_json::Value::Null);
    let run = gpuctl(&addr, &["job", "why", "99"]);
    assert_eq!(run.code, Some(2));
    assert_eq!(run.stderr, "error: not found: job j-99 does not exist\n");
}

#[test]
fn wait_for_a_missing_job_fails_at_once() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["job", "wait", "99"]);
    assert_eq!(run.code, Some(2));
    assert_eq!(run.stderr, "error: not found: job j-99 does not exist\n");
}

#[test]
fn logs_are_copied_byte_for_byte() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["job", "logs", "j-1"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, LOG);
    let run = gpuctl(&addr, &["job", "logs", "2", "--follow"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("failed precondition: job has not run yet")
    );
}

#[test]
fn logs_resume_at_the_offset_written_when_the_stream_breaks() {
    let (fake, addr) = serve();
    let run = gpuctl(&addr, &["job", "logs", "4"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, LOG);
    let offsets = fake
        .log_offsets
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(offsets, [0, 6]);
}

#[test]
fn an_answer_lost_mid_call_is_retried_on_the_next_agent_as_the_same_request() {
    let (lossy, lossy_addr) = serve_fake(Fake {
        loses_submits: true,
        ..Fake::default()
    });
    let (fake, addr) = serve();
    let run = gpuctl(
        &format!("{lossy_addr},{addr}"),
        &["job", "submit", "--", "/bin/train.sh"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let ids = |f: &Fake| {
        f.submit_request_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    };
    let (first, retry) = (ids(&lossy), ids(&fake));
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(!first[0].is_empty(), "no request id sent");
    assert_eq!(retry, first, "the retry is another request");
    // The next call is another request.
    let again = gpuctl(&addr, &["job", "submit", "--", "/bin/train.sh"]);
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    let after = ids(&fake);
    assert_ne!(after[1], after[0]);
}

#[test]
fn a_busy_cluster_is_asked_again_as_the_same_request_until_the_deadline() {
    let busy = |refusals| Fake {
        busy_submits: Arc::new(Mutex::new(refusals)),
        ..Fake::default()
    };
    let ids = |f: &Fake| {
        f.submit_request_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    };
    let (fake, addr) = serve_fake(busy(2));
    let run = gpuctl(&addr, &["job", "submit", "--", "/bin/train.sh"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(text(&run), "j-6\n");
    let tries = ids(&fake);
    assert_eq!(tries.len(), 3, "{tries:?}");
    assert!(tries.iter().all(|id| *id == tries[0]), "{tries:?}");

    let (fake, addr) = serve_fake(busy(u32::MAX));
    let run = gpuctl(
        &addr,
        &["--timeout", "1s", "job", "submit", "--", "/bin/train.sh"],
    );
    assert_ne!(run.code, Some(0));
    assert!(run.stderr.contains("rate limit"), "{}", run.stderr);
    assert!(ids(&fake).len() > 1, "asked once only");
}

#[test]
fn submit_fails_over_with_one_generated_key() {
    let (fake, addr) = serve();
    let endpoints = format!("{},{addr}", dead_addr());
    let run = gpuctl(
        &endpoints,
        &["job", "submit", "--gpus", "2", "--", "/bin/train.sh", "-x"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(text(&run), "j-6\n");
    assert_eq!(run.stderr, "");
    let submits = fake
        .submits
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(submits.len(), 1);
    let key = &submits[0].idempotency_key;
    assert!(
        key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    let spec = submits[0].spec.clone().expect("spec");
    assert_eq!((spec.name.as_str(), spec.gpus), ("train.sh", 2));
}

#[test]
fn submit_reports_an_existing_job_on_stderr() {
    let (_, addr) = serve();
    let run = gpuctl(
        &addr,
        &["job", "submit", "--idempotency-key", "seen", "--", "x"],
    );
    assert_eq!(run.code, Some(0));
    assert_eq!(text(&run), "j-5\n");
    assert_eq!(
        run.stderr,
        "job j-5 already existed (idempotency key \"seen\")\n"
    );
    let run = gpuctl(
        &addr,
        &[
            "-o",
            "json",
            "job",
            "submit",
            "--idempotency-key",
            "seen",
            "--",
            "x",
        ],
    );
    let reply: serde_json::Value = serde_json::from_slice(&run.stdout).expect("json");
    assert_eq!(reply, serde_json::json!({"job_id": 5, "existing": true}));
}

#[test]
fn submit_prints_the_servers_invalid_argument() {
    let (_, addr) = serve();
    let run = gpuctl(&addr, &["job", "submit", "--name", "bad", "--", "x"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stdout.is_empty());
    assert_eq!(
        run.stderr,
        "error: invalid argument: job name \"bad\" is reserved\n"
    );
}

#[test]
fn list_cancel_cordon_inject_render() {
    let (fake, addr) = serve();
    let run = gpuctl(&addr, &["job", "list"]);
    assert_eq!(run.code, Some(0));
    let table = text(&run);
    assert!(
        table.starts_with("ID   NAME  TENANT   STATE    GPUS  NODE  AGE"),
        "{table}"
    );
    assert!(
        table.contains("j-3  job3  default  Running  1     -"),
        "{table}"
    );

    let run = gpuctl(&addr, &["job", "cancel", "3"]);
    assert!(text(&run).contains("State:       Running (cancel requested)\n"));

    let run = gpuctl(&addr, &["node", "cordon", "n4"]);
    assert!(
        text(&run).contains("n4    10.0.0.1:7070  Ready,cordoned  -     0"),
        "{}",
        text(&run)
    );

    let run = gpuctl(&addr, &["debug", "inject", "n4", "2", "XID:79"]);
    assert_eq!(text(&run), "injected xid:79 into n4/2\n");
    let faults = fake
        .faults
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(
        (
            faults[0].node_id,
            faults[0].gpu_index,
            faults[0].fault,
            faults[0].xid
        ),
        (4, 2, pb::GpuFault::Xid as i32, 79)
    );
}

#[test]
fn image_pull_answers_per_node_and_fails_when_any_node_fails() {
    let (_, addr) = serve();
    let one = gpuctl(&addr, &["image", "pull", "--node", "n1", "busybox"]);
    assert_eq!(one.code, Some(0), "{}", one.stderr);
    assert!(
        text(&one).contains("n1    docker.io/library/busybox:latest  pulled"),
        "{}",
        text(&one)
    );
    let all = gpuctl(&addr, &["-o", "json", "image", "pull", "--all", "busybox"]);
    assert_eq!(all.code, Some(0), "{}", all.stderr);
    let v: serde_json::Value = serde_json::from_slice(&all.stdout).expect("json");
    let nodes: Vec<(u64, &str)> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["node_id"].as_u64().unwrap_or_default(),
                r["result"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [(1, "pulled"), (2, "already-present")],
        "only the nodes with a runtime"
    );
    let failed = gpuctl(&addr, &["image", "pull", "--node", "3", "busybox"]);
    assert_eq!(failed.code, Some(2));
    assert!(failed.stderr.contains("n3: "), "{}", failed.stderr);
    assert!(failed.stderr.contains("unauthorized"), "{}", failed.stderr);
    assert!(text(&failed).contains("failed"), "{}", text(&failed));
    let neither = gpuctl(&addr, &["image", "pull", "busybox"]);
    assert_eq!(neither.code, Some(2));
    assert!(
        neither.stderr.contains("--node, or --all"),
        "{}",
        neither.stderr
    );
}
