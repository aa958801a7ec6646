//! `run`: the agent's whole life, as one linear script. Every background task is started here,
//! takes the shared cancellation token, and is joined (with a deadline) on shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use gpu_raft_store::{CONTAINER_RUNTIME_LABEL, Command, Raft};
use openraft::BasicNode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::{Config, ForeignPolicy};
use crate::executor::lease::LeaseKeeper;
use crate::executor::retention::Retention;
use crate::executor::{DiskLimits, Executor, ExecutorSettings, Host, Launcher};
use crate::gpu::{self, GpuBackend};
use crate::host::images::{ImageReporter, NodeImages};
use crate::host::inventory::InventoryReporter;
use crate::host::sd_notify::SdNotify;
use crate::host::watchdog::Watchdog;
use crate::leader::archiver::Archiver;
use crate::leader::audit_signer::{AuditSigner, SIGN_INTERVAL};
use crate::leader::autopilot::Autopilot;
use crate::leader::expiry::{EXPIRY_INTERVAL, Expiry};
use crate::leader::liveness::Liveness;
use crate::leader::scheduler_loop::Scheduler;
use crate::monitor::Telemetry;
use crate::monitor::alerting::Alerting;
use crate::monitor::foreign::ForeignProcesses;
use crate::monitor::metrics_http::{self, MetricsServer, MetricsSource};
use crate::monitor::power_task::PowerTask;
use crate::monitor::sampler::Sampler;
use crate::monitor::webhook::Notifier;
use crate::notify::JobNotifier;
use crate::notify::post::Poster;
use crate::raft::Cluster;
use crate::raft::archive_fill::ArchiveFill;
use crate::raft::contact::ContactBook;
use crate::raft::failover::FastFailover;
use crate::raft::network::NetworkFactory;
use crate::raft::peer_client::PeerClients;
use crate::raft::snapshots::SnapshotTrigger;
use crate::raft::transport_faults::TransportFaults;
use crate::scheduler::Policy;
use crate::server::{Services, serve};
use crate::tls::ca_keeper::CaKeeper;
use crate::tls::enroll::{self, Renewer, TlsIdentity};
use crate::tls::files::write_file;
use crate::tls::{NodeTls, Subject, TlsDir};
use gpu_proto::tls::{read_public, read_secret};
use gpu_raft_store::ca::CaSet;

