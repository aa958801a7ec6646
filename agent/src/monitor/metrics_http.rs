//! `/metrics` over plain HTTP/1.1 for Prometheus (`monitor.metrics_listen`, off unless set):
//! gathers a `prometheus::Scrape` from the local replica and telemetry on every request. Read
//! only, and it exposes no secret; bind it to an address only your scrapers reach. Slow clients
//! are cut off (header deadline) and connections are capped.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::{JobId, JobState};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Telemetry;
use super::attribution::job_of_pid;
use super::prometheus::{self, BoundJob, Scrape};
use crate::gpu::GpuDevice;
use crate::raft::Cluster;

/// Concurrent scrapes served; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 16;
/// A client has this long to send its request headers.
const HEADER_DEADLINE: Duration = Duration::from_secs(5);

/// What a scrape reads.
#[derive(Clone)]
pub(crate) struct MetricsSource {
    pub cluster: Cluster,
    pub telemetry: Telemetry,
    pub devices: Arc<Vec<GpuDevice>>,
    pub hostname: Arc<str>,
}

pub(crate) struct MetricsServer {
    pub listener: TcpListener,
    pub source: MetricsSource,
}

impl MetricsServer {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = JoinSet::new();
        loop {
            let permit = tokio::select! {
                () = cancel.cancelled() => break,
                p = permits.clone().acquire_owned() => p.expect("never closed"),
            };
            let (stream, peer) = tokio::select! {
                () = cancel.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "accepting a metrics connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let source = self.source.clone();
            let cancel = cancel.clone();
            connections.spawn(async move {
                let _permit = permit;
                let service = hyper::service::service_fn(move |req| {
                    let source = source.clone();
                    async move { Ok::<_, Infallible>(answer(&source, &req)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_DEADLINE)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    () = cancel.cancelled() => {}
                    served = conn => if let Err(e) = served {
                        debug!(%peer, error = %e, "metrics connection ended");
                    },
                }
            });
            while connections.try_join_next().is_some() {}
        }
        connections.shutdown().await;
    }
}

fn answer(source: &MetricsSource, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "only /metrics is served here\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".into());
    }
    let mut response = reply(StatusCode::OK, exposition(source));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// The exposition as of now.
pub(crate) fn exposition(source: &MetricsSource) -> String {
    let node_id = source.cluster.id;
    let latest = source.telemetry.latest();
    let (bound, jobs_by_state, pending_by_tenant, open_alerts, accuracy) =
        source.cluster.state.read(|s| {
            let mut bound = BTreeMap::new();
            let mut by_state = BTreeMap::new();
            let mut pending = BTreeMap::new();
            for job in s.jobs.values() {
                *by_state.entry(job.state.to_string()).or_insert(0) += 1;
                if job.state == JobState::Pending {
                    *pending.entry(job.spec.tenant.clone()).or_insert(0) += 1;
                }
                if job.state.is_terminal() {
                    continue;
                }
                let Some(b) = job.binding.as_ref().filter(|b| b.node == node_id) else {
                    continue;
                };
                for gpu in &b.gpus {
                    let tenant = job.spec.tenant.clone();
                    bound.insert(*gpu, BoundJob { id: job.id, tenant });
                }
            }
            let mut alerts = BTreeMap::from([("critical", 0), ("warning", 0)]);
            for a in s.alerts.values().filter(|a| a.is_open()) {
                *alerts.entry(a.severity.name()).or_insert(0) += 1;
            }
            (
                bound,
                by_state,
                pending,
                alerts,
                crate::scheduler::accuracy(s),
            )
        });
    let mut process_memory: BTreeMap<(u32, Option<JobId>), u64> = BTreeMap::new();
    for r in &latest {
        for p in &r.sample.processes {
            *process_memory
                .entry((r.sample.index, job_of_pid(p.pid)))
                .or_insert(0) += p.used_mib;
        }
    }
    let raft = source.cluster.view();
    prometheus::render(&Scrape {
        hostname: &source.hostname,
        node_id,
        devices: &source.devices,
        latest: &latest,
        bound: &bound,
        process_memory: &process_memory,
        raft: &raft,
        jobs_by_state: &jobs_by_state,
        pending_by_tenant: &pending_by_tenant,
        open_alerts: &open_alerts,
        accuracy: &accuracy,
    })
}

/// This host's name, as dcgm-exporter's `Hostname` label shows it.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}
