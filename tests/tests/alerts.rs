//! Alerts and self-healing on real agents with simulated GPUs: an overheating GPU is alerted
//! on after the rule's duration, throttled, cools down and the alert resolves; a fatal XID on a
//! GPU running a job quarantines that GPU, moves the job (it completes on another GPU without
//! using up its one attempt), and the node's other GPUs keep working; a webhook receiver on
//! loopback gets every notice; bad rules are refused with the reason.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_client::AlertServiceClient;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use gpu_tests::{Cluster, is_terminal, shell_job};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A webhook receiver on loopback: every JSON body POSTed to it, in arrival order.
struct Receiver {
    url: String,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let seen = bodies.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = stream.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        request.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&request).into_owned();
                        let Some((head, body)) = text.split_once("\r\n\r\n") else {
                            continue;
                        };
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() < length {
                            continue;
                        }
                        if let Ok(json) = serde_json::from_str(&body[..length]) {
                            seen.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(json);
                        }
                        let _ = stream
                            .write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                });
            }
        });
        Receiver { url, bodies }
    }

    /// (event, rule) of every notice received.
    fn events(&self) -> Vec<(String, String)> {
        self.bodies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|b| {
                (
                    b["event"].as_str().unwrap_or_default().to_owned(),
                    b["alert"]["rule"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

async fn alerts(c: &Cluster) -> Vec<pb::Alert> {
    let Ok(ch) = c.channel(1).await else {
        return Vec::new();
    };
    AlertServiceClient::new(ch)
        .list_alerts(pb::ListAlertsRequest {
            include_resolved: true,
            stale: false,
        })
        .await
        .map(|r| r.into_inner().alerts)
        .unwrap_or_default()
}

async fn inject(c: &Cluster, gpu_index: u32, fault: pb::GpuFault, xid: u32) {
    GpuServiceClient::new(c.channel(1).await.expect("channel"))
        .inject_fault(pb::InjectFaultRequest {
            node_id: 1,
            gpu_index,
            fault: fault as i32,
            xid,
        })
        .await
        .expect("inject");
}

async fn gpu_of(c: &Cluster, job: &pb::Job) -> u32 {
    let node = c.node(1, 1, false).await.expect("node");
    node.gpus
        .iter()
        .find(|g| job.gpu_uuids.contains(&g.uuid))
        .map(|g| g.index)
        .expect("the job's GPU")
}

async fn telemetry(c: &Cluster, index: u32) -> Option<pb::GpuTelemetry> {
    let gpus = GpuServiceClient::new(c.channel(1).await.ok()?)
        .list_gpus(pb::ListGpusRequest { node_id: Some(1) })
        .await
        .ok()?
        .into_inner()
        .gpus;
    gpus.into_iter()
        .find(|g| g.gpu.as_ref().is_some_and(|g| g.index == index))?
        .telemetry
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn running(j: &pb::Job) -> bool {
    j.state == pb::JobState::Running as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overheat_is_throttled_and_a_fatal_xid_moves_the_job_off_its_gpu() {
    let hook = Receiver::start().await;
    let config = format!(
        "[monitor]\ninterval = \"200ms\"\nwebhooks = [{:?}]\n\
         [[monitor.rules]]\nname = \"gpu-overheat\"\nmetric = \"temperature_c\"\nabove = 85\n\
         for = \"2s\"\nclear_after = \"2s\"\naction = \"throttle:60\"\n",
        hook.url
    );
    // n1: four A100-80GB (400 W, slowdown at 89 °C).
    let c = Cluster::start(1, 1, &config).await;

    // 1. Overheat a busy GPU: alert after 2 s above 85 °C, throttled to 240 W, cools, resolves.
    let hot = c
        .submit(1, shell_job("hot", 1, "sleep 120"), "hot")
        .await
        .expect("submit")
        .job_id;
    let hot_job = c.wait_job(hot, Duration::from_secs(30), running).await;
    let hot_gpu = gpu_of(&c, &hot_job).await;
    // Let the busy GPU's power settle at full load first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let injected_at = now_ms();
    inject(&c, hot_gpu, pb::GpuFault::Overheat, 0).await;
    c.wait_for(
        "the overheat alert",
        Duration::from_secs(20),
        |c| async move { alerts(c).await.iter().any(|a| a.rule == "gpu-overheat") },
    )
    .await;
    let raised = alerts(&c)
        .await
        .into_iter()
        .find(|a| a.rule == "gpu-overheat")
        .expect("raised");
    assert_eq!(raised.gpu_index, hot_gpu);
    assert_eq!(raised.action, "throttle:60");
    assert!(
        raised.raised_at_ms + 300 >= injected_at + 2000,
        "raised {} ms after the fault, before the rule's 2 s",
        raised.raised_at_ms.saturating_sub(injected_at)
    );
    c.wait_for(
        "the throttled GPU to cool",
        Duration::from_secs(20),
        |c| async move {
            telemetry(c, hot_gpu)
                .await
                .is_some_and(|t| t.power_limit_w == 240.0 && t.temperature_c < 85.0)
        },
    )
    .await;
    c.wait_for(
        "the overheat alert to resolve",
        Duration::from_secs(20),
        |c| async move {
            alerts(c)
                .await
                .iter()
                .any(|a| a.id == raised.id && a.resolved_at_ms.is_some())
        },
    )
    .await;
    inject(&c, hot_gpu, pb::GpuFault::Clear, 0).await;
    c.wait_for(
        "the full power limit back",
        Duration::from_secs(20),
        |c| async move {
            telemetry(c, hot_gpu)
                .await
                .is_some_and(|t| t.power_limit_w == 400.0)
        },
    )
    .await;

    // 2. A fatal XID on the GPU of a job with a single attempt: the GPU is quarantined, the job
    //    is moved (its second run is quick) and succeeds elsewhere; the other GPUs keep working.
    let moved = c
        .submit(
            1,
            shell_job(
                "moved",
                1,
                "if [ \"$GPUMESH_GENERATION\" = 1 ]; then sleep 120; fi; echo done",
            ),
            "moved",
        )
        .await
        .expect("submit")
        .job_id;
    let first = c.wait_job(moved, Duration::from_secs(30), running).await;
    let failing_gpu = gpu_of(&c, &first).await;
    inject(&c, failing_gpu, pb::GpuFault::Xid, 79).await;
    let done = c
        .wait_job(moved, Duration::from_secs(60), is_terminal)
        .await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "{} {}",
        done.reason,
        done.outcome
    );
    assert!(done.generation > first.generation, "it ran again");
    assert_ne!(gpu_of(&c, &done).await, failing_gpu, "elsewhere");
    let failing = alerts(&c)
        .await
        .into_iter()
        .find(|a| a.rule == "gpu-failing")
        .expect("the health alert");
    assert_eq!(
        (failing.gpu_index, failing.migrated_job_id),
        (failing_gpu, Some(moved))
    );
    assert!(failing.message.contains("XID 79"), "{}", failing.message);
    let node = c.node(1, 1, false).await.expect("node");
    let quarantined: Vec<u32> = node
        .gpus
        .iter()
        .filter(|g| !g.quarantined_by.is_empty())
        .map(|g| g.index)
        .collect();
    assert_eq!(quarantined, [failing_gpu], "only that GPU is out");
    let others = c
        .submit(1, shell_job("others", 2, "true"), "others")
        .await
        .expect("submit")
        .job_id;
    let others = c
        .wait_job(others, Duration::from_secs(30), is_terminal)
        .await;
    assert_eq!(
        others.state,
        pb::JobState::Succeeded as i32,
        "{}",
        others.reason
    );

    // 3. The webhook heard all of it.
    c.wait_for("the webhook notices", Duration::from_secs(20), |_| async {
        let events = hook.events();
        ["raised", "resolved"]
            .iter()
            .all(|e| events.contains(&((*e).into(), "gpu-overheat".into())))
            && events.contains(&("raised".into(), "gpu-failing".into()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_rules_are_set_listed_and_refused_with_the_reason() {
    let c = Cluster::start(1, 1, "").await;
    let run = |args: &[&str]| {
        let out = c
            .gpuctl()
            .args(["--endpoint", c.addr(1), "-o", "json", "alert", "rule"])
            .args(args)
            .output()
            .expect("gpuctl");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[
        "set",
        "hbm-hot",
        "--metric",
        "memory_temperature_c",
        "--above",
        "95",
        "--for",
        "10s",
        "--action",
        "throttle:80",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"source\": \"replicated\""), "{out}");
    for (args, why) in [
        (
            vec!["set", "x", "--metric", "tempreature", "--above", "1"],
            "unknown metric \"tempreature\"",
        ),
        (
            vec![
                "set",
                "x",
                "--metric",
                "power_w",
                "--above",
                "1",
                "--for=-5s",
            ],
            "expected a duration",
        ),
        (
            vec![
                "set",
                "x",
                "--metric",
                "power_w",
                "--above",
                "1",
                "--action",
                "throttle:0",
            ],
            "10-100%",
        ),
        (vec!["set", "x", "--metric", "power_w"], "exactly one of"),
        (vec!["delete", "never-set"], "no replicated alert rule"),
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let (_, out, _) = run(&["list"]);
    let rules: serde_json::Value = serde_json::from_str(&out).expect("json");
    let names: Vec<(&str, &str)> = rules
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or(""),
                r["source"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("gpu-failing", "builtin"),
            ("gpu-memory-will-fill", "builtin"),
            ("gpu-overheat", "builtin"),
            ("hbm-hot", "replicated")
        ]
    );
    let (code, _, err) = run(&["delete", "hbm-hot"]);
    assert_eq!(code, Some(0), "{err}");

    // A rule that fires at once quarantines every GPU; deleting it resolves its alerts and
    // returns the GPUs to service.
    let (code, _, err) = run(&[
        "set",
        "always",
        "--metric",
        "temperature_c",
        "--above",
        "0",
        "--action",
        "quarantine",
    ]);
    assert_eq!(code, Some(0), "{err}");
    c.wait_for(
        "every GPU quarantined",
        Duration::from_secs(20),
        |c| async move {
            c.node(1, 1, false)
                .await
                .is_ok_and(|n| n.gpus.iter().all(|g| g.quarantined_by == "always"))
        },
    )
    .await;
    let (code, _, err) = run(&["delete", "always"]);
    assert_eq!(code, Some(0), "{err}");
    c.wait_for(
        "its alerts resolved",
        Duration::from_secs(20),
        |c| async move {
            let all = alerts(c).await;
            let node = c.node(1, 1, false).await;
            all.iter().filter(|a| a.rule == "always").count() == 4
                && all.iter().all(|a| a.resolved_at_ms.is_some())
                && node.is_ok_and(|n| n.gpus.iter().all(|g| g.quarantined_by.is_empty()))
        },
    )
    .await;
}