const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub async fn run(config: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    let node_id = config.node_id;
    let systemd = SdNotify::from_env();
    if config.bootstrap && !config.data_dir.join("raft").exists() {
        // A new cluster: what the bootstrap will write must be writable before anything is.
        bootstrap_outputs_writable(&config.bootstrap_token_file)?;
    }
    info!(node_id, data_dir = %config.data_dir.display(), "opening data directory");
    let (data_dir, log, sm) = gpu_raft_store::open(&config.data_dir)?;
    let state = sm.reader();
    let committed = log.committed_index();

    info!(node_id, backend = %config.gpu_backend, "opening the GPU backend");
    let gpus: Arc<dyn GpuBackend> = Arc::from(gpu::open(
        config.gpu_backend,
        &config.sim_gpus,
        node_id,
        Some(&config.data_dir.join("dev")),
    )?);
    info!(node_id, launcher = %config.jobs.launcher, "choosing how jobs are started");
    let launcher = Launcher::choose(config.jobs.launcher)
        .await
        .context("choosing how jobs are started (jobs.launcher)")?;
    let telemetry = Telemetry::new(config.monitor.history_len());
    let metrics_listener = match config.monitor.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for metrics on {addr}"))?,
        ),
        None => None,
    };

    info!(node_id, "starting raft");
    let contacts = ContactBook::default();
    let peers = PeerClients::default();
    let faults = TransportFaults::default();
    let network = NetworkFactory {
        peers: peers.clone(),
        contacts: contacts.clone(),
        faults: faults.clone(),
        state: state.clone(),
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
    let cluster = Cluster::new(
        raft.clone(),
        state,
        committed,
        &network,
        config.cluster_settings(),
    );

    let tls = if config.tls.insecure {
        warn!(
            node_id,
            "running WITHOUT TLS (--insecure): loopback only, nobody is authenticated by certificate"
        );
        None
    } else {
        let material = tls_material(&config, &cluster).await?;
        let state = cluster.state.clone();
        let identity = TlsIdentity::new(
            TlsDir::in_data_dir(&config.data_dir),
            peers.clone(),
            config.tls.cert_validity,
            Arc::new(move |serial| state.read(|s| s.is_revoked(serial))),
        );
        identity.install(material)?;
        Some(identity)
    };

    info!(node_id, listen = %config.listen, advertise = %config.advertise, tls = tls.is_some(), "serving gRPC");
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let tasks = TaskTracker::new();
    info!(node_id, interval = ?config.monitor.interval, "starting the GPU sampler");
    let sampler = Sampler {
        gpus: gpus.clone(),
        telemetry: telemetry.clone(),
        interval: config.monitor.interval,
        timeout: config.monitor.sample_timeout,
    };
    tasks.spawn(sampler.run(cancel.clone()));
    let poster = Poster::new(config.api.webhook_ca_file.as_deref())?;
    let (notifier, webhooks) = Notifier::new(config.monitor.webhooks.clone(), poster.clone());
    if let Some(webhooks) = webhooks {
        info!(
            node_id,
            webhooks = config.monitor.webhooks.len(),
            "starting alert notices"
        );
        tasks.spawn(webhooks.run(cancel.clone()));
    }
    if let Some(listener) = metrics_listener {
        info!(node_id, listen = ?listener.local_addr().ok(), "serving Prometheus metrics");
        let metrics = MetricsServer {
            listener,
            source: MetricsSource {
                cluster: cluster.clone(),
                telemetry: telemetry.clone(),
                devices: Arc::new(gpus.devices()),
                hostname: metrics_http::hostname().into(),
            },
        };
        tasks.spawn(metrics.run(cancel.clone()));
    }
    let jobs_dir = config.jobs.disk.dir.clone();
    let images = NodeImages::new(node_id, &config.containers);
    let services = Services {
        cluster: cluster.clone(),
        reachable_within: config.reachable_within(),
        gpus: gpus.clone(),
        telemetry: telemetry.clone(),
        alert_rules: config.monitor.rules.clone(),
        jobs_dir: jobs_dir.clone(),
        tls: tls.clone(),
        api: config.api.clone(),
        transport_faults: config.raft.fault_injection.then_some(faults),
        images: images.clone(),
    };
    tasks.spawn(serve(listener, services, cancel.clone()));
    info!(node_id, "watching raft for a fatal error");
    let fatal = Arc::new(std::sync::OnceLock::<String>::new());
    tasks.spawn(watch_fatal(raft.clone(), fatal.clone(), cancel.clone()));
    if let Some(interval) = systemd.watchdog_interval() {
        info!(
            node_id,
            ?interval,
            "pinging the systemd watchdog while alive"
        );
        let watchdog = Watchdog {
            raft: raft.clone(),
            state: cluster.state.clone(),
            notify: systemd.clone(),
            interval,
        };
        tasks.spawn(watchdog.run(cancel.clone()));
    }

    let started = enter_cluster(&config, &cluster, tls.as_ref(), &tasks, &cancel).await;
    if let Err(e) = started {
        let _ = systemd.stopping();
        shutdown(&cancel, &tasks, &raft).await;
        return match fatal.get() {
            Some(why) => Err(e.context(format!("raft stopped on a fatal error: {why}"))),
            None => Err(e),
        };
    }
    if let Some(identity) = &tls {
        info!(node_id, validity = ?config.tls.cert_validity, "starting certificate renewal");
        let view = cluster.clone();
        let state = cluster.state.clone();
        let renewer = Renewer {
            identity: identity.clone(),
            node_id,
            peers_of: Arc::new(move || {
                view.view()
                    .members
                    .into_iter()
                    .filter(|(id, _)| *id != node_id)
                    .map(|(_, addr)| addr)
                    .collect()
            }),
            from_old_ca: Arc::new(move |cert_pem| {
                let signing = state.read(|s| s.ca.as_ref().and_then(CaSet::signing_cert_pem));
                signing.is_some_and(|ca| !crate::tls::pki::issued_by(cert_pem, &ca))
            }),
        };
        tasks.spawn(renewer.run(cancel.clone()));
        let keeper = CaKeeper {
            identity: identity.clone(),
            cluster: cluster.clone(),
            interval: Duration::from_secs(2),
        };
        tasks.spawn(keeper.run(cancel.clone()));
        let signer = AuditSigner {
            cluster: cluster.clone(),
            identity: identity.clone(),
            interval: SIGN_INTERVAL,
        };
        tasks.spawn(signer.run(cancel.clone()));
    }

    info!(
        node_id,
        "registering this node (and again whenever its inventory changes)"
    );
    let reporter = InventoryReporter {
        cluster: cluster.clone(),
        gpus: gpus.clone(),
        telemetry: telemetry.clone(),
        node_id,
        addr: config.advertise.clone(),
        labels: registered_labels(&config),
        edge: config.edge.as_ref().map(crate::config::EdgeSettings::terms),
        interval: Duration::from_secs(2),
    };
    tasks.spawn(reporter.run(cancel.clone()));
    info!(node_id, every = ?config.containers.image_refresh, "reporting this node's container images");
    let image_reporter = ImageReporter {
        cluster: cluster.clone(),
        images,
        every: config.containers.image_refresh,
    };
    tasks.spawn(image_reporter.run(cancel.clone()));
    info!(
        node_id,
        rules = config.monitor.rules.len(),
        "starting alerting"
    );
    let alerting = Alerting {
        cluster: cluster.clone(),
        telemetry: telemetry.clone(),
        gpus: gpus.clone(),
        configured: config.monitor.rules.clone(),
        interval: config.monitor.interval,
        notifier: notifier.clone(),
    };
    tasks.spawn(alerting.run(cancel.clone()));
    info!(node_id, green = ?config.monitor.green, "starting power management");
    let power = PowerTask {
        cluster: cluster.clone(),
        telemetry: telemetry.clone(),
        gpus: gpus.clone(),
        green: config.monitor.green,
        interval: config.monitor.interval,
        report_every: config.monitor.energy_report_every,
    };
    tasks.spawn(power.run(cancel.clone()));
    start_leader_tasks(&tasks, &cluster, &config, &cancel);
    info!(node_id, "starting job webhooks (active while leader)");
    let job_webhooks = JobNotifier {
        cluster: cluster.clone(),
        tls: tls.clone(),
        poster,
    };
    tasks.spawn(job_webhooks.run(cancel.clone()));
    let lease_path = config.data_dir.join("lease");
    let node_lease = config.node_lease();
    info!(node_id, lease = ?node_lease, edge_site = ?config.edge.as_ref().map(|e| &e.site), "starting the node lease");
    let lease = LeaseKeeper {
        cluster: cluster.clone(),
        path: lease_path.clone(),
        lease: node_lease,
    };
    tasks.spawn(lease.run(cancel.clone()));
    let settings = ExecutorSettings {
        jobs_dir: jobs_dir.clone(),
        lease_path,
        lease: node_lease,
        stop_grace: config.jobs.stop_grace,
        agent_exe: std::env::current_exe().context("locating the gpu-agent binary")?,
        tick: Duration::from_secs(1),
        run_as: config.jobs.run_as.clone(),
        run_as_by_tenant: config.jobs.run_as_by_tenant.clone(),
        cgroup_root: config.jobs.cgroup_root.clone(),
        uid_range: config.jobs.uid_range,
        confine: config.jobs.confine.clone(),
        disk: DiskLimits::from(&config.jobs.disk),
        containers: config.containers.clone(),
    };
    crate::executor::setup::check_jobs_dir(&config.jobs.disk, &config.data_dir)
        .context("checking the jobs directory")?;
    info!(
        node_id,
        "preparing this host for jobs (cgroups, device fence, OOM shield)"
    );
    let host = Host::prepare(&settings, launcher.is_systemd());
    info!(node_id, policy = ?config.jobs.confine.foreign_processes, "watching jobs' GPUs for foreign processes");
    let foreign = ForeignProcesses {
        cluster: cluster.clone(),
        telemetry: telemetry.clone(),
        notifier,
        kill: config.jobs.confine.foreign_processes == ForeignPolicy::Kill,
        job_cgroups: host.cgroups.has_job_cgroups(),
        interval: config.monitor.interval,
    };
    tasks.spawn(foreign.run(cancel.clone()));
    info!(node_id, jobs_dir = %jobs_dir.display(), "starting the executor");
    let executor = Executor {
        cluster: cluster.clone(),
        gpus,
        settings,
        host,
        launcher,
        tls: tls.clone(),
    };
    tasks.spawn(executor.run(cancel.clone()));
    info!(node_id, keep = ?config.jobs.disk.keep_finished_runs, "removing ended runs' directories after jobs.keep_finished_runs");
    let retention = Retention {
        cluster: cluster.clone(),
        jobs_dir: config.jobs.disk.dir.clone(),
        keep: config.jobs.disk.keep_finished_runs,
    };
    tasks.spawn(retention.run(cancel.clone()));
    let fill = ArchiveFill {
        cluster: cluster.clone(),
    };
    tasks.spawn(fill.run(cancel.clone()));
    let snapshots = SnapshotTrigger {
        raft: raft.clone(),
        state: cluster.state.clone(),
        every: config.raft.snapshot_every,
    };
    tasks.spawn(snapshots.run(cancel.clone()));
    info!(
        node_id,
        systemd = systemd.enabled(),
        "agent started: it says it is ready once caught up with the cluster"
    );
    tasks.spawn(announce_ready(
        cluster.clone(),
        systemd.clone(),
        cancel.clone(),
    ));

    cancel.cancelled().await;
    info!(node_id, "shutting down");
    if let Err(e) = systemd.stopping() {
        warn!(error = %e, "could not tell systemd we are stopping");
    }
    shutdown(&cancel, &tasks, &raft).await;
    drop(data_dir);
    match fatal.get() {
        Some(why) => bail!("raft stopped on a fatal error: {why}"),
        None => Ok(()),
    }
}

