//! Edge sites against real agents: an edge agent joins as a learner only — never promoted,
//! though voter seats are free — keeps its membership behind 200 ms of injected delay on every
//! Raft message the voters send it, registers its site's terms, and runs the jobs placed on its
//! site; an agent of the same site restarted with other terms is refused its registration (the
//! site keeps the terms it has); a voter restarted as edge gives up its seat; an edge agent
//! asked to bootstrap a cluster (its first voter) refuses to start. The 2-minute partition is
//! `chaos/tests/edge_partition.rs`.

use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use gpu_tests::{AgentCommand, Cluster, free_addr, make_edge, shell_job, voters};

/// LAN voters with timings that suit a 200 ms link to the edge (openraft uses the heartbeat
/// interval as every AppendEntries deadline), fault injection on, short plain job timings.
pub const EDGE_MESH: &str = "heartbeat_interval = \"500ms\"\nelection_timeout_min = \"1500ms\"\n\
                             election_timeout_max = \"3s\"\nfault_injection = true\n\
                             [jobs]\nlease = \"6s\"\ndown_after = \"9s\"\nstop_grace = \"2s\"\n";

/// Delay every Raft message the voters send to `edge` by `ms` (both ways of the round trip are
/// in that one wait: the reply comes straight back).
async fn delay_to(c: &Cluster, voters: &[u64], edge: &[u64], ms: u32) {
    let admin = c.admin_token();
    for v in voters {
        let mut client =
            NodeServiceClient::new(c.channel_as(*v, Some(&admin)).await.expect("channel"));
        client
            .inject_network_fault(pb::InjectNetworkFaultRequest {
                node_id: *v,
                delay_min_ms: ms,
                delay_max_ms: ms,
                seed: *v,
                peers: edge.to_vec(),
                ..Default::default()
            })
            .await
            .expect("inject the delay");
    }
}

