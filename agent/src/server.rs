//! The agent's one server on its API port: every gRPC service (the public `gpumesh.v1` ones
//! and the internal peer service) is registered here once, and the same registration marks it
//! serving in gRPC health, so the two lists cannot drift apart; the web console's routes are
//! merged beside them, made from the same handlers. Above both `api/` and `console/`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_server::RaftPeerServer;
use gpu_proto::v1::alert_service_server::AlertServiceServer;
use gpu_proto::v1::audit_service_server::AuditServiceServer;
use gpu_proto::v1::cert_service_server::CertServiceServer;
use gpu_proto::v1::cluster_service_server::ClusterServiceServer;
use gpu_proto::v1::gpu_service_server::GpuServiceServer;
use gpu_proto::v1::job_service_server::JobServiceServer;
use gpu_proto::v1::node_service_server::NodeServiceServer;
use gpu_proto::v1::scheduler_service_server::SchedulerServiceServer;
use gpu_proto::v1::tenant_service_server::TenantServiceServer;
use gpu_proto::v1::token_service_server::TokenServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::api::alert::AlertApi;
use crate::api::audit::AuditApi;
use crate::api::auth::Auth;
use crate::api::auth::limit::Limits;
use crate::api::auth::peer::PeerCheck;
use crate::api::cert::CertApi;
use crate::api::cluster::ClusterApi;
use crate::api::gpu::GpuApi;
use crate::api::job::JobApi;
use crate::api::job_watch;
use crate::api::node::NodeApi;
use crate::api::peer::{PeerService, check_protocol};
use crate::api::scheduler::SchedulerApi;
use crate::api::tenant::TenantApi;
use crate::api::token::TokenApi;
use crate::config::ApiSettings;
use crate::gpu::GpuBackend;
use crate::monitor::Telemetry;
use crate::raft::Cluster;
use crate::raft::transport_faults::TransportFaults;
use crate::tls::TlsIdentity;

/// Everything the gRPC services need.
pub(crate) struct Services {
    pub cluster: Cluster,
    pub reachable_within: Duration,
    pub gpus: Arc<dyn GpuBackend>,
    pub telemetry: Telemetry,
    /// The config file's alert rules.
    pub alert_rules: Vec<gpu_raft_store::AlertRule>,
    pub jobs_dir: PathBuf,
    pub tls: Option<TlsIdentity>,
    pub api: ApiSettings,
    /// The live transport faults, when `raft.fault_injection` lets an admin set them.
    pub transport_faults: Option<TransportFaults>,
    /// This node's container images.
    pub images: crate::host::images::NodeImages,
}

/// Serve every service on `listener` (TLS when this agent has an identity) until `cancel`;
/// a server that cannot start or fails stops the agent.
pub(crate) async fn serve(listener: TcpListener, s: Services, cancel: CancellationToken) {
    let tls_config = match &s.tls {
        Some(identity) => match server_tls(identity) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "cannot set up TLS; stopping the agent");
                cancel.cancel();
                return;
            }
        },
        None => None,
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    let mut serving = Vec::new();
    let routes = register(Routes::new(health_service), &mut serving, s);
    let router = server().add_routes(routes.prepare());
    for name in serving {
        health
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let result = match tls_config {
        Some(config) => {
            let incoming = crate::tls::server::incoming(listener, config, cancel.clone());
            router
                .serve_with_incoming_shutdown(incoming, cancel.cancelled())
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), cancel.cancelled())
                .await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "gRPC server failed; stopping the agent");
        cancel.cancel();
    }
}

fn server_tls(identity: &TlsIdentity) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    crate::tls::server::server_config(identity.slot.clone())
}

/// The server's limits against hostile or broken clients and dead peers.
fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        // No request runs forever (streams are not cut: the limit covers producing the
        // response), one connection cannot monopolise the agent, and dead peers are noticed.
        .timeout(Duration::from_secs(60))
        // Browsers reach the web console over HTTP/1.1 when they do not negotiate HTTP/2.
        .accept_http1(true)
        .concurrency_limit_per_connection(256)
        // Raft calls carry deadlines of one heartbeat (100 ms): under load many are cancelled,
        // each a stream reset. At h2's default of 20 pending resets the server answers
        // GOAWAY(ENHANCE_YOUR_CALM) and drops the peer's connection, which turns a slow moment
        // into missed heartbeats and a TLS reconnect. Peers are authenticated; allow more.
        .http2_max_pending_accept_reset_streams(Some(1024))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
}