/// The tasks that act only while this agent leads (each idles otherwise): autopilot, fast
/// failover (a follower's), the scheduler, node liveness, expiry and archiving.
fn start_leader_tasks(
    tasks: &TaskTracker,
    cluster: &Cluster,
    config: &Config,
    cancel: &CancellationToken,
) {
    let node_id = config.node_id;
    info!(node_id, "starting autopilot");
    let autopilot = Autopilot {
        cluster: cluster.clone(),
        dead_voter_after: config.autopilot.dead_voter_after,
        reachable_within: config.reachable_within(),
        interval: Duration::from_millis(500),
    };
    tasks.spawn(autopilot.run(cancel.clone()));
    let failover = FastFailover {
        cluster: cluster.clone(),
        heartbeat: config.raft.heartbeat_interval,
        lease: config.raft.election_timeout_max,
    };
    tasks.spawn(failover.run(cancel.clone()));
    info!(node_id, "starting the scheduler (active while leader)");
    let scheduler = Scheduler {
        cluster: cluster.clone(),
        policy: Policy::default(),
        tick: Duration::from_secs(1),
    };
    tasks.spawn(scheduler.run(cancel.clone()));
    info!(node_id, "starting node liveness (active while leader)");
    let liveness = Liveness {
        cluster: cluster.clone(),
        down_after: config.jobs.down_after,
        reachable_within: config.reachable_within(),
        interval: Duration::from_millis(500),
    };
    tasks.spawn(liveness.run(cancel.clone()));
    let expiry = Expiry {
        cluster: cluster.clone(),
        interval: EXPIRY_INTERVAL,
    };
    tasks.spawn(expiry.run(cancel.clone()));
    let archiver = Archiver {
        cluster: cluster.clone(),
        retention: config.retention.retention,
        interval: config.retention.interval,
    };
    tasks.spawn(archiver.run(cancel.clone()));
}

