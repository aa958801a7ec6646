//! One chaos scenario end to end: start a cluster (3 agents, or 5 for C6/C7), run the recorded workload while the
//! nemesis works, heal, drain, collect the final job list, the jobs' records and the replicas'
//! digests once they settle, check, and write `history.jsonl`, `jobs.json`, `runs.json`,
//! `digests.json`, `report.json` and `timeline.svg` into the run directory (and, when a checker
//! found a violation, every agent's log as `node-<id>.log`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpu_tests::{AgentCommand, Cluster, Placement, is_terminal};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use serde::Serialize;

use crate::check;
use crate::client::{Client, Keyed, Outcome, state_name};
use crate::history::{OpKind, Phase, Recorder};
use crate::model::{FinalJob, Violation};
use gpu_tests::records;

use crate::netns::Netns;
use crate::partition::Partitioned;
use crate::workload::Load;
use crate::{
    crash, failpoints, isolation, lagging, membership, nemesis, observer, pause, settle, splits,
    storm, timeline, transport, workload,
};

/// Which faults a scenario injects.
#[derive(Clone, Copy, Debug)]
pub enum Nemesis {
    /// No faults: the workload runs `secs` seconds (the baseline for broken-agent tests).
    Quiet { secs: u64 },
    /// C1: kill -9 the leader and restart it, `rounds` times.
    LeaderKillLoop { rounds: u32 },
    /// C2: kill -9 a random agent (a minority) and restart it, `rounds` times.
    MinorityKillLoop { rounds: u32 },
    /// C3: kill -9 every agent at once mid-load, restart all.
    KillAll,
    /// C4: restart every agent gracefully, one after another, under load.
    RollingRestart,
    /// C16: keys stormed one after another by `tasks` concurrent submitters each, at least
    /// `min_keys` of them and until a leader kill midway has healed. C17 (`Keyed::RequestId`):
    /// the same with no idempotency key, the key sent as each try's request id.
    RetryStorm {
        min_keys: usize,
        tasks: usize,
        keyed: Keyed,
    },
    /// C9: `SIGSTOP` the leader past the election timeout, then `SIGCONT` it, `rounds` times.
    LeaderPause { rounds: u32 },
    /// C10: `SIGSTOP` an agent running jobs past its lease until its runs are re-placed.
    HolderPause,
    /// C5: cut the leader off from the others (network namespaces), probe, heal.
    IsolateLeader,
    /// C10 by partition: cut off an agent running jobs until its runs are re-placed.
    HolderIsolate,
    /// C6: the leader and one follower split from the other three of five, probed, healed.
    SplitLeaderSide,
    /// C7: five agents in a ring (each reaches only its two neighbours), then healed.
    Ring,
    /// C8: `rounds` random cuts among `agents` agents, each held briefly and healed.
    Flapping { rounds: u32, agents: u64 },
    /// C11: delay, loss and duplication on the Raft transport (in the agents), then healed.
    LossyTransport,
    /// C14: one agent at a time restarted with a crash failpoint armed, for each of `points`
    /// (the failpoints build; snapshots every few entries so snapshot points are reached).
    CrashAt { points: &'static [&'static str] },
    /// C15: one agent restarted with failing fsyncs; it must stop on its own.
    FsyncError,
    /// C13: a follower down while the leader purges the log it needs; it must catch up by
    /// installing a snapshot (after first crashing at `crash_at` on the install path: C14).
    FollowerBehindPurge { crash_at: Option<&'static str> },
    /// C12: four agents; a voter killed for good must be replaced by the learner.
    VoterLost,
}

impl Nemesis {
    /// Whether the scenario runs its agents in network namespaces.
    pub fn needs_netns(self) -> bool {
        matches!(
            self,
            Nemesis::IsolateLeader
                | Nemesis::HolderIsolate
                | Nemesis::SplitLeaderSide
                | Nemesis::Ring
                | Nemesis::Flapping { .. }
        )
    }

    /// Whether the scenario runs the failpoints build of the agent.
    pub fn needs_failpoints(self) -> bool {
        matches!(
            self,
            Nemesis::CrashAt { .. }
                | Nemesis::FsyncError
                | Nemesis::FollowerBehindPurge { crash_at: Some(_) }
        )
    }

