//! `run`: the agent's whole life, as one linear script. Every background task is started here,
//! takes the shared cancellation token, and is joined (with a deadline) on shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use gpu_proto::internal::v1::raft_peer_server::RaftPeerServer;
use gpu_proto::v1::cluster_service_server::ClusterServiceServer;
use gpu_proto::v1::node_service_server::NodeServiceServer;
use gpu_raft_store::{Command, Raft};
use openraft::BasicNode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::TcpIncoming;
use tracing::{info, warn};

use crate::autopilot::Autopilot;
use crate::cluster::Cluster;
use crate::cluster_service::ClusterApi;
use crate::config::Config;
use crate::contact::ContactBook;
use crate::node_service::NodeApi;
use crate::peer_client::PeerClients;
use crate::peer_service::PeerService;
use crate::raft_network::NetworkFactory;

const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub async fn run(config: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    let node_id = config.node_id;
    info!(node_id, data_dir = %config.data_dir.display(), "opening data directory");
    let (data_dir, log, sm) = gpu_raft_store::open(&config.data_dir)?;
    let state = sm.reader();
    let committed = log.committed_index();

    info!(node_id, "starting raft");
    let contacts = ContactBook::default();
    let peers = PeerClients::default();
    let network = NetworkFactory {
        peers: peers.clone(),
        contacts: contacts.clone(),
    };
    let raft = Raft::new(
        node_id,
        Arc::new(config.openraft()?),
        network.clone(),
        log,
        sm,
    )
    .await
    .context("starting raft")?;
    let cluster = Cluster::new(raft.clone(), state, committed, &network, &config);

    info!(node_id, listen = %config.listen, advertise = %config.advertise, "serving gRPC");
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let tasks = TaskTracker::new();
    tasks.spawn(serve(
        listener,
        cluster.clone(),
        config.reachable_within(),
        cancel.clone(),
    ));

    let started = enter_cluster(&config, &cluster, &tasks, &cancel).await;
    if let Err(e) = started {
        shutdown(&cancel, &tasks, &raft).await;
        return Err(e);
    }

    info!(node_id, "registering this node");
    tasks.spawn(register(cluster.clone(), config.clone(), cancel.clone()));
    info!(node_id, "starting autopilot");
    let autopilot = Autopilot {
        cluster: cluster.clone(),
        dead_voter_after: config.autopilot.dead_voter_after,
        reachable_within: config.reachable_within(),
        interval: Duration::from_millis(500),
    };
    tasks.spawn(autopilot.run(cancel.clone()));
    info!(node_id, "agent ready");

    cancel.cancelled().await;
    info!(node_id, "shutting down");
    shutdown(&cancel, &tasks, &raft).await;
    drop(data_dir);
    Ok(())
}

/// Bootstrap a new cluster, join an existing one, or (with state on disk) resume membership.
async fn enter_cluster(
    config: &Config,
    cluster: &Cluster,
    tasks: &TaskTracker,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let initialized = cluster
        .raft
        .is_initialized()
        .await
        .context("reading raft state")?;
    if initialized {
        info!(node_id = config.node_id, "resuming from the data directory");
        // Ask to be (re)admitted in the background: a no-op for a current member, and the way
        // back in for a member the autopilot removed while it was down.
        let seeds = rejoin_seeds(config, cluster);
        if !seeds.is_empty() {
            let (cluster, config, cancel) = (cluster.clone(), config.clone(), cancel.clone());
            tasks.spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    r = cluster.join_via(&seeds, config.node_id, &config.advertise, config.join_timeout) => {
                        if let Err(e) = r { warn!(error = %e, "could not confirm membership with the cluster"); }
                    }
                }
            });
        }
        return Ok(());
    }
    if config.bootstrap {
        info!(node_id = config.node_id, "bootstrapping a new cluster");
        let members = BTreeMap::from([(config.node_id, BasicNode::new(&config.advertise))]);
        cluster
            .raft
            .initialize(members)
            .await
            .context("initializing the cluster")?;
        return Ok(());
    }
    if config.join.is_empty() {
        bail!(
            "data directory {} holds no cluster state: start with --bootstrap to create a cluster \
             or --join ADDR to join one",
            config.data_dir.display()
        );
    }
    info!(node_id = config.node_id, seeds = ?config.join, "joining the cluster");
    let joined = tokio::select! {
        () = cancel.cancelled() => bail!("cancelled while joining"),
        r = cluster.join_via(&config.join, config.node_id, &config.advertise, config.join_timeout) => r,
    };
    let voter = joined.with_context(|| {
        format!(
            "could not join the cluster through {} within {:?}",
            config.join.join(","),
            config.join_timeout
        )
    })?;
    info!(node_id = config.node_id, voter, "joined the cluster");
    Ok(())
}

/// Where to ask for readmission: configured seeds plus every member we last knew of.
fn rejoin_seeds(config: &Config, cluster: &Cluster) -> Vec<String> {
    let mut seeds: BTreeSet<String> = config.join.iter().cloned().collect();
    seeds.extend(
        cluster
            .view()
            .members
            .into_iter()
            .filter(|(id, _)| *id != config.node_id)
            .map(|(_, a)| a),
    );
    seeds.into_iter().collect()
}

/// Announce this node (address, labels) through Raft, retrying until it lands.
async fn register(cluster: Cluster, config: Config, cancel: CancellationToken) {
    let cmd = Command::RegisterNode {
        node: config.node_id,
        addr: config.advertise.clone(),
        labels: config.labels.clone(),
        inventory: Default::default(),
    };
    loop {
        match cluster.write(cmd.clone()).await {
            Ok(()) => {
                info!(node_id = config.node_id, "registered");
                return;
            }
            Err(e) => warn!(node_id = config.node_id, error = %e, "registration failed; retrying"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn serve(
    listener: TcpListener,
    cluster: Cluster,
    reachable_within: Duration,
    cancel: CancellationToken,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ClusterServiceServer<ClusterApi>>()
        .await;
    health.set_serving::<NodeServiceServer<NodeApi>>().await;
    let max = gpu_proto::MAX_MESSAGE_BYTES;
    let peer = RaftPeerServer::new(PeerService {
        cluster: cluster.clone(),
        reachable_within,
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let cluster_api = ClusterServiceServer::new(ClusterApi {
        cluster: cluster.clone(),
        reachable_within,
    })
    .max_decoding_message_size(max);
    let node_api = NodeServiceServer::new(NodeApi { cluster }).max_decoding_message_size(max);
    let result = tonic::transport::Server::builder()
        .timeout(Duration::from_secs(30))
        .add_service(health_service)
        .add_service(peer)
        .add_service(cluster_api)
        .add_service(node_api)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), cancel.cancelled())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "gRPC server failed; stopping the agent");
        cancel.cancel();
    }
}

async fn shutdown(cancel: &CancellationToken, tasks: &TaskTracker, raft: &Raft) {
    cancel.cancel();
    tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait())
        .await
        .is_err()
    {
        warn!("background tasks did not stop within {SHUTDOWN_GRACE:?}");
    }
    if let Err(e) = raft.shutdown().await {
        warn!(error = %e, "raft did not shut down cleanly");
    }
}