/// Stop the agent when Raft stops on a fatal error (a storage write or fsync that failed):
/// Raft then answers nothing and acknowledges nothing, and an agent lingering without it would
/// look alive while serving stale reads and never recovering. Exiting with the error lets the
/// operator (or systemd) see it and restart the agent once the disk is fixed.
async fn watch_fatal(
    raft: Raft,
    fatal: Arc<std::sync::OnceLock<String>>,
    cancel: CancellationToken,
) {
    let mut metrics = raft.metrics();
    loop {
        if let Err(e) = &metrics.borrow_and_update().running_state {
            if !matches!(e, openraft::error::Fatal::Stopped) {
                tracing::error!(error = %e, "raft stopped on a fatal error; stopping the agent");
                let _ = fatal.set(e.to_string());
                cancel.cancel();
            }
            return;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// "agent ready" (and systemd's `READY=1`) once this agent has caught up: a leader confirmed
/// a read index with a quorum and the local replica has applied it. Until then systemd sees
/// the unit as starting (a restarted agent without a majority to talk to stays there, with a
/// STATUS saying why).
async fn announce_ready(cluster: Cluster, systemd: SdNotify, cancel: CancellationToken) {
    let _ = systemd.status("waiting to catch up with the cluster");
    loop {
        let caught_up = tokio::select! {
            () = cancel.cancelled() => return,
            r = cluster.linearizable_read() => r,
        };
        match caught_up {
            Ok(()) => break,
            Err(e) => {
                let _ = systemd.status(&format!("waiting to catch up with the cluster: {e}"));
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
    let applied = cluster.state.applied_index();
    info!(
        node_id = cluster.id,
        log_index = applied,
        "agent ready: caught up with the cluster"
    );
    if let Err(e) = systemd.ready() {
        warn!(error = %e, "could not tell systemd we are ready");
    }
}

/// Bootstrap a new cluster, join an existing one, or (with state on disk) resume membership.
async fn enter_cluster(
    config: &Config,
    cluster: &Cluster,
    tls: Option<&TlsIdentity>,
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
        if config.bootstrap {
            finish_bootstrap(config, cluster, tls).await?;
        }
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
        info!(node_id = config.node_id, path = %config.bootstrap_token_file.display(), "minting the bootstrap admin token");
        // The token last: once it is there, so is everything gpuctl needs beside it.
        if let Some(tls) = tls {
            write_bootstrap_client_cert(cluster, tls, &config.bootstrap_token_file).await?;
        }
        write_bootstrap_token(cluster, &config.bootstrap_token_file).await?;
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

/// The bootstrap writes the admin token (and beside it the admin's certificate) after the
/// cluster exists: check first that it can, creating the directory (0700) if need be, so a
/// path that cannot be written stops the bootstrap before anything is.
fn bootstrap_outputs_writable(token_file: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = token_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| {
            format!(
                "creating {} for the bootstrap admin token (nothing was written)",
                dir.display()
            )
        })?;
    let probe = token_file.with_extension("probe");
    write_file(&probe, "", 0o600).with_context(|| {
        format!(
            "the bootstrap admin token cannot be written to {} (nothing was written)",
            token_file.display()
        )
    })?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

/// A bootstrap interrupted after the cluster was created but before the admin token was
/// recorded (a crash, a path that could not be written) is finished on the next start with
/// `bootstrap`: once this replica has applied everything committed, a cluster with no
/// bootstrap token gets one (and the admin certificate) now.
async fn finish_bootstrap(
    config: &Config,
    cluster: &Cluster,
    tls: Option<&TlsIdentity>,
) -> anyhow::Result<()> {
    cluster
        .linearizable_read()
        .await
        .context("catching up before finishing the bootstrap")?;
    let minted = cluster
        .state
        .read(|s| s.tokens.values().any(|t| t.created_by == BOOTSTRAP_ACTOR));
    if minted {
        return Ok(());
    }
    warn!(
        node_id = config.node_id,
        path = %config.bootstrap_token_file.display(),
        "the bootstrap was interrupted before the admin token was recorded: finishing it"
    );
    bootstrap_outputs_writable(&config.bootstrap_token_file)?;
    if let Some(tls) = tls {
        write_bootstrap_client_cert(cluster, tls, &config.bootstrap_token_file).await?;
    }
    write_bootstrap_token(cluster, &config.bootstrap_token_file).await?;
    Ok(())
}

/// Who minted the bootstrap admin token, in its record.
const BOOTSTRAP_ACTOR: &str = "system:bootstrap";

/// Mint the first admin token and hand it to the operator as a 0600 file (the cluster keeps
/// only its hash). Revoke it once real admin tokens exist.
async fn write_bootstrap_token(cluster: &Cluster, path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let minted = crate::api::auth::token::mint();
    let record = gpu_raft_store::TokenRecord {
        account: None,
        id: minted.id.clone(),
        secret_sha256: minted.secret_sha256,
        role: gpu_raft_store::Role::Admin,
        tenant: None,
        description: "bootstrap admin token".into(),
        created_at_ms: crate::clock::now_ms(),
        created_by: BOOTSTRAP_ACTOR.into(),
        revoked: false,
        limits: Default::default(),
    };
    cluster
        .write(Command::CreateToken { token: record })
        .await
        .context("recording the bootstrap token")?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(file, "{}", minted.bearer).with_context(|| format!("writing {}", path.display()))?;
    file.sync_all()?;
    Ok(())
}

/// The first admin's client certificate, beside the bootstrap token: `admin.crt`,
/// `admin.key` (0600) and the cluster's `ca.crt`: with the token, everything gpuctl needs.
async fn write_bootstrap_client_cert(
    cluster: &Cluster,
    tls: &TlsIdentity,
    token_file: &std::path::Path,
) -> anyhow::Result<()> {
    let dir = token_file
        .parent()
        .context("the bootstrap token file has no directory")?;
    let material = tls.current().context("no TLS material")?;
    let (key_pem, csr_pem) = crate::tls::pki::new_request()?;
    let cert_pem = tls
        .issue(
            cluster,
            &csr_pem,
            &Subject::Client("admin".into()),
            None,
            None,
        )
        .await
        .context("issuing the admin client certificate")?;
    write_file(&dir.join("ca.crt"), &material.ca_cert_pem, 0o644)?;
    write_file(&dir.join("admin.key"), &key_pem, 0o600)?;
    write_file(&dir.join("admin.crt"), &cert_pem, 0o644)?;
    info!(dir = %dir.display(), "wrote the admin client certificate (admin.crt, admin.key, ca.crt)");
    Ok(())
}

/// This agent's TLS material: from its data directory, else made now (bootstrap) or obtained
/// by enrolling with a join token (join).
async fn tls_material(config: &Config, cluster: &Cluster) -> anyhow::Result<NodeTls> {
    let dir = TlsDir::in_data_dir(&config.data_dir);
    if let Some(material) = dir.load()? {
        return Ok(material);
    }
    let initialized = cluster
        .raft
        .is_initialized()
        .await
        .context("reading raft state")?;
    if initialized {
        bail!(
            "{} holds cluster state but no TLS material in {}: restore it from a backup, or \
             wipe the data directory and join again",
            config.data_dir.display(),
            dir.dir.display()
        );
    }
    if config.bootstrap {
        info!(
            node_id = config.node_id,
            "creating the cluster certificate authority"
        );
        return enroll::bootstrap(config.node_id, config.tls.cert_validity);
    }
    if config.join.is_empty() {
        bail!(
            "data directory {} holds no cluster state: start with --bootstrap to create a cluster \
             or --join ADDR to join one",
            config.data_dir.display()
        );
    }
    let ca_file = config.tls.ca_file.as_ref().context(
        "joining needs the cluster's CA certificate: --ca-file (a copy of the bootstrap agent's \
         <data-dir>/tls/ca.crt)",
    )?;
    let token_file = config.tls.join_token_file.as_ref().context(
        "joining needs a join token: --join-token-file (made with `gpuctl token create --role node`)",
    )?;
    let ca = read_public(ca_file)?;
    let token = read_secret(token_file)?;
    info!(node_id = config.node_id, seeds = ?config.join, "enrolling: asking for our certificate");
    enroll::join(
        &config.join,
        config.node_id,
        &token,
        &ca,
        config.join_timeout,
    )
    .await
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

/// The labels this node registers with: its configured ones, and the container runtime it
/// runs container jobs with when one is installed (no container job is placed here without).
fn registered_labels(config: &Config) -> BTreeMap<String, String> {
    let mut labels = config.labels.clone();
    match config.containers.installed() {
        Some((kind, program)) => {
            info!(runtime = %kind, program = %program.display(), "container jobs run here");
            labels.insert(CONTAINER_RUNTIME_LABEL.to_owned(), kind.to_string());
        }
        None => info!(
            looked_for = config.containers.looked_for(),
            "no container runtime installed: no container job is placed here"
        ),
    }
    labels
}
