//! Removing a learner for good (`gpuctl node remove`), with real agents: refused, changing
//! nothing, for a voter, a non-member, a node running a job, and when sent to a learner;
//! then the idle learner leaves the membership, its certificates are revoked, and the cluster
//! writes on without it.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, shell_job};
use serde_json::Value;

fn gpuctl(c: &Cluster, via: u64, args: &[&str]) -> (Option<i32>, Value, String) {
    c.gpuctl_json(via, args)
}

fn refused(c: &Cluster, via: u64, args: &[&str], why: &str) {
    let (code, _, err) = gpuctl(c, via, args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(err.contains(why), "{args:?}: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_is_removed_for_good_and_nothing_else_is() {
    let c = Cluster::start(4, 3, "").await;
    let voters = gpu_tests::voters(&c.status(1, false).await.expect("status"));
    let learner = (1..=4).find(|id| !voters.contains(id)).expect("a learner");
    let follower = *voters.iter().find(|id| **id != 1).expect("a follower");
    let id = learner.to_string();

    refused(
        &c,
        1,
        &["node", "remove", &follower.to_string()],
        "is a voter",
    );
    refused(&c, 1, &["node", "remove", "9"], "not a member");
    refused(
        &c,
        learner,
        &["node", "remove", &id],
        "send this to a voter",
    );
    // While it runs a job.
    c.label(1, learner, "removal", "here").await.expect("label");
    let mut spec = shell_job("on-the-learner", 1, "sleep 6");
    spec.node_selector = [("removal".to_owned(), "here".to_owned())].into();
    let job = c
        .submit(1, spec, "on-learner")
        .await
        .expect("submit")
        .job_id;
    c.wait_for("the job to run", Duration::from_secs(30), |c| async move {
        c.job(1, job)
            .await
            .is_ok_and(|j| j.state == pb::JobState::Running as i32)
    })
    .await;
    refused(&c, follower, &["node", "remove", &id], "drain it first");
    let members = c.status(1, false).await.expect("status").members.len();
    assert_eq!(members, 4, "nothing changed");

    let done = c
        .wait_job(job, Duration::from_secs(60), gpu_tests::is_terminal)
        .await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    let (code, removed, err) = gpuctl(&c, follower, &["node", "remove", &id]);
    assert_eq!(code, Some(0), "{err}\n{}", c.logs());
    let revoked = removed["revoked"].as_array().cloned().unwrap_or_default();
    assert!(!revoked.is_empty(), "{removed}");
    let status = c.status(1, false).await.expect("status");
    assert!(
        status.members.iter().all(|m| m.node_id != learner),
        "{status:?}"
    );
    let (_, certs, _) = gpuctl(&c, 1, &["cert", "list"]);
    for serial in &revoked {
        let cert = certs
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| &c["serial"] == serial)
            .unwrap_or_else(|| panic!("{serial} listed: {certs}"));
        assert_eq!(cert["revoked"], true, "{cert}");
    }
    c.submit(follower, shell_job("after", 0, "true"), "after")
        .await
        .expect("the cluster writes on");
}
