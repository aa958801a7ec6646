//! What the fencing tests share: leases as tight as the config allows, the namespaced cluster
//! they start from with jobs kept off the leader by a label on the followers, and a job
//! waited for until it runs.

// Each test crate that includes this module uses only part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use gpu_chaos::netns::Netns;
use gpu_chaos::ready::cluster_in_namespaces;
use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, records};

/// Leases as tight as the config allows (`down_after` = 1.5 × `lease`), so a late fence shows.
const FAST_FENCING: &str = "[jobs]\nlease = \"2s\"\ndown_after = \"3s\"\nstop_grace = \"2s\"\n";

/// Three agents in network namespaces with `FAST_FENCING`, a records directory, and every
/// follower labelled `pool=followers`.
pub(crate) struct Fenced {
    pub net: Netns,
    pub c: Cluster,
    pub all: [u64; 3],
    pub records: PathBuf,
    pub leader: u64,
}

/// The cluster the namespaced fencing tests start from; `None` where namespaces are
/// unavailable (the test is skipped).
pub(crate) async fn fenced_cluster() -> Option<Fenced> {
    let (net, c) = cluster_in_namespaces(3, FAST_FENCING, "the partition test")
        .await
        .expect("namespaces")?;
    let all = [1, 2, 3];
    let records = records::prepare_dir(c.root.path()).expect("records dir");
    let leader = c.leader().await;
    label_followers(&c, leader, &all).await;
    Some(Fenced {
        net,
        c,
        all,
        records,
        leader,
    })
}

/// Label every agent of `all` but `leader` `pool=followers`, so a job with that node selector
/// runs on a follower and cutting its node off leaves the leader in place.
pub(crate) async fn label_followers(c: &Cluster, leader: u64, all: &[u64]) {
    for node in all.iter().filter(|n| **n != leader) {
        c.label(leader, *node, "pool", "followers")
            .await
            .expect("label");
    }
}

/// Submit `spec` through `via` and wait (up to 30 s) until it runs: the job, and the node it
/// runs on.
pub(crate) async fn run_job(c: &Cluster, via: u64, spec: pb::JobSpec) -> (pb::Job, u64) {
    let id = c.submit(via, spec, "").await.expect("submit").job_id;
    let running = c
        .wait_job(id, Duration::from_secs(30), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let node = running.node_id.expect("placed");
    (running, node)
}
