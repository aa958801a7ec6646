//! What users expect when runs fail, on real agents and the real `gpuctl`: a failing run with
//! `--max-attempts 3` is retried after its backoff (doubling) and ends Failed after three runs,
//! each on record with its outcome and its log readable by attempt; a job that succeeds on its
//! second attempt ends Succeeded; a process job past its time limit is stopped and ends "time
//! limit exceeded", not retried; a gang's rank-1 log is readable through an agent that ran
//! neither member. Asking for a rank or attempt that does not exist is a clear error.

use std::process::Output;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal, shell_job};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

/// `gpuctl --endpoint <via's address> ARGS`.
fn gpuctl(c: &Cluster, via: u64, args: &[&str]) -> Output {
    c.gpuctl()
        .args(["--endpoint", c.addr(via)])
        .args(args)
        .output()
        .expect("run gpuctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `job logs j-ID ARGS` through agent `via`: its stdout, after checking it exited 0.
fn logs(c: &Cluster, via: u64, id: u64, args: &[&str]) -> String {
    let job = format!("j-{id}");
    let out = gpuctl(c, via, &[&["job", "logs", &job][..], args].concat());
    assert!(
        out.status.success(),
        "job logs {job} {args:?} via n{via}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `job get -o json` through agent `via`.
fn job_json(c: &Cluster, via: u64, id: u64) -> Value {
    let out = gpuctl(c, via, &["-o", "json", "job", "get", &format!("j-{id}")]);
    assert!(out.status.success(), "job get: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("job get prints JSON")
}

/// Each run's (attempt, outcome).
fn runs(job: &Value) -> Vec<(u64, String)> {
    job["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            let outcome = r["outcome"].as_str().unwrap_or_default().to_owned();
            (r["attempt"].as_u64().unwrap_or_default(), outcome)
        })
        .collect()
}

fn retried(name: &str, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        max_attempts: 3,
        retry_backoff_s: Some(1),
        ..shell_job(name, 1, script)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_are_retried_and_every_run_and_rank_keeps_its_log() {
    let c = Cluster::start(3, 3, "").await;

    // Phase 1: a run that always fails is tried three times, 1 s then 2 s apart, and fails.
    let id = c
        .submit(
            1,
            retried("always-fails", "echo try $GPUMESH_GENERATION; exit 1"),
            "",
        )
        .await
        .expect("submit")
        .job_id;
    let done = c.wait_job(id, WAIT, is_terminal).await;
    assert_eq!(done.state, pb::JobState::Failed as i32, "{done:?}");
    assert_eq!((done.attempts, done.generation), (3, 3), "{done:?}");
    assert_eq!(done.reason, "exited with code 1");
    let job = job_json(&c, 2, id);
    let failed = (1..=3).map(|a| (a, "exited with code 1".to_owned()));
    assert_eq!(runs(&job), failed.collect::<Vec<_>>(), "{job:#}");
    let at = |run: usize, field: &str| job["runs"][run][field].as_u64().unwrap_or(0);
    for (run, backoff_ms) in [(1, 1_000), (2, 2_000)] {
        let waited = at(run, "bound_at_ms").saturating_sub(at(run - 1, "finished_at_ms"));
        assert!(
            waited >= backoff_ms,
            "run {run} placed {waited} ms after the last ended"
        );
        eprintln!(
            "run {run}: placed {waited} ms after the run before ended (backoff {backoff_ms} ms)"
        );
    }
    let table = text(&gpuctl(&c, 3, &["job", "get", &format!("j-{id}")]).stdout);
    assert!(
        table.contains("ATTEMPT") && table.matches("exited with code 1").count() >= 3,
        "job get shows a table of attempts:\n{table}"
    );
    // Each attempt's log, through every agent (two of them ran nothing of it, or not that run).
    for via in 1..=3 {
        assert_eq!(logs(&c, via, id, &["--attempt", "1"]), "try 1\n");
        assert_eq!(logs(&c, via, id, &["--attempt", "3"]), "try 3\n");
        assert_eq!(
            logs(&c, via, id, &[]),
            "try 3\n",
            "the latest run by default"
        );
    }
    let none = gpuctl(
        &c,
        1,
        &["job", "logs", &format!("j-{id}"), "--attempt", "4"],
    );
    let err = text(&none.stderr);
    assert_eq!(none.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not found") && err.contains("no attempt 4"),
        "{err}"
    );
    let rank = gpuctl(&c, 1, &["job", "logs", &format!("j-{id}"), "--rank", "1"]);
    let err = text(&rank.stderr);
    assert!(
        rank.status.code() == Some(2) && err.contains("only rank 0"),
        "{err}"
    );

    // Phase 2: a run that fails once, then succeeds (its state in a file the job keeps).
    let state = gpu_tests::records::prepare_dir(c.root.path()).expect("state dir");
    let script = format!(
        "f={}/second-time; if [ -e $f ]; then echo second; exit 0; fi; touch $f; echo first; exit 1",
        state.display()
    );
    let id = c
        .submit(2, retried("flaky", &script), "")
        .await
        .expect("submit")
        .job_id;
    let done = c.wait_job(id, WAIT, is_terminal).await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    let job = job_json(&c, 1, id);
    assert_eq!(
        runs(&job),
        [
            (1, "exited with code 1".to_owned()),
            (2, "exited with code 0".to_owned())
        ]
    );
    assert_eq!(logs(&c, 3, id, &["--attempt", "1"]), "first\n");
    assert_eq!(logs(&c, 3, id, &[]), "second\n");

    // Phase 3: a process job past its time limit is stopped and not retried.
    let sleeper = pb::JobSpec {
        wall_time_limit_s: Some(2),
        ..retried("sleeper", "sleep 60")
    };
    let id = c.submit(3, sleeper, "").await.expect("submit").job_id;
    let done = c.wait_job(id, WAIT, is_terminal).await;
    assert_eq!(done.state, pb::JobState::Failed as i32, "{done:?}");
    assert_eq!(done.outcome, "time limit exceeded");
    assert_eq!(done.attempts, 1, "a time limit is not retried");
    let ran = done
        .finished_at_ms
        .unwrap_or(0)
        .saturating_sub(done.started_at_ms.unwrap_or(0));
    assert!(
        (2_000..20_000).contains(&ran),
        "stopped about 2 s after it started (then SIGTERM and the grace): ran {ran} ms"
    );

    // Phase 4: each member of a two-node gang writes its own output; rank 1's is read through
    // the agent that ran neither member.
    let gang = pb::JobSpec {
        nodes: 2,
        ..shell_job("ranks", 2, "echo rank $NODE_RANK on n$GPUMESH_NODE_ID")
    };
    let id = c.submit(1, gang, "").await.expect("submit").job_id;
    let done = c.wait_job(id, WAIT, is_terminal).await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    let members = done.gang_nodes.clone();
    assert_eq!(members.len(), 2, "{done:?}");
    let outsider = (1..=3)
        .find(|n| !members.contains(n))
        .expect("an agent outside the gang");
    for (rank, node) in members.iter().enumerate() {
        let r = rank.to_string();
        assert_eq!(
            logs(&c, outsider, id, &["--rank", &r]),
            format!("rank {rank} on n{node}\n")
        );
    }
    let beyond = gpuctl(
        &c,
        outsider,
        &["job", "logs", &format!("j-{id}"), "--rank", "2"],
    );
    let err = text(&beyond.stderr);
    assert!(
        beyond.status.code() == Some(2)
            && err.contains("invalid argument")
            && err.contains("ranks 0..=1"),
        "{err}"
    );
}