    /// How many agents the scenario's cluster has.
    pub fn agents(self) -> u64 {
        match self {
            Nemesis::SplitLeaderSide | Nemesis::Ring => 5,
            Nemesis::Flapping { agents, .. } => agents,
            Nemesis::VoterLost => membership::AGENTS,
            _ => 3,
        }
    }

    /// How many of them vote: every agent of the partition scenarios on five, else three.
    fn voters(self) -> usize {
        match self {
            Nemesis::SplitLeaderSide | Nemesis::Ring | Nemesis::Flapping { .. } => {
                self.agents() as usize
            }
            _ => 3,
        }
    }

    /// Agent configuration the scenario needs (inside `[raft]`).
    fn extra_toml(self) -> &'static str {
        match self {
            Nemesis::LossyTransport => transport::AGENT_TOML,
            Nemesis::CrashAt { .. } => "snapshot_every = 25",
            Nemesis::FollowerBehindPurge { .. } => lagging::CONFIG,
            Nemesis::VoterLost => membership::CONFIG,
            _ => "",
        }
    }
}

/// Background workers submitting during every scenario.
const WORKERS: usize = 2;
/// How long the healed cluster gets to finish every job.
const DRAIN: Duration = Duration::from_secs(60);
/// How long the recovery probe tries after the heal (the checker's bound, and a margin).
const AFTER_HEAL: Duration = Duration::from_secs(12);

/// What one scenario run found; written as the run directory's `report.json`.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The scenario's run name.
    pub name: String,
    /// The seed that reproduces the run.
    pub seed: u64,
    /// The run directory (history, jobs, runs, report, timeline).
    pub dir: PathBuf,
    /// From the cluster being up to the checks being done.
    #[serde(rename = "wall_s", serialize_with = "secs")]
    pub wall: Duration,
    /// Submissions acknowledged.
    pub ok: usize,
    /// Submissions that certainly did not take effect.
    pub fail: usize,
    /// Submissions with an unknown outcome.
    pub info: usize,
    /// Distinct job ids acknowledged.
    pub acked_jobs: usize,
    /// Jobs the cluster listed at the end.
    pub final_jobs: usize,
    /// Runs the jobs themselves recorded.
    pub runs: usize,
    /// The applied index every replica reported at the end (`None` when they differed).
    pub settled_at: Option<u64>,
    /// Everything the checkers reported.
    pub violations: Vec<Violation>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Report {
    /// One line for humans.
    pub fn summary(&self) -> String {
        format!(
            "{} seed={} {:.1}s: submits ok={} fail={} info={}; {} acked, {} jobs, {} runs; \
             replicas at {}; {} violation(s) [{}]",
            self.name,
            self.seed,
            self.wall.as_secs_f64(),
            self.ok,
            self.fail,
            self.info,
            self.acked_jobs,
            self.final_jobs,
            self.runs,
            self.settled_at
                .map_or_else(|| "no common index".to_owned(), |i| format!("index {i}")),
            self.violations.len(),
            self.dir.display()
        )
    }
}

/// How a scenario's cluster is started, beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// The agent binary and environment (a failpoints build with `FAIL_POINTS`).
    pub agent: AgentCommand,
    /// Appended to every agent's config (`Cluster::start`'s `extra_toml`).
    pub extra_toml: String,
}

/// Run scenario `name` with `seed`, writing its files under `out/<name>-<seed>/`.
pub async fn run(name: &str, seed: u64, nemesis: Nemesis, out: &Path) -> anyhow::Result<Report> {
    run_with(name, seed, nemesis, out, &Setup::default()).await
}

