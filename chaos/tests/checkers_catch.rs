//! The partition checkers catch what they exist for on a real history: a read served by a
//! cut-off old leader from its own replica (a `--stale` read, standing in for an agent that
//! would answer default reads without confirming its leadership) is reported, after the
//! majority has changed the job and a read there has seen it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_chaos::check::{job_order, minority};
use gpu_chaos::client::{Client, Outcome};
use gpu_chaos::history::{Event, OpKind, Phase, Recorder};
use gpu_chaos::partition::{self, Cut};
use gpu_chaos::ready::cluster_in_namespaces;
use gpu_tests::shell_job;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_from_the_cut_off_leader_is_reported() {
    let Some((net, c)) = cluster_in_namespaces(3, "", "the partition test")
        .await
        .expect("namespaces")
    else {
        return;
    };
    let all = [1, 2, 3];
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("checkers-catch");
    std::fs::create_dir_all(&dir).expect("dir");
    let rec = Arc::new(Recorder::create(&dir.join("history.jsonl")).expect("history"));
    let client = Client::new(&c, rec.clone());
    let old = c.leader().await;
    let majority: Vec<u64> = all.iter().copied().filter(|n| *n != old).collect();
    for node in &majority {
        c.label(old, *node, "pool", "majority")
            .await
            .expect("label");
    }
    // A job running on the majority side; the old leader's replica sees it running.
    let spec = gpu_proto::v1::JobSpec {
        node_selector: [("pool".to_owned(), "majority".to_owned())].into(),
        ..shell_job("long", 0, "sleep 60")
    };
    let Outcome::Ok(id) = client
        .submit("w0", old, spec, "long", Duration::from_secs(5))
        .await
        .expect("submit")
    else {
        panic!("the job was not acknowledged");
    };
    c.wait_job(id, Duration::from_secs(30), |j| {
        j.state == gpu_proto::v1::JobState::Running as i32
    })
    .await;
    Cut::isolate(old, &all).apply(&net, &all).expect("isolate");
    rec.record(Event {
        minority: Some(vec![old]),
        ..Event::new("nemesis", Phase::Ok, OpKind::Nemesis)
    })
    .expect("record");
    // The majority cancels it, and a read there sees it cancelled.
    c.wait_for(
        "the majority to cancel the job",
        Duration::from_secs(30),
        |c| {
            let via = majority[0];
            async move { c.cancel(via, id).await.is_ok() }
        },
    )
    .await;
    let mut seen = None;
    for _ in 0..50 {
        seen = client
            .read("w1", majority[0], id, Duration::from_secs(3))
            .await
            .expect("read");
        if seen.as_deref() == Some("JOB_STATE_CANCELLED") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen.as_deref(), Some("JOB_STATE_CANCELLED"));
    // The cut-off old leader's own replica still says running.
    let stale = client
        .read_with("w2", old, id, Duration::from_secs(3), true)
        .await
        .expect("read");
    assert_eq!(
        stale.as_deref(),
        Some("JOB_STATE_RUNNING"),
        "its replica lags"
    );
    // The same read as a linearizable one is refused (times out) instead.
    let linearizable = client
        .read("w3", old, id, Duration::from_secs(1))
        .await
        .expect("read");
    assert_eq!(linearizable, None);
    partition::heal(&net, &all).expect("heal");
    let history = rec.events();
    let kinds = |v: Vec<gpu_chaos::model::Violation>| -> Vec<&'static str> {
        v.iter().map(|v| v.kind).collect()
    };
    assert_eq!(kinds(minority::check(&history)), ["minority-read"]);
    assert_eq!(kinds(job_order::check(&history)), ["read-regressed"]);
}
