//! Waiting until every agent has finished starting. An agent serves its API before its join
//! through the seed returns; cutting the seed off in that moment leaves the joining agent
//! retrying until its `join_timeout` and exiting, so partition scenarios wait for every
//! agent's "agent ready" log line first. Also the start the partition tests share: a ready
//! cluster whose agents each run in a network namespace, or a skip where there are none.

use std::time::Duration;

use gpu_tests::Cluster;

use crate::netns::Netns;

/// The line `gpu-agent run` logs once it has started and caught up with the cluster.
const READY: &str = "agent ready";

/// Wait (up to 30 s) until every running agent's log says it is ready.
pub async fn wait_all_ready(c: &Cluster) {
    c.wait_for(
        "every agent to finish starting",
        Duration::from_secs(30),
        |c| async move {
            c.running().iter().all(|id| {
                std::fs::read_to_string(&c.agents[id].log).is_ok_and(|log| log.contains(READY))
            })
        },
    )
    .await;
}

/// Whether network namespaces can be made here; where not, says on stdout that `what` is
/// skipped.
pub fn namespaces_or_skip(what: &str) -> bool {
    match Netns::unavailable() {
        Some(why) => {
            println!("skipping {what}: {why}");
            false
        }
        None => true,
    }
}

/// `agents` agents (three of them voters), each in its own network namespace so it can be cut
/// off, every one with `config` and ready; `None` where namespaces are unavailable (`what` is
/// skipped).
pub async fn cluster_in_namespaces(
    agents: u64,
    config: &str,
    what: &str,
) -> anyhow::Result<Option<(Netns, Cluster)>> {
    if !namespaces_or_skip(what) {
        return Ok(None);
    }
    let net = Netns::create(agents)?;
    let c = Cluster::start_placed(3, config, net.placements()).await;
    wait_all_ready(&c).await;
    Ok(Some((net, c)))
}