/// `run` with the cluster started as `setup` says.
pub async fn run_with(
    name: &str,
    seed: u64,
    nemesis: Nemesis,
    out: &Path,
    setup: &Setup,
) -> anyhow::Result<Report> {
    println!(
        "chaos {name}: seed {seed} (reproduce with {}={seed})",
        crate::seed::SEED_ENV
    );
    let dir = out.join(format!("{name}-{seed}"));
    std::fs::create_dir_all(&dir)?;
    let mut rng = StdRng::seed_from_u64(seed);
    // Declared before the cluster, so its agents are gone before the namespaces are.
    let agents = nemesis.agents();
    let net = if nemesis.needs_netns() {
        Some(Netns::create(agents)?)
    } else {
        None
    };
    // Clusters take turns (a process-wide lock in `Cluster::start`): time from the start.
    let mut setup = setup.clone();
    if nemesis.needs_failpoints() && setup.agent.bin.is_none() {
        setup.agent.bin = Some(tokio::task::spawn_blocking(failpoints::agent).await??);
    }
    if setup.extra_toml.is_empty() {
        setup.extra_toml = nemesis.extra_toml().to_owned();
    }
    let (extra, agent) = (&setup.extra_toml, setup.agent.clone());
    let mut c = match &net {
        Some(net) => {
            let c = Cluster::start_with(nemesis.voters(), extra, net.placements(), agent).await;
            crate::ready::wait_all_ready(&c).await;
            c
        }
        None => {
            let loopback = (0..agents).map(|_| Placement::loopback()).collect();
            Cluster::start_with(nemesis.voters(), extra, loopback, agent).await
        }
    };
    let started = Instant::now();
    let rec = Arc::new(Recorder::create(&dir.join("history.jsonl"))?);
    let records = records::prepare_dir(c.root.path())?;
    let client = Client::new(&c, rec.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        workers.spawn(workload::worker(
            client.clone(),
            w,
            rng.random(),
            name.to_owned(),
            records.clone(),
            stop.clone(),
        ));
    }
    let observing = Arc::new(AtomicBool::new(false));
    let observer = tokio::spawn(observer::observe(client.clone(), observing.clone()));
    let faults = inject(
        &mut c,
        net.as_ref(),
        &rec,
        &mut rng,
        nemesis,
        &client,
        name,
        &records,
    )
    .await;
    nemesis::heal(&mut c, &rec).await?;
    recovery_probe(&client, name, &records).await?;
    stop.store(true, Ordering::Relaxed);
    observing.store(true, Ordering::Relaxed);
    while let Some(r) = workers.join_next().await {
        r??;
    }
    observer.await??;
    faults?;

    let jobs = drain(&c).await?;
    std::fs::write(dir.join("jobs.json"), serde_json::to_vec_pretty(&jobs)?)?;
    let runs = records::read_all(&records)?;
    std::fs::write(dir.join("runs.json"), serde_json::to_vec_pretty(&runs)?)?;
    let replicas = settle::replica_digests(&c).await;
    std::fs::write(
        dir.join("digests.json"),
        serde_json::to_vec_pretty(&replicas)?,
    )?;
    let history = rec.events();
    let violations = check::all(&history, &jobs, &runs, &replicas);
    std::fs::write(dir.join("timeline.svg"), timeline::svg(&history))?;
    if !violations.is_empty() {
        // The agents' own account of what went wrong, kept beside the verdicts.
        for id in c.agents.keys() {
            std::fs::write(dir.join(format!("node-{id}.log")), c.log_of(*id))?;
        }
    }

    let submits = history.iter().filter(|e| e.op == OpKind::Submit);
    let count = |p: Phase| submits.clone().filter(|e| e.phase == p).count();
    let mut acked: Vec<u64> = submits
        .clone()
        .filter(|e| e.phase == Phase::Ok)
        .filter_map(|e| e.job_id)
        .collect();
    acked.sort_unstable();
    acked.dedup();
    let report = Report {
        name: name.to_owned(),
        seed,
        dir,
        wall: started.elapsed(),
        ok: count(Phase::Ok),
        fail: count(Phase::Fail),
        info: count(Phase::Info),
        acked_jobs: acked.len(),
        final_jobs: jobs.len(),
        runs: runs.len(),
        settled_at: settle::common_index(&replicas),
        violations,
    };
    std::fs::write(
        report.dir.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn inject(
    c: &mut Cluster,
    net: Option<&Netns>,
    rec: &Recorder,
    rng: &mut StdRng,
    nemesis: Nemesis,
    client: &Client,
    name: &str,
    records: &Path,
) -> anyhow::Result<()> {
    let load = Load {
        client,
        prefix: name,
        records,
    };
    match nemesis {
        Nemesis::Quiet { secs } => {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok(())
        }
        Nemesis::LeaderKillLoop { rounds } => nemesis::leader_kill_loop(c, rec, rng, rounds).await,
        Nemesis::MinorityKillLoop { rounds } => {
            nemesis::minority_kill_loop(c, rec, rng, rounds).await
        }
        Nemesis::KillAll => nemesis::kill_all(c, rec, rng).await,
        Nemesis::RollingRestart => nemesis::rolling_restart(c, rec, rng).await,
        Nemesis::RetryStorm {
            min_keys,
            tasks,
            keyed,
        } => {
            let stop = Arc::new(AtomicBool::new(false));
            let task = tokio::spawn(storm::storm(
                client.clone(),
                min_keys,
                tasks,
                keyed,
                stop.clone(),
                rng.random(),
                name.to_owned(),
                records.to_owned(),
            ));
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
            let killed = nemesis::kill_leader_once(c, rec, rng).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(1000..2000))).await;
            stop.store(true, Ordering::Relaxed);
            killed?;
            task.await?
        }
        Nemesis::LeaderPause { rounds } => pause::leader_pause(c, rec, rng, rounds).await,
        Nemesis::HolderPause => pause::holder_pause(c, rec, rng, load).await,
        Nemesis::IsolateLeader => {
            let net = net.ok_or_else(|| anyhow::anyhow!("C5 needs network namespaces"))?;
            isolation::isolate_leader(c, &Partitioned::new(c, net, rec), rng, load).await
        }
        Nemesis::CrashAt { points } => crash::crash_at(c, rec, rng, points).await,
        Nemesis::FsyncError => crash::fsync_error(c, rec, rng).await,
        Nemesis::VoterLost => membership::voter_lost(c, rec, rng).await,
        Nemesis::FollowerBehindPurge { crash_at } => {
            lagging::follower_behind_purged_log(c, rec, rng, crash_at).await
        }
        Nemesis::HolderIsolate => {
            let net = net.ok_or_else(|| anyhow::anyhow!("C10 by partition needs namespaces"))?;
            isolation::isolate_holder(c, &Partitioned::new(c, net, rec), rng, load).await
        }
        Nemesis::SplitLeaderSide => {
            let net = net.ok_or_else(|| anyhow::anyhow!("C6 needs network namespaces"))?;
            splits::split_leader_side(c, &Partitioned::new(c, net, rec), rng, load).await
        }
        Nemesis::Ring => {
            let net = net.ok_or_else(|| anyhow::anyhow!("C7 needs network namespaces"))?;
            splits::ring(c, &Partitioned::new(c, net, rec), rng, load).await
        }
        Nemesis::LossyTransport => transport::lossy_transport(c, rec, rng, client).await,
        Nemesis::Flapping { rounds, .. } => {
            let net = net.ok_or_else(|| anyhow::anyhow!("C8 needs network namespaces"))?;
            splits::flapping(c, &Partitioned::new(c, net, rec), rng, rounds).await
        }
    }
}