fn role(s: &pb::ClusterStatus, id: u64) -> Option<pb::MemberRole> {
    s.members
        .iter()
        .find(|m| m.node_id == id)
        .and_then(|m| pb::MemberRole::try_from(m.role).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_learner_behind_200ms_stays_a_member_and_runs_its_sites_jobs() {
    let placements = (0..5).map(|_| gpu_tests::Placement::loopback()).collect();
    // Five voter seats for five agents: only the edge agents' choice keeps them learners.
    let mut c = Cluster::start_prepared(5, EDGE_MESH, placements, AgentCommand::default(), |c| {
        make_edge(
            &c.agents[&4].config,
            "edge-1",
            "lease = \"20s\"\ndown_after = \"30s\"\n",
        )
        .expect("n4 edge");
        make_edge(
            &c.agents[&5].config,
            "edge-1",
            "lease = \"20s\"\ndown_after = \"30s\"\n",
        )
        .expect("n5 edge");
    })
    .await;
    let status = c.status(1, false).await.expect("status");
    assert_eq!(voters(&status), [1, 2, 3], "{status:?}");
    delay_to(&c, &[1, 2, 3], &[4, 5], 200).await;
    // The delay is real: a write committed by the voters reaches n4's replica (and the commit
    // index with it, in the next message) only after the injected delay.
    c.label(1, 4, "probe", "1").await.expect("label");
    let read_at = Instant::now();
    let n4 = c
        .node(4, 4, false)
        .await
        .expect("n4 through its own replica");
    let took = read_at.elapsed();
    assert_eq!(n4.labels.get("probe").map(String::as_str), Some("1"));
    assert!(
        took >= Duration::from_millis(150),
        "a linearizable read on n4 right after a write took {took:?}: no delay on its link?"
    );

    // Both register with their site's terms.
    c.wait_for(
        "n4 and n5 to register",
        Duration::from_secs(20),
        |c| async move {
            c.node(1, 4, false).await.is_ok_and(|n| n.edge.is_some())
                && c.node(1, 5, false).await.is_ok_and(|n| n.edge.is_some())
        },
    )
    .await;
    let n4 = c.node(1, 4, false).await.expect("n4");
    assert_eq!(
        n4.edge,
        Some(pb::EdgeSite {
            site: "edge-1".into(),
            lease_ms: 20_000,
            down_after_ms: 30_000,
        })
    );
    assert_eq!(n4.labels.get("site").map(String::as_str), Some("edge-1"));

    // n5 restarted with another grace for the same site is refused, with the reason, and
    // keeps the terms it registered with: one site, one grace.
    c.kill(5);
    let config5 = std::fs::read_to_string(&c.agents[&5].config).expect("n5 config");
    std::fs::write(
        &c.agents[&5].config,
        config5.replace("down_after = \"30s\"", "down_after = \"40s\""),
    )
    .expect("rewrite n5's config");
    c.start_agent(5);
    c.wait_for(
        "n5's registration to be refused",
        Duration::from_secs(30),
        |c| async move {
            std::fs::read_to_string(&c.agents[&5].log)
                .is_ok_and(|l| l.contains("every agent of a site needs the same [edge] settings"))
        },
    )
    .await;
    let log5 = std::fs::read_to_string(&c.agents[&5].log).expect("n5 log");
    assert!(
        log5.contains(
            "is an edge site (lease 20000 ms, down_after 30000 ms) for n4, but n5 registers it \
             as an edge site (lease 20000 ms, down_after 40000 ms)"
        ),
        "the refusal names the site's terms:\n{log5}"
    );
    let n5 = c.node(1, 5, false).await.expect("n5");
    assert_eq!(n5.edge.map(|e| e.down_after_ms), Some(30_000));

    // A job for the edge site runs there, once, through the delayed link.
    let spec = pb::JobSpec {
        node_selector: [("site".to_owned(), "edge-1".to_owned())].into(),
        ..shell_job("at-the-edge", 1, "sleep 1")
    };
    let id = c.submit(1, spec, "edge-1").await.expect("submit").job_id;
    let done = c
        .wait_job(id, Duration::from_secs(60), gpu_tests::is_terminal)
        .await;
    assert_eq!(
        (done.state, done.node_id, done.generation),
        (pb::JobState::Succeeded as i32, Some(4), 1),
        "{done:?}"
    );

    // Long past the autopilot's rounds (every 500 ms) with seats free, both edge agents are
    // still learners, reachable and caught up behind the delay.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let s = c.status(1, false).await.expect("status");
        assert_eq!(voters(&s), [1, 2, 3], "an edge agent was promoted: {s:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let s = c.status(1, false).await.expect("status");
    for edge in [4, 5] {
        assert_eq!(role(&s, edge), Some(pb::MemberRole::Learner), "{s:?}");
        let m = s
            .members
            .iter()
            .find(|m| m.node_id == edge)
            .expect("member");
        assert_eq!(m.reachable, Some(true), "{m:?}");
        assert!(
            m.matched_index.unwrap_or(0) + 20 >= s.last_log_index,
            "n{edge} is behind: {m:?} of {}",
            s.last_log_index
        );
    }
    let n4 = c.node(1, 4, false).await.expect("n4");
    assert_eq!(n4.status, pb::NodeStatus::Ready as i32);
}

/// An edge agent is a learner only, so it cannot be the first voter of a new cluster: the
/// agent refuses to start, saying why, before it touches its data directory.
#[test]
fn an_edge_agent_refuses_to_bootstrap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = 1\nlisten = {:?}\ndata_dir = {data:?}\nbootstrap = true\n\
             gpu_backend = \"sim\"\nlabels = {{ site = \"edge-1\" }}\n[edge]\nenabled = true\n",
            free_addr()
        ),
    )
    .expect("config");
    let out = std::process::Command::new(gpu_tests::bin("gpu-agent"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run gpu-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("an edge agent cannot bootstrap a cluster")
            && stderr.contains("edge agents are learners only"),
        "{stderr}"
    );
    assert!(!data.exists(), "nothing written");
}

/// A voter whose agent comes back configured as edge gives its seat to a healthy learner and
/// stays a member, as a learner: an edge agent never keeps voting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_reconfigured_as_edge_gives_up_its_seat() {
    let mut c = Cluster::start(4, 3, "").await;
    let leader = c.leader().await;
    let status = c.status(leader, false).await.expect("status");
    let voter = *voters(&status)
        .iter()
        .find(|v| **v != leader)
        .expect("a voter that is not the leader");
    let learner = status
        .members
        .iter()
        .map(|m| m.node_id)
        .find(|id| role(&status, *id) == Some(pb::MemberRole::Learner))
        .expect("one learner");
    c.wait_for(
        "the learner to register",
        Duration::from_secs(20),
        |c| async move { c.node(leader, learner, false).await.is_ok() },
    )
    .await;
    c.kill(voter);
    make_edge(&c.agents[&voter].config, "edge-9", "").expect("reconfigure as edge");
    c.start_agent(voter);
    c.wait_for(
        "the edge agent's seat to go to the learner",
        Duration::from_secs(30),
        |c| async move {
            c.status(leader, false).await.is_ok_and(|s| {
                role(&s, voter) == Some(pb::MemberRole::Learner)
                    && role(&s, learner) == Some(pb::MemberRole::Voter)
            })
        },
    )
    .await;
    let n = c.node(leader, voter, false).await.expect("node");
    assert_eq!(n.edge.map(|e| e.site), Some("edge-9".to_owned()));
    let s = c.status(leader, false).await.expect("status");
    assert_eq!(voters(&s).len(), 3, "{s:?}");
}
