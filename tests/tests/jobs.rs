//! Jobs end to end on real agents: submit → bind → run pinned to GPUs → finish; no GPU runs two
//! jobs at once; node loss requeues without running a job twice; idempotent submission;
//! exactly-once keyless requests; bad input.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_agent::host::proc_stat::ProcStat;
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_tests::records::{self, RunRecord};
use gpu_tests::{Cluster, is_terminal, shell_job};

/// The run of job `id` at `generation`, as the job recorded it.
fn read_run(records: &Path, id: u64, generation: u64) -> RunRecord {
    records::read(records, id, generation)
        .unwrap_or_else(|e| panic!("record of j-{id}-g{generation}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_jobs_succeed_and_never_share_a_gpu() {
    let c = Cluster::start(3, 3, "").await;
    let records = records::prepare_dir(c.root.path()).expect("records dir");
    let mut ids = Vec::new();
    for i in 0..50u32 {
        let spec = shell_job(
            &format!("job-{i}"),
            1 + i % 4,
            &records::script(&records, "0.3"),
        );
        let via = c.running()[i as usize % 3];
        ids.push(
            c.submit(via, spec, &format!("key-{i}"))
                .await
                .expect("submit")
                .job_id,
        );
    }
    let mut runs = Vec::new();
    for id in &ids {
        let j = c.wait_job(*id, Duration::from_secs(120), is_terminal).await;
        assert_eq!(
            j.state,
            pb::JobState::Succeeded as i32,
            "j-{id}: {} {}",
            j.reason,
            j.outcome
        );
        assert_eq!(
            j.gpu_uuids.len(),
            j.spec.as_ref().expect("spec").gpus as usize
        );
        let run = read_run(&records, *id, j.generation);
        assert_eq!(
            run.gpus, j.gpu_uuids,
            "CUDA_VISIBLE_DEVICES must be exactly the bound GPUs"
        );
        assert_eq!(Some(run.node), j.node_id);
        runs.push(run);
    }
    let mut by_gpu: BTreeMap<&str, Vec<(u128, u128)>> = BTreeMap::new();
    for r in &runs {
        let end = r
            .end_ns
            .filter(|end| *end > r.start_ns)
            .expect("every run ended");
        for g in &r.gpus {
            by_gpu.entry(g).or_default().push((r.start_ns, end));
        }
    }
    for (gpu, mut intervals) in by_gpu {
        intervals.sort_unstable();
        for w in intervals.windows(2) {
            assert!(w[0].1 <= w[1].0, "GPU {gpu} ran two jobs at once: {w:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_killed_agent_is_requeued_and_never_runs_twice() {
    let mut c = Cluster::start(3, 3, "").await;
    let records = records::prepare_dir(c.root.path()).expect("records dir");
    // A100s only exist on n1; T4s on n3. Any node will do: 1 GPU.
    let spec = pb::JobSpec {
        max_attempts: 2,
        ..shell_job("long", 1, &records::script(&records, "8"))
    };
    let leader = c.leader().await;
    let id = c
        .submit(leader, spec, "long-1")
        .await
        .expect("submit")
        .job_id;
    let running = c
        .wait_job(id, Duration::from_secs(30), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let victim = running.node_id.expect("placed");
    let survivor = c
        .running()
        .into_iter()
        .find(|n| *n != victim)
        .expect("another agent");
    c.kill(victim);

    let done = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "{} {}",
        done.reason,
        done.outcome
    );
    assert_eq!(done.generation, 2, "exactly one requeue");
    assert_ne!(done.node_id, Some(victim), "re-placed on another node");

    // The first run was fenced by its own node before the second started.
    let first = read_run(&records, id, 1);
    let second = read_run(&records, id, 2);
    let first_end = first
        .end_ns
        .expect("the first run must have been stopped (fenced)");
    assert!(
        first_end <= second.start_ns,
        "runs overlapped: first ended {first_end} after second started {}",
        second.start_ns
    );

    // The killed agent comes back and does not run the job again.
    c.start_agent(victim);
    c.wait_for(
        "the restarted agent to be ready again",
        Duration::from_secs(30),
        |c| async move {
            c.status(victim, true)
                .await
                .is_ok_and(|s| s.leader_id.is_some())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs: Vec<_> = std::fs::read_dir(&records)
        .expect("records")
        .filter_map(Result::ok)
        .collect();
    assert_eq!(runs.len(), 2, "the job ran exactly twice (once fenced)");
    let after = c.job(survivor, id).await.expect("job");
    assert_eq!(
        (after.state, after.generation),
        (pb::JobState::Succeeded as i32, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_its_running_job() {
    let mut c = Cluster::start(
        3,
        3,
        "[jobs]\nlease = \"6s\"\ndown_after = \"10s\"\nstop_grace = \"2s\"\n",
    )
    .await;
    let records = records::prepare_dir(c.root.path()).expect("records dir");
    let id = c
        .submit(
            1,
            shell_job("adopted", 1, &records::script(&records, "4")),
            "",
        )
        .await
        .expect("submit")
        .job_id;
    let running = c
        .wait_job(id, Duration::from_secs(30), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let node = running.node_id.expect("placed");
    c.kill(node);
    c.start_agent(node);
    let done = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "{} {}",
        done.reason,
        done.outcome
    );
    assert_eq!(
        (done.generation, done.node_id),
        (1, Some(node)),
        "the same run, not a re-placement"
    );
    let run = read_run(&records, id, 1);
    let text = std::fs::read_to_string(records.join(format!("j-{id}-g1"))).expect("record");
    assert!(
        run.end_ns.is_some_and(|end| end > run.start_ns) && !text.contains("term"),
        "the run was not disturbed:\n{text}"
    );
}

/// A run's directory names its supervisor by pid and start time. Once a supervisor is gone the
/// kernel gives its pid to some other process, which the executor must not take for the run and
/// signal: in CI a reused pid belonged to the test runner, and the agent (root) sent it SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_supervisor_pid_is_never_signalled() {
    let c = Cluster::start(1, 1, "").await;
    let jobs = c.jobs_dir(1);
    let sleep = || {
        Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep")
    };
    let start_ticks = |pid: u32| ProcStat::of(pid).expect("its stat").start_ticks;
    // A process that took the pid of a run's dead supervisor, and a live supervisor of a run
    // that is no longer current (no such job): the executor stops the second only.
    let mut impostor = sleep();
    let mut stale = sleep();
    let (i, s) = (impostor.id(), stale.id());
    plant_run(&jobs, 900, &format!("{i} {}", start_ticks(i) + 1));
    plant_run(&jobs, 901, &format!("{s} {}", start_ticks(s)));
    let deadline = Instant::now() + Duration::from_secs(30);
    while stale.try_wait().expect("wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "the stale supervisor was never stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left_alone = impostor.try_wait().expect("wait").is_none();
    impostor.kill().ok();
    impostor.wait().ok();
    assert!(
        left_alone,
        "the executor signalled a process that only reused a supervisor's pid"
    );
}

/// Put a run directory `j-<job>-g1` whose `shim.pid` says `record` under `jobs`, whole at once.
fn plant_run(jobs: &Path, job: u64, record: &str) {
    let staging = jobs.join(format!("planting-{job}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    std::fs::write(staging.join("shim.pid"), record).expect("shim.pid");
    std::fs::rename(&staging, jobs.join(format!("j-{job}-g1"))).expect("plant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_submission_survives_a_leader_change() {
    let mut c = Cluster::start(3, 3, "").await;
    let spec = shell_job("once", 0, "true");
    let leader = c.leader().await;
    let first = c
        .submit(leader, spec.clone(), "the-key")
        .await
        .expect("submit");
    assert!(!first.existing);
    c.kill(leader);
    let other = c.running()[0];
    let again = c
        .submit(other, spec.clone(), "the-key")
        .await
        .expect("resubmit");
    assert_eq!((again.job_id, again.existing), (first.job_id, true));
    let different = pb::JobSpec {
        name: "twice".into(),
        ..spec
    };
    let err = c
        .submit(other, different, "the-key")
        .await
        .expect_err("same key, different spec");
    assert_eq!(err.code(), tonic::Code::AlreadyExists, "{err}");
}

/// A keyless submission through `via` as `bearer`, with `request_id` as its `x-request-id`.
async fn submit_keyless(
    c: &Cluster,
    via: u64,
    bearer: &str,
    request_id: &str,
    spec: pb::JobSpec,
) -> pb::SubmitJobResponse {
    let mut jobs = JobServiceClient::new(c.channel_as(via, Some(bearer)).await.expect("channel"));
    let mut req = tonic::Request::new(pb::SubmitJobRequest {
        spec: Some(spec),
        idempotency_key: String::new(),
        hold: false,
    });
    req.metadata_mut()
        .insert("x-request-id", request_id.parse().expect("header"));
    jobs.submit_job(req).await.expect("submit").into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_request_retried_through_other_agents_creates_one_job() {
    let c = Cluster::start(3, 3, "").await;
    let admin = c.admin_token();
    let spec = shell_job("retried", 0, "true");
    let first = submit_keyless(&c, 1, &admin, "req-1", spec.clone()).await;
    // The retries a client makes when an answer is lost, through the other agents: one of
    // them a follower that forwards it, one perhaps the leader.
    for via in [2, 3, 1] {
        let again = submit_keyless(&c, via, &admin, "req-1", spec.clone()).await;
        assert_eq!(again.job_id, first.job_id, "a retry through n{via}");
    }
    // Another request id is another request, and so is the same id from another caller.
    let second = submit_keyless(&c, 2, &admin, "req-2", spec.clone()).await;
    assert_ne!(second.job_id, first.job_id);
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let user = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::User as i32,
            tenant: "default".into(),
            description: "another caller".into(),
            ..Default::default()
        })
        .await
        .expect("a user token")
        .into_inner()
        .bearer;
    let theirs = submit_keyless(&c, 3, &user, "req-1", spec).await;
    assert!(![first.job_id, second.job_id].contains(&theirs.job_id));
    let named: Vec<u64> = c
        .list_jobs(1)
        .await
        .expect("list")
        .into_iter()
        .filter(|j| j.spec.as_ref().is_some_and(|s| s.name == "retried"))
        .map(|j| j.id)
        .collect();
    assert_eq!(named.len(), 3, "jobs {named:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_jobs_get_clear_answers() {
    let c = Cluster::start(3, 3, "").await;

    let missing = shell_job("missing", 0, "x");
    let missing = pb::JobSpec {
        command: vec!["/no/such/program".into()],
        ..missing
    };
    let id = c.submit(1, missing, "").await.expect("submit").job_id;
    let j = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(j.state, pb::JobState::Failed as i32);
    assert!(
        j.outcome.contains("failed to start") && j.outcome.contains("/no/such/program"),
        "{}",
        j.outcome
    );

    let huge = c
        .submit(2, shell_job("huge", 64, "true"), "")
        .await
        .expect("submit")
        .job_id;
    let j = c
        .wait_job(huge, Duration::from_secs(10), |j| !j.reason.is_empty())
        .await;
    assert_eq!(j.state, pb::JobState::Pending as i32);
    assert!(
        j.reason.contains("no schedulable node has 64 GPUs"),
        "{}",
        j.reason
    );
    assert!(
        j.node_id.is_none() && j.gpus.is_empty(),
        "never partly bound"
    );

    for (what, spec) in [
        (
            "empty command",
            pb::JobSpec {
                command: vec![],
                ..shell_job("e", 0, "")
            },
        ),
        ("control chars", shell_job("bad\nname", 0, "true")),
        ("traversal", shell_job("../../etc", 0, "true")),
        ("long name", shell_job(&"n".repeat(1 << 20), 0, "true")),
        ("u32::MAX gpus", shell_job("many", u32::MAX, "true")),
    ] {
        let err = c.submit(3, spec, "").await.expect_err(what);
        assert!(
            matches!(
                err.code(),
                tonic::Code::InvalidArgument
                    | tonic::Code::OutOfRange
                    | tonic::Code::ResourceExhausted
            ),
            "{what}: {err}"
        );
    }

    // Over the message size limit (16 MiB): refused before it is decoded, nothing queued.
    let jobs_before = c.list_jobs(1).await.expect("list").len();
    let huge_env = [("BLOB".to_owned(), "x".repeat(20 << 20))]
        .into_iter()
        .collect();
    let big = pb::JobSpec {
        env: huge_env,
        ..shell_job("big", 0, "true")
    };
    let err = c.submit(1, big, "").await.expect_err("too big");
    assert!(
        matches!(
            err.code(),
            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
        ),
        "{err}"
    );
    assert_eq!(c.list_jobs(1).await.expect("list").len(), jobs_before);

    assert_eq!(
        c.cancel(1, 999_999).await.expect_err("unknown").code(),
        tonic::Code::NotFound
    );
    let quick = c
        .submit(1, shell_job("quick", 0, "true"), "")
        .await
        .expect("submit")
        .job_id;
    c.wait_job(quick, Duration::from_secs(30), is_terminal)
        .await;
    assert_eq!(
        c.cancel(1, quick).await.expect_err("finished").code(),
        tonic::Code::FailedPrecondition
    );

    let sleeper = c
        .submit(2, shell_job("sleeper", 1, "sleep 60"), "")
        .await
        .expect("submit")
        .job_id;
    c.wait_job(sleeper, Duration::from_secs(30), |j| {
        j.state == pb::JobState::Running as i32
    })
    .await;
    c.cancel(3, sleeper).await.expect("cancel");
    let j = c
        .wait_job(sleeper, Duration::from_secs(30), is_terminal)
        .await;
    assert_eq!(j.state, pb::JobState::Cancelled as i32, "{}", j.outcome);
    // Cancelling is idempotent (a retry whose first try committed must not fail).
    let again = c.cancel(1, sleeper).await.expect("cancel a cancelled job");
    assert_eq!(again.state, pb::JobState::Cancelled as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gpu_is_taken_out_of_scheduling_until_it_is_back() {
    use gpu_proto::v1::gpu_service_client::GpuServiceClient;
    use gpu_proto::v1::node_service_client::NodeServiceClient;
    // A lost GPU also trips the built-in health alert, which keeps it quarantined until it has
    // been healthy for the rule's clear_after: shortened here so the test need not wait 5 min.
    let c = Cluster::start(
        3,
        3,
        "[monitor]\ninterval = \"200ms\"\n[[monitor.rules]]\nname = \"gpu-failing\"\n\
         fatal_xids = [79]\nclear_after = \"2s\"\naction = \"migrate\"\n",
    )
    .await;
    let inject = |fault: pb::GpuFault| pb::InjectFaultRequest {
        node_id: 1,
        gpu_index: 0,
        fault: fault as i32,
        xid: 0,
    };
    let mut gpus = GpuServiceClient::new(c.channel(2).await.expect("channel"));
    gpus.inject_fault(inject(pb::GpuFault::Lost))
        .await
        .expect("inject through another agent");
    c.wait_for(
        "n1 to report GPU 0 unhealthy",
        Duration::from_secs(15),
        |c| async move {
            let Ok(ch) = c.channel(3).await else {
                return false;
            };
            let node = NodeServiceClient::new(ch)
                .get_node(pb::GetNodeRequest {
                    id: 1,
                    stale: false,
                })
                .await;
            node.is_ok_and(|n| {
                n.into_inner()
                    .gpus
                    .iter()
                    .any(|g| g.index == 0 && !g.healthy)
            })
        },
    )
    .await;

    // Four A100s exist only on n1, and one of them is lost: the job must wait.
    let spec = pb::JobSpec {
        gpu_types: vec!["A100".into()],
        ..shell_job("four", 4, "true")
    };
    let id = c.submit(1, spec, "").await.expect("submit").job_id;
    let waiting = c
        .wait_job(id, Duration::from_secs(15), |j| !j.reason.is_empty())
        .await;
    assert_eq!(
        waiting.state,
        pb::JobState::Pending as i32,
        "{}",
        waiting.reason
    );
    assert!(
        waiting.reason.contains("waiting for 4 GPUs of type A100"),
        "{}",
        waiting.reason
    );

    gpus.inject_fault(inject(pb::GpuFault::Clear))
        .await
        .expect("clear");
    let done = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "{} {}",
        done.reason,
        done.outcome
    );
    assert!(
        done.gpus.contains(&0),
        "the recovered GPU is used again: {:?}",
        done.gpus
    );

    // Fault injection changes no replicated state, but it is a mutation: both are audited.
    let mut audit = gpu_proto::v1::audit_service_client::AuditServiceClient::new(
        c.channel(2).await.expect("channel"),
    );
    let injections = audit
        .list_audit(pb::ListAuditRequest { after: 0, limit: 0 })
        .await
        .expect("audit")
        .into_inner()
        .entries
        .into_iter()
        .filter(|e| e.verb == "gpu.inject" && e.outcome == "ok")
        .count();
    assert_eq!(injections, 2);
}
