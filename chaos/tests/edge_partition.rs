//! An edge site cut off for two minutes (network namespaces, nft): its agent is a learner behind
//! 200 ms of injected delay, its site's grace (`[edge] down_after`) far longer than the
//! cluster's `jobs.down_after`. While it is cut off the leader keeps it Ready and places its
//! jobs nowhere else, and the agent keeps running them past the plain `jobs.lease`; one job
//! ends during the cut and is reported after the heal, the other runs on past it. Each job runs
//! once, in one generation, and ends Succeeded.

use std::time::{Duration, Instant, SystemTime};

use gpu_chaos::check::fencing;
use gpu_chaos::netns::Netns;
use gpu_chaos::partition::{self, Cut};
use gpu_chaos::ready::namespaces_or_skip;
use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use gpu_tests::{AgentCommand, Cluster, make_edge, records, shell_job};

const CUT_FOR: Duration = Duration::from_secs(120);

/// Voters tuned for a 200 ms link (the heartbeat is every AppendEntries deadline), plain nodes
/// declared down after 9 s.
const MESH: &str = "heartbeat_interval = \"500ms\"\nelection_timeout_min = \"1500ms\"\n\
                    election_timeout_max = \"3s\"\nfault_injection = true\n\
                    [jobs]\nlease = \"6s\"\ndown_after = \"9s\"\nstop_grace = \"2s\"\n";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_site_cut_off_for_two_minutes_keeps_its_jobs_and_reconciles() {
    if !namespaces_or_skip("the edge partition test") {
        return;
    }
    let net = Netns::create(4).expect("namespaces");
    let all = [1, 2, 3, 4];
    let edge = 4;
    let c = Cluster::start_prepared(3, MESH, net.placements(), AgentCommand::default(), |c| {
        make_edge(
            &c.agents[&edge].config,
            "edge-1",
            "lease = \"150s\"\ndown_after = \"225s\"\n",
        )
        .expect("n4 edge");
    })
    .await;
    gpu_chaos::ready::wait_all_ready(&c).await;
    let records = records::prepare_dir(c.root.path()).expect("records dir");
    let admin = c.admin_token();
    for v in [1, 2, 3] {
        let mut client =
            NodeServiceClient::new(c.channel_as(v, Some(&admin)).await.expect("channel"));
        client
            .inject_network_fault(pb::InjectNetworkFaultRequest {
                node_id: v,
                delay_min_ms: 200,
                delay_max_ms: 200,
                seed: v,
                peers: vec![edge],
                ..Default::default()
            })
            .await
            .expect("inject the delay");
    }
    c.wait_for("n4 to register", Duration::from_secs(20), |c| async move {
        c.node(1, edge, false).await.is_ok_and(|n| n.edge.is_some())
    })
    .await;

    // One job ends during the cut, one runs past it; attempts to spare, so a requeue would
    // show as a second generation rather than a failure.
    let at_edge = |name: &str, secs: &str| pb::JobSpec {
        max_attempts: 3,
        node_selector: [("site".to_owned(), "edge-1".to_owned())].into(),
        ..shell_job(name, 1, &records::script(&records, secs))
    };
    let leader = c.leader().await;
    let short = c
        .submit(leader, at_edge("ends-while-cut", "30"), "short")
        .await
        .expect("submit")
        .job_id;
    let long = c
        .submit(leader, at_edge("outlives-the-cut", "140"), "long")
        .await
        .expect("submit")
        .job_id;
    for id in [short, long] {
        let j = c
            .wait_job(id, Duration::from_secs(30), |j| {
                j.state == pb::JobState::Running as i32
            })
            .await;
        assert_eq!(j.node_id, Some(edge), "{j:?}");
    }

    Cut::isolate(edge, &all).apply(&net, &all).expect("isolate");
    let cut_at = Instant::now();
    while cut_at.elapsed() < CUT_FOR {
        let leader = c.leader().await;
        if let Ok(n) = c.node(leader, edge, false).await {
            assert_eq!(
                n.status,
                pb::NodeStatus::Ready as i32,
                "n4 declared down {:?} into the cut, inside its site's grace\n{}",
                cut_at.elapsed(),
                c.logs()
            );
        }
        for id in [short, long] {
            if let Ok(j) = c.job(leader, id).await {
                assert_eq!(
                    (j.generation, j.node_id),
                    (1, Some(edge)),
                    "j-{id} placed again during the cut: {j:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    partition::heal(&net, &all).expect("heal");
    let healed_ns = now_ns();

    // The job that ended while cut off is reported once the link is back, the other ends on
    // its own; neither was placed again.
    for id in [short, long] {
        let j = c
            .wait_job(id, Duration::from_secs(60), gpu_tests::is_terminal)
            .await;
        assert_eq!(
            (j.state, j.generation, j.node_id),
            (pb::JobState::Succeeded as i32, 1, Some(edge)),
            "{j:?}"
        );
    }
    let runs = records::read_all(&records).expect("records");
    assert_eq!(
        runs.iter()
            .map(|r| (r.job_id, r.generation))
            .collect::<Vec<_>>(),
        [(short, 1), (long, 1)],
        "each job ran exactly once: {runs:?}"
    );
    let ends: Vec<u128> = runs
        .iter()
        .map(|r| {
            r.end_ns
                .unwrap_or_else(|| panic!("a run was stopped: {runs:?}"))
        })
        .collect();
    assert!(
        ends[0] < healed_ns,
        "the short job finished while cut off: {runs:?}"
    );
    assert!(
        ends[1] > healed_ns,
        "the long job kept running through the cut: {runs:?}"
    );
    assert!(fencing::check(&runs).is_empty(), "{runs:?}");
    let status = c.status(c.leader().await, false).await.expect("status");
    let member = status
        .members
        .iter()
        .find(|m| m.node_id == edge)
        .expect("n4 is still a member");
    assert_eq!(member.role, pb::MemberRole::Learner as i32, "{status:?}");
    let n4 = c.node(1, edge, false).await.expect("n4");
    assert_eq!(n4.status, pb::NodeStatus::Ready as i32);
}
