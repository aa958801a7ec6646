//! What Slurm users reach for, on real agents and the real `gpuctl`: a three-stage pipeline of
//! dependencies whose middle stage fails ends its last stage with the never-satisfied reason;
//! `job cancel --name GLOB` cancels exactly the matching jobs; a held job with its dependency
//! met stays pending until it is released, then runs; an unknown dependency is refused; a
//! held job is updated, a failed one requeued, `job list` filters on the server and `--watch`
//! prints each change; webhooks post signed events, a refused post is retried, and a job's
//! webhook elsewhere than its tenant's origin is refused.

use std::process::Output;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

fn gpuctl(c: &Cluster, args: &[&str]) -> Output {
    c.gpuctl()
        .args(["--endpoint", c.addr(2)])
        .args(args)
        .output()
        .expect("run gpuctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `job submit --name NAME FLAGS -- /bin/sh -c SCRIPT`: the new job's id.
fn submit(c: &Cluster, name: &str, flags: &[&str], script: &str) -> u64 {
    let args = [
        &["-o", "json", "job", "submit", "--gpus", "1", "--name", name][..],
        flags,
        &["--", "/bin/sh", "-c", script],
    ]
    .concat();
    let out = gpuctl(c, &args);
    assert!(out.status.success(), "submit {name}: {}", text(&out.stderr));
    let reply: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    reply["job_id"].as_u64().expect("a job id")
}

fn job(c: &Cluster, id: u64) -> Value {
    let out = gpuctl(c, &["-o", "json", "job", "get", &format!("j-{id}")]);
    assert!(out.status.success(), "job get: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn state(j: &pb::Job) -> pb::JobState {
    pb::JobState::try_from(j.state).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_whose_middle_stage_fails_ends_its_last_stage_with_the_reason() {
    let c = Cluster::start(3, 3, "").await;
    let prepare = submit(&c, "prepare", &[], "sleep 2");
    let train = submit(
        &c,
        "train",
        &["--after", &format!("ok:j-{prepare}")],
        "exit 3",
    );
    let report = submit(&c, "report", &["--after", &format!("ok:j-{train}")], "true");
    let waiting = job(&c, train);
    assert_eq!(waiting["state"], "pending", "{waiting:#}");
    assert_eq!(waiting["waiting_for"], serde_json::json!([prepare]));
    let why = text(&gpuctl(&c, &["job", "why", &format!("j-{train}")]).stdout);
    assert!(
        why.contains(&format!("waiting for j-{prepare} to succeed")),
        "{why}"
    );

    let ended = c.wait_job(report, WAIT, is_terminal).await;
    assert_eq!(state(&ended), pb::JobState::Cancelled, "{ended:?}");
    assert_eq!(
        ended.reason,
        format!("dependency never satisfied: ok:j-{train}: j-{train} failed")
    );
    assert!(ended.runs.is_empty(), "the last stage never ran");
    let train = c.wait_job(train, WAIT, is_terminal).await;
    assert_eq!(state(&train), pb::JobState::Failed, "{train:?}");

    let unknown = gpuctl(&c, &["job", "submit", "--after", "ok:j-9999", "--", "true"]);
    assert!(!unknown.status.success());
    assert!(
        text(&unknown.stderr).contains("has no job j-9999"),
        "{}",
        text(&unknown.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_name_and_hold_until_release() {
    let c = Cluster::start(3, 3, "").await;
    let sweep: Vec<u64> = (1..=3)
        .map(|i| submit(&c, &format!("sweep-{i}"), &[], "sleep 60"))
        .collect();
    let keep = submit(&c, "keep", &[], "sleep 60");
    let held = submit(
        &c,
        "after-keep",
        &["--after", &format!("any:j-{keep}")],
        "true",
    );
    let out = gpuctl(&c, &["job", "hold", &format!("j-{held}")]);
    assert!(out.status.success(), "hold: {}", text(&out.stderr));
    assert_eq!(job(&c, held)["held"], true);

    let out = gpuctl(&c, &["-o", "json", "job", "cancel", "--name", "sweep-*"]);
    assert!(out.status.success(), "cancel: {}", text(&out.stderr));
    let cancelled: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    let ids: Vec<u64> = cancelled.iter().filter_map(|j| j["id"].as_u64()).collect();
    assert_eq!(ids, sweep, "exactly the sweep");
    for id in sweep {
        c.wait_job(id, WAIT, is_terminal).await;
    }
    assert_eq!(job(&c, keep)["cancel_requested"], false, "keep is kept");

    // Its dependency met, the held job still waits for its release.
    let out = gpuctl(&c, &["job", "cancel", &format!("j-{keep}")]);
    assert!(out.status.success(), "cancel keep: {}", text(&out.stderr));
    c.wait_job(keep, WAIT, is_terminal).await;
    c.wait_job(held, WAIT, |j| j.waiting_for.is_empty()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = job(&c, held);
    assert_eq!(still["state"], "pending", "{still:#}");
    let out = gpuctl(&c, &["job", "release", &format!("j-{held}")]);
    assert!(out.status.success(), "release: {}", text(&out.stderr));
    let done = c.wait_job(held, WAIT, is_terminal).await;
    assert_eq!(state(&done), pb::JobState::Succeeded, "{done:?}");

    let nothing = gpuctl(&c, &["job", "cancel"]);
    assert!(!nothing.status.success(), "a cancel of nothing is refused");
}

/// The most runs of `tasks` that overlapped in time (bound to finished).
fn most_at_once(tasks: &[Value]) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for t in tasks {
        let runs = t["runs"].as_array().cloned().unwrap_or_default();
        for r in runs {
            let (bound, finished) = (r["bound_at_ms"].as_u64(), r["finished_at_ms"].as_u64());
            if let (Some(b), Some(f)) = (bound, finished) {
                edges.extend([(b, 1), (f, -1)]);
            }
        }
    }
    // Ends before starts at the same millisecond: a GPU freed and taken again in one tick.
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_runs_each_index_once_within_its_limit_and_folds_into_one_line() {
    let c = Cluster::start(3, 3, "").await;
    let array = submit(
        &c,
        "sweep",
        &["--array", "0-39%3"],
        "echo task $SLURM_ARRAY_TASK_ID of $GPUMESH_ARRAY_JOB_ID",
    );
    let last = array + 39;
    for id in array..=last {
        let done = c.wait_job(id, WAIT, is_terminal).await;
        assert_eq!(state(&done), pb::JobState::Succeeded, "{done:?}");
    }
    let out = gpuctl(&c, &["-o", "json", "job", "list"]);
    let lines: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(lines.len(), 1, "one line for the array: {lines:#?}");
    assert_eq!(
        lines[0]["array_task_states"],
        serde_json::json!({"succeeded": 40})
    );
    let table = text(&gpuctl(&c, &["job", "list"]).stdout);
    assert!(
        table.contains(&format!("j-{array}[0-39%3]")) && table.contains("succeeded:40"),
        "{table}"
    );

    let out = gpuctl(&c, &["-o", "json", "job", "list", "--tasks"]);
    let tasks: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(tasks.len(), 40);
    let most = most_at_once(&tasks);
    eprintln!("at most {most} tasks held GPUs at once (limit 3)");
    assert!(most <= 3, "the limit was exceeded: {most}");

    let task = format!("j-{array}[17]");
    let log = gpuctl(&c, &["job", "logs", &task]);
    assert_eq!(text(&log.stdout), format!("task 17 of {array}\n"));
    let got = gpuctl(&c, &["-o", "json", "job", "get", &task]);
    let got: Value = serde_json::from_slice(&got.stdout).expect("JSON");
    assert_eq!(
        (got["id"].as_u64(), got["array_index"].as_u64()),
        (Some(array + 17), Some(17))
    );
    let missing = gpuctl(&c, &["job", "get", &format!("j-{array}[40]")]);
    assert!(!missing.status.success(), "no task of index 40");

    // `job cancel j-ARRAY` cancels every unfinished task.
    let slow = submit(&c, "slow", &["--array", "0-9%2"], "sleep 60");
    let out = gpuctl(&c, &["job", "cancel", &format!("j-{slow}")]);
    assert!(out.status.success(), "cancel: {}", text(&out.stderr));
    for id in slow..slow + 10 {
        let done = c.wait_job(id, WAIT, is_terminal).await;
        assert_eq!(state(&done), pb::JobState::Cancelled, "{done:?}");
    }

    let huge = gpuctl(&c, &["job", "submit", "--array", "0-10000", "--", "true"]);
    assert!(
        text(&huge.stderr).contains("at most 10000 tasks"),
        "{}",
        text(&huge.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_slurm_batch_script_runs_unchanged() {
    let c = Cluster::start(3, 3, "").await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/sweep.sbatch");
    let out = gpuctl(
        &c,
        &["-o", "json", "job", "submit", &script.to_string_lossy()],
    );
    assert!(out.status.success(), "submit: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--output=sweep-%A_%a.out ignored"),
        "the ignored directive is named: {}",
        text(&out.stderr)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let array = reply["job_id"].as_u64().expect("an id");
    let rates = ["0.1", "0.03", "0.01", "0.003"];
    for (index, lr) in rates.iter().enumerate() {
        let id = array + index as u64;
        let done = c.wait_job(id, WAIT, is_terminal).await;
        assert_eq!(state(&done), pb::JobState::Succeeded, "{done:?}");
        let spec = done.spec.clone().unwrap_or_default();
        assert_eq!(spec.name, "lr-sweep");
        assert_eq!(spec.wall_time_limit_s, Some(600));
        let log = gpuctl(&c, &["job", "logs", &format!("j-{array}[{index}]")]);
        let line = text(&log.stdout);
        assert!(
            line.starts_with(&format!("task {index} of {array}: lr={lr} on GPU ")),
            "{line}"
        );
    }
}

/// `job list` with the server's filters (labels, name glob, user) over `gpuctl`.
fn listed(c: &Cluster, filters: &[&str]) -> Vec<u64> {
    let args = [&["-o", "json", "job", "list", "--tasks"][..], filters].concat();
    let out = gpuctl(c, &args);
    assert!(out.status.success(), "list: {}", text(&out.stderr));
    let jobs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    jobs.iter().filter_map(|j| j["id"].as_u64()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_thoughts_and_queries_update_requeue_filter_and_watch() {
    let c = Cluster::start(3, 3, "").await;
    // A watch opened first sees every change after it, printed as JSON lines.
    let mut watch = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "-o", "json", "job", "list", "-w"])
        .args(["--name", "flaky"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run gpuctl job list -w");
    let lines = watch_lines(watch.stdout.take().expect("stdout"));

    let held = submit(
        &c,
        "big",
        &["--hold", "--label", "team=vision", "--time-limit", "1h"],
        "true",
    );
    let flaky = submit(
        &c,
        "flaky",
        &["--label", "team=nlp"],
        "test \"$GPUMESH_GENERATION\" -gt 1 || exit 3",
    );
    let owner = job(&c, held)["submitted_by"]
        .as_str()
        .expect("an owner")
        .to_owned();
    assert!(!owner.is_empty());
    assert_eq!(listed(&c, &["-l", "team=vision"]), [held]);
    assert_eq!(listed(&c, &["--name", "fl*", "--user", &owner]), [flaky]);
    assert!(listed(&c, &["--user", "nobody"]).is_empty());

    // Update a held job: a shorter limit, more GPUs, a priority; a longer limit is refused.
    let out = gpuctl(
        &c,
        &[
            "job",
            "update",
            &format!("j-{held}"),
            "--gpus",
            "2",
            "--time-limit",
            "30m",
            "--priority",
            "5",
        ],
    );
    assert!(out.status.success(), "update: {}", text(&out.stderr));
    let updated = job(&c, held);
    assert_eq!(
        (
            updated["gpus"].as_u64(),
            updated["wall_time_limit_s"].as_u64()
        ),
        (Some(2), Some(1800))
    );
    assert_eq!(
        (updated["priority"].as_i64(), updated["held"].as_bool()),
        (Some(5), Some(true))
    );
    let longer = gpuctl(
        &c,
        &["job", "update", &format!("j-{held}"), "--time-limit", "2h"],
    );
    assert!(!longer.status.success());
    assert!(
        text(&longer.stderr).contains("only be shortened"),
        "{}",
        text(&longer.stderr)
    );

    // The flaky job fails once, and the watch shows it (a watch prints each changed job's
    // state when it looks, every 200 ms: the requeue waits for it, or the failure could come
    // and go between two looks).
    let failed = c.wait_job(flaky, WAIT, is_terminal).await;
    assert_eq!(state(&failed), pb::JobState::Failed, "{failed:?}");
    let watched_until = |goal: &str| {
        let deadline = std::time::Instant::now() + WAIT;
        let mut states = Vec::new();
        while !states.iter().any(|s| s == goal) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the watch prints {goal}, saw {states:?}"));
            let j: Value = serde_json::from_str(&line).expect("a JSON line");
            if j["id"].as_u64() == Some(flaky) {
                states.push(j["state"].as_str().unwrap_or_default().to_owned());
            }
        }
    };
    watched_until("failed");
    // Requeued, it runs again in its own directory and succeeds, and the watch shows that too.
    let out = gpuctl(&c, &["job", "requeue", &format!("j-{flaky}")]);
    assert!(out.status.success(), "requeue: {}", text(&out.stderr));
    let done = c
        .wait_job(flaky, WAIT, |j| state(j) == pb::JobState::Succeeded)
        .await;
    assert_eq!(done.runs.len(), 2, "{done:?}");
    watched_until("succeeded");
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(job(&c, held)["state"], "pending", "still held");
}

/// The lines a child writes to `stdout`, as they come.
fn watch_lines(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// One POST a webhook receiver got: its path, headers (lower-case names) and body.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: std::collections::BTreeMap<String, String>,
    body: Vec<u8>,
}

/// A plain-HTTP webhook receiver on loopback that refuses the first post to `/tenant` (500)
/// and accepts every other (200).
async fn receiver() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Received>::new()));
    let log = std::sync::Arc::clone(&got);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let log = std::sync::Arc::clone(&log);
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 8192];
                let (head, body) = loop {
                    let n = tcp.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    read.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&read).into_owned();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let head = text[..end].to_owned();
                        let length: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if read.len() >= end + 4 + length {
                            break (head, read[end + 4..end + 4 + length].to_vec());
                        }
                    }
                };
                let mut lines = head.lines();
                let path = lines
                    .next()
                    .and_then(|l| l.split(' ').nth(1))
                    .unwrap_or_default()
                    .to_owned();
                let headers = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
                    .collect();
                let first_to_tenant = {
                    let mut log = log.lock().expect("log");
                    let first = path == "/tenant" && !log.iter().any(|r| r.path == "/tenant");
                    log.push(Received {
                        path,
                        headers,
                        body,
                    });
                    first
                };
                let status = if first_to_tenant {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = tcp.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_post_signed_events_and_retry_a_refused_one() {
    let c = Cluster::start(3, 3, "").await;
    let (addr, got) = receiver().await;
    let hook = format!("http://{addr}/tenant");
    let out = gpuctl(
        &c,
        &[
            "tenant",
            "create",
            "vision",
            "--webhook",
            &hook,
            "--webhook-on",
            "start,end,failure",
        ],
    );
    assert!(out.status.success(), "tenant create: {}", text(&out.stderr));

    let out = gpuctl(
        &c,
        &[
            "tenant",
            "update",
            "vision",
            "--webhook",
            "file:///etc/passwd",
        ],
    );
    assert!(!out.status.success(), "a file URL accepted");
    assert!(
        text(&out.stderr).contains("http:// or https://"),
        "{}",
        text(&out.stderr)
    );

    // Bad input: not http(s); another origin than the tenant's webhook.
    for (url, says) in [
        ("ftp://127.0.0.1/x", "http:// or https://"),
        ("http://127.0.0.2:1/x", "origin"),
    ] {
        let out = gpuctl(
            &c,
            &[
                "job", "submit", "--tenant", "vision", "--notify", url, "--", "true",
            ],
        );
        assert!(!out.status.success(), "{url} accepted");
        assert!(
            text(&out.stderr).contains(says),
            "{url}: {}",
            text(&out.stderr)
        );
    }
    let mine = format!("http://{addr}/job");
    let job = submit(
        &c,
        "hooked",
        &[
            "--tenant",
            "vision",
            "--notify",
            &mine,
            "--notify-on",
            "end",
        ],
        "true",
    );
    let done = c.wait_job(job, WAIT, is_terminal).await;
    assert_eq!(state(&done), pb::JobState::Succeeded, "{done:?}");

    // The tenant's webhook hears the start and (after one refusal) the end; the job's own
    // only the end. Each post is signed with the tenant's secret.
    let deadline = std::time::Instant::now() + WAIT;
    let wanted = |r: &Vec<Received>| {
        let count = |path: &str, event: &str| {
            r.iter()
                .filter(|x| {
                    x.path == path
                        && x.headers.get("x-gpumesh-event").map(String::as_str) == Some(event)
                })
                .count()
        };
        count("/tenant", "start") >= 1
            && count("/tenant", "end") >= 1
            && count("/job", "end") >= 1
            && r.iter().filter(|x| x.path == "/tenant").count() >= 3
    };
    while !wanted(&got.lock().expect("log")) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            got.lock().expect("log")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Agent 1 made the cluster's CA: it holds the key (the other voters fetch it in time).
    let out = c
        .gpuctl()
        .args([
            "--endpoint",
            c.addr(1),
            "-o",
            "json",
            "tenant",
            "webhook-secret",
            "vision",
        ])
        .output()
        .expect("run gpuctl");
    assert!(out.status.success(), "secret: {}", text(&out.stderr));
    let secret: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let key = hex::decode(secret["secret"].as_str().expect("hex")).expect("hex");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let received = got.lock().expect("log").clone();
    for r in &received {
        let timestamp = &r.headers["x-gpumesh-timestamp"];
        let signed = [timestamp.as_bytes(), b".", &r.body].concat();
        let expected = format!(
            "sha256={}",
            hex::encode(ring::hmac::sign(&key, &signed).as_ref())
        );
        assert_eq!(r.headers["x-gpumesh-signature"], expected, "{r:?}");
        let body: Value = serde_json::from_slice(&r.body).expect("a JSON body");
        assert_eq!(body["job"]["id"].as_u64(), Some(job));
        assert_eq!(body["id"], r.headers["x-gpumesh-delivery"].as_str());
    }
    // The refused post came again, the same event (its delivery id) once more.
    let first = received
        .iter()
        .find(|r| r.path == "/tenant")
        .expect("a post");
    let id = &first.headers["x-gpumesh-delivery"];
    let tries = (received.iter())
        .filter(|r| r.path == "/tenant" && &r.headers["x-gpumesh-delivery"] == id)
        .count();
    assert!(tries >= 2, "{id} was not retried: {received:?}");
    // An accepted post is not made again: the job's own webhook got its end once.
    let posts_to_job: Vec<&str> = (received.iter())
        .filter(|r| r.path == "/job")
        .map(|r| r.headers["x-gpumesh-delivery"].as_str())
        .collect();
    assert_eq!(posts_to_job, [format!("j-{job}.1.end")], "{received:?}");
    assert!(
        received
            .iter()
            .all(|r| r.headers["x-gpumesh-delivery"].starts_with(&format!("j-{job}.")))
    );
}
