//! The leader's group commit on real agents: concurrent writes through every agent are batched
//! into fewer log entries than writes, each writer still gets its own answer, and a key
//! submitted twice at once (so likely inside one batch) names one job.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use gpu_tests::{AgentCommand, Cluster, Placement, free_addr, scrape, shell_job};

const CLIENTS: u64 = 64;
const KEYS_PER_CLIENT: u64 = 3;

/// The value of the unlabelled-but-`node_id` metric `name` in `text`.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_log_entries_and_each_gets_its_own_answer() {
    let placements: Vec<Placement> = (0..3).map(|_| Placement::loopback()).collect();
    let metrics: BTreeMap<u64, String> = (1..=3).map(|id| (id, free_addr())).collect();
    let c = Cluster::start_prepared(3, "", placements, AgentCommand::default(), |c| {
        for (id, agent) in &c.agents {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&agent.config)
                .expect("open config");
            writeln!(f, "[monitor]\nmetrics_listen = {:?}", metrics[id]).expect("append");
        }
    })
    .await;

    // Every key is submitted twice at the same moment, through two different agents.
    let c = &c;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        tasks.push(async move {
            let mut answers = Vec::new();
            for k in 0..KEYS_PER_CLIENT {
                let key = format!("c{client}-k{k}");
                let spec = shell_job(&key, 1, "sleep 0.1");
                let (a, b) = (1 + client % 3, 1 + (client + 1) % 3);
                let (x, y) = tokio::join!(c.submit(a, spec.clone(), &key), c.submit(b, spec, &key));
                let x = x.unwrap_or_else(|e| panic!("{key} via n{a}: {e}")).job_id;
                let y = y.unwrap_or_else(|e| panic!("{key} via n{b}: {e}")).job_id;
                answers.push((key, x, y));
            }
            answers
        });
    }
    let mut ids = BTreeSet::new();
    for answers in futures::future::join_all(tasks).await {
        for (key, x, y) in answers {
            assert_eq!(x, y, "{key} was submitted twice and must name one job");
            assert!(ids.insert(x), "{key}: j-{x} was also another key's job");
        }
    }
    assert_eq!(ids.len() as u64, CLIENTS * KEYS_PER_CLIENT);

    // Each agent's replica has every job (read-your-writes held for every writer).
    for via in 1..=3 {
        let listed: BTreeSet<u64> = c
            .list_jobs(via)
            .await
            .expect("list")
            .iter()
            .map(|j| j.id)
            .collect();
        assert!(ids.is_subset(&listed), "n{via} misses jobs");
    }

    let leader = c.leader().await;
    let text = scrape(&metrics[&leader]).expect("leader's /metrics");
    let writes = metric(&text, "gpumesh_raft_writes_proposed_total").expect("writes figure");
    let entries = metric(&text, "gpumesh_raft_entries_proposed_total").expect("entries figure");
    assert!(
        writes >= (2 * CLIENTS * KEYS_PER_CLIENT) as f64,
        "the leader proposed only {writes} writes"
    );
    assert!(
        entries < writes / 2.0,
        "{writes} concurrent writes became {entries} log entries: no group commit"
    );
    println!("{writes} writes in {entries} entries");
}
