//! The web console: HTML pages served by every agent on its API port, beside the gRPC services
//! and over the same TLS identity. A browser logs in with a token; every page is rendered on
//! the server from the public API's own handlers, called in-process with that token, so a page
//! can show or do exactly what `gpuctl` with the same token could, and nothing more. The
//! templates (maud) escape everything they interpolate; a small script (`assets/console.js`)
//! refreshes the parts of a page that server-sent events say have changed.

mod assets;
mod chart;
mod cluster;
mod cookie;
mod events;
mod failure;
mod frame;
mod guard;
mod job;
mod jobs;
mod login;
mod nodes;
mod scheduler;
mod session;
mod submit;
mod tenants;
mod trail;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::response::Redirect;
use axum::routing::{get, post};

use crate::api::alert::AlertApi;
use crate::api::audit::AuditApi;
use crate::api::cluster::ClusterApi;
use crate::api::gpu::GpuApi;
use crate::api::job::JobApi;
use crate::api::node::NodeApi;
use crate::api::scheduler::SchedulerApi;
use crate::api::tenant::TenantApi;
use crate::api::token::TokenApi;

/// The public API's handlers the pages are made from.
pub(crate) struct Apis {
    pub cluster: Arc<ClusterApi>,
    pub node: Arc<NodeApi>,
    pub gpu: Arc<GpuApi>,
    pub job: Arc<JobApi>,
    pub tenant: Arc<TenantApi>,
    pub alert: Arc<AlertApi>,
    pub audit: Arc<AuditApi>,
    pub token: Arc<TokenApi>,
    pub scheduler: Arc<SchedulerApi>,
    /// The console's live event streams (`events::MAX_STREAMS`).
    pub streams: Arc<tokio::sync::Semaphore>,
    /// Whether the port speaks TLS (the session cookie is then `Secure`).
    pub tls: bool,
}

pub(crate) type Shared = Arc<Apis>;

pub(crate) use events::streams as live_streams;

/// The console's routes, to be merged with the gRPC services' router.
pub(crate) fn routes(apis: Apis) -> Router {
    let pages = Router::new()
        .route("/", get(|| async { Redirect::to("/console/jobs") }))
        .route("/console", get(|| async { Redirect::to("/console/jobs") }))
        .route("/console/", get(|| async { Redirect::to("/console/jobs") }))
        .route("/console/login", get(login::page).post(login::login))
        .route("/console/logout", post(login::logout))
        .route("/console/cluster", get(cluster::page))
        .route("/console/nodes", get(nodes::page))
        .route("/console/gpus/{node}/{index}", get(nodes::gpu))
        .route("/console/jobs", get(jobs::page))
        .route("/console/jobs/rows", get(jobs::rows))
        .route("/console/jobs/{id}", get(job::page))
        .route("/console/jobs/{id}/panel", get(job::panel))
        .route("/console/jobs/{id}/{action}", post(job::act))
        .route("/console/submit", get(submit::page).post(submit::submit))
        .route("/console/tenants", get(tenants::page))
        .route("/console/scheduler", get(scheduler::page))
        .route("/console/scheduler/policy", post(scheduler::set_policy))
        .route("/console/scheduler/replay", post(scheduler::replay))
        .route("/console/alerts", get(trail::alerts))
        .route("/console/audit", get(trail::audit))
        .route("/console/events/jobs", get(events::jobs))
        .route("/console/events/logs/{id}", get(events::logs))
        .route("/console/assets/{file}", get(assets::serve))
        .with_state(Arc::new(apis));
    guard::layered(pages)
}
