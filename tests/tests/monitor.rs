//! GPU monitoring on real agents: a live agent's `/metrics` passes `promtool check metrics`
//! and names the job on its GPU; `gpuctl gpu stats` reads a GPU's history through any agent;
//! bad references are refused.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use gpu_tests::{Cluster, free_addr, scrape, shell_job};

/// Polls `check` until it yields a value, for at most `timeout`.
async fn eventually<T, F, Fut>(c: &Cluster, what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "timed out after {timeout:?} waiting for {what}\n{}",
        c.logs()
    );
}

/// `promtool check metrics` on `text`: `None` when promtool is not installed (and
/// `GPUMESH_REQUIRE_PROMTOOL` is unset; CI sets it), else its exit status and output.
fn promtool(text: &str) -> Option<(bool, String)> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var_os("GPUMESH_REQUIRE_PROMTOOL").is_none() => {
            println!("skipping promtool (apt-get install prometheus): {e}");
            return None;
        }
        Err(e) => panic!("promtool is required here: {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_agents_metrics_pass_promtool_and_name_the_job_on_its_gpu() {
    let metrics = free_addr();
    let c = Cluster::start(
        1,
        1,
        &format!("[monitor]\ninterval = \"200ms\"\nmetrics_listen = {metrics:?}\n"),
    )
    .await;
    let job = c
        .submit(1, shell_job("watched", 1, "sleep 60"), "watched")
        .await
        .expect("submit")
        .job_id;
    c.wait_job(job, Duration::from_secs(30), |j| {
        j.state == pb::JobState::Running as i32
    })
    .await;
    let job_label = format!("job=\"{job}\"");
    let text = eventually(
        &c,
        "the job's label on a GPU line",
        Duration::from_secs(10),
        || {
            let (metrics, job_label) = (metrics.clone(), job_label.clone());
            async move {
                let text = scrape(&metrics).ok()?;
                text.lines()
                    .any(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{") && l.contains(&job_label))
                    .then_some(text)
            }
        },
    )
    .await;
    for family in [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_XID_ERRORS",
        "gpumesh_raft_term",
        "gpumesh_raft_is_leader",
        "gpumesh_queue_length",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    assert!(
        text.contains("gpumesh_raft_is_leader{node_id=\"1\"} 1"),
        "{text}"
    );
    assert!(text.contains("gpumesh_jobs{state=\"Running\"} 1"), "{text}");
    if let Some((ok, said)) = promtool(&text) {
        assert!(
            ok,
            "promtool check metrics refused the exposition: {said}\n{text}"
        );
    }

    // Anything but GET /metrics is refused, and the agent keeps serving.
    let mut stream = std::net::TcpStream::connect(&metrics).expect("connect");
    write!(
        stream,
        "GET /debug HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(scrape(&metrics).is_ok());
}

/// `gpuctl -o json gpu stats ...` through agent `via`: exit code and stdout/stderr.
fn gpu_stats(c: &Cluster, via: u64, args: &[&str]) -> (Option<i32>, String) {
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(via), "-o", "json", "gpu", "stats"])
        .args(args)
        .output()
        .expect("gpuctl gpu stats");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_stats_reads_a_gpus_history_through_any_agent() {
    let c = Cluster::start(3, 3, "[monitor]\ninterval = \"200ms\"\n").await;
    // n3 has four T4s; ask n1 about n3's last GPU until a few samples are in.
    let readings = eventually(
        &c,
        "n3's samples through n1",
        Duration::from_secs(20),
        || async {
            let (code, text) = gpu_stats(&c, 1, &["n3/3", "--since", "1m"]);
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let readings = v["readings"].as_array()?.clone();
            (code == Some(0) && v["node_id"] == 3 && v["gpu_index"] == 3 && readings.len() >= 3)
                .then_some(readings)
        },
    )
    .await;
    let times: Vec<u64> = readings
        .iter()
        .filter_map(|r| r["at_ms"].as_u64())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "oldest first: {times:?}"
    );
    let t = &readings[0]["telemetry"];
    assert_eq!(t["memory_total_mib"], 15_360, "{t}");
    assert_eq!(t["healthy"], true, "{t}");
    assert!(t["temperature_c"].as_f64().is_some_and(|c| c > 20.0), "{t}");
    assert_eq!(t["throttle_reasons"], serde_json::json!(["idle"]), "{t}");

    // `gpuctl top` prints one frame when stdout is not a terminal: every GPU of every node.
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(2), "top", "--once"])
        .output()
        .expect("gpuctl top");
    let frame = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{frame}");
    assert!(frame.starts_with("NODE  GPU  MODEL"), "{frame}");
    assert_eq!(
        frame.lines().count(),
        1 + 12,
        "three nodes of four GPUs: {frame}"
    );
    assert!(
        frame.contains("T4-16GB") && frame.contains("H100-80GB"),
        "{frame}"
    );

    let (code, text) = gpu_stats(&c, 2, &["3/4"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("node 3 has no GPU 4 (it has 4)"), "{text}");
    let (code, text) = gpu_stats(&c, 2, &["9/0"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("node 9 is not registered"), "{text}");
    let (code, text) = gpu_stats(&c, 2, &["3-0"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("expected NODE/GPU like 2/0 or n2/0"),
        "{text}"
    );
}

/// The power limit of each of node 1's GPUs, by index.
async fn power_limits(c: &Cluster) -> Option<Vec<f32>> {
    let gpus = GpuServiceClient::new(c.channel(1).await.ok()?)
        .list_gpus(pb::ListGpusRequest { node_id: Some(1) })
        .await
        .ok()?
        .into_inner()
        .gpus;
    gpus.iter()
        .map(|g| g.telemetry.as_ref().map(|t| t.power_limit_w))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn green_mode_caps_idle_gpus_and_energy_is_accounted_per_job_node_and_tenant() {
    let c = Cluster::start(
        1,
        1,
        "[monitor]\ninterval = \"200ms\"\ngreen_idle_after = \"1s\"\ngreen_power_pct = 50\n\
         energy_report_every = \"1s\"\n",
    )
    .await;
    // n1: four A100-80GB of 400 W; idle for a second, each is capped at 200 W.
    eventually(
        &c,
        "every idle GPU capped",
        Duration::from_secs(20),
        || async {
            power_limits(&c)
                .await
                .filter(|l| l.iter().all(|w| *w == 200.0))
        },
    )
    .await;
    let job = c
        .submit(1, shell_job("warm", 1, "sleep 4"), "warm")
        .await
        .expect("submit")
        .job_id;
    let running = c
        .wait_job(job, Duration::from_secs(30), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let gpu = running.gpus[0] as usize;
    let limits = eventually(
        &c,
        "the bound GPU back at full power",
        Duration::from_secs(10),
        || async { power_limits(&c).await.filter(|l| l[gpu] == 400.0) },
    )
    .await;
    assert_eq!(
        limits.iter().filter(|w| **w == 200.0).count(),
        3,
        "{limits:?}"
    );
    c.wait_job(job, Duration::from_secs(30), gpu_tests::is_terminal)
        .await;

    // The job's GPU energy is reported (at 1 s here), and adds up per node and tenant.
    let used = eventually(&c, "the job's energy", Duration::from_secs(20), || async {
        let j = c.job(1, job).await.ok()?;
        (j.energy_mj > 0).then_some(j.energy_mj)
    })
    .await;
    // At most 400 W for the job's few seconds on one GPU.
    assert!(used < 400 * 10 * 1000, "{used} mJ");
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "-o", "json", "gpu", "energy"])
        .output()
        .expect("gpuctl gpu energy");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let node = report["nodes"][0]["gpu_mj"].as_u64().unwrap_or(0);
    assert!(
        node >= used,
        "the node's GPUs used at least the job's energy: {report}"
    );
    assert!(
        report["nodes"][0]["green_capped_ms"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );
    assert_eq!(report["tenants"][0]["tenant"], "default", "{report}");
    assert!(
        report["tenants"][0]["gpu_mj"].as_u64().unwrap_or(0) >= used,
        "{report}"
    );
}

/// A job shorter than the energy report interval shows its energy as soon as it ends: the
/// agent reports a job's energy when the job stops holding its GPUs, not at the next
/// interval (an hour here, which nothing else would reach).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_jobs_energy_is_reported_when_it_ends() {
    let c = Cluster::start(1, 1, "[monitor]\nenergy_report_every = \"1h\"\n").await;
    let job = c
        .submit(1, shell_job("brief", 2, "sleep 3"), "brief")
        .await
        .expect("submit")
        .job_id;
    c.wait_job(job, Duration::from_secs(30), gpu_tests::is_terminal)
        .await;
    let used = eventually(&c, "the job's energy", Duration::from_secs(10), || async {
        let j = c.job(1, job).await.ok()?;
        (j.energy_mj > 0).then_some(j.energy_mj)
    })
    .await;
    // Two GPUs for about three seconds, at most 400 W each on the simulated A100s.
    assert!(used < 2 * 400 * 6 * 1000, "{used} mJ");
}