/// Right after the heal, submit (recorded, process `after-heal`) through each agent in turn
/// until one submission is acknowledged or `AFTER_HEAL` has passed, so `check::recovery`
/// always has writes invoked after the heal to judge. The workers keep running meanwhile.
async fn recovery_probe(client: &Client, prefix: &str, records: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    let nodes = client.nodes();
    let mut k = 0;
    while start.elapsed() < AFTER_HEAL {
        let key = format!("{prefix}-after-heal-{k}");
        let via = nodes[k % nodes.len()];
        k += 1;
        let spec = workload::job_spec(&key, 1, records);
        let deadline = Duration::from_secs(2);
        if let Outcome::Ok(_) = client
            .submit("after-heal", via, spec, &key, deadline)
            .await?
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Wait (up to `DRAIN`) until every job is terminal; return the final list.
async fn drain(c: &Cluster) -> anyhow::Result<Vec<FinalJob>> {
    let start = Instant::now();
    let mut last = Vec::new();
    while start.elapsed() < DRAIN {
        for via in c.running() {
            if let Ok(jobs) = c.list_jobs(via).await {
                let done = jobs.iter().all(is_terminal);
                last = jobs;
                if done {
                    return Ok(to_final(&last));
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    anyhow::ensure!(
        !last.is_empty(),
        "no agent listed the jobs within {DRAIN:?}"
    );
    Ok(to_final(&last))
}

fn to_final(jobs: &[gpu_proto::v1::Job]) -> Vec<FinalJob> {
    jobs.iter()
        .map(|j| FinalJob {
            id: j.id,
            // A keyless job is known by its name, which the workload makes its key.
            key: if j.idempotency_key.is_empty() {
                j.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default()
            } else {
                j.idempotency_key.clone()
            },
            state: state_name(j.state),
            generation: j.generation,
            reason: j.reason.clone(),
        })
        .collect()
}