/// Note `service`'s name as serving and hand it back, for `add_service`.
fn serving<S: NamedService>(names: &mut Vec<&'static str>, service: S) -> S {
    names.push(S::NAME);
    service
}

/// Add every service to `routes`, each once, noting its name in `names`, and the web console
/// beside them, made from the same handlers.
fn register(routes: Routes, names: &mut Vec<&'static str>, s: Services) -> Routes {
    let max = gpu_proto::MAX_MESSAGE_BYTES;
    let cluster = s.cluster;
    let tls = s.tls.is_some();
    let peers = PeerCheck {
        tls,
        state: cluster.state.clone(),
    };
    let auth = Auth {
        cluster: cluster.clone(),
        peers: peers.clone(),
        limits: Arc::new(std::sync::Mutex::new(Limits::new(&s.api))),
    };
    let cluster_id = s
        .tls
        .as_ref()
        .and_then(|t| t.current())
        .and_then(|t| crate::tls::pki::fingerprint(&t.ca_cert_pem).ok())
        .unwrap_or_else(|| "insecure".into());
    let peer = RaftPeerServer::new(PeerService {
        cluster: cluster.clone(),
        reachable_within: s.reachable_within,
        gpus: s.gpus.clone(),
        telemetry: s.telemetry.clone(),
        jobs_dir: s.jobs_dir.clone(),
        peers,
        auth: auth.clone(),
        tls: s.tls.clone(),
        images: s.images.clone(),
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let cluster_api = ClusterApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        reachable_within: s.reachable_within,
        cluster_id,
    };
    let node_api = NodeApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        transport_faults: s.transport_faults,
        images: s.images.clone(),
    };
    let alert_api = AlertApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        configured: s.alert_rules,
    };
    let scheduler_api = SchedulerApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
    };
    let tenant_api = TenantApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        tls: s.tls.clone(),
    };
    let job_api = JobApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        jobs_dir: s.jobs_dir,
        max_array_tasks: s.api.max_array_tasks,
        watchers: job_watch::watchers(),
    };
    let gpu_api = GpuApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        gpus: s.gpus,
        telemetry: s.telemetry,
    };
    let token_api = TokenApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
    };
    let audit_api = AuditApi {
        cluster: cluster.clone(),
        auth: auth.clone(),
        tls: s.tls.clone(),
    };
    let cert_api = CertApi {
        cluster,
        auth,
        tls: s.tls,
    };
    let apis = crate::console::Apis {
        cluster: Arc::new(cluster_api),
        node: Arc::new(node_api),
        gpu: Arc::new(gpu_api),
        job: Arc::new(job_api),
        tenant: Arc::new(tenant_api),
        alert: Arc::new(alert_api),
        audit: Arc::new(audit_api),
        token: Arc::new(token_api),
        scheduler: Arc::new(scheduler_api),
        streams: crate::console::live_streams(),
        tls,
    };
    let mut routes = routes
        .add_service(InterceptedService::new(
            serving(names, peer),
            check_protocol,
        ))
        .add_service(serving(
            names,
            ClusterServiceServer::from_arc(apis.cluster.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            NodeServiceServer::from_arc(apis.node.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            SchedulerServiceServer::from_arc(apis.scheduler.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            AlertServiceServer::from_arc(apis.alert.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            TenantServiceServer::from_arc(apis.tenant.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            JobServiceServer::from_arc(apis.job.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            GpuServiceServer::from_arc(apis.gpu.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            TokenServiceServer::from_arc(apis.token.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            AuditServiceServer::from_arc(apis.audit.clone()).max_decoding_message_size(max),
        ))
        .add_service(serving(
            names,
            CertServiceServer::new(cert_api).max_decoding_message_size(max),
        ));
    let grpc = std::mem::take(routes.axum_router_mut());
    *routes.axum_router_mut() = grpc.merge(crate::console::routes(apis));
    routes
}
